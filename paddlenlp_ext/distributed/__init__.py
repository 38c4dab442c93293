"""Distributed training: layout (``ParallelDims``), TP + FSDP2 application, data-parallel helpers.

Usage from a trainer::

    dims = init_distributed(training_args)              # world 1 without torchrun: mesh None, all no-ops
    model = parallelize_model(model, dims, training_args)  # TP plan, compile (to_static), FSDP2 per layer + root
    rows = dp_slice(global_batch_rows, dims)            # this rank's slice; TP ranks read the same slice
    with loss_parallel_context(dims):                   # forward + loss + backward
        ...
        count = all_reduce_sum_dp(local_token_count, dims)

See docs/distributed.md.
"""

from .parallel_dims import ParallelDims, init_distributed, parse_sharding
from .parallelize import (apply_compile, apply_fsdp, apply_tp, hidden_states_and_head, llama_tp_plan, loss_parallel_context,
                          parallelize_model)
from .utils import all_reduce_sum_dp, clip_grad_norm_, dp_rank, dp_slice, dp_world_size, to_local_loss

__all__ = [
    "ParallelDims", "init_distributed", "parse_sharding",
    "apply_compile", "apply_fsdp", "apply_tp", "hidden_states_and_head", "llama_tp_plan", "loss_parallel_context", "parallelize_model",
    "all_reduce_sum_dp", "clip_grad_norm_", "dp_rank", "dp_slice", "dp_world_size", "to_local_loss",
]
