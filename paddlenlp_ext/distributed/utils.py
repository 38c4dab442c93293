"""Helpers the trainer and the sampler use: data-parallel rank/size and the token-count all-reduce.

"Data parallel" here is the flattened ``dp x sharding`` axis (PaddleNLP's ``dataset_world_size`` and
``dataset_rank``, paddlenlp/trainer/training_args.py): ranks on it read different slices of each global batch;
ranks that differ only in TP read the same slice. Every function is a no-op without a mesh (world size 1).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .parallel_dims import ParallelDims


def dp_world_size(parallel_dims: ParallelDims | None) -> int:
    """Number of data slices per global batch (``dp x sharding``); 1 without a mesh."""
    return 1 if parallel_dims is None else parallel_dims.batch_world_size


def dp_rank(parallel_dims: ParallelDims | None) -> int:
    """This rank's data slice in ``[0, dp_world_size)``; 0 without a mesh. Equal on all TP ranks."""
    return 0 if parallel_dims is None else parallel_dims.batch_rank


def dp_slice(num_rows: int, parallel_dims: ParallelDims | None) -> slice:
    """Rows of a global batch of ``num_rows`` that this rank reads (contiguous block, like Paddle's
    ``IterableDatasetShard`` / ``DistributedBatchSampler``).

    Raises:
        ValueError: ``num_rows`` is not divisible by the data-parallel world size.
    """
    world, rank = dp_world_size(parallel_dims), dp_rank(parallel_dims)
    if num_rows % world:
        raise ValueError(f"global batch of {num_rows} rows does not split over data-parallel world size {world} "
                         f"(dp x sharding); make per_device_train_batch_size x {world} the global batch")
    per = num_rows // world
    return slice(rank * per, (rank + 1) * per)


def all_reduce_sum_dp(value: torch.Tensor, parallel_dims: ParallelDims | None) -> torch.Tensor:
    """Sum ``value`` over the data-parallel ranks (``dp x sharding``), never over TP ranks.

    Args:
        value: any tensor (a token count int64 scalar, a detached loss sum fp32 scalar); on CPU for gloo,
            on the current CUDA device for NCCL.

    Returns:
        A new tensor holding the sum (``value`` itself is not modified). Without a mesh, a clone.
    """
    out = value.detach().clone()
    if parallel_dims is None or parallel_dims.batch_mesh is None or parallel_dims.batch_world_size == 1:
        return out
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=parallel_dims.batch_mesh.get_group("batch"))
    return out


def to_local_loss(loss: torch.Tensor) -> torch.Tensor:
    """Plain tensor of a (possibly ``DTensor``) scalar loss, keeping autograd.

    Under ``loss_parallel`` the cross entropy is a replicated ``DTensor``; dividing it by a plain count or
    adding it to plain tensors needs a local tensor. ``to_local()`` of a ``Replicate`` DTensor is the full
    value on every TP rank and its backward is exact.
    """
    from torch.distributed.tensor import DTensor

    return loss.to_local() if isinstance(loss, DTensor) else loss


@torch.no_grad()
def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for a mix of plain tensors and DTensors on different meshes.

    Under TP (plain norm weights next to ``DTensor`` projections) or FSDP x TP (1D ``sharding`` and 2D
    ``(sharding, tp)`` meshes) the stock function fails ("mixed torch.Tensor and DTensor" / "must have the
    same mesh"). Here gradients are grouped by (mesh, placements); each group's local ``sum |g|^p`` is summed
    over the mesh axes it is sharded on (replicated axes are not summed), then the groups are added.

    Args:
        parameters: iterable of parameters (those without ``.grad`` are skipped).
        max_norm: clip threshold; gradients are scaled by ``min(1, max_norm / (total + 1e-6))``.
        norm_type: p of the p-norm (finite; ``inf`` is not supported here).

    Returns:
        The total norm before clipping, fp32 scalar plain tensor, equal on every rank.

    Raises:
        ValueError: ``norm_type`` is infinite.
    """
    from torch.distributed.tensor import DTensor, Partial, Replicate

    if norm_type == float("inf"):
        raise ValueError("clip_grad_norm_: norm_type=inf is not supported for sharded gradients; use 2.0")
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros(())
    groups: dict[tuple, list[torch.Tensor]] = {}
    for g in grads:
        key = (g.device_mesh, tuple(g.placements)) if isinstance(g, DTensor) else (None, ())
        groups.setdefault(key, []).append(g)
    total = None
    for (mesh, placements), gs in groups.items():
        local = [g.to_local() if isinstance(g, DTensor) else g for g in gs]
        part = torch.stack([t.detach().float().norm(norm_type) for t in local]).pow(norm_type).sum()
        if mesh is not None and not all(p.is_replicate() for p in placements):
            # Partial on sharded axes sums the shards' contributions; replicated axes hold equal copies.
            # (Test is_replicate, not isinstance Shard: FSDP x TP uses _StridedShard, not a Shard subclass.)
            pl = [Replicate() if p.is_replicate() else Partial() for p in placements]
            part = DTensor.from_local(part, mesh, pl).full_tensor()
        total = part if total is None else total + part.to(total.device)
    total = total.pow(1.0 / norm_type)
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.to(g.device) if not isinstance(g, DTensor) else float(coef))
    return total
