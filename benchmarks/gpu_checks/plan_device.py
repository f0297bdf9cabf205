"""Which row of the planner's device table (``bloomline.trainer.plan.devices.DEVICES``) a CUDA
device is, from the name and memory torch reports.

Contract: :func:`plan_device` returns ``(key, note)``: ``key`` is always a key of ``DEVICES``;
``note`` is empty for a device the table has, else it says the prediction is for another
device (an unknown GPU is planned as an A100 80GB, the table's default, and the note says so).
"""

from __future__ import annotations

__all__ = ["FALLBACK", "plan_device"]

FALLBACK = "a100-80gb"
_GIB = 2**30


def plan_device(name: str, memory_bytes: int) -> tuple[str, str]:
    """``name`` as ``torch.cuda.get_device_name`` gives it (e.g. "NVIDIA H100 80GB HBM3",
    "NVIDIA A100-SXM4-40GB"), ``memory_bytes`` its total memory."""
    upper = name.upper()
    # H200 before H100 only for clarity: neither name contains the other
    if "H200" in upper:
        return "h200", ""
    if "H100" in upper:
        # the table's H100 row is the SXM part; a PCIe card has a lower peak
        note = "" if "PCIE" not in upper else "H100 PCIe planned as the SXM part (higher peak)"
        return "h100-80gb", note
    if "A100" in upper:
        # the name carries the size on most boards, the memory always does
        return ("a100-80gb" if memory_bytes > 48 * _GIB else "a100-40gb"), ""
    return FALLBACK, f"{name} is not in the plan's device table: planned as {FALLBACK}"
