"""FlashMask backward kernels (Triton).

- ``_flashmask_bwd_dkdv_kernel``: column-parallel, one program per (key block, batch * kv head); it loops the
  GQA group of query heads itself (dK/dV owned by one program: no atomics, deterministic), and over the query
  blocks in the ``[lo, hi)`` range found from the key block's min/max, skipping fully masked tiles
  (FlashMask v1 ``compute_dq_dk_dv_1colblock_flashmask``, ``csrc/flash_attn/src/flash_bwd_kernel.h``;
  flashmask.md §2.5). With ``ATOMIC_DQ`` it also adds dQ into an fp32 buffer with atomics (fast default).
- ``_flashmask_bwd_dq_kernel``: row-parallel dQ (recomputes P and dP) for ``deterministic=True``:
  bitwise-reproducible, like FlexAttention's dQ programs.

Math (natural-log LSE stored by the forward; log2 units inside): P = exp2(S*scale*log2e - LSE*log2e),
dV = P^T dO, dP = dO V^T, dS = P * (dP - Delta), Delta = rowsum(dO * O) - dLSE, dQ = scale dS K,
dK = scale dS^T Q. Empty rows have LSE = -inf -> treated as +inf here -> P = 0 -> zero gradients.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_prep import _elem_masked, _key_block_range, _row_block_range, _tile_class


@triton.jit
def _flashmask_bwd_dkdv_kernel(
    Q, K, V, DO, LSE2, DELTA, DK, DV, DQA, LTS, LTE, UTS, UTE, MM,
    sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sdob, sdos, sdoh,
    sdkb, sdks, sdkh, sdvb, sdvs, sdvh, sdqb, sdqs, sdqh,
    S_q, S_k, H_q, H_k, H_mask, G, NB, NM, mm_vec_stride, qk_scale, sm_scale,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    NM_POW2: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_LTE: tl.constexpr,
    HAS_UT: tl.constexpr, HAS_UTS: tl.constexpr, ATOMIC_DQ: tl.constexpr, DOT_PREC: tl.constexpr,
):
    n = tl.program_id(0)
    bhk = tl.program_id(1)
    b = bhk // H_k
    hk = bhk % H_k
    hm = (hk * G) // (H_q // H_mask)  # every query head of the group maps to this mask head
    bm = b * H_mask + hm
    c0 = n * BLOCK_N
    offs_n = c0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    cmask = offs_n < S_k
    kv_mask = cmask[:, None] & dmask[None, :]
    k = tl.load(K + b * skb + hk * skh + offs_n[:, None] * sks + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + b * svb + hk * svh + offs_n[:, None] * svs + offs_d[None, :], mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)

    MMb = MM + bm * NB
    vec_off = bm * S_k
    LTS += vec_off
    LTE += vec_off
    UTS += vec_off
    UTE += vec_off
    lo, hi = _row_block_range(c0, MMb, mm_vec_stride, n, S_q, NM, BLOCK_M, NM_POW2,
                              CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)

    for g in range(0, G):
        h = hk * G + g
        Qh = Q + b * sqb + h * sqh
        DOh = DO + b * sdob + h * sdoh
        LSEh = LSE2 + (b * H_q + h) * S_q
        DELh = DELTA + (b * H_q + h) * S_q
        DQh = DQA + b * sdqb + h * sdqh
        for m in range(lo, hi):
            r0 = m * BLOCK_M
            r1 = tl.minimum(r0 + BLOCK_M, S_q)
            # classification of tile (rows of block m, this key block): same scalars as the forward
            skip, need = _tile_class(r0, r1, c0, n, MMb, mm_vec_stride, S_k, BLOCK_N,
                                     CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)
            if not skip:
                offs_m = r0 + tl.arange(0, BLOCK_M)
                rmask = offs_m < S_q
                q_mask = rmask[:, None] & dmask[None, :]
                q = tl.load(Qh + offs_m[:, None] * sqs + offs_d[None, :], mask=q_mask, other=0.0)
                do = tl.load(DOh + offs_m[:, None] * sdos + offs_d[None, :], mask=q_mask, other=0.0)
                lse2 = tl.load(LSEh + offs_m, mask=rmask, other=float("inf"))  # [BLOCK_M], log2 units
                delta = tl.load(DELh + offs_m, mask=rmask, other=0.0)
                sT = tl.dot(k, tl.trans(q), input_precision=DOT_PREC) * qk_scale  # [BLOCK_N, BLOCK_M]
                pT = tl.math.exp2(sT - lse2[None, :])
                if need:
                    maskedT = _elem_masked(offs_m[None, :], offs_n[:, None], S_k, LTS, LTE, UTS, UTE,
                                           CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)
                    pT = tl.where(maskedT, 0.0, pT)
                dv += tl.dot(pT.to(do.dtype), do, input_precision=DOT_PREC)
                dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)  # [BLOCK_N, BLOCK_M]
                dsT = pT * (dpT - delta[None, :])
                dk += tl.dot(dsT.to(q.dtype), q, input_precision=DOT_PREC)
                if ATOMIC_DQ:
                    dq = tl.dot(tl.trans(dsT.to(k.dtype)), k, input_precision=DOT_PREC) * sm_scale
                    tl.atomic_add(DQh + offs_m[:, None] * sdqs + offs_d[None, :], dq, mask=q_mask, sem="relaxed")

    tl.store(DK + b * sdkb + hk * sdkh + offs_n[:, None] * sdks + offs_d[None, :],
             (dk * sm_scale).to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + b * sdvb + hk * sdvh + offs_n[:, None] * sdvs + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _flashmask_bwd_dq_kernel(
    Q, K, V, DO, LSE2, DELTA, DQ, LTS, LTE, UTS, UTE, MM,
    sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sdob, sdos, sdoh, sdqb, sdqs, sdqh,
    S_q, S_k, H_q, H_mask, G, NB, mm_vec_stride, qk_scale, sm_scale,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    NB_POW2: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_LTE: tl.constexpr,
    HAS_UT: tl.constexpr, HAS_UTS: tl.constexpr, DOT_PREC: tl.constexpr,
):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H_q
    h = bh % H_q
    hk = h // G
    hm = h // (H_q // H_mask)
    bm = b * H_mask + hm
    r0 = pid_m * BLOCK_M
    r1 = tl.minimum(r0 + BLOCK_M, S_q)
    offs_m = r0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    rmask = offs_m < S_q
    q_mask = rmask[:, None] & dmask[None, :]
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqs + offs_d[None, :], mask=q_mask, other=0.0)
    do = tl.load(DO + b * sdob + h * sdoh + offs_m[:, None] * sdos + offs_d[None, :], mask=q_mask, other=0.0)
    lse2 = tl.load(LSE2 + bh * S_q + offs_m, mask=rmask, other=float("inf"))
    delta = tl.load(DELTA + bh * S_q + offs_m, mask=rmask, other=0.0)
    K += b * skb + hk * skh
    V += b * svb + hk * svh
    MMb = MM + bm * NB
    vec_off = bm * S_k
    LTS += vec_off
    LTE += vec_off
    UTS += vec_off
    UTE += vec_off
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo, hi = _key_block_range(r0, r1, MMb, mm_vec_stride, NB, BLOCK_N, NB_POW2,
                              CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)
    for n in range(lo, hi):
        c0 = n * BLOCK_N
        skip, need = _tile_class(r0, r1, c0, n, MMb, mm_vec_stride, S_k, BLOCK_N,
                                 CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)
        if not skip:
            offs_n = c0 + tl.arange(0, BLOCK_N)
            kv_mask = (offs_n < S_k)[:, None] & dmask[None, :]
            k = tl.load(K + offs_n[:, None] * sks + offs_d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(V + offs_n[:, None] * svs + offs_d[None, :], mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale
            p = tl.math.exp2(s - lse2[:, None])
            if need:
                masked = _elem_masked(offs_m[:, None], offs_n[None, :], S_k, LTS, LTE, UTS, UTE,
                                      CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)
                p = tl.where(masked, 0.0, p)
            dp = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
            ds = p * (dp - delta[:, None])
            dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PREC)
    tl.store(DQ + b * sdqb + h * sdqh + offs_m[:, None] * sdqs + offs_d[None, :],
             (dq * sm_scale).to(DQ.dtype.element_ty), mask=q_mask)
