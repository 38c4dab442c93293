"""Tensor-parallel ``ParallelStyle`` s beyond torch's stock ones: fp32 row-parallel reductions, fused projections.

1. :class:`Fp32ReduceRowwiseParallel`: ``RowwiseParallel`` whose partial sums are all-reduced (or
   reduce-scattered under sequence parallelism) in fp32 when the local matmul produced bf16/fp16. A bf16
   all-reduce rounds the sum of the ranks' partial products to bf16 once more than one device does (it rounds
   the full product once); upcasting before the collective keeps the sum exact up to fp32. Under autocast the
   result stays fp32 (the residual stream is fp32 there anyway: fp32 parameters); without autocast (FSDP bf16
   parameters) it is cast back to the matmul's dtype, so the next layer sees the dtype it expects.
   Cost: those collectives move twice the bytes (fp32 instead of bf16). Megatron-LM keeps bf16 here; PaddleNLP's
   ``RowParallelLinear`` all-reduces in the activation dtype too.

2. Fused projections whose output (or input) concatenates several blocks that must each be split over TP,
   e.g. ERNIE-3.5-SE's ``qkv_gate_up_proj`` ``[QKV (3H) | G (I) | U (I)]`` and ``o_proj`` input
   ``[FFN (I) | ATTN (H)]``. Rank ``r`` must hold ``[QKV_r | G_r | U_r]``, which no single ``Shard`` placement
   gives. :func:`colwise_style` / :func:`rowwise_style` with ``blocks`` (and ``local_tp``, with the same
   ``_shard_permuted``) permute the weight rows (columns) into rank-major order (:func:`rank_major_index`) and
   then ``Shard(0)`` (``Shard(1)``) the permuted tensor, so the
   local matmul emits ``[QKV_r | G_r | U_r]`` with no communication. The permutation is undone wherever whole
   tensors are read (``paddlenlp_ext.distributed.fused_layout``): model and optimizer state dicts (DCP, exports,
   LoRA adapters) always hold the natural layout, so checkpoints move between TP degrees.

Source: PaddleNLP ``llm/experimental/ernie-3.5-se/modeling.py`` (``Ernie35MLPAttention`` under
``tensor_parallel_degree > 1`` splits ``qkv_gate_up_proj`` per block with ``ColumnParallelLinear`` and its
conversion mappings ``_get_tensor_parallel_mappings`` split each block); torch ``ColwiseParallel`` /
``RowwiseParallel``.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn

from .fused_layout import register_fused_layout


def rank_major_index(blocks: Sequence[int], tp: int) -> torch.Tensor:
    """Index that reorders a dimension made of ``blocks`` so that rank ``r``'s slice of every block is adjacent.

    ``natural.index_select(dim, index)`` is ``[b0_0 | b1_0 | ... | b0_1 | b1_1 | ...]`` where ``bk_r`` is the
    ``r``-th of ``tp`` equal chunks of block ``k``; ``Shard(dim)`` of that tensor gives rank ``r``
    ``[b0_r | b1_r | ...]``.

    Args:
        blocks: sizes of the consecutive blocks along the dimension (e.g. ``[3H, I, I]``).
        tp: tensor-parallel degree.

    Returns:
        int64 ``[sum(blocks)]``.

    Raises:
        ValueError: a block size not divisible by ``tp`` (named with its position).
    """
    bad = [(k, b) for k, b in enumerate(blocks) if b % tp]
    if bad:
        raise ValueError(f"fused projection blocks {list(blocks)}: block {bad[0][0]} of size {bad[0][1]} is not "
                         f"divisible by tensor_parallel_degree={tp}")
    starts = [sum(blocks[:k]) for k in range(len(blocks))]
    parts = [torch.arange(s + r * (b // tp), s + (r + 1) * (b // tp)) for r in range(tp)
             for s, b in zip(starts, blocks)]
    return torch.cat(parts)


def _shard_permuted(module: nn.Module, pname: str, dim: int, index: torch.Tensor, device_mesh) -> None:
    """Replace ``module.<pname>`` by ``Shard(dim)`` of the parameter permuted with ``index`` along ``dim``."""
    from torch.distributed.tensor import Shard, distribute_tensor

    param = getattr(module, pname, None)
    if param is None:
        return
    permuted = param.detach().index_select(dim, index.to(param.device))
    module.register_parameter(pname, nn.Parameter(distribute_tensor(permuted, device_mesh, [Shard(dim)]),
                                                  requires_grad=param.requires_grad))
    register_fused_layout(module, pname, dim, index)


def _fp32_reduce_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
    """``RowwiseParallel._prepare_output_fn`` with the Partial -> Replicate/Shard reduction done in fp32."""
    from torch.distributed.tensor import DTensor

    dtype = outputs.dtype
    low = dtype in (torch.bfloat16, torch.float16)
    if low:  # [*, out] partial sums, exact values of this rank's bf16 product, reduced in fp32
        outputs = DTensor.from_local(outputs.to_local().float(), outputs.device_mesh, outputs.placements,
                                     run_check=False, shape=outputs.shape, stride=outputs.stride())
    if outputs.placements != tuple(output_layouts):
        outputs = outputs.redistribute(placements=output_layouts, async_op=True)
    out = outputs.to_local() if use_local_output else outputs
    if low and not torch.is_autocast_enabled(out.device.type):
        out = out.to(dtype)  # no autocast: downstream matmuls need the parameter dtype
    return out


def rowwise_style(lora: bool, fp32_reduce: bool = True, blocks: Sequence[int] | None = None, **kwargs):
    """A ``RowwiseParallel`` for ``nn.Linear`` (or ``paddlenlp_ext.peft.LoRALinear``).

    Args:
        lora: the module is a ``LoRALinear``: also split ``lora_A [r, in]`` on ``in`` and replicate
            ``lora_B [out, r]`` (PaddleNLP ``RowParallelLoRALinear``); both branches give partial sums that the
            output reduction completes together.
        fp32_reduce: reduce bf16/fp16 partial sums in fp32 (see module docstring).
        blocks: input-column blocks of a fused input (e.g. ERNIE ``o_proj`` ``[I, H]``): the weight columns
            (and ``lora_A`` columns) are permuted rank-major before ``Shard(1)``.
        kwargs: ``input_layouts`` / ``output_layouts`` / ``use_local_output`` of ``RowwiseParallel``.
    """
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import RowwiseParallel

    class Style(RowwiseParallel):
        def _partition_linear_fn(self, name, module, device_mesh):
            if name in ("",) + (("lora_A",) if lora else ()):
                if blocks is not None:
                    _shard_permuted(module, "weight", 1, rank_major_index(blocks, device_mesh.size()), device_mesh)
                elif not lora:
                    return super()._partition_linear_fn(name, module, device_mesh)
                else:
                    from .parallelize import _shard_param

                    _shard_param(module, "weight", device_mesh, Shard(1))  # bias stays replicated

    if fp32_reduce:
        Style._prepare_output_fn = staticmethod(_fp32_reduce_output_fn)
    Style.__name__ = ("Fused" if blocks else "") + ("LoRA" if lora else "") + "RowwiseParallel" + \
        ("Fp32Reduce" if fp32_reduce else "")
    return Style(**kwargs)


def colwise_style(lora: bool, blocks: Sequence[int] | None = None, **kwargs):
    """A ``ColwiseParallel`` for ``nn.Linear`` / ``LoRALinear``.

    Args:
        lora: also split ``lora_B [out, r]`` on ``out`` and replicate ``lora_A`` (PaddleNLP
            ``ColumnParallelLoRALinear``).
        blocks: output-row blocks of a fused output (e.g. ERNIE ``qkv_gate_up_proj`` ``[3H, I, I]``): weight,
            bias and ``lora_B`` rows are permuted rank-major before ``Shard(0)``.
        kwargs: ``input_layouts`` / ``output_layouts`` / ``use_local_output`` of ``ColwiseParallel``.
    """
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel

    if not lora and blocks is None:
        return ColwiseParallel(**kwargs)

    class Style(ColwiseParallel):
        def _partition_linear_fn(self, name, module, device_mesh):
            # Called once per submodule: "" is the base Linear, "lora_B" the up-projection; the rest
            # (lora_A, dropout) is replicated by distribute_module.
            if name in ("", "lora_B"):
                if blocks is not None:
                    index = rank_major_index(blocks, device_mesh.size())
                    _shard_permuted(module, "weight", 0, index, device_mesh)
                    _shard_permuted(module, "bias", 0, index, device_mesh)
                else:
                    from .parallelize import _shard_param

                    _shard_param(module, "weight", device_mesh, Shard(0))
                    _shard_param(module, "bias", device_mesh, Shard(0))

    Style.__name__ = ("Fused" if blocks else "") + ("LoRA" if lora else "") + "ColwiseParallel"
    return Style(**kwargs)
