"""Triton FlashMask attention: autograd Function and launchers.

Shape legend: B batch, S_q / S_k query / key length, H_q / H_k query / kv heads, H_mask mask heads (1 or H_k),
D head dim (any size; padded to the next power of two >= 16 inside the kernels with masking).

Kernels: ``triton_fwd`` (forward), ``triton_bwd`` (dK/dV column-parallel + dQ), ``triton_prep`` (SoA vectors,
per-key-block min/max, tile classification). Algorithm: FlashMask (Wang et al., ICLR 2025, arXiv 2410.01359)
on a FlashAttention-2 schedule; see docs/kernel_notes.md.

Runs on CUDA, or on CPU under ``TRITON_INTERPRET=1`` (fp32/fp16 only; used by the CPU tests).
"""

from __future__ import annotations

import os
import warnings

import torch
import triton
import triton.runtime.errors  # noqa: F401  (OutOfResources)

from .triton_bwd import _flashmask_bwd_dkdv_kernel, _flashmask_bwd_dq_kernel
from .triton_fwd import _flashmask_fwd_kernel
from .triton_prep import MaskVectors

LOG2E = 1.4426950408889634


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _pow2(x: int) -> int:
    return max(16, triton.next_power_of_2(x))


def _env_cfg(name: str, keys: tuple[str, ...]) -> dict | None:
    """Override from an environment variable of comma-separated ints (used by benchmarks/tune_blocks.py)."""
    raw = os.environ.get(name)
    if not raw:
        return None
    vals = [int(x) for x in raw.split(",")]
    if len(vals) != len(keys):
        raise ValueError(f"{name}={raw!r}: expected {len(keys)} comma-separated ints {keys}")
    return dict(zip(keys, vals))


def fwd_config(d_pad: int, dtype: torch.dtype, on_gpu: bool) -> dict:
    """Forward tile shape ``{BLOCK_M, BLOCK_N, num_warps, num_stages}`` for padded head dim ``d_pad``.

    ``FLASHMASK_FWD_CFG="BM,BN,warps,stages"`` overrides it on GPU (offline tuning).
    """
    env = _env_cfg("FLASHMASK_FWD_CFG", ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")) if on_gpu else None
    if env:
        return env
    if not on_gpu:
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=1)
    if dtype == torch.float32:
        return dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)
    if d_pad <= 64:
        return dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3)
    if d_pad <= 128:
        # H200 sweep (docs/kernel_notes.md): 128x128/8 warps is fastest; 3 stages overflow shared memory by 1 KiB
        # with C=4 masks, 2 stages cost ~2 %
        return dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2)
    return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)


def bwd_config(d_pad: int, dtype: torch.dtype, on_gpu: bool) -> dict:
    """Backward tile shapes: dK/dV kernel (BLOCK_N keys per program, BLOCK_M query rows per step) and dQ kernel.

    ``FLASHMASK_BWD_CFG="BM,BN,warps,stages,dqBM,dqBN,dqwarps,dqstages"`` overrides it on GPU.
    """
    env = _env_cfg("FLASHMASK_BWD_CFG", ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "DQ_BLOCK_M",
                                         "DQ_BLOCK_N", "dq_warps", "dq_stages")) if on_gpu else None
    if env:
        return env
    if not on_gpu:
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=1,
                    DQ_BLOCK_M=16, DQ_BLOCK_N=16, dq_warps=1, dq_stages=1)
    if dtype == torch.float32:
        return dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1,
                    DQ_BLOCK_M=32, DQ_BLOCK_N=32, dq_warps=4, dq_stages=1)
    if d_pad <= 128:
        # H200 sweep (docs/kernel_notes.md): 64 query rows x 128 keys, 8 warps, 2 stages was best of 5 at D=128
        return dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=2,
                    DQ_BLOCK_M=128, DQ_BLOCK_N=64, dq_warps=8, dq_stages=2)
    return dict(BLOCK_M=32, BLOCK_N=64, num_warps=8, num_stages=1,
                DQ_BLOCK_M=64, DQ_BLOCK_N=32, dq_warps=8, dq_stages=1)


def _launch(kernel, grid, *args, **kwargs):
    """Launch; if the tile config needs more shared memory than the GPU has (e.g. a C=4 mask on top of a
    3-stage pipeline), retry once with ``num_stages=1`` (same tiles, so the block lists stay valid)."""
    try:
        kernel[grid](*args, **kwargs)
    except triton.runtime.errors.OutOfResources:
        if kwargs.get("num_stages", 1) == 1:
            raise
        warnings.warn(f"{kernel.fn.__name__}: out of shared memory with num_stages={kwargs['num_stages']}, "
                      "retrying with num_stages=1", RuntimeWarning, stacklevel=3)
        kernel[grid](*args, **dict(kwargs, num_stages=1))


def _flags(mv: MaskVectors, causal: bool, dtype: torch.dtype) -> dict:
    return dict(CAUSAL=causal, HAS_MASK=mv.has_mask, HAS_LTE=mv.has_lte, HAS_UT=mv.has_ut, HAS_UTS=mv.has_uts,
                DOT_PREC="ieee" if dtype == torch.float32 else "tf32")


def _fwd(q, k, v, mv: MaskVectors, causal: bool, scale: float):
    b, s_q, h_q, d = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    d_pad = _pow2(d)
    cfg = fwd_config(d_pad, q.dtype, q.is_cuda and not _interpreting())
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    idx, n_part, n_full = mv.block_lists(bm, bn, by_key=False)
    o = torch.empty_like(q)
    lse = torch.empty(b, h_q, s_q, dtype=torch.float32, device=q.device)
    grid = (idx.shape[1], b * h_q)
    _launch(_flashmask_fwd_kernel, grid,
        q, k, v, o, lse, mv.lts, mv.lte, mv.uts, mv.ute, idx, n_part, n_full,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
        s_q, s_k, h_q, mv.h_mask, h_q // h_k, idx.shape[1], idx.shape[2], scale * LOG2E,
        D=d, BLOCK_D=d_pad, BLOCK_M=bm, BLOCK_N=bn,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **_flags(mv, causal, q.dtype),
    )
    return o, lse


def _bwd(do, q, k, v, o, lse, dlse, mv: MaskVectors, causal: bool, scale: float, deterministic: bool):
    b, s_q, h_q, d = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    d_pad = _pow2(d)
    cfg = bwd_config(d_pad, q.dtype, q.is_cuda and not _interpreting())
    flags = _flags(mv, causal, q.dtype)
    # Delta = rowsum(dO * O) in fp32, [B, H_q, S_q]; a gradient on the LSE enters as dS += P * dLSE.
    delta = (do.float() * o.float()).sum(-1).transpose(1, 2).contiguous()
    if dlse is not None:
        delta = delta - torch.nan_to_num(dlse.float(), nan=0.0, posinf=0.0, neginf=0.0)
    lse2 = torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse * LOG2E).contiguous()
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    atomic = not deterministic
    dqa = torch.zeros(b, s_q, h_q, d, dtype=torch.float32, device=q.device) if atomic else lse  # dummy if unused
    bn, bm = cfg["BLOCK_N"], cfg["BLOCK_M"]
    idx, n_part, n_full = mv.block_lists(bm, bn, by_key=True)  # [L, NUM_N, NUM_M]
    sdq = dqa.stride() if atomic else (0, 0, 0)
    _launch(_flashmask_bwd_dkdv_kernel, (idx.shape[1], b * h_k),
        q, k, v, do, lse2, delta, dk, dv, dqa, mv.lts, mv.lte, mv.uts, mv.ute, idx, n_part, n_full,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2),
        dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2),
        sdq[0], sdq[1], sdq[2],
        s_q, s_k, h_q, h_k, mv.h_mask, h_q // h_k, idx.shape[1], idx.shape[2], scale * LOG2E, scale,
        D=d, BLOCK_D=d_pad, BLOCK_M=bm, BLOCK_N=bn, ATOMIC_DQ=atomic,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **flags,
    )
    if atomic:
        return dqa.to(q.dtype), dk, dv
    dq = torch.empty_like(q)
    bm2, bn2 = cfg["DQ_BLOCK_M"], cfg["DQ_BLOCK_N"]
    idx2, n_part2, n_full2 = mv.block_lists(bm2, bn2, by_key=False)
    _launch(_flashmask_bwd_dq_kernel, (idx2.shape[1], b * h_q),
        q, k, v, do, lse2, delta, dq, mv.lts, mv.lte, mv.uts, mv.ute, idx2, n_part2, n_full2,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2),
        dq.stride(0), dq.stride(1), dq.stride(2),
        s_q, s_k, h_q, mv.h_mask, h_q // h_k, idx2.shape[1], idx2.shape[2], scale * LOG2E, scale,
        D=d, BLOCK_D=d_pad, BLOCK_M=bm2, BLOCK_N=bn2,
        num_warps=cfg["dq_warps"], num_stages=cfg["dq_stages"], **flags,
    )
    return dq, dk, dv


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _mask_vectors(sri, causal: bool, seq_q: int, seq_k: int, device) -> MaskVectors:
    """Preprocessed mask (SoA vectors, block min/max, visit lists), cached on the index tensor itself.

    All layers of a forward pass receive the same ``startend_row_indices`` tensor, so the O(N + Tr*Tc)
    preprocessing runs once per batch, not once per layer and pass. The key includes ``sri._version`` so an
    in-place edit of the indices rebuilds it.
    """
    if sri is None:
        return MaskVectors(None, causal, seq_q, seq_k, device)
    key = (causal, seq_q, seq_k, sri._version)
    cached = getattr(sri, "_flashmask_vectors", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    mv = MaskVectors(sri, causal, seq_q, seq_k, device)
    sri._flashmask_vectors = (key, mv)
    return mv


class FlashMaskTritonFunction(torch.autograd.Function):
    """Autograd wrapper: ``forward(q, k, v, sri, causal, scale, deterministic) -> (out, lse)``.

    ``out`` is ``[B, S_q, H_q, D]`` in the input dtype; ``lse`` fp32 ``[B, H_q, S_q]`` (natural log, -inf on
    empty rows). Gradients flow to q, k, v (also through ``lse``); ``sri`` and the flags get none.
    """

    @staticmethod
    def forward(ctx, q, k, v, sri, causal, scale, deterministic):
        q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
        mv = _mask_vectors(sri, causal, q.shape[1], k.shape[1], q.device)
        o, lse = _fwd(q, k, v, mv, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.mv, ctx.causal, ctx.scale, ctx.deterministic = mv, causal, scale, deterministic
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, o, lse = ctx.saved_tensors
        if do is None:
            do = torch.zeros_like(o)
        do = _last_dim_contiguous(do)
        dq, dk, dv = _bwd(do, q, k, v, o, lse, dlse, ctx.mv, ctx.causal, ctx.scale, ctx.deterministic)
        return dq, dk, dv, None, None, None, None


def flashmask_attention_triton(q, k, v, startend_row_indices, causal: bool, softmax_scale: float,
                               deterministic: bool = False):
    """FlashMask attention on the Triton kernels; returns ``(out [B,S_q,H_q,D], lse fp32 [B,H_q,S_q])``.

    Args:
        q: ``[B, S_q, H_q, D]``; k, v: ``[B, S_k, H_k, D]``; fp16/bf16 (fp32 also works; on GPU its dots
            run in IEEE fp32). Inputs are assumed validated by :func:`flashmask.flashmask_attention`.
        startend_row_indices: int32 ``[B, H_mask, S_k, C]`` or None (semantics in :mod:`flashmask.dense`).
        causal: FlashMask causal mode (requires S_q == S_k, checked by the API).
        softmax_scale: score multiplier.
        deterministic: backward computes dQ in a separate row-parallel kernel (no atomics): bitwise
            reproducible. Default uses fp32 atomics for dQ.

    Raises:
        RuntimeError: tensors on CPU without ``TRITON_INTERPRET=1`` (set before triton is imported).
        ValueError: bf16 tensors on CPU (the interpreter computes bf16 dots wrongly: numpy has no bf16).
    """
    if not q.is_cuda and not _interpreting():
        raise RuntimeError(
            "flashmask_attention_triton needs CUDA tensors, or TRITON_INTERPRET=1 set before importing triton "
            "(CPU interpreter, slow; fp32/fp16 only). Use impl='reference' on CPU.")
    if not q.is_cuda and q.dtype == torch.bfloat16:
        raise ValueError("flashmask_attention_triton on CPU (TRITON_INTERPRET=1) supports float32/float16 only: "
                         "the interpreter gives wrong bf16 results. Cast to float32 or use impl='reference'.")
    return FlashMaskTritonFunction.apply(q, k, v, startend_row_indices, causal, softmax_scale, deterministic)
