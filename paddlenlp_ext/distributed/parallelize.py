"""Apply tensor parallelism and FSDP2 to a model from outside the model code, by module name.

Order (torchtitan ``parallelize_llama``): (1) the TP plan with ``parallelize_module``; (2) activation
checkpointing is the model's own ``recompute`` flag, left alone here; (3) with ``to_static``, ``torch.compile``
of each decoder layer (:func:`apply_compile`); (4) ``fully_shard`` on every decoder layer, then on the root (which takes the embedding, the final norm and the LM head, so tied weights share one
FSDP group).

TP plan for Llama (HF module names; PaddleNLP ``LlamaForCausalLM._get_tensor_parallel_mappings``):

=========================================  =====================================  =============================
module                                      style                                  weight placement
=========================================  =====================================  =============================
``model.embed_tokens``                      ``RowwiseParallel`` (vocab-parallel)   ``Shard(0)`` of ``[V, H]``
``model.layers.*.self_attn.{q,k,v}_proj``   ``ColwiseParallel``                    ``Shard(0)`` of ``[out, in]``
``model.layers.*.mlp.{gate,up}_proj``       ``ColwiseParallel``                    ``Shard(0)``
``model.layers.*.self_attn.o_proj``         ``RowwiseParallel``                    ``Shard(1)``
``model.layers.*.mlp.down_proj``            ``RowwiseParallel``                    ``Shard(1)``
``lm_head``                                 ``ColwiseParallel`` (vocab-parallel)   ``Shard(0)`` of ``[V, H]``
norms                                       replicated (``SequenceParallel`` if sequence_parallel)
=========================================  =====================================  =============================

Embedding and LM head are split only when ``vocab_size % tp == 0`` (else replicated, as in Paddle). With
``tensor_parallel_output`` the LM head keeps its output vocab-sharded (a ``DTensor`` with ``Shard(-1)``) and
the loss must run inside :func:`loss_parallel_context`; otherwise logits are all-gathered to full ``[B, L, V]``.

That table is the DTensor implementation (``tp_impl="dtensor"``, used with LoRA). Without LoRA the same
placements are computed on local shards with one collective per block (``local_tp``, Megatron-LM's layout; see
docs/distributed.md for why). ERNIE-3.5-SE's fused ``qkv_gate_up_proj`` / ``o_proj`` are split per block with
rank-major permuted rows / columns (``tp_styles``, ``fused_layout``).

Each TP rank then runs the model with its local heads: the q/k/v projections emit ``[B, L, H_local*D]``,
which the model reshapes with ``-1`` heads (or its local head count) before FlashMask; the
``attn_mask_startend_row_indices`` are replicated (every rank holds the same ``[B, 1, L, 1]``).
"""

from __future__ import annotations

import contextlib
import logging
import re
import types
from typing import Any

import torch
import torch.nn as nn

from .parallel_dims import ParallelDims

logger = logging.getLogger(__name__)

_LAYER_RE = re.compile(r"(^|\.)layers\.\d+$")


def _model_config(model: nn.Module) -> Any:
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError(f"{type(model).__name__} has no `config`; parallelize_model needs num_attention_heads etc.")
    return config


def _decoder_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in model.named_modules() if _LAYER_RE.search(name)]


def _is_tied(model: nn.Module) -> bool:
    head, emb = getattr(model, "lm_head", None), getattr(getattr(model, "model", None), "embed_tokens", None)
    return head is not None and emb is not None and head.weight is emb.weight


def _gather_sequence_style():
    """``ParallelStyle`` that all-gathers a module's first positional input from ``Shard(1)`` to a local full
    tensor, leaving the other inputs (rope cos/sin, FlashMask indices, caches) untouched.

    ``PrepareModuleInput`` needs one layout per positional argument; this works for any call signature.
    """
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.parallel.style import ParallelStyle

    class GatherSequenceInput(ParallelStyle):
        def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
            def hook(_mod, args):
                x = args[0]
                if isinstance(x, DTensor):
                    x = x.redistribute(device_mesh, [Replicate()]).to_local()  # [B, L/tp, E] -> [B, L, E]
                return (x,) + tuple(args[1:])

            module.register_forward_pre_hook(hook)
            return module

    return GatherSequenceInput()


def _is_lora(module: nn.Module) -> bool:
    return hasattr(module, "lora_A") and hasattr(module, "lora_B")


def _shard_param(module: nn.Module, pname: str, device_mesh, placement) -> None:
    from torch.distributed.tensor import distribute_tensor

    param = getattr(module, pname, None)
    if param is not None:
        module.register_parameter(pname, nn.Parameter(distribute_tensor(param, device_mesh, [placement]),
                                                      requires_grad=param.requires_grad))


def _colwise(lora: bool, **kwargs):
    """``ColwiseParallel``; for a ``LoRALinear`` also split ``lora_B`` on ``out`` (see ``tp_styles``)."""
    from .tp_styles import colwise_style

    return colwise_style(lora, **kwargs)


def _rowwise(lora: bool, fp32_reduce: bool = True, **kwargs):
    """``RowwiseParallel``, reducing bf16 partial sums in fp32 when ``fp32_reduce``; for a ``LoRALinear`` also split
    ``lora_A`` on ``in`` (see ``tp_styles``)."""
    from .tp_styles import rowwise_style

    return rowwise_style(lora, fp32_reduce=fp32_reduce, **kwargs)


def llama_tp_plan(model: nn.Module, parallel_dims: ParallelDims) -> dict[str, Any]:
    """The ``parallelize_module`` plan for a Llama-named model (module FQN -> ``ParallelStyle``).

    With ``sequence_parallel`` the residual stream between blocks is ``Shard(1)`` (sequence-sharded), the
    norms run ``SequenceParallel`` and the attention / MLP hidden-state inputs are all-gathered by a pre-hook.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import RowwiseParallel, SequenceParallel

    config = _model_config(model)
    sp = parallel_dims.sequence_parallel
    vocab_split = config.vocab_size % parallel_dims.tp == 0
    loss_par = parallel_dims.tensor_parallel_output and vocab_split
    residual = Shard(1) if sp else Replicate()

    plan: dict[str, Any] = {}
    has_head = isinstance(getattr(model, "lm_head", None), nn.Linear)  # a reward model has `score` instead
    if vocab_split:
        plan["model.embed_tokens"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=residual)
        if has_head:
            # a LoRA-wrapped head (lora_target_modules naming lm_head) needs the LoRA style: the stock one walks
            # its submodules' parameters by dotted name and fails ("parameter name can't contain '.'")
            plan["lm_head"] = _colwise(_is_lora(model.lm_head), input_layouts=residual,
                                       output_layouts=Shard(-1) if loss_par else Replicate(),
                                       use_local_output=not loss_par)
    elif sp:
        raise ValueError(f"sequence_parallel needs vocab_size ({config.vocab_size}) divisible by "
                         f"tensor_parallel_degree ({parallel_dims.tp})")
    if sp:
        plan["model.norm"] = SequenceParallel()
    # LoRA wraps the projections in place (same names); the styles then also place the adapters.
    lora = any(_is_lora(m) for m in model.modules())
    fp32 = _fp32_reduce(parallel_dims)
    if any(n.endswith("qkv_gate_up_proj") for n, _ in model.named_modules()):
        plan.update(_ernie_layer_plan(model, config, lora, fp32, residual, sp))
        return plan
    layer = "model.layers.*."
    for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
        plan[layer + name] = _colwise(lora)
    plan[layer + "self_attn.o_proj"] = _rowwise(lora, fp32, output_layouts=residual)
    plan[layer + "mlp.down_proj"] = _rowwise(lora, fp32, output_layouts=residual)
    if sp:
        plan[layer + "input_layernorm"] = SequenceParallel()
        plan[layer + "post_attention_layernorm"] = SequenceParallel()
        # Only the hidden states (first positional input) are gathered; rope / mask inputs are replicated.
        plan[layer + "self_attn"] = _gather_sequence_style()
        plan[layer + "mlp"] = _gather_sequence_style()
    return plan


_ERNIE_COL = re.compile(r"layers\.\d+\.(self_attn\.[qkv]_proj|mlp\.(gate|up)_proj)$")
_ERNIE_ROW = re.compile(r"layers\.\d+\.(self_attn\.o_proj|mlp\.down_proj)$")
_ERNIE_NORM = re.compile(r"layers\.\d+\.(input_layernorm|post_attention_layernorm)$")
_ERNIE_BLOCK = re.compile(r"layers\.\d+\.(self_attn|mlp|self_attn_mlp)$")


def _ernie_layer_plan(model: nn.Module, config: Any, lora: bool, fp32: bool, residual, sp: bool) -> dict[str, Any]:
    """Per-module TP entries of ERNIE-3.5-SE's decoder layers (explicit names: layers differ in structure).

    Head layer ``self_attn.{q,k,v,o}_proj`` and tail layer ``mlp.{gate,up,down}_proj`` as Llama's. Fused layers:
    ``self_attn_mlp.qkv_gate_up_proj`` (rows ``[QKV 3H | G I | U I]``, QKV head-interleaved) column-parallel with
    its rows permuted so rank r holds ``[QKV_r | G_r | U_r]`` (whole heads ``r*n/tp ...``, FFN columns
    ``r*I/tp ...``); ``self_attn_mlp.o_proj`` (input ``[FFN I | ATTN H]``) row-parallel with its columns permuted
    to ``[FFN_r | ATTN_r]`` (PaddleNLP splits the same blocks).
    """
    from torch.distributed.tensor.parallel import SequenceParallel

    h, i = config.hidden_size, config.intermediate_size
    plan: dict[str, Any] = {}
    for name, _ in model.named_modules():
        if _ERNIE_COL.search(name):
            plan[name] = _colwise(lora)
        elif _ERNIE_ROW.search(name):
            plan[name] = _rowwise(lora, fp32, output_layouts=residual)
        elif name.endswith("self_attn_mlp.qkv_gate_up_proj"):
            plan[name] = _colwise(lora, blocks=(3 * h, i, i))
        elif name.endswith("self_attn_mlp.o_proj"):
            plan[name] = _rowwise(lora, fp32, blocks=(i, h), output_layouts=residual)
        elif sp and _ERNIE_NORM.search(name):
            plan[name] = SequenceParallel()
        elif sp and _ERNIE_BLOCK.search(name):
            plan[name] = _gather_sequence_style()
    return plan


def apply_tp(model: nn.Module, parallel_dims: ParallelDims) -> None:
    """Tensor parallelism on ``parallel_dims.tp_mesh()``: local compute (``local_tp``) or :func:`llama_tp_plan`
    with ``parallelize_module`` (``parallel_dims.tp_impl``); re-tie ``lm_head.weight`` if it was tied.

    Raises:
        ValueError: the model does not have the Llama / ERNIE module names the plan expects; ``tp_impl`` unknown,
            or "local" with LoRA layers.
    """
    from torch.distributed.tensor.parallel import parallelize_module

    names = {n for n, _ in model.named_modules()}
    tied = _is_tied(model)
    if _use_local_tp(model, parallel_dims):
        _apply_local(model, parallel_dims)
    else:
        plan = llama_tp_plan(model, parallel_dims)
        for fqn in plan:
            pattern = re.compile("^" + re.escape(fqn).replace(r"\*", r"\d+") + "$")
            if not any(pattern.match(n) for n in names):
                raise ValueError(f"TP plan entry {fqn!r} matches no module of {type(model).__name__}; "
                                 f"tensor parallelism expects HF Llama module names (docs/design.md section 4)")
        parallelize_module(model, parallel_dims.tp_mesh(), plan)
        _replicate_rest(model, parallel_dims.tp_mesh())
    if parallel_dims.sequence_parallel:
        model.register_forward_pre_hook(_check_sequence_divisible(parallel_dims.tp), with_kwargs=True)
    if tied:
        # Embedding (RowwiseParallel) and LM head (ColwiseParallel) both place [V, H] as Shard(0): one DTensor.
        model.lm_head.weight = model.model.embed_tokens.weight


def _use_local_tp(model: nn.Module, parallel_dims: ParallelDims) -> bool:
    """``tp_impl``: "local" (Megatron-style local compute, ``local_tp``), "dtensor" (torch's styles) or "auto"
    (local unless the model has LoRA layers, whose adapters only the DTensor styles place)."""
    impl = getattr(parallel_dims, "tp_impl", "auto")
    lora = any(_is_lora(m) for m in model.modules())
    if impl not in ("auto", "local", "dtensor"):
        raise ValueError(f"ParallelDims.tp_impl={impl!r}: expected 'auto', 'local' or 'dtensor'")
    if impl == "local" and lora:
        raise ValueError("ParallelDims.tp_impl='local' does not place LoRA adapters; use 'auto' or 'dtensor'")
    return impl == "local" or (impl == "auto" and not lora)


def _apply_local(model: nn.Module, parallel_dims: ParallelDims) -> None:
    from .local_tp import apply_local_tp, local_plan

    config = _model_config(model)
    sp = parallel_dims.sequence_parallel
    vocab_split = config.vocab_size % parallel_dims.tp == 0
    if sp and not vocab_split:
        raise ValueError(f"sequence_parallel needs vocab_size ({config.vocab_size}) divisible by "
                         f"tensor_parallel_degree ({parallel_dims.tp})")
    fp32 = _fp32_reduce(parallel_dims)
    plan = local_plan(model, config, sp=sp, vocab_split=vocab_split)
    apply_local_tp(model, plan, parallel_dims.tp_mesh(), sp=sp, fp32=fp32,
                   loss_parallel=parallel_dims.tensor_parallel_output and vocab_split)


def _fp32_reduce(parallel_dims) -> bool:
    """Whether the row-parallel partial sums are reduced in fp32: ``tp_fp32_reduce``, default (None) on for every
    TP degree. Measured on 2 H200s (TP 2 + SP, 1B Llama, 4 x 8K packs, 5 AdamW steps; docs/distributed_gpu_results.md):
    the largest relative loss difference from one GPU is 2.1e-5 with bf16 sums and 1.5e-5 with fp32
    ones (4e-7 at the last step), at the same tokens/s within the run-to-run spread."""
    fp32 = getattr(parallel_dims, "tp_fp32_reduce", None)
    return parallel_dims.tp > 1 if fp32 is None else bool(fp32)


def _replicate_rest(model: nn.Module, tp_mesh) -> None:
    """Turn every parameter the plan left alone (norm weights; a replicated embedding / head) into a
    ``Replicate()`` ``DTensor`` on the TP mesh, with inputs wrapped and outputs unwrapped around its module.

    Then all parameters are DTensors on one mesh (``tp``, or ``(sharding, tp)`` after FSDP), so stock utilities
    that stack per-parameter results (``torch.nn.utils.clip_grad_norm_``, foreach optimizers) work. Each TP
    rank computes the same full gradient for these parameters (their inputs are replicated), so no reduction
    is needed.
    """
    from torch.distributed.tensor import DTensor, Replicate, distribute_module

    def wrap_inputs(_mod, inputs, mesh):
        return tuple(DTensor.from_local(x, mesh, [Replicate()], run_check=False)
                     if isinstance(x, torch.Tensor) and not isinstance(x, DTensor) else x for x in inputs)

    def unwrap_output(_mod, out, mesh):
        return out.to_local() if isinstance(out, DTensor) else out

    for module in list(model.modules()):
        if any(p is not None and not isinstance(p, DTensor) for p in module._parameters.values()):
            # partition_fn=None replicates this module's params and buffers (children already placed are kept).
            distribute_module(module, tp_mesh, None, wrap_inputs, unwrap_output)


def _check_sequence_divisible(tp: int):
    def hook(_mod, args, kwargs):
        ids = args[0] if args else kwargs.get("input_ids")
        if isinstance(ids, torch.Tensor) and ids.dim() == 2 and ids.shape[1] % tp:
            # unpacked batches are padded to their longest row, so this can strike at any step, not the first
            raise ValueError(f"sequence_parallel: sequence length {ids.shape[1]} (input_ids {list(ids.shape)}) is not "
                             f"divisible by tensor_parallel_degree={tp}; pad every batch to max_length (a multiple of "
                             f"{tp}), as PaddleNLP does under sequence_parallel: zero_padding: true (packs) or "
                             f"pad_to_max_length: true, else pad_to_multiple_of: {tp}")
    return hook


def _reshard_when_no_grad(module: nn.Module, _args, output):
    """Post-forward hook of the root: after a forward without autograd (evaluation, a frozen DPO reference model)
    no backward will reshard the groups kept gathered by ``reshard_after_forward=False``; reshard all of them
    now. Besides memory, this keeps FSDP's at-rest invariant: ``model.parameters()`` are the sharded DTensors,
    so an optimizer built after an evaluation holds the real parameters (measured: built while gathered,
    those groups silently never train)."""
    if not torch.is_grad_enabled():
        for m in module.modules():
            if hasattr(m, "reshard") and hasattr(m, "unshard"):
                m.reshard()
    return output


def _fsdp_kwargs(parallel_dims: ParallelDims, training_args: Any) -> dict[str, Any]:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    kwargs: dict[str, Any] = {"mesh": parallel_dims.fsdp_mesh()}
    bf16 = bool(getattr(training_args, "bf16", False))
    if bf16 and parallel_dims.device_type == "cuda":
        # PaddleNLP O2: bf16 compute weights, fp32 master weights (the sharded params) and fp32 grad reduce.
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if parallel_dims.offload and parallel_dims.device_type == "cpu":
        # the parameters already live in host memory; CPUOffloadPolicy pins memory, which needs an accelerator
        # ("Cannot access accelerator device when none is available" from fully_shard on a CPU-only machine)
        if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
            logger.warning("sharding 'offload' has no effect on the CPU (the sharded parameters, gradients and "
                           "optimizer states are in host memory already): training without CPUOffloadPolicy")
    elif parallel_dims.offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    return kwargs


def apply_fsdp(model: nn.Module, parallel_dims: ParallelDims, training_args: Any = None) -> None:
    """``fully_shard`` each decoder layer, then the root; gradients are summed (divide factor 1).

    ``reshard_after_forward`` is True only for ``stage3``: stage1/stage2 keep each layer's gathered
    parameters from forward to backward (no second all-gather), stage3 frees them after forward. The root
    group is never resharded after forward (torchtitan does the same).

    Gradients are reduced with SUM, not FSDP's default mean: the trainer divides every rank's loss by the
    token count summed over all data-parallel ranks, so the sum of per-rank gradients is the gradient of
    the global token mean.

    Raises:
        ValueError: no module named ``...layers.<N>`` was found (nothing would be sharded per layer).
    """
    from torch.distributed.fsdp import fully_shard

    layers = _decoder_layers(model)
    if not layers:
        raise ValueError(f"apply_fsdp found no decoder layers (modules named '...layers.<N>') in "
                         f"{type(model).__name__}; nothing would be sharded per layer")
    kwargs = _fsdp_kwargs(parallel_dims, training_args)
    reshard = parallel_dims.sharding_stage == "stage3"
    for _, layer in layers:
        fully_shard(layer, reshard_after_forward=reshard, **kwargs)
    # Heads other than a (possibly tied) lm_head, applied by the caller after the forward (a reward model's
    # `score`), get their own group: FSDP gathers them when they are called and reshards right after.
    for name, child in model.named_children():
        if isinstance(child, nn.Linear) and name != "lm_head":
            fully_shard(child, reshard_after_forward=True, **kwargs)
    # Root (embedding, final norm, heads): kept unsharded after forward in every stage; backward needs it at
    # once, and heads used outside forward (a reward model's `score`) then see whole parameters.
    fully_shard(model, reshard_after_forward=False, **kwargs)
    model.register_forward_hook(_reshard_when_no_grad)
    for m in model.modules():
        if hasattr(m, "set_gradient_divide_factor"):
            m.set_gradient_divide_factor(1.0)
            # A custom factor makes FSDP use PREMUL_SUM, which gloo lacks; plain SUM with factor 1 is the same.
            if hasattr(m, "set_force_sum_reduction_for_comms"):
                m.set_force_sum_reduction_for_comms(True)


def apply_compile(model: nn.Module) -> int:
    """``torch.compile`` each decoder layer for training passes (PaddleNLP's ``to_static``; torchtitan's
    ``apply_compile``). Returns the number of layers compiled.

    Each ``...layers.<N>`` module gets an instance ``forward`` that runs the compiled layer when autograd is on
    and no KV cache is passed, and the eager one otherwise (evaluation under ``no_grad``, generation with a
    cache, a DPO reference model): those calls would only add recompiles. Parameter names and the state dict
    are unchanged. The FlashMask attention is one custom op (``flashmask::triton_fwd`` / ``triton_bwd``), so
    each layer compiles to one graph around it (under TP without LoRA, ``local_tp``, the norms run eagerly between
    graphs); activation checkpointing (``recompute``) wraps the compiled call. Apply after TP and before FSDP
    (torchtitan's order), after LoRA is injected.

    Measured on an H200 (1B shape, 8K packs, O2; docs/benchmarks.md): 1.03-1.04x eager tokens/s through the
    Trainer, same peak memory (``benchmarks/trainer_to_static.py``).

    Raises:
        ValueError: no module named ``...layers.<N>`` was found.
    """
    layers = _decoder_layers(model)
    if not layers:
        raise ValueError(f"to_static: found no decoder layers (modules named '...layers.<N>') in "
                         f"{type(model).__name__} to compile")
    for _, layer in layers:
        layer.forward = _training_compiled(layer)
    return len(layers)


def _training_compiled(layer: nn.Module):
    """The instance ``forward`` of :func:`apply_compile` for ``layer``: the class's ``forward``, compiled, as a
    method bound to the layer, so that ``copy.deepcopy`` of the model rebinds it to the copy (a closure over
    ``layer.forward`` would be copied as is, and a deep copy of a compiled model would run the ORIGINAL layers'
    weights).
    Taking the class's ``forward`` also makes a second :func:`apply_compile` replace the wrapper, not nest it."""
    fn = type(layer).forward
    compiled = torch.compile(fn)

    def forward(self, *args, **kwargs):
        if torch.is_grad_enabled() and _kv_cache(args, kwargs) is None:
            return compiled(self, *args, **kwargs)
        return fn(self, *args, **kwargs)

    return types.MethodType(forward, layer)


def _kv_cache(args: tuple, kwargs: dict):
    return kwargs.get("kv_cache", args[4] if len(args) > 4 else None)  # Llama's 5th argument (after self)


def parallelize_model(model: nn.Module, parallel_dims: ParallelDims | None, training_args: Any = None, *,
                      compile: bool = True) -> nn.Module:
    """Apply TP (if ``tp > 1``), ``torch.compile`` of the layers (if ``to_static``), then FSDP2 (if
    ``dp x sharding > 1``) in place; return the model. torchtitan's ``parallelize_llama`` order.

    Call after the model is built (and LoRA injected) and before the optimizer is created. With one process
    (``parallel_dims`` None, or its ``mesh`` None) only the compile step can apply.

    Args:
        model: Llama-named ``nn.Module`` with a ``config`` (docs/design.md section 4).
        parallel_dims: from :func:`init_distributed`, or None for one process.
        training_args: reads ``bf16`` (bf16 FSDP compute on CUDA; fp32 on CPU) and ``to_static``
            (:func:`apply_compile`).
        compile: False skips the compile step whatever ``to_static`` says (a model only run under ``no_grad``,
            such as DPO's reference model).

    Raises:
        ValueError: heads / KV heads / intermediate size not divisible by ``tp`` (``check_model_config``),
            or module names the TP plan cannot find.
    """
    distributed = parallel_dims is not None and parallel_dims.mesh is not None
    if distributed:
        parallel_dims.check_model_config(_model_config(model))
        if parallel_dims.tp_enabled:
            _check_tp_layout(model)
            apply_tp(model, parallel_dims)
    if compile and getattr(training_args, "to_static", False):
        apply_compile(model)
    if distributed and parallel_dims.fsdp_enabled:
        apply_fsdp(model, parallel_dims, training_args)
    return model


def _check_tp_layout(model: nn.Module) -> None:
    """Refuse layouts the name-based TP plan would split wrongly: per-head q/k norms (Qwen3, Gemma 3, OLMo 2) see
    only local heads, so their weight gradients would need an all-reduce over TP that the plan does not add."""
    norms = sorted({n.rsplit(".", 1)[-1] for n, _ in model.named_modules() if n.endswith((".q_norm", ".k_norm"))})
    if norms:
        mt = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        raise ValueError(f"tensor_parallel_degree > 1: model_type {mt!r} normalises each head ({', '.join(norms)}), "
                         "whose weight gradients this TP plan does not all-reduce; train it with sharding (FSDP2) "
                         "instead, tensor_parallel_degree 1")


def loss_parallel_context(parallel_dims: ParallelDims | None):
    """Context manager for forward + loss + backward when logits are vocab-sharded.

    Inside it, ``F.cross_entropy`` on a ``DTensor`` with ``Shard(-1)`` logits computes the vocab-parallel
    cross entropy (each rank its vocab slice; max and sum-exp all-reduced), like PaddleNLP's
    ``ParallelCrossEntropy``. Both the forward loss and ``backward()`` must run inside it. Returns a
    ``nullcontext`` when logits are not vocab-sharded.
    """
    if parallel_dims is None or not (parallel_dims.tp_enabled and parallel_dims.tensor_parallel_output):
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def hidden_states_and_head(model: nn.Module, input_ids: torch.Tensor, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Final hidden states and the whole LM-head weight of a (possibly parallelized) causal LM.

    For losses that apply ``lm_head.weight`` themselves in chunks (DPO log-probs). Calling ``model.model(...)``
    directly breaks under FSDP2 (the root group holding the embedding is only gathered by the root's forward)
    and ``lm_head.weight`` is a vocab-sharded ``DTensor`` under TP. Here the root forward runs with ``lm_head``
    swapped for ``nn.Identity`` (FSDP hooks fire, gradients are reduced as usual), and the weight is
    all-gathered over TP (its gradient, equal on all TP ranks, is sliced back).

    Args:
        model: ``forward(input_ids, **kwargs) -> lm_head(hidden)``, with an ``lm_head`` ``nn.Linear``.
        input_ids: int64 ``[B, L]``; kwargs: ``position_ids``, ``attn_mask_startend_row_indices``.

    Returns:
        ``hidden`` ``[B, L, H]`` (plain tensor, full sequence) and ``weight`` ``[V, H]`` (plain tensor), both
        differentiable.
    """
    from torch.distributed.tensor import DTensor, Replicate

    head = model.lm_head
    model.lm_head = nn.Identity()
    try:
        hidden = model(input_ids, **kwargs)
    finally:
        model.lm_head = head
    if isinstance(hidden, DTensor):  # sequence parallel: [B, L/tp, H] shards -> [B, L, H]
        hidden = hidden.redistribute(hidden.device_mesh, [Replicate()] * hidden.device_mesh.ndim).to_local()
    weight = head.weight
    if isinstance(weight, DTensor):
        weight = weight.full_tensor()
    return hidden, weight
