"""Tensor parallelism computed on local tensors (Megatron-LM's layout), with parameters kept as DTensors.

Why: with torch's ``ColwiseParallel`` / ``RowwiseParallel`` / ``SequenceParallel`` every projection, norm and
residual op of every layer runs as a ``DTensor`` op (Python dispatch + sharding propagation + redistribute
bookkeeping, ~200 DTensor ops per layer per micro-batch measured on gloo), and each column-parallel projection
all-reduces its own input gradient (q, k, v, gate, up: 5 all-reduces of ``[B, L, E]`` per layer in backward instead
of 2). On 2 x H200 (1B model) that plan runs TP 2 at 0.51 x one GPU: the step is host-bound.

Here parameters are placed exactly as in the DTensor plan (same ``Shard`` placements, same rank-major permutation of
fused ERNIE projections, so state dicts, DCP, exports, clipping and FSDP2 are unchanged), but each module's forward
swaps its DTensor parameters for their local shards (``DTensor.to_local``, differentiable) and the communication is
done by four autograd functions once per block (Megatron's f / g and their sequence-parallel forms):

========================  =======================================  =======================================
function                  forward                                  backward
========================  =======================================  =======================================
``copy_to_tp`` (f)        identity                                 all-reduce
``reduce_from_tp`` (g)    all-reduce (fp32 if ``fp32``)             identity
``gather_seq`` (SP f)     all-gather on the sequence dim           reduce-scatter
``reduce_scatter_seq``    reduce-scatter on the sequence dim       all-gather
========================  =======================================  =======================================

Per decoder layer and micro-batch: without SP, forward 2 all-reduces (o, down; ERNIE fused layer: 1), backward 2
(attention and MLP block inputs); with SP, forward 2 all-gathers + 2 reduce-scatters, backward the same, plus one
small all-reduce per norm weight (norm weights see only their sequence shard).

Used by ``parallelize.apply_tp`` when the model has no LoRA layers (``ParallelDims.tp_impl`` "auto"/"local");
LoRA keeps the DTensor plan. Source: Megatron-LM ``megatron/core/tensor_parallel/mappings.py``,
``layers.py`` (``VocabParallelEmbedding``, ``ColumnParallelLinear``, ``RowParallelLinear``); PaddleNLP
``paddle.distributed.fleet.layers.mpu`` (the same f/g operators).
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


# ---------------------------------------------------------------------------------------------- collectives
def _is_gloo(group) -> bool:
    return dist.get_backend(group) == "gloo"


def _all_reduce(x: torch.Tensor, group, fp32: bool = False) -> torch.Tensor:
    """Sum over the TP group; bf16/fp16 summed in fp32 when ``fp32`` (kept fp32 under autocast)."""
    dtype = x.dtype
    low = fp32 and dtype in (torch.bfloat16, torch.float16)
    y = x.float() if low else x.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(y, group=group)
    return y.to(dtype) if low and not torch.is_autocast_enabled(y.device.type) else y


def _all_gather(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    world = dist.get_world_size(group)
    x0 = x.movedim(dim, 0).contiguous()  # [n, ...]
    if _is_gloo(group):
        parts = [torch.empty_like(x0) for _ in range(world)]
        dist.all_gather(parts, x0, group=group)
        out = torch.cat(parts, 0)
    else:
        out = x0.new_empty((world * x0.shape[0],) + tuple(x0.shape[1:]))
        dist.all_gather_into_tensor(out, x0, group=group)
    return out.movedim(0, dim)


def _reduce_scatter(x: torch.Tensor, group, dim: int, fp32: bool = False) -> torch.Tensor:
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    dtype = x.dtype
    low = fp32 and dtype in (torch.bfloat16, torch.float16)
    x0 = (x.float() if low else x).movedim(dim, 0).contiguous()  # [world * n, ...]
    if x0.shape[0] % world:
        raise ValueError(f"reduce-scatter over {world} TP ranks: dimension {dim} of {list(x.shape)} is not divisible")
    if _is_gloo(group):  # gloo has no reduce_scatter_tensor
        dist.all_reduce(x0, group=group)
        out = x0.chunk(world, 0)[rank].clone()
    else:
        out = x0.new_empty((x0.shape[0] // world,) + tuple(x0.shape[1:]))
        dist.reduce_scatter_tensor(out, x0, group=group)
    out = out.movedim(0, dim)
    return out.to(dtype) if low and not torch.is_autocast_enabled(out.device.type) else out


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return _all_reduce(g, ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, fp32):
        return _all_reduce(x, group, fp32)

    @staticmethod
    def backward(ctx, g):
        return g, None, None


class _GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        return _all_gather(x, group, dim)

    @staticmethod
    def backward(ctx, g):
        return _reduce_scatter(g, ctx.group, ctx.dim), None, None


class _ReduceScatterSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, dim, fp32):
        ctx.group, ctx.dim = group, dim
        return _reduce_scatter(x, group, dim, fp32)

    @staticmethod
    def backward(ctx, g):
        return _all_gather(g, ctx.group, ctx.dim), None, None, None


class _GatherSeqReplicatedGrad(torch.autograd.Function):
    """All-gather on the sequence dim whose consumers give every rank the same whole gradient (the vocab-parallel
    head all-reduces its input gradient; DPO / reward heads run replicated): backward keeps this rank's slice."""

    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim, ctx.n = group, dim, x.shape[dim]
        return _all_gather(x, group, dim)

    @staticmethod
    def backward(ctx, g):
        r = dist.get_rank(ctx.group)
        return g.narrow(ctx.dim, r * ctx.n, ctx.n).contiguous(), None, None


class _GatherLastDim(torch.autograd.Function):
    """All-gather on the last dim (vocab-parallel logits made whole); backward keeps this rank's slice (the loss
    is computed identically on every TP rank, so its gradient is replicated)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group, ctx.n = group, x.shape[-1]
        return _all_gather(x, group, x.dim() - 1)

    @staticmethod
    def backward(ctx, g):
        r = dist.get_rank(ctx.group)
        return g[..., r * ctx.n:(r + 1) * ctx.n].contiguous(), None


def copy_to_tp(x, group):
    """f: identity forward, all-reduce of the gradient."""
    return _CopyToTP.apply(x, group)


def reduce_from_tp(x, group, fp32=False):
    """g: all-reduce forward, identity backward."""
    return _ReduceFromTP.apply(x, group, fp32)


def gather_seq(x, group, dim=1):
    """SP f: ``[B, L/tp, ...] -> [B, L, ...]``; backward reduce-scatters."""
    return _GatherSeq.apply(x, group, dim)


def reduce_scatter_seq(x, group, dim=1, fp32=False):
    """SP g: partial ``[B, L, ...]`` -> summed ``[B, L/tp, ...]``; backward all-gathers."""
    return _ReduceScatterSeq.apply(x, group, dim, fp32)


# ---------------------------------------------------------------------------------------------- module wrappers
def _local(p: torch.Tensor | None, group=None, reduce_grad: bool = False):
    from torch.distributed.tensor import DTensor

    if p is None:
        return None
    t = p.to_local() if isinstance(p, DTensor) else p
    return copy_to_tp(t, group) if reduce_grad else t


def localize(module: nn.Module, group=None, reduce_grads: bool = False) -> None:
    """Run ``module``'s own forward with its DTensor parameters swapped for their local tensors.

    ``reduce_grads``: the parameters' gradients are partial on each TP rank (the module saw only its sequence
    shard: norms under SP); they are all-reduced in backward. Otherwise each rank's gradient is already whole
    (replicated parameters on replicated inputs) or is its own shard's.
    """
    orig = module.forward

    def forward(*args, **kwargs):
        saved = {}
        for name, p in list(module._parameters.items()):
            if p is not None and hasattr(p, "to_local"):
                saved[name] = p
                module._parameters[name] = _local(p, group, reduce_grads)
        try:
            return orig(*args, **kwargs)
        finally:
            module._parameters.update(saved)

    # Eager even inside a compiled layer (to_static): dynamo lifts parameters as graph inputs, so the swap above is
    # invisible to a traced forward (it crashed: "mixed torch.Tensor and DTensor"); a graph break per norm instead.
    module.forward = torch._dynamo.disable(forward)


def _rowwise_forward(module: nn.Linear, group, sp: bool, fp32: bool):
    """``[B, L, in/tp] -> [B, L(/tp), out]``: local matmul, reduce (g or SP g), then the replicated bias."""

    def forward(x):
        y = F.linear(x, _local(module.weight))
        y = reduce_scatter_seq(y, group, 1, fp32) if sp else reduce_from_tp(y, group, fp32)
        if module.bias is not None:
            y = y + _local(module.bias, group, reduce_grad=sp)
        return y

    module.forward = forward


def _block_input_hook(group, sp: bool):
    """Pre-hook of an attention / MLP block: its hidden-state input (first positional argument) made whole (SP) or
    marked for one gradient all-reduce (f), shared by all column-parallel projections inside."""

    def hook(_mod, args, kwargs):
        if not args and "hidden_states" in kwargs:  # transformers' layers call their blocks with keywords
            x = kwargs["hidden_states"]
            kwargs = dict(kwargs, hidden_states=gather_seq(x, group) if sp else copy_to_tp(x, group))
            return args, kwargs
        x = gather_seq(args[0], group) if sp else copy_to_tp(args[0], group)
        return (x,) + tuple(args[1:]), kwargs

    return hook


def _vocab_embedding_forward(module: nn.Embedding, group, rank: int, sp: bool):
    """Vocab-parallel lookup: rows ``[rank * V/tp, (rank + 1) * V/tp)`` here, other ids give 0, then summed."""
    if module.max_norm is not None:
        raise ValueError("vocab-parallel embedding: nn.Embedding(max_norm=...) is not supported under TP")

    def forward(ids):
        w = _local(module.weight)  # [V/tp, E]
        lo = rank * w.shape[0]
        outside = (ids < lo) | (ids >= lo + w.shape[0])
        pad = module.padding_idx
        pad = pad - lo if pad is not None and lo <= pad < lo + w.shape[0] else None
        out = F.embedding((ids - lo).masked_fill(outside, 0), w, pad)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)  # [B, L, E] partial
        return reduce_scatter_seq(out, group) if sp else reduce_from_tp(out, group)

    module.forward = forward


def _vocab_head_forward(module: nn.Linear, mesh, group, loss_parallel: bool):
    """Column-parallel LM head on whole hidden states: ``[B, L, E] -> [B, L, V/tp]`` as a ``Shard(-1)`` DTensor
    (vocab-parallel cross entropy) or all-gathered to ``[B, L, V]``."""
    from torch.distributed.tensor import DTensor, Shard

    def forward(x):
        y = F.linear(copy_to_tp(x, group), _local(module.weight), _local(module.bias))
        if loss_parallel:
            return DTensor.from_local(y, mesh, [Shard(-1)], run_check=False)
        return _GatherLastDim.apply(y, group)

    module.forward = forward


def _gather_output_hook(group):
    def hook(_mod, _args, out):
        return _GatherSeqReplicatedGrad.apply(out, group, 1)  # [B, L/tp, E] -> [B, L, E]

    return hook


_COL = re.compile(r"layers\.\d+\.(self_attn\.[qkv]_proj|mlp\.(gate|up)_proj)$")
_ROW = re.compile(r"layers\.\d+\.(self_attn\.o_proj|mlp\.down_proj)$")
_BLOCK = re.compile(r"layers\.\d+\.(self_attn|mlp|self_attn_mlp)$")
_NORM = re.compile(r"(layers\.\d+\.(input_layernorm|post_attention_layernorm)|^model\.norm)$")


def local_plan(model: nn.Module, config: Any, *, sp: bool, vocab_split: bool) -> dict[str, tuple[str, tuple | None]]:
    """``{module name: (kind, fused blocks or None)}`` for HF Llama / ERNIE-3.5-SE names (docs/design.md section 4).

    Kinds: ``colwise`` (q/k/v/gate/up; ERNIE ``qkv_gate_up_proj`` with blocks ``(3H, I, I)``), ``rowwise`` (o/down;
    ERNIE fused ``o_proj`` with blocks ``(I, H)``), ``block`` (attention / MLP modules whose first input feeds the
    column-parallel projections), ``embedding`` / ``head`` (vocab-parallel, when ``vocab_size % tp == 0``) and, under
    SP, ``norm``.

    Raises:
        ValueError: no column-parallel projection found (not a Llama / ERNIE module layout).
    """
    h, i = config.hidden_size, config.intermediate_size
    out: dict[str, tuple[str, tuple | None]] = {}
    for name, mod in model.named_modules():
        if _COL.search(name):
            out[name] = ("colwise", None)
        elif _ROW.search(name):
            out[name] = ("rowwise", None)
        elif name.endswith("self_attn_mlp.qkv_gate_up_proj"):
            out[name] = ("colwise", (3 * h, i, i))
        elif name.endswith("self_attn_mlp.o_proj"):
            out[name] = ("rowwise", (i, h))
        elif _BLOCK.search(name):
            out[name] = ("block", None)
        elif sp and _NORM.search(name):
            out[name] = ("norm", None)
        elif vocab_split and name == "model.embed_tokens":
            out[name] = ("embedding", None)
        elif vocab_split and name == "lm_head" and isinstance(mod, nn.Linear):
            out[name] = ("head", None)
    if not any(k == "colwise" for k, _ in out.values()):
        raise ValueError(f"tensor parallelism found no q/k/v/gate/up projections in {type(model).__name__}; it "
                         f"expects HF Llama or ERNIE-3.5-SE module names (docs/design.md section 4)")
    if sp and "model.norm" not in out:
        raise ValueError(f"sequence_parallel: {type(model).__name__} has no final norm 'model.norm' to gather after")
    return out


def apply_local_tp(model: nn.Module, plan: dict[str, tuple[str, tuple | None]], mesh, *, sp: bool,
                   loss_parallel: bool, fp32: bool) -> None:
    """Place parameters per ``plan`` (:func:`local_plan`) and install the local-tensor forwards.

    Placements equal the DTensor plan's (``Shard(0)`` column-parallel weights and biases, ``Shard(1)`` row-parallel
    weights, replicated row-parallel biases, rank-major permuted fused ERNIE weights), so state dicts and FSDP2 see
    the same parameters. Under SP the final norm's output is gathered, so the trunk returns whole hidden states
    (LM head, ``hidden_states_and_head`` and reward heads read them as in one process).
    """
    from torch.distributed.tensor import Replicate, Shard, distribute_module

    from .tp_styles import _shard_permuted, rank_major_index

    group, rank = mesh.get_group(), mesh.get_local_rank()
    modules = dict(model.named_modules())
    for name, (kind, blocks) in plan.items():
        mod = modules[name]
        if kind == "colwise":
            if blocks is not None:
                index = rank_major_index(blocks, mesh.size())
                _shard_permuted(mod, "weight", 0, index, mesh)
                _shard_permuted(mod, "bias", 0, index, mesh)
            else:
                _place(mod, mesh, Shard(0), Shard(0))
            localize(mod)
        elif kind == "rowwise":
            if blocks is not None:
                _shard_permuted(mod, "weight", 1, rank_major_index(blocks, mesh.size()), mesh)
            _place(mod, mesh, Shard(1), Replicate())
            _rowwise_forward(mod, group, sp, fp32)
        elif kind == "embedding":
            _place(mod, mesh, Shard(0), None)
            _vocab_embedding_forward(mod, group, rank, sp)
        elif kind == "head":
            _place(mod, mesh, Shard(0), Shard(0))
            _vocab_head_forward(mod, mesh, group, loss_parallel)
        elif kind == "norm":  # sequence-parallel norm: local shard, partial weight gradients
            distribute_module(mod, mesh, None)
            localize(mod, group, reduce_grads=True)
        elif kind == "block":
            mod.register_forward_pre_hook(_block_input_hook(group, sp), with_kwargs=True)
    if sp:
        modules["model.norm"].register_forward_hook(_gather_output_hook(group))
    # Everything else (norms without SP, replicated embedding / head, a reward model's score): whole inputs on
    # every rank, so replicated local parameters get whole gradients.
    for mod in model.modules():
        if any(p is not None and not hasattr(p, "to_local") for p in mod._parameters.values()):
            distribute_module(mod, mesh, None)
            localize(mod)


def _place(module: nn.Module, mesh, weight_placement, bias_placement) -> None:
    from torch.distributed.tensor import distribute_tensor

    for pname, placement in (("weight", weight_placement), ("bias", bias_placement)):
        p = module._parameters.get(pname)
        if p is not None and placement is not None and not hasattr(p, "to_local"):
            module.register_parameter(pname, nn.Parameter(distribute_tensor(p, mesh, [placement]),
                                                          requires_grad=p.requires_grad))
