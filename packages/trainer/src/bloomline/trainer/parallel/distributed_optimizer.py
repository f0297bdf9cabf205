"""ZeRO-1/2 as Megatron's distributed optimizer (the BF16Optimizer BLOOM trained with): the
model computes with its parameters in the compute dtype (bf16), gradients accumulate in fp32
buffers (``grad_buffers.py``), and each rank keeps the fp32 master copy and Adam's moments of
the rows it owns only.

Per parameter and rank, at dp ranks: bf16 parameters 2 bytes, the fp32 gradient buffer 4
(ZeRO-2: 4/dp), the fp32 master 4/dp and Adam's m and v 8/dp: 6 + 12/dp bytes (ZeRO-2:
2 + 16/dp), where the FSDP2 engine holds 4 + 4 (its working copy) + 4 + 8/dp. In an fp32 run
the parameter is its own master (the owned rows are stepped in place): 8 + 8/dp.

A step: ``reduce_gradients()`` (the buckets' reduce-scatter, averaged over dp), the runner's
own reductions on the owned rows (the tied embedding under pp), ``clip_grad_norm`` over the
owned rows (one all-reduce of the squared norm over the whole world), ``step()`` (Adam on the
master pieces, then the master rows cast into the parameters and all-gathered bucket by
bucket).

The pieces are DTensors of the parameter's global shape, sharded over dp by rows (and over tp
as the parameter is), so ``state_dict()`` (Adam's moments) and ``master_state()`` (the fp32
weights, saved under the model's names) are what DCP saves and reshards; a checkpoint of the
FSDP2 engine loads here and back. ``param_groups`` hold the model's parameters (the trainer
sets ``lr`` on them; DCP maps them to names).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from bloomline.trainer.master_weights import register_master_weights
from bloomline.trainer.parallel.grad_buffers import GradBuffers
from bloomline.trainer.parallel.sharded_optimizer_state import (
    ModelParameterView,
    dp_rows_placement,
)

__all__ = ["DistributedOptimizer"]


def _piece_layout(param: torch.Tensor, mesh):
    """The mesh and placements of this rank's rows of ``param`` as a DTensor: dp shards
    dim 0 of the local tensor (``_StridedShard`` where tp already splits dim 0, FSDP2's
    layout for tp + dp), other axes as the parameter has them."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(param, DTensor):
        return mesh["dp"], (dp_rows_placement(1),)
    names = param.device_mesh.mesh_dim_names
    if names != ("tp",):
        raise ValueError(f"parameter on mesh {names}: the buffers engine expects plain or "
                         "tensor-parallel parameters")
    (tp_placement,) = param.placements
    split = param.device_mesh.size() if (isinstance(tp_placement, Shard)
                                        and tp_placement.dim == 0) else 1
    return mesh["dp", "tp"], (dp_rows_placement(split), tp_placement)


def _cast(param: nn.Parameter, dtype: torch.dtype) -> None:
    """Cast ``param`` in place, keeping the object (the modules and the buckets hold it). A
    DTensor's ``.data`` setter changes its dtype but not its local tensor, so a DTensor is
    swapped for one built on the cast local tensor (``nn.Module._apply``'s way for tensor
    subclasses)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        param.data = param.data.to(dtype)
        return
    local = param.to_local().detach().to(dtype)
    cast = DTensor.from_local(local, param.device_mesh, param.placements, shape=param.shape,
                              stride=param.stride(), run_check=False)
    torch.utils.swap_tensors(param, nn.Parameter(cast, requires_grad=param.requires_grad))


class _Piece:
    """One parameter's owned rows: ``master`` (an fp32 DTensor parameter the inner optimizer
    steps: a copy for a low-precision model, a view of the parameter's rows in fp32) whose
    ``grad`` is a view of the reduced gradient buffer; ``replicas`` how many ranks beside dp
    hold the same rows (tp-replicated parameters: their norm is counted once)."""

    def __init__(self, param, buffers: GradBuffers, mesh, dp_rank: int,
                 compute_dtype: torch.dtype) -> None:
        from torch.distributed.tensor import DTensor, Replicate

        self.param = param
        local = param.to_local() if isinstance(param, DTensor) else param
        _, region = buffers.region(param)
        rows = region.owned_rows(local.detach(), dp_rank)
        # an fp32 model steps its own rows; otherwise a copy, made before the cast to bf16
        owned = rows if compute_dtype == torch.float32 else rows.float().clone()
        piece_mesh, placements = _piece_layout(param, mesh)
        self.mesh, self.placements = piece_mesh, placements
        self.master = nn.Parameter(self._dtensor(owned))
        self.master.grad = self._dtensor(buffers.shard_grad(param))
        self.replicas = 1
        if isinstance(param, DTensor) and isinstance(param.placements[0], Replicate):
            self.replicas = param.device_mesh.size()

    def _dtensor(self, local: torch.Tensor):
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(local, self.mesh, self.placements,
                                  shape=self.param.shape, stride=self.param.stride(),
                                  run_check=False)

    @property
    def local(self) -> torch.Tensor:
        return self.master.to_local()

    @property
    def grad_local(self) -> torch.Tensor:
        return self.master.grad.to_local()


class DistributedOptimizer(ModelParameterView):
    """``optimizer`` (built over ``model``'s parameters) stepping this rank's fp32 pieces of
    them, with the gradients in ``GradBuffers`` over ``mesh["dp"]``. ``chunks``: the modules
    the rank runs (the model, or its pipeline stages). ``sharded_grads``: ZeRO-2.
    ``compute_dtype``: the parameters' dtype from here on (the model is cast to it after the
    fp32 masters are taken from it)."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: nn.Module, chunks, mesh,
                 bucket_size: int, sharded_grads: bool, device: torch.device,
                 compute_dtype: torch.dtype) -> None:
        dp_mesh = mesh["dp"]
        self.dp_group = dp_mesh.get_group()
        self.dp, self.dp_rank = dp_mesh.size(), dp_mesh.get_local_rank()
        self.model = model
        self.buffers = GradBuffers(model, chunks, self.dp_group, self.dp, self.dp_rank,
                                   bucket_size, sharded_grads, device)
        self._pieces: dict[torch.Tensor, _Piece] = {}
        groups = []
        for group in optimizer.param_groups:
            pieces = [_Piece(p, self.buffers, mesh, self.dp_rank, compute_dtype)
                      for p in group["params"]]
            self._pieces.update((piece.param, piece) for piece in pieces)
            groups.append({**group, "params": [piece.param for piece in pieces]})
            group["params"] = [piece.master for piece in pieces]
        super().__init__(optimizer, groups,
                         {param: piece.master for param, piece in self._pieces.items()})
        for param in self._pieces:  # bf16: what the model computes with from now on
            if param.dtype != compute_dtype:
                _cast(param, compute_dtype)
        self.buffers.install_hooks()
        register_master_weights(model, self)  # the checkpoint and init_from ask there

    # -- what DCP and the trainer read (the state, under the model's names: the base class) ----
    def master_state(self, names: dict[torch.Tensor, str]) -> dict[str, torch.Tensor]:
        """The fp32 weights by parameter name (``names``: parameter -> name), as dp-sharded
        DTensors: what a checkpoint saves and loads as the model."""
        return {names[param]: piece.master for param, piece in self._pieces.items()}

    def full_master(self, names: dict[torch.Tensor, str]) -> dict[str, torch.Tensor]:
        """Every fp32 weight whole, on every rank (gathers: tests and small models)."""
        return {names[param]: piece.master.detach().full_tensor().cpu()
                for param, piece in self._pieces.items()}

    def load_full(self, full: dict[str, torch.Tensor], names: dict[torch.Tensor, str]) -> None:
        """Set the weights from whole tensors (every rank has them: an imported model): each
        rank takes its tp shard into the parameter and its rows into the master."""
        from torch.distributed.tensor import DTensor, Shard

        with torch.no_grad():
            for param, piece in self._pieces.items():
                value = full[names[param]]
                if isinstance(param, DTensor):
                    (placement,) = param.placements
                    if isinstance(placement, Shard):
                        mesh = param.device_mesh
                        value = torch.chunk(value, mesh.size(), dim=placement.dim)[
                            mesh.get_local_rank()]
                local = param.to_local() if isinstance(param, DTensor) else param
                local.copy_(value)
                if local.dtype != torch.float32:  # an fp32 master is a view of these rows
                    _, region = self.buffers.region(param)
                    piece.local.copy_(region.owned_rows(value, self.dp_rank))

    def publish(self) -> None:
        """Copy the masters into the parameters (in their dtype) on every dp rank: after a
        step and after the masters were loaded."""
        def fill(region, rows: torch.Tensor) -> None:
            rows.copy_(self._pieces[region.param].local)

        with torch.no_grad():
            self.buffers.gather(fill)

    # -- the step ------------------------------------------------------------------------------
    def reduce_gradients(self) -> None:
        self.buffers.reduce()

    def shard_grad(self, param: torch.Tensor) -> torch.Tensor:
        """This rank's rows of ``param``'s reduced gradient (a view)."""
        return self.buffers.shard_grad(param)

    def grad_of(self, param: torch.Tensor):
        """``param``'s reduced gradient as a dp-sharded DTensor (norms per layer)."""
        return self._pieces[param].master.grad

    def clip_grad_norm(self, max_norm: float, leave_out=()) -> torch.Tensor:
        """The whole model's gradient norm from every rank's owned rows (summed over the
        world: dp and tp shards, pipeline stages; ``leave_out``: parameters counted elsewhere,
        the tied copy), then every owned row scaled as ``clip_grads_with_norm_`` does."""
        skip = {id(p) for p in leave_out}
        grads, weights = [], []
        for param, piece in self._pieces.items():
            if id(param) not in skip and piece.grad_local.numel():
                grads.append(piece.grad_local)
                weights.append(1.0 / piece.replicas)
        device = next(iter(self._pieces.values())).grad_local.device
        square = torch.zeros((), dtype=torch.float32, device=device)
        if grads:
            norms = torch._foreach_norm(grads, 2.0)
            square = square + sum(w * n.float() ** 2 for w, n in zip(weights, norms, strict=True))
        if dist.is_initialized():
            dist.all_reduce(square, op=dist.ReduceOp.SUM)
        total = square.sqrt()
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        every = [piece.grad_local for piece in self._pieces.values() if piece.grad_local.numel()]
        if every:
            torch._foreach_mul_(every, coef)
        return total

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        self._push_hyperparameters()
        self.inner.step()
        self.publish()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.buffers.zero()
        for param in self._pieces:
            param.grad = None  # DCP's state initialization sets zeros here

    def __repr__(self) -> str:
        return f"DistributedOptimizer(dp={self.dp}, {self.inner!r})"

