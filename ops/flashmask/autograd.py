"""FlashMask attention on the GPU kernels as a differentiable torch operation: ``flashmask_attention_triton``.

Two paths run the same passes (:func:`flashmask.dispatch.forward` / :func:`~flashmask.dispatch.backward` on the
cached mask, :func:`flashmask.mask_cache.mask_vectors`):

- the custom ops ``flashmask::triton_fwd`` / ``flashmask::triton_bwd`` (with autograd and fake kernels), under
  ``torch.compile`` / export and for tensor subclasses (DTensor, fake) and meta tensors: the compiler sees one
  opaque call and traces the model around it without a graph break;
- a plain ``torch.autograd.Function`` for eager calls on ordinary tensors: it skips the ``torch.library`` layers
  (dispatch, alias checks, autograd wrapper), about 200 us of host time per forward+backward on the H200 host,
  which matters at small shapes (B = 1, 8K, D = 64: 0.75 ms of kernels).

Both give bitwise the same outputs, LSE and gradients. The backward is first order: a double backward raises.
"""

from __future__ import annotations

import torch

from . import dispatch
from .env import interpreting
from .mask_cache import mask_vectors

# The op namespace is the package's import name ("flashmask"): a copy of the package imported under another name
# (the tile sweep's --alt copies) gets ops of its own, because torch.library.custom_op silently replaces the
# kernels of a name that already exists (both copies would run the last-imported code).
_NS = (__package__ or "flashmask").replace(".", "_")


def _attention_fwd(q, k, v, sri, causal: bool, scale: float, deterministic: bool = False):
    """Mask vectors (cached per index tensor), then the forward kernel: the body of both autograd paths."""
    return dispatch.forward(q, k, v, mask_vectors(sri, causal, q.shape[1], k.shape[1], q.device), causal, scale)


def _attention_bwd(do, q, k, v, o, lse, dlse, sri, causal: bool, scale: float, deterministic: bool):
    """Mask vectors (cached per index tensor), then the backward kernels: the body of both autograd paths."""
    mv = mask_vectors(sri, causal, q.shape[1], k.shape[1], q.device)
    return dispatch.backward(do, q, k, v, o, lse, dlse, mv, causal, scale, deterministic)


@torch.library.custom_op(f"{_NS}::triton_fwd", mutates_args=())
def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sri: torch.Tensor | None, causal: bool,
            scale: float, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [B,S_q,H_q,D], lse fp32 [B,H_q,S_q])``; ``deterministic`` is only read by the backward."""
    return _attention_fwd(q, k, v, sri, causal, scale, deterministic)


@_fwd_op.register_fake
def _(q, k, v, sri, causal, scale, deterministic):
    b, s_q, h_q, _ = q.shape
    return torch.empty_like(q), q.new_empty((b, h_q, s_q), dtype=torch.float32)


@torch.library.custom_op(f"{_NS}::triton_bwd", mutates_args=())
def _bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
            lse: torch.Tensor, dlse: torch.Tensor | None, sri: torch.Tensor | None, causal: bool, scale: float,
            deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` shaped like ``q, k, v``."""
    return _attention_bwd(do, q, k, v, o, lse, dlse, sri, causal, scale, deterministic)


@_bwd_op.register_fake
def _(do, q, k, v, o, lse, dlse, sri, causal, scale, deterministic):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, sri, causal, scale, deterministic = inputs
    ctx.save_for_backward(q, k, v, *output, *([] if sri is None else [sri]))
    ctx.causal, ctx.scale, ctx.deterministic = causal, scale, deterministic


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _backward_with(bwd, ctx, do, dlse):
    """The autograd backward of both paths: ``bwd`` is ``_bwd_op`` (custom op) or ``_attention_bwd`` (eager)."""
    q, k, v, o, lse, *sri = ctx.saved_tensors
    do = torch.zeros_like(o) if do is None else _last_dim_contiguous(do)
    dq, dk, dv = bwd(do, q, k, v, o, lse, dlse, sri[0] if sri else None, ctx.causal, ctx.scale, ctx.deterministic)
    return dq, dk, dv, None, None, None, None


def _backward(ctx, do, dlse):
    return _backward_with(_bwd_op, ctx, do, dlse)


_fwd_op.register_autograd(_backward, setup_context=_setup_context)


class _EagerFunction(torch.autograd.Function):
    """The same two passes as ``_fwd_op`` / ``_bwd_op`` for eager calls, without the ``torch.library`` layers.
    Gradients are not materialised: an unused LSE output gives ``dlse = None`` (no zeros tensor, no
    ``HAS_DLSE`` loads)."""

    @staticmethod
    def forward(ctx, *inputs):  # q, k, v, sri, causal, scale, deterministic (as _fwd_op)
        ctx.set_materialize_grads(False)
        output = _attention_fwd(*inputs)
        _setup_context(ctx, inputs, output)
        return output

    @staticmethod
    @torch.autograd.function.once_differentiable  # as _bwd_op (no autograd formula): a double backward raises
    def backward(ctx, do, dlse):
        return _backward_with(_attention_bwd, ctx, do, dlse)


def _use_custom_op(*tensors) -> bool:
    """The custom op under ``torch.compile`` / export, for tensor subclasses (fake, functional, DTensor) and meta
    tensors (its fake kernel gives the shapes); the plain autograd.Function for eager calls on ordinary tensors."""
    return torch.compiler.is_compiling() or any(type(t) is not torch.Tensor or t.is_meta for t in tensors
                                                if t is not None)


def _check_int32_offsets(**tensors) -> None:
    """ValueError when an element offset of a tensor exceeds 2**31 - 1: the kernels compute addresses as program
    ids times int32 strides (``b * stride(0)``), which would wrap around and read / write out of bounds."""
    for name, t in tensors.items():
        if t.is_contiguous():  # the common case: the span is the element count (a few µs of host time less)
            span = t.numel()
        else:
            span = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) if t.numel() else 0
        if span > 2**31:  # span - 1 is the largest offset
            raise ValueError(f"flashmask_attention_triton: {name} {tuple(t.shape)} spans {span} elements, over the "
                             "int32 indexing limit of 2**31 of the Triton kernels; split the batch (or the heads) "
                             "into smaller calls")


def flashmask_attention_triton(q, k, v, startend_row_indices, causal: bool, softmax_scale: float,
                               deterministic: bool = False):
    """FlashMask attention on the Triton / Gluon kernels; returns ``(out [B,S_q,H_q,D], lse fp32 [B,H_q,S_q])``.

    Args:
        q: ``[B, S_q, H_q, D]``; k, v: ``[B, S_k, H_k, D]``; fp16/bf16 (fp32 also works; on GPU its dots
            run in IEEE fp32). Inputs are assumed validated by :func:`flashmask.flashmask_attention`.
        startend_row_indices: int32 ``[B, H_mask, S_k, C]`` or None (semantics in :mod:`flashmask.dense`).
        causal: FlashMask causal mode (requires S_q == S_k, checked by the API).
        softmax_scale: score multiplier.
        deterministic: guarantee a bitwise reproducible backward (also implied by
            ``torch.use_deterministic_algorithms(True)``): the Triton kernels, which compute dQ in a separate
            row-parallel kernel (no atomics). Without it, on an sm_90 GPU at D = 64 or 128 the Gluon backward runs
            (dQ summed by fp32 TMA reduce-adds, not bitwise reproducible; :func:`flashmask.dispatch.gluon_bwd_eligible`).

    Raises:
        RuntimeError: tensors on CPU without ``TRITON_INTERPRET=1`` (set before triton is imported).
        ValueError: bf16 tensors on CPU (the interpreter computes bf16 dots wrongly: numpy has no bf16); an
            unknown value of ``FLASHMASK_FWD`` / ``FLASHMASK_BWD``; q, k or v spanning more than 2**31 elements (or
            a visit list that long: ``triton_blocklists.block_lists``), past the kernels' int32 indexing.
    """
    if not q.is_cuda and not interpreting():
        raise RuntimeError(
            "flashmask_attention_triton needs CUDA tensors, or TRITON_INTERPRET=1 set before importing triton "
            "(CPU interpreter, slow; fp32/fp16 only). Use impl='reference' on CPU.")
    if not q.is_cuda and q.dtype == torch.bfloat16:
        raise ValueError("flashmask_attention_triton on CPU (TRITON_INTERPRET=1) supports float32/float16 only: "
                         "the interpreter gives wrong bf16 results. Cast to float32 or use impl='reference'.")
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    _check_int32_offsets(q=q, k=k, v=v)
    if _use_custom_op(q, k, v, startend_row_indices):
        return _fwd_op(q, k, v, startend_row_indices, causal, float(softmax_scale), deterministic)
    return _EagerFunction.apply(q, k, v, startend_row_indices, causal, float(softmax_scale), deterministic)
