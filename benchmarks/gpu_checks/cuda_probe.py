"""Whether this process can run the GPU checks at all.

Contract: :func:`why_no_gpu` returns ``None`` when torch has CUDA and sees at least one device,
else one line saying which of the two is missing (for the single stderr line of exit 2).
"""

from __future__ import annotations

__all__ = ["why_no_gpu"]


def why_no_gpu() -> str | None:
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a build without CUDA"
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device "
                "(no NVIDIA GPU, no driver, or CUDA_VISIBLE_DEVICES hides them)")
    return None
