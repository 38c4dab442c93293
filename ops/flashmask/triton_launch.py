"""Host side of the Triton kernels: buffers, visit lists, TMA descriptors and the launches of one forward or one
backward (:mod:`flashmask.triton_fwd`, :mod:`flashmask.triton_bwd`) for preprocessed mask vectors.

Shape legend: B batch, S_q / S_k query / key length, H_q / H_k query / kv heads, D head dim (any size; padded to
the next power of two >= 16 inside the kernels with masking). Tiles come from :mod:`flashmask.launch_config`.
"""

from __future__ import annotations

import torch
import triton

from .env import interpreting
from .launch_config import LOG2E, bwd_config, dp_first, fwd_config, launch, pow2
from .triton_bwd import (DQ_TILE, _flashmask_bwd_dkdv_kernel, _flashmask_bwd_dq_kernel,
                         _flashmask_bwd_preprocess_kernel, _flashmask_dq_from_tiles_kernel)
from .triton_fwd import _flashmask_fwd_kernel
from .triton_prep import MaskVectors


def _on_gpu(t: torch.Tensor) -> bool:
    return t.is_cuda and not interpreting()


def _flags(mv: MaskVectors, causal: bool, dtype: torch.dtype) -> dict:
    return dict(CAUSAL=causal, HAS_MASK=mv.has_mask, HAS_LTE=mv.has_lte, HAS_UT=mv.has_ut, HAS_UTS=mv.has_uts,
                DOT_PREC="ieee" if dtype == torch.float32 else "tf32")


def _even(s_rows: int, s_cols: int, block_rows: int, block_cols: int, d: int, d_pad: int) -> bool:
    """True when no tile crosses a sequence end and D needs no padding: the kernels then load and store
    without bounds predicates (FlexAttention's ``IS_DIVISIBLE``)."""
    return s_rows % block_rows == 0 and s_cols % block_cols == 0 and d == d_pad


def _tma_enabled(t: torch.Tensor) -> bool:
    """TMA tensor-descriptor loads in the forward: on a Hopper-or-newer GPU, and in the CPU interpreter (so the
    tests cover that path)."""
    return interpreting() or (t.is_cuda and torch.cuda.get_device_capability(t.device)[0] >= 9)


def _tma_2d(t: torch.Tensor, block_rows: int):
    """A 2-D tensor descriptor over ``t`` ``[B, S, H, D]`` seen as ``[B*S, H*D]`` with ``[block_rows, D]`` boxes,
    or None when the layout does not allow it (rows of one stride, heads adjacent, 16-byte aligned). Only used
    when the launch is EVEN, so a box never crosses into the next batch or head."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    b, s, h, d = t.shape
    row = t.stride(1)
    if t.stride(3) != 1 or t.stride(2) != d or (b > 1 and t.stride(0) != s * row):
        return None
    if (row * t.element_size()) % 16 or t.data_ptr() % 16 or (d * t.element_size()) % 16:
        return None
    return TensorDescriptor(t, [b * s, h * d], [row, 1], [block_rows, d])


def _operands(even: bool, *tensor_rows):
    """``(operands, tma)``: TMA descriptors for every ``(tensor, box_rows)`` when the launch is EVEN, TMA is
    available and every layout allows it; else the tensors themselves (pointer loads)."""
    if even and _tma_enabled(tensor_rows[0][0]):
        descs = [_tma_2d(t, rows) for t, rows in tensor_rows]
        if all(x is not None for x in descs):
            return descs, True
    return [t for t, _ in tensor_rows], False


def triton_forward(q, k, v, mv: MaskVectors, causal: bool, scale: float):
    """The Triton forward: ``(out like q, lse fp32 [B, H_q, S_q])``, natural-log LSE, -inf on empty rows.

    q ``[B, S_q, H_q, D]``, k / v ``[B, S_k, H_k, D]`` with unit last stride; ``mv`` the call's preprocessed mask.
    """
    b, s_q, h_q, d = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    d_pad = pow2(d)
    cfg = fwd_config(d_pad, q.dtype, _on_gpu(q), mv.has_uts)
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    idx, n_part, n_full, full_lo, _ = mv.block_lists(bm, bn, by_key=False)
    o = torch.empty_like(q)
    lse = torch.empty(b, h_q, s_q, dtype=torch.float32, device=q.device)
    even = _even(s_q, s_k, bm, bn, d, d_pad)
    (q_, k_, v_), tma = _operands(even, (q, bm), (k, bn), (v, bn))
    launch(_flashmask_fwd_kernel, (idx.shape[1], b * h_q),
           q_, k_, v_, o, lse, mv.lts, mv.lte, mv.uts, mv.ute, idx, n_part, n_full, full_lo,
           q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
           v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
           s_q, s_k, h_q, mv.h_mask, h_q // h_k, idx.shape[1], idx.shape[2], scale * LOG2E,
           D=d, BLOCK_D=d_pad, BLOCK_M=bm, BLOCK_N=bn, EVEN=even, TMA=tma,
           num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **_flags(mv, causal, q.dtype))
    return o, lse


def preprocess(o, do, lse, dlse, dq_accum=None):
    """``(delta, lse2)``, fp32 ``[B, H_q, S_q]``: Delta = rowsum(dO * O) - dLSE (a non-finite dLSE counts as 0) and
    the LSE in log2 units (+inf on empty rows), in one pass over O and dO; the input of both backward kernels.
    ``dq_accum`` (contiguous fp32, ``B * S_q * H_q * D`` elements in any layout, optional) is zeroed in the same
    pass."""
    b, s_q, h_q, d = o.shape
    delta = torch.empty_like(lse)
    lse2 = torch.empty_like(lse)
    dlse_c = dlse.float().contiguous() if dlse is not None else lse
    pre_bm = 64
    launch(_flashmask_bwd_preprocess_kernel, (triton.cdiv(s_q, pre_bm), b * h_q),
           o, do, lse.contiguous(), dlse_c, delta, lse2, lse if dq_accum is None else dq_accum, o.stride(0),
           o.stride(1), o.stride(2), do.stride(0), do.stride(1), do.stride(2), s_q, h_q, LOG2E,
           D=d, BLOCK_D=pow2(d), BLOCK_M=pre_bm, HAS_DLSE=dlse is not None, ZERO_DQ=dq_accum is not None,
           num_warps=4, num_stages=1)
    return delta, lse2


def dq_from_tiles(dq_accum, scale: float, dtype: torch.dtype, shape):
    """dQ ``[B, S_q, H_q, D]`` (``shape``; S_q and D multiples of 64) in ``dtype`` from the Gluon backward's tiled fp32
    accumulator (``triton_bwd.DQ_TILE_BASES``, as many elements): ``dq_accum * scale`` rounded once, in one pass
    (FlashAttention-3's dQ postprocessing of its dQaccum).

    Raises:
        ValueError: S_q or D not a multiple of 64, or ``dq_accum`` not ``B * S_q * H_q * D`` elements.
    """
    b, s_q, h_q, d = shape
    if s_q % DQ_TILE or d % DQ_TILE or dq_accum.numel() != b * s_q * h_q * d:
        raise ValueError(f"dq_from_tiles: needs S_q and D multiples of {DQ_TILE} and {b * s_q * h_q * d} "
                         f"accumulator elements; got shape {tuple(shape)}, {dq_accum.numel()} elements")
    dq = torch.empty(shape, dtype=dtype, device=dq_accum.device)
    launch(_flashmask_dq_from_tiles_kernel, (s_q // DQ_TILE * (d // DQ_TILE), b * h_q), dq_accum, dq, scale, s_q,
           h_q, s_q // DQ_TILE, D=d, TILE=DQ_TILE, num_warps=4)
    return dq


def triton_backward(do, q, k, v, lse2, delta, mv: MaskVectors, causal: bool, scale: float):
    """The Triton backward: ``(dq, dk, dv)`` shaped like ``q, k, v``, bitwise reproducible (dK/dV from the
    column-parallel kernel, dQ from its own row-parallel kernel; no atomics). ``lse2`` / ``delta`` from
    :func:`preprocess`."""
    b, s_q, h_q, d = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    d_pad = pow2(d)
    cfg = bwd_config(d_pad, q.dtype, _on_gpu(q))
    flags = dict(_flags(mv, causal, q.dtype), DP_FIRST=dp_first(d_pad))
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    bn, bm = cfg["BLOCK_N"], cfg["BLOCK_M"]
    idx, n_part, n_full, full_lo, _ = mv.block_lists(bm, bn, by_key=True)  # idx [L, NUM_N, NUM_M]
    launch(_flashmask_bwd_dkdv_kernel, (idx.shape[1], b * h_k),
           q, k, v, do, lse2, delta, dk, dv, mv.lts, mv.lte, mv.uts, mv.ute, idx, n_part, n_full, full_lo,
           q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
           v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2),
           dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2),
           s_q, s_k, h_q, h_k, mv.h_mask, h_q // h_k, idx.shape[1], idx.shape[2], scale * LOG2E, scale,
           D=d, BLOCK_D=d_pad, BLOCK_M=bm, BLOCK_N=bn, EVEN=_even(s_q, s_k, bm, bn, d, d_pad),
           num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **flags)
    dq = torch.empty_like(q)
    bm2, bn2 = cfg["DQ_BLOCK_M"], cfg["DQ_BLOCK_N"]
    idx2, n_part2, n_full2, full_lo2, _ = mv.block_lists(bm2, bn2, by_key=False)
    launch(_flashmask_bwd_dq_kernel, (idx2.shape[1], b * h_q),
           q, k, v, do, lse2, delta, dq, mv.lts, mv.lte, mv.uts, mv.ute, idx2, n_part2, n_full2, full_lo2,
           q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
           v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2),
           dq.stride(0), dq.stride(1), dq.stride(2),
           s_q, s_k, h_q, mv.h_mask, h_q // h_k, idx2.shape[1], idx2.shape[2], scale * LOG2E, scale,
           D=d, BLOCK_D=d_pad, BLOCK_M=bm2, BLOCK_N=bn2, EVEN=_even(s_q, s_k, bm2, bn2, d, d_pad),
           num_warps=cfg["dq_warps"], num_stages=cfg["dq_stages"], **flags)
    return dq, dk, dv
