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
