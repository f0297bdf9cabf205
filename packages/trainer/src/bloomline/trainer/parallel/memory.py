"""Model-state memory per rank: the bytes of parameters, gradients and optimizer state this
rank holds on the device and on the host, measured from the tensors it keeps.

Measured: each tensor's *local* part (a DTensor's ``to_local()``: a tp, FSDP2 or ZeRO-1 shard),
counted by its storage, once per storage (FSDP2's shards are views of padded buffers: the
padding of uneven shards is counted, views sharing a buffer are not counted twice). What is
counted is what is registered at the moment of the call: between steps the sharded
parameters, and in a forward hook the full copies FSDP2 computes with (``data_parallel.py``
says which stage holds what when). Gradients: the ones that exist; between steps, when the
trainer has freed them (``zero_grad(set_to_none=True)``), the bytes they take at the optimizer
step, which is each parameter's local shard (FSDP2's sharded gradient has the sharded
parameter's shape; a replicated one the whole parameter's). Optimizer state: every state
tensor but scalars (Adam's step count is not a model state in the paper's count).

The buffers engine (``distributed_optimizer.py``): gradients are its fp32 buckets (whole at
ZeRO-1; at ZeRO-2 the shards, and a bucket's buffer while it exists), the optimizer state
includes the fp32 master rows (none in an fp32 run: there the parameter is its own master
and its rows are counted with the parameters, storage by storage).

Host or device: a tensor in CPU memory while training runs on an accelerator is on the host;
with ``parallel.offload`` every model state is (FSDP2's CPUOffloadPolicy keeps parameter
shards, their gradients and the optimizer state there), which is how a CPU-only run, where
host and device are the same memory, reports it.

The ZeRO paper's figures to compare them with are ``plan/memory_formulas.zero_model_states``
(the planner's formula, one copy of it in the code base).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["memory_record", "model_state_bytes"]

KINDS = ("params", "grads", "optim")


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


class _Counter:
    """Bytes per (kind, place), each storage counted once."""

    def __init__(self, device: torch.device, offload: bool) -> None:
        self.device, self.offload = torch.device(device), offload
        self.seen: set[tuple[str, int]] = set()
        self.bytes = {f"{kind}_{place}": 0 for kind in KINDS for place in ("device", "host")}

    def place(self, tensor: torch.Tensor) -> str:
        on_cpu = tensor.device.type == "cpu"
        return "host" if on_cpu and (self.device.type != "cpu" or self.offload) else "device"

    def add(self, kind: str, tensor: torch.Tensor) -> None:
        local = _local(tensor)
        storage = local.untyped_storage()
        key = (local.device.type, storage.data_ptr())
        if storage.nbytes() == 0 or key in self.seen:
            return
        self.seen.add(key)
        self.bytes[f"{kind}_{self.place(local)}"] += storage.nbytes()

    def add_size(self, kind: str, like: torch.Tensor) -> None:
        local = _local(like)
        self.bytes[f"{kind}_{self.place(local)}"] += local.numel() * local.element_size()


def model_state_bytes(model: nn.Module, optimizer=None, device: torch.device | str = "cpu",
                      offload: bool = False) -> dict[str, int]:
    """Bytes this rank holds, by ``{params,grads,optim}_{device,host}``: see the module
    docstring for what is counted and when."""
    counter = _Counter(device, offload)
    params = [p for p in model.parameters()]
    for param in params:
        counter.add("params", param)
    buffers = getattr(optimizer, "buffers", None)  # the buffers engine's fp32 gradients
    if buffers is not None:
        for bucket in buffers.buckets:
            for held in (bucket.buffer, bucket.shard):
                if held is not None:
                    counter.add("grads", held)
        for group in optimizer.inner.param_groups:  # the fp32 masters (a view in fp32 runs)
            for master in group["params"]:
                counter.add("optim", master)
    else:
        for param in params:
            if param.grad is not None:
                counter.add("grads", param.grad)
            elif param.requires_grad:
                counter.add_size("grads", param)
    if optimizer is not None:
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.ndim > 0:
                    counter.add("optim", value)
    return counter.bytes


def memory_record(model: nn.Module, optimizer, device: torch.device | str,
                  offload: bool = False) -> dict[str, float]:
    """The log record's model-state figures in GB (1e9 bytes): ``memory_params_gb``,
    ``memory_grads_gb``, ``memory_optim_gb`` (device) and ``memory_host_*_gb``."""
    counted = model_state_bytes(model, optimizer, device, offload)
    record = {}
    for kind in KINDS:
        record[f"memory_{kind}_gb"] = counted[f"{kind}_device"] / 1e9
        record[f"memory_host_{kind}_gb"] = counted[f"{kind}_host"] / 1e9
    return record
