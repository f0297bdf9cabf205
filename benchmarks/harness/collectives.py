"""Counting the collectives a process calls, by wrapping the Python functions that start them.

Which functions. Everything that reaches a process group from Python in the trainer goes
through one of two modules, looked up as module attributes at call time:

- ``torch.distributed`` (``dist.all_reduce``, ``dist.reduce_scatter_single``/``_tensor``,
  ``dist.all_gather_single``/``_into_tensor``, ...): the buffers engine, the trainer's own
  loss and norm reductions, and FSDP2 (``fully_shard``, and ``replicate``, which is FSDP2's
  machinery: ``_fsdp_collectives`` calls ``dist.all_gather_single``,
  ``dist.reduce_scatter_single`` and ``dist.all_reduce``);
- ``torch.distributed._functional_collectives`` (``funcol.all_reduce``,
  ``funcol.all_gather_single``, ``funcol.reduce_scatter_single``, ...): DTensor's
  ``redistribute`` and ``full_tensor`` (the FSDP2 engine's ZeRO-1 all-gathers each updated
  parameter slice this way, and a DTensor norm all-reduces this way).

Both modules' functions are replaced by counting wrappers, and so is every alias of them a
``bloomline`` module bound at import (``grad_buffers`` binds ``_REDUCE_SCATTER`` and
``_ALL_GATHER`` once). A collective that calls another (a deprecated name calling the new one)
counts once: only the outermost call counts. Point-to-point sends (pipelining) are not
collectives and are not wrapped.

What a call records: its kind (``all_reduce``, ``reduce_scatter``, ``all_gather``,
``broadcast``, ``barrier``, ...) and the bytes of the whole tensor it works on: an all-reduce's
tensor, a reduce-scatter's input, an all-gather's output (for a functional all-gather, the
input times the group's size). Counting is on only between ``start()`` and ``stop()``.

The cross-check is the profiler's ``gloo:*`` events (``gloo_ops``), recorded by the backend
itself whatever the Python path: a count here below it means a path this module does not wrap.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter

import torch

__all__ = ["CollectiveCounter", "bytes_written", "gloo_ops"]

# name in torch.distributed -> kind
DIST_KINDS = {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "reduce_scatter_single": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter", "reduce_scatter": "reduce_scatter",
    "all_gather_single": "all_gather", "all_gather_into_tensor": "all_gather",
    "_all_gather_base": "all_gather", "all_gather": "all_gather",
    "all_gather_coalesced": "all_gather", "all_gather_object": "all_gather",
    "broadcast": "broadcast", "broadcast_object_list": "broadcast", "reduce": "reduce",
    "all_to_all_single": "all_to_all", "all_to_all": "all_to_all", "barrier": "barrier",
    "gather": "gather", "scatter": "scatter",
}
# name in torch.distributed._functional_collectives -> kind
FUNCOL_KINDS = {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "all_reduce_inplace": "all_reduce",
    "all_gather_single": "all_gather", "all_gather_tensor": "all_gather",
    "all_gather_single_autograd": "all_gather", "all_gather_tensor_autograd": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather", "all_gather_single_coalesced": "all_gather",
    "all_gather_inplace": "all_gather", "all_gather_tensor_inplace": "all_gather",
    "reduce_scatter_single": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single_autograd": "reduce_scatter",
    "reduce_scatter_tensor_autograd": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "reduce_scatter_single_coalesced": "reduce_scatter",
    "reduce_scatter_tensor_inplace": "reduce_scatter",
    "all_to_all_single": "all_to_all", "all_to_all_single_autograd": "all_to_all",
    "broadcast": "broadcast", "permute_tensor": "permute",
}


def _nbytes(value) -> int:
    if isinstance(value, torch.Tensor):
        local = value.to_local() if hasattr(value, "to_local") else value
        return local.numel() * local.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


def _dist_bytes(kind: str, args, kwargs) -> int:
    """The whole tensor's bytes: the all-gather's output, the reduce-scatter's input."""
    def arg(index: int, *keys: str):
        if len(args) > index:
            return args[index]
        return next((kwargs[k] for k in keys if k in kwargs), None)
    if kind == "all_gather":
        return _nbytes(arg(0, "output_tensor", "tensor_list", "output"))
    if kind == "reduce_scatter":
        return _nbytes(arg(1, "input", "input_tensor", "input_list"))
    return _nbytes(arg(0, "tensor", "tensors"))


def _group_size(group) -> int:
    """The size of a functional collective's group argument (1 when it cannot be told)."""
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed import distributed_c10d as c10d

    try:
        if isinstance(group, tuple):  # (mesh, mesh dimension)
            return group[0].size(group[1])
        if isinstance(group, list):  # ranks
            return len(group)
        if hasattr(group, "size") and callable(group.size):  # a 1-D mesh, a process group
            return group.size()
        return c10d._resolve_process_group(funcol._resolve_group_name(group)).size()
    except Exception:  # noqa: BLE001 - the size only scales the byte count
        return 1


def _funcol_bytes(kind: str, args, kwargs) -> int:
    tensor = args[0] if args else kwargs.get("self")
    size = _nbytes(tensor)
    if kind == "all_gather":
        group = args[2] if len(args) > 2 else kwargs.get("group")
        size *= _group_size(group)
    return size


class CollectiveCounter:
    """``install()`` the wrappers (once per process), then ``start()`` / ``stop()`` around what
    is counted; ``stop()`` returns ``{kind: [bytes of each call]}`` since ``start()``.
    ``uninstall()`` puts the original functions back."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._active = False
        self._calls: dict[str, list[int]] = {}
        self._patched: list[tuple[object, str, object]] = []

    def _wrap(self, original, kind: str, measure):
        counter = self

        def wrapper(*args, **kwargs):
            depth = getattr(counter._local, "depth", 0)
            if counter._active and depth == 0:
                try:
                    size = measure(kind, args, kwargs)
                except Exception:  # noqa: BLE001 - counted with no size rather than failing
                    size = 0
                counter._calls.setdefault(kind, []).append(size)
            counter._local.depth = depth + 1
            try:
                return original(*args, **kwargs)
            finally:
                counter._local.depth = depth
        wrapper.__wrapped__ = original
        wrapper._counted = True
        return wrapper

    def install(self) -> CollectiveCounter:
        import torch.distributed as dist
        from torch.distributed import _functional_collectives as funcol

        originals: dict[int, object] = {}
        for module, kinds, measure in (
                (dist, DIST_KINDS, _dist_bytes),
                (funcol, FUNCOL_KINDS, _funcol_bytes)):
            for name, kind in kinds.items():
                original = getattr(module, name, None)
                if original is None or getattr(original, "_counted", False):
                    continue
                wrapper = self._wrap(original, kind, measure)
                originals[id(original)] = wrapper
                self._patched.append((module, name, original))
                setattr(module, name, wrapper)
        # aliases bound at import by our own modules (grad_buffers' _REDUCE_SCATTER, ...)
        for module_name, module in list(sys.modules.items()):
            if not module_name.startswith("bloomline") or module is None:
                continue
            for attr, value in list(vars(module).items()):
                wrapper = originals.get(id(value))
                if wrapper is not None:
                    self._patched.append((module, attr, value))
                    setattr(module, attr, wrapper)
        return self

    def uninstall(self) -> None:
        for module, name, original in reversed(self._patched):
            setattr(module, name, original)
        self._patched.clear()

    def start(self) -> None:
        self._calls = {}
        self._active = True

    def stop(self) -> dict[str, list[int]]:
        self._active = False
        return self._calls


def gloo_ops(prof) -> Counter:
    """gloo's own collectives in a profiled region: ``gloo:NAME`` event name -> calls (gloo
    runs a reduce-scatter as an all-reduce: it shows as ``all_reduce``)."""
    return Counter(event.name[len("gloo:"):] for event in prof.events()
                   if event.name.startswith("gloo:"))


def bytes_written() -> int:
    """This process's bytes written to any file or socket so far (``/proc/self/io``'s
    ``wchar``: gloo's sends over loopback included); 0 where the file does not exist."""
    try:
        with open("/proc/self/io") as fh:
            for line in fh:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0
