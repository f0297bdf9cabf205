"""The one place where the supported torch versions (2.11 to 2.15) behave differently for us.

Each entry says which versions differ, how, and what every version gets from here instead,
so that no other module checks torch's version.

- Memory trackers (``torch.distributed._tools``: ``MemTracker``, ``FSDPMemTracker``), which
  ``trainer plan``'s traced step runs under. DTensor works out an op's output shape by running
  the op on global-shape tensors under a fake mode of its own (``_sharding_prop``'s
  ``detect_fake_mode() or FakeTensorMode()``); those tensors are not allocations of the rank.
  torch 2.13 has a check in both trackers' ``__torch_dispatch__`` (in ``__enter__`` they
  record ``active_fake_mode()`` as ``_fake_mode_on_entry``, and they count an op's outputs
  only while that same mode is active); 2.11's trackers count them all (2.12 not checked):
  a tp rank's trace then holds whole-vocabulary logits and the optimizer step's global-shape
  temporaries (the tiny recipe's pp2 x dp2 x tp2 first stage peaks inside the optimizer step
  at 31.4 MB instead of 25.6 MB, with no activations live). The trackers here make that
  check on every version (on 2.13 and later it repeats torch's own), so a trace gives the
  same bytes on each (checked on 2.11, 2.13 and 2.15).
- Memory tracker kinds (same tools), no version difference: torch's only public way to count
  tensors made before the step, ``track_external``, counts a module's parameters, buffers and
  gradients, an optimizer's ``state`` and, for a bare tensor, "Other". The buffers engine
  (``parallel/distributed_optimizer.py``) keeps its gradients in fp32 bucket buffers that are
  no parameter's ``.grad``, and its fp32 master rows as the inner optimizer's parameters, not
  its state: ``track_as`` puts them under the tracker's gradient and optimizer kinds through
  its private API (checked in 2.13's ``mem_tracker.py``): ``tracker._ref_class``, whose
  members ``GRAD`` (``SHARDED_GRAD`` in ``FSDPMemTracker``) and ``OPT`` name the kinds;
  ``tracker._WINFO``, mapping a counted storage to its ``_WeakRefInfo``; and
  ``tracker._update_and_maybe_create_winfos(tensor, kind)``, ``track_external``'s own path,
  which counts a new storage or moves a counted one to ``kind``. Where one of those is
  missing, ``track_as`` raises rather than miscount.
- Pipeline stages (``torch.distributed.pipelining``), no code here: torch 2.11's
  ``PipelineStage.forward_one_chunk`` always checks the first stage's inputs
  (``_validate_fwd_input`` -> ``_utils.validate_tensor_metadata``: shape, dtype and stride)
  against the metadata its shape inference recorded with ``x.to("meta")``, which is
  contiguous; from 2.13 on that check runs only under ``TORCH_DISTRIBUTED_DEBUG=DETAIL``
  (``PipelineStage._runtime_validate``). A micro-batch of the view ``tokens[:, :-1]`` has
  the row stride L + 1, so every pipelined step failed on 2.11 ("stride mismatch: expected
  (L, 1) actual (L + 1, 1)"); ``PipelinedRunner._run`` hands the schedule a contiguous copy, on
  every version.
- Pipeline send completion (``torch.distributed.pipelining.schedules``), used to release a
  stage's output once it has been sent (``parallel/pipeline.py``'s ``release_output``). torch
  has no public hook for "this forward send is done": its schedules fire their P2P ops through
  the module's private ``_batch_p2p`` and wait the works it returns through
  ``_wait_batch_p2p`` (checked in 2.13's ScheduleGPipe, Schedule1F1B and the runtime
  schedules ScheduleInterleaved1F1B / ScheduleLoopedBFS, where the works are lists).
  ``after_sends_waited`` wraps both (once per process; an untagged call behaves as before): the
  list of works of a call carrying tagged ops comes back as a list subclass remembering them,
  and once that list has been waited the tag's callback runs. Where either function is
  missing, or returns something other than a list, nothing is tagged and no output is
  released (the schedule then keeps each output until its backward, as torch does).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["after_sends_waited", "memory_tracker", "sends_followed", "track_as"]


def memory_tracker(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None):
    """A torch memory tracker for one training step of ``model`` and ``optimizer``:
    ``FSDPMemTracker`` when the model is FSDP2-sharded (it tells all-gather and reduce-scatter
    buffers apart), else ``MemTracker`` tracking both; either one counting only what is
    allocated under the fake mode (if any) active when it is entered."""
    # torch's private memory-tracking tools: imported only by the planner's traced step
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        return _own_fake_mode_only(FSDPMemTracker)(model, optimizer)
    tracker = _own_fake_mode_only(MemTracker)()
    tracker.track_external(model, optimizer)
    return tracker


_TRACKERS: dict[type, type] = {}


def _own_fake_mode_only(base: type) -> type:
    """``base`` counting tensors (``_track``) and peaks (``_update_peak_stats``, both only
    called from its ``__torch_dispatch__``) only under the fake mode active at its entry."""
    if base in _TRACKERS:
        return _TRACKERS[base]
    from torch._guards import active_fake_mode

    class Tracker(base):
        def __enter__(self) -> Any:
            if self._depth == 0:
                self._bloomline_fake_mode = active_fake_mode()
            return super().__enter__()

        def _track(self, reftype: Any, t: torch.Tensor) -> None:
            if active_fake_mode() is self._bloomline_fake_mode:
                super()._track(reftype, t)

        def _update_peak_stats(self, peak_state: Any) -> None:
            if active_fake_mode() is self._bloomline_fake_mode:
                super()._update_peak_stats(peak_state)

    Tracker.__name__ = Tracker.__qualname__ = base.__name__
    _TRACKERS[base] = Tracker
    return Tracker


# the tracker's kinds for ``track_as``: the members of its reference-type enum, by preference
_TRACKED_KINDS = {"gradients": ("GRAD", "SHARDED_GRAD"), "optimizer": ("OPT",)}


def track_as(tracker, kind: str, tensors, move: bool = False) -> None:
    """Count the storages of ``tensors`` (plain tensors or DTensors) in ``tracker`` (a
    ``memory_tracker``) as ``kind``: ``"gradients"`` or ``"optimizer"`` (see the module
    docstring). A storage the tracker counts already keeps its kind (an fp32 run's master
    rows are views of the parameters), unless ``move``: a tensor made inside the tracked step,
    which the tracker counted as an activation or a temporary when it was allocated."""
    from torch.distributed._tools.common_utils import get_untyped_storages

    ref_class = tracker._ref_class
    names = [name for name in _TRACKED_KINDS[kind] if hasattr(ref_class, name)]
    if not names or not hasattr(tracker, "_WINFO"):
        raise RuntimeError(f"this torch's {type(tracker).__name__} has no {kind} kind or "
                           "storage table (torch_compat.track_as)")
    reftype = getattr(ref_class, names[0])
    for tensor in tensors:
        if tensor is None:
            continue
        if not move and any(tracker._WINFO.get(storage) is not None
                            for storage in get_untyped_storages(tensor)):
            continue
        tracker._update_and_maybe_create_winfos(tensor, reftype)


# -- pipeline send completion ----------------------------------------------------------------

_SENT_TAG = "_bloomline_after_wait"
_send_hook_installed: bool | None = None


class _SentWorks(list):
    """The works of one ``_batch_p2p`` call, with the tagged send ops among its ops."""

    sent: list


def _install_send_wait_hook() -> bool:
    """Wrap ``schedules._batch_p2p`` and ``schedules._wait_batch_p2p`` (see the module
    docstring); False where this torch has not both."""
    global _send_hook_installed
    if _send_hook_installed is not None:
        return _send_hook_installed
    try:
        from torch.distributed.pipelining import schedules

        batch_p2p, wait_batch_p2p = schedules._batch_p2p, schedules._wait_batch_p2p
    except (ImportError, AttributeError):
        _send_hook_installed = False
        return False

    def _batch_p2p(p2p_ops, *args, **kwargs):
        works = batch_p2p(p2p_ops, *args, **kwargs)
        sent = [op for op in p2p_ops if hasattr(op, _SENT_TAG)]
        if not sent or type(works) is not list:
            return works
        tagged = _SentWorks(works)
        tagged.sent = sent
        return tagged

    def _wait_batch_p2p(work, *args, **kwargs):
        result = wait_batch_p2p(work, *args, **kwargs)
        sent = getattr(work, "sent", None)
        if sent:
            work.sent = []  # once, should a list be waited twice
            for op in sent:
                getattr(op, _SENT_TAG)(op)
        return result

    schedules._batch_p2p, schedules._wait_batch_p2p = _batch_p2p, _wait_batch_p2p
    _send_hook_installed = True
    return True


def sends_followed() -> bool:
    """Whether ``after_sends_waited`` can follow this torch's schedules (installing its
    wrappers, once)."""
    return _install_send_wait_hook()


def after_sends_waited(ops: list, callback) -> bool:
    """Arrange ``callback(ops)`` to run right after a pipeline schedule has waited the works
    of every op of ``ops`` (``dist.P2POp`` sends, from one ``get_fwd_send_ops`` call): their
    buffers are then no longer read. False, with nothing arranged, where this torch's schedules
    cannot be followed (see the module docstring) or ``ops`` is empty."""
    if not ops or not _install_send_wait_hook():
        return False
    left = [len(ops)]

    def one_waited(op) -> None:
        delattr(op, _SENT_TAG)
        left[0] -= 1
        if left[0] == 0:
            callback(ops)

    for op in ops:
        setattr(op, _SENT_TAG, one_waited)
    return True
