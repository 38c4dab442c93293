"""Small helpers of the training loop: seeding, data-parallel view of ``ParallelDims``, resumable data order.

Source: ``paddlenlp/trainer/trainer_utils.py`` (``set_seed``, ``TrainOutput``) and
``paddlenlp/trainer/utils/helper.py`` / ``torch.utils.data.DistributedSampler`` (padding and slicing per
data-parallel rank; PaddleNLP's ``DistributedBatchSampler`` does the same).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, Sampler


def set_seed(seed: int) -> None:
    """Seed python, numpy and torch (CPU and all CUDA devices)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


@dataclass
class DataParallelView:
    """What the trainer needs from ``paddlenlp_ext.distributed.ParallelDims``.

    ``rank``/``size``: this rank's slice among the ``dp x sharding`` data slices (TP ranks share one slice).
    ``group``: process group for token-count / loss all-reduces (None when ``size == 1``).
    ``is_main``: global rank 0 (logs, writes TensorBoard and the final model).
    """

    rank: int = 0
    size: int = 1
    group: Any = None
    is_main: bool = True

    @classmethod
    def from_parallel_dims(cls, parallel_dims: Any) -> "DataParallelView":
        """Build from a ``ParallelDims`` (or None: single process)."""
        is_main = not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
        if parallel_dims is None or getattr(parallel_dims, "mesh", None) is None:
            return cls(is_main=is_main)
        size = int(parallel_dims.batch_world_size)
        group = parallel_dims.batch_mesh["batch"].get_group() if size > 1 else None
        return cls(rank=int(parallel_dims.batch_rank), size=size, group=group, is_main=is_main)

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """In-place SUM over the data-parallel group (no-op for one slice); returns ``t``."""
        if self.size > 1:
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        return t


class ResumableSampler(Sampler[int]):
    """Per-epoch permutation (or order) of ``range(n)``, sliced for one data-parallel rank, with a skip.

    Epoch ``e`` uses ``torch.randperm(n, generator=seed + e)`` when ``shuffle``, independent of the global RNG,
    so a resumed run sees the same order. Like ``DistributedSampler``, the list is padded by wrapping around
    (or truncated when ``drop_last``) to a multiple of ``num_replicas`` and rank ``r`` takes ``[r::num_replicas]``;
    ``pad=False`` leaves the list as it is (ranks may then get one item fewer: evaluation).
    ``skip`` drops the first ``skip`` indices of this rank's slice (already consumed before a resume).
    """

    def __init__(self, n: int, num_replicas: int = 1, rank: int = 0, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, epoch: int = 0, skip: int = 0, pad: bool = True):
        if n <= 0:
            raise ValueError("the dataset is empty: no example survived tokenisation / packing "
                             "(check dataset_name_or_path, max_length and src_length)")
        self.n, self.num_replicas, self.rank = n, num_replicas, rank
        self.shuffle, self.seed, self.drop_last, self.epoch, self.skip = shuffle, seed, drop_last, epoch, skip
        self.pad = pad

    def _indices(self) -> list[int]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.n, generator=g).tolist()
        else:
            order = list(range(self.n))
        if self.drop_last:
            order = order[: len(order) - len(order) % self.num_replicas]
        elif self.pad and len(order) % self.num_replicas:
            pad = self.num_replicas - len(order) % self.num_replicas
            order += (order * (pad // len(order) + 1))[:pad]
        return order[self.rank :: self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        return iter(self._indices()[self.skip :])

    def __len__(self) -> int:
        return max(len(self._indices()) - self.skip, 0)


class ShardedIterable(IterableDataset):
    """One data-parallel rank's view of an iterable dataset, with a skip (PaddleNLP ``IterableDatasetShard``).

    Items are read in global batches of ``batch_size * num_replicas``; rank ``r`` keeps items
    ``[r*batch_size, (r+1)*batch_size)`` of each; an incomplete last global batch is dropped when
    ``num_replicas > 1`` so every rank runs the same number of steps. ``skip_items`` items of this rank's
    stream are dropped first (resume). Calls ``dataset.set_epoch(epoch)`` when the dataset has it.
    """

    def __init__(self, dataset, batch_size: int, num_replicas: int = 1, rank: int = 0, epoch: int = 0,
                 skip_items: int = 0):
        self.dataset, self.batch_size, self.num_replicas, self.rank = dataset, batch_size, num_replicas, rank
        self.epoch, self.skip_items = epoch, skip_items

    def _mine(self) -> Iterator[Any]:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(self.epoch)
        it = iter(self.dataset)
        if self.num_replicas == 1:
            yield from it
            return
        global_bs = self.batch_size * self.num_replicas
        while True:
            chunk = list(itertools.islice(it, global_bs))
            if len(chunk) < global_bs:
                return
            yield from chunk[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(self._mine(), self.skip_items, None)
