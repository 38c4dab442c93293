"""FlashMask backward kernels (Triton).

- ``_flashmask_bwd_dkdv_kernel``: column-parallel, one program per (key block, batch * kv head); it loops the
  GQA group of query heads itself (dK/dV owned by one program: no atomics, deterministic) and, per head, the
  query blocks listed for its key block (partial ones with the element mask, then unmasked ones; fully masked
  ones are not listed). Source: FlashMask v1 ``compute_dq_dk_dv_1colblock_flashmask``
  (``csrc/flash_attn/src/flash_bwd_kernel.h``) and V3's m-segments (flashmask.md §2.5-2.6).
- ``_flashmask_bwd_dq_kernel``: row-parallel dQ (recomputes S, P and dP), no atomics: bitwise reproducible. On
  the H200 it is as fast as or faster than adding dQ from the dK/dV kernel with atomics (docs/kernel_notes.md).
- ``_flashmask_bwd_preprocess_kernel``: Delta and the log2 LSE in one pass over O and dO.

``EVEN`` as in ``triton_fwd``; loads are plain pointer loads (TMA descriptors measured neutral to slower here).
``DP_FIRST`` issues dP = dO V^T right after S = Q K^T instead of after the softmax math (same values; the faster
order depends on the head dim, ``launch_config.dp_first``).

Math (natural-log LSE from the forward; log2 units inside): P = exp2(S*scale*log2e - LSE*log2e),
dV = P^T dO, dP = dO V^T, dS = P * (dP - Delta), Delta = rowsum(dO * O) - dLSE, dQ = scale dS K,
dK = scale dS^T Q. Empty rows have LSE = -inf, passed here as +inf, so P = 0 and their gradients are 0.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_prep import _elem_masked, _load, _load_mask_cols, _masked_from_cols, _store, _visit_list


@triton.jit
def _dkdv_tile(dk, dv, k, v, Qh, DOh, LSEh, DELh, m, offs_n, offs_d, dmask, sqs, sdos,
               S_q, S_k, lts, lte, uts, ute, qk_scale,
               BLOCK_M: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
               HAS_MASK: tl.constexpr, HAS_LTE: tl.constexpr, HAS_UT: tl.constexpr, HAS_UTS: tl.constexpr,
               DOT_PREC: tl.constexpr, EVEN: tl.constexpr, DP_FIRST: tl.constexpr):
    offs_m = m * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = offs_m < S_q
    q_mask = rmask[:, None] & dmask[None, :]
    q = _load(Qh + offs_m[:, None] * sqs + offs_d[None, :], q_mask, 0.0, EVEN)  # [BLOCK_M, BLOCK_D]
    do = _load(DOh + offs_m[:, None] * sdos + offs_d[None, :], q_mask, 0.0, EVEN)
    lse2 = _load(LSEh + offs_m, rmask, float("inf"), EVEN)  # [BLOCK_M], log2 units
    delta = _load(DELh + offs_m, rmask, 0.0, EVEN)
    sT = tl.dot(k, tl.trans(q), input_precision=DOT_PREC) * qk_scale  # [BLOCK_N, BLOCK_M]
    if DP_FIRST:  # both independent products issued before the softmax math (see _dq_tile)
        dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)  # [BLOCK_N, BLOCK_M]
    pT = tl.math.exp2(sT - lse2[None, :])
    if MASKED:
        maskedT = _masked_from_cols(offs_m[None, :], offs_n[:, None], S_k, lts, lte, uts, ute,
                                    CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)
        pT = tl.where(maskedT, 0.0, pT)
    dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=DOT_PREC)
    if not DP_FIRST:
        dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)  # [BLOCK_N, BLOCK_M]
    dsT = pT * (dpT - delta[None, :])
    dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=DOT_PREC)
    return dk, dv


@triton.jit
def _flashmask_bwd_dkdv_kernel(
    Q, K, V, DO, LSE2, DELTA, DK, DV, LTS, LTE, UTS, UTE, IDX, NPART, NFULL, FLO,
    sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sdob, sdos, sdoh,
    sdkb, sdks, sdkh, sdvb, sdvs, sdvh,
    S_q, S_k, H_q, H_k, H_mask, G, NUM_N, NUM_M, qk_scale, sm_scale,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_LTE: tl.constexpr,
    HAS_UT: tl.constexpr, HAS_UTS: tl.constexpr, DOT_PREC: tl.constexpr,
    EVEN: tl.constexpr, DP_FIRST: tl.constexpr,
):
    """dK (scaled by ``sm_scale``) and dV of one key block of one KV head, summed over the G query heads of its
    group. Grid ``(key blocks, B * H_k)``; LSE2 / DELTA fp32 ``[B, H_q, S_q]`` from the preprocess kernel."""
    bhk = tl.program_id(1)
    b = bhk // H_k
    hk = bhk % H_k
    hm = (hk * G) // (H_q // H_mask)  # every query head of the group maps to this mask head
    bm = b * H_mask + hm
    n = tl.program_id(0)
    offs_n = n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    kv_mask = (offs_n < S_k)[:, None] & dmask[None, :]
    k = _load(K + b * skb + hk * skh + offs_n[:, None] * sks + offs_d[None, :], kv_mask, 0.0, EVEN)
    v = _load(V + b * svb + hk * svh + offs_n[:, None] * svs + offs_d[None, :], kv_mask, 0.0, EVEN)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    vec_off = bm * S_k
    # the key block is fixed for the whole program: its mask columns are loaded once, as [BLOCK_N, 1]
    lts, lte, uts, ute = _load_mask_cols(offs_n[:, None], S_k, LTS + vec_off, LTE + vec_off, UTS + vec_off,
                                         UTE + vec_off, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS, EVEN)
    IDX, n_part, n_full, f_lo = _visit_list(IDX, NPART, NFULL, FLO, n, bm, NUM_N, NUM_M, HAS_MASK)

    for g in range(0, G):
        h = hk * G + g
        Qh = Q + b * sqb + h * sqh
        DOh = DO + b * sdob + h * sdoh
        LSEh = LSE2 + (b * H_q + h) * S_q
        DELh = DELTA + (b * H_q + h) * S_q
        for i in range(0, n_part):
            m = tl.load(IDX + i)
            dk, dv = _dkdv_tile(dk, dv, k, v, Qh, DOh, LSEh, DELh, m, offs_n, offs_d, dmask, sqs, sdos,
                                S_q, S_k, lts, lte, uts, ute, qk_scale, BLOCK_M, True, CAUSAL,
                                HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS, DOT_PREC, EVEN, DP_FIRST)
        if f_lo >= 0:  # unmasked query blocks form one run: affine addresses
            for m in range(f_lo, f_lo + n_full):
                dk, dv = _dkdv_tile(dk, dv, k, v, Qh, DOh, LSEh, DELh, m, offs_n, offs_d, dmask, sqs, sdos,
                                    S_q, S_k, lts, lte, uts, ute, qk_scale, BLOCK_M, False,
                                    CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS, DOT_PREC, EVEN, DP_FIRST)
        else:
            for i in range(n_part, n_part + n_full):
                m = tl.load(IDX + i)
                dk, dv = _dkdv_tile(dk, dv, k, v, Qh, DOh, LSEh, DELh, m, offs_n, offs_d, dmask, sqs, sdos,
                                    S_q, S_k, lts, lte, uts, ute, qk_scale, BLOCK_M, False,
                                    CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS, DOT_PREC, EVEN, DP_FIRST)

    _store(DK + b * sdkb + hk * sdkh + offs_n[:, None] * sdks + offs_d[None, :],
           (dk * sm_scale).to(DK.dtype.element_ty), kv_mask, EVEN)
    _store(DV + b * sdvb + hk * sdvh + offs_n[:, None] * sdvs + offs_d[None, :],
           dv.to(DV.dtype.element_ty), kv_mask, EVEN)


@triton.jit
def _dq_tile(dq, q, do, lse2, delta, K, V, n, offs_m, offs_d, dmask, sks, svs, S_k, LTS, LTE, UTS, UTE, qk_scale,
             BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
             HAS_LTE: tl.constexpr, HAS_UT: tl.constexpr, HAS_UTS: tl.constexpr, DOT_PREC: tl.constexpr,
             EVEN: tl.constexpr, DP_FIRST: tl.constexpr):
    offs_n = n * BLOCK_N + tl.arange(0, BLOCK_N)
    kv_mask = (offs_n < S_k)[:, None] & dmask[None, :]
    k = _load(K + offs_n[:, None] * sks + offs_d[None, :], kv_mask, 0.0, EVEN)
    v = _load(V + offs_n[:, None] * svs + offs_d[None, :], kv_mask, 0.0, EVEN)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale
    if DP_FIRST:  # issue dP = dO V^T before the exp2/mask math instead of after it (same values, other order)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
    p = tl.math.exp2(s - lse2[:, None])
    if MASKED:
        masked = _elem_masked(offs_m[:, None], offs_n[None, :], S_k, LTS, LTE, UTS, UTE,
                              CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS, EVEN)
        p = tl.where(masked, 0.0, p)
    if not DP_FIRST:
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
    ds = p * (dp - delta[:, None])
    dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PREC)
    return dq


@triton.jit
def _flashmask_bwd_dq_kernel(
    Q, K, V, DO, LSE2, DELTA, DQ, LTS, LTE, UTS, UTE, IDX, NPART, NFULL, FLO,
    sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sdob, sdos, sdoh, sdqb, sdqs, sdqh,
    S_q, S_k, H_q, H_mask, G, NUM_M, NUM_N, qk_scale, sm_scale,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_LTE: tl.constexpr,
    HAS_UT: tl.constexpr, HAS_UTS: tl.constexpr, DOT_PREC: tl.constexpr, EVEN: tl.constexpr,
    DP_FIRST: tl.constexpr,
):
    """dQ (scaled by ``sm_scale``) of one query block of one query head. Grid ``(query blocks, B * H_q)``, the
    last query blocks first, as in the forward kernel."""
    bh = tl.program_id(1)
    b = bh // H_q
    h = bh % H_q
    hk = h // G
    hm = h // (H_q // H_mask)
    bm = b * H_mask + hm
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    rmask = offs_m < S_q
    q_mask = rmask[:, None] & dmask[None, :]
    q = _load(Q + b * sqb + h * sqh + offs_m[:, None] * sqs + offs_d[None, :], q_mask, 0.0, EVEN)
    do = _load(DO + b * sdob + h * sdoh + offs_m[:, None] * sdos + offs_d[None, :], q_mask, 0.0, EVEN)
    lse2 = _load(LSE2 + bh * S_q + offs_m, rmask, float("inf"), EVEN)
    delta = _load(DELTA + bh * S_q + offs_m, rmask, 0.0, EVEN)
    K += b * skb + hk * skh
    V += b * svb + hk * svh
    vec_off = bm * S_k
    LTS += vec_off
    LTE += vec_off
    UTS += vec_off
    UTE += vec_off
    IDX, n_part, n_full, f_lo = _visit_list(IDX, NPART, NFULL, FLO, pid_m, bm, NUM_M, NUM_N, HAS_MASK)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for i in range(0, n_part):
        n = tl.load(IDX + i)
        dq = _dq_tile(dq, q, do, lse2, delta, K, V, n, offs_m, offs_d, dmask, sks, svs, S_k, LTS, LTE, UTS, UTE,
                      qk_scale, BLOCK_N, True, CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS, DOT_PREC, EVEN, DP_FIRST)
    if f_lo >= 0:
        for n in range(f_lo, f_lo + n_full):
            dq = _dq_tile(dq, q, do, lse2, delta, K, V, n, offs_m, offs_d, dmask, sks, svs, S_k, LTS, LTE, UTS,
                          UTE, qk_scale, BLOCK_N, False, CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS, DOT_PREC,
                          EVEN, DP_FIRST)
    else:
        for i in range(n_part, n_part + n_full):
            n = tl.load(IDX + i)
            dq = _dq_tile(dq, q, do, lse2, delta, K, V, n, offs_m, offs_d, dmask, sks, svs, S_k, LTS, LTE, UTS,
                          UTE, qk_scale, BLOCK_N, False, CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS, DOT_PREC,
                          EVEN, DP_FIRST)
    _store(DQ + b * sdqb + h * sdqh + offs_m[:, None] * sdqs + offs_d[None, :],
           (dq * sm_scale).to(DQ.dtype.element_ty), q_mask, EVEN)


# The Gluon backward's fp32 dQ accumulator holds one contiguous 64 x 64 tile per (batch, query head, query block of
# 64, part of 64 head dims), laid out as a warpgroup's wgmma accumulator registers can store it: offset bit i holds
# the tile coordinate DQ_TILE_BASES[i] (row, column), i.e. [4 row groups][8 column groups][16 rows][8 columns]. A warp
# then stages its part with 8-byte stores of 256 contiguous bytes each (no bank conflict) and each warpgroup adds its
# tile with one bulk reduce-add of 16 KB (FlashAttention-3's dQaccum).
DQ_TILE = 64
DQ_TILE_BASES = [(0, 1), (0, 2), (0, 4), (1, 0), (2, 0), (4, 0), (8, 0), (0, 8), (0, 16), (0, 32), (16, 0), (32, 0)]


@triton.jit
def _flashmask_dq_from_tiles_kernel(ACC, DQ, scale, S_q, H_q, NUM_M, D: tl.constexpr, TILE: tl.constexpr):
    """``DQ [B, S_q, H_q, D] = (ACC * scale).to(DQ's dtype)`` from the tiled fp32 accumulator (``DQ_TILE_BASES``),
    one program per (query block x head-dim part, batch * head)."""
    NPARTS: tl.constexpr = D // TILE
    t = tl.program_id(0)
    bh = tl.program_id(1)
    m = t // NPARTS
    part = t % NPARTS
    tile = (bh * NUM_M + m) * NPARTS + part
    # the tile in its own order ([row group, column group, row, column], contiguous loads), then rows and columns
    acc = tl.load(ACC + tile.to(tl.int64) * (TILE * TILE) + tl.arange(0, TILE * TILE))
    acc = tl.reshape(tl.permute(tl.reshape(acc, [4, 8, 16, 8]), [0, 2, 1, 3]), [TILE, TILE])
    r = tl.arange(0, TILE)[:, None]
    c = tl.arange(0, TILE)[None, :]
    rows = ((bh // H_q) * S_q + m * TILE + r).to(tl.int64)
    tl.store(DQ + (rows * H_q + bh % H_q) * D + part * TILE + c, (acc * scale).to(DQ.dtype.element_ty))


@triton.jit
def _flashmask_bwd_preprocess_kernel(
    O, DO, LSE, DLSE, DELTA, LSE2, DQ, sob, sos, soh, sdob, sdos, sdoh, S_q, H_q, log2e,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, HAS_DLSE: tl.constexpr, ZERO_DQ: tl.constexpr,
):
    """Delta = rowsum(dO * O) - dLSE (fp32; a non-finite dLSE counts as 0) and LSE in log2 units (+inf for
    empty rows, whose LSE is -inf), both ``[B*H_q, S_q]``; with ``ZERO_DQ`` also zeroes a share of the fp32 dQ
    accumulator ``DQ`` (``B * S_q * H_q * D`` elements, indexed as ``[B, S_q, H_q, D]``; all programs together cover
    every element, so the Gluon backward's tile order needs no other fill). One program per (row block,
    batch * head)."""
    m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H_q
    h = bh % H_q
    offs_m = m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    rmask = offs_m < S_q
    msk = rmask[:, None] & (offs_d < D)[None, :]
    o = tl.load(O + b * sob + h * soh + offs_m[:, None] * sos + offs_d[None, :], mask=msk, other=0.0)
    do = tl.load(DO + b * sdob + h * sdoh + offs_m[:, None] * sdos + offs_d[None, :], mask=msk, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)  # [BLOCK_M]
    row = bh * S_q + offs_m
    if HAS_DLSE:
        dl = tl.load(DLSE + row, mask=rmask, other=0.0)
        finite = (dl == dl) & (tl.abs(dl) != float("inf"))
        delta -= tl.where(finite, dl, 0.0)
    lse = tl.load(LSE + row, mask=rmask, other=0.0)
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * log2e)
    tl.store(DELTA + row, delta, mask=rmask)
    tl.store(LSE2 + row, lse2, mask=rmask)
    if ZERO_DQ:
        dq_rows = (b * S_q + offs_m) * H_q + h
        tl.store(DQ + dq_rows[:, None] * D + offs_d[None, :], tl.zeros([BLOCK_M, BLOCK_D], tl.float32), mask=msk)
