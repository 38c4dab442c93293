"""FlashMask forward kernel (Triton): FlashAttention-2 online softmax with column-interval tile skipping.

One program per (query block, batch * query head). Per query block the contiguous range of key blocks that
are not fully masked is found from the per-key-block min/max (``triton_prep``); inside it each tile is
classified with 8 scalars: fully masked -> skipped (no K/V load), partial -> element mask from the 4 column
vectors loaded once per tile, unmasked -> no mask math. Source: FlashMask v1 ``compute_attn_1rowblock_flashmask``
(PaddlePaddle/flash-attention ``csrc/flash_attn/src/flash_fwd_kernel.h``); flashmask.md §2.3.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_prep import _elem_masked, _key_block_range, _tile_class

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@triton.jit
def _flashmask_fwd_kernel(
    Q, K, V, O, LSE, LTS, LTE, UTS, UTE, MM,
    sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sob, sos, soh,
    S_q, S_k, H_q, H_mask, G, NB, mm_vec_stride, qk_scale,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    NB_POW2: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_LTE: tl.constexpr,
    HAS_UT: tl.constexpr, HAS_UTS: tl.constexpr, DOT_PREC: tl.constexpr,
):
    # heaviest (last, for causal) query blocks first: a cheap LPT order
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

    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqs + offs_d[None, :],
                mask=rmask[:, None] & dmask[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
    K += b * skb + hk * skh
    V += b * svb + hk * svh
    MMb = MM + bm * NB
    vec_off = bm * S_k
    LTS += vec_off
    LTE += vec_off
    UTS += vec_off
    UTE += vec_off

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    lo, hi = _key_block_range(r0, r1, MMb, mm_vec_stride, NB, BLOCK_N, NB_POW2,
                              CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)
    for n in range(lo, hi):
        c0 = n * BLOCK_N
        skip, need = _tile_class(r0, r1, c0, n, MMb, mm_vec_stride, S_k, BLOCK_N,
                                 CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)
        if not skip:
            offs_n = c0 + tl.arange(0, BLOCK_N)
            cmask = offs_n < S_k
            k = tl.load(K + offs_n[:, None] * sks + offs_d[None, :],
                        mask=cmask[:, None] & dmask[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale  # [BLOCK_M, BLOCK_N], log2 units
            if need:
                masked = _elem_masked(offs_m[:, None], offs_n[None, :], S_k, LTS, LTE, UTS, UTE,
                                      CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)
                s = tl.where(masked, float("-inf"), s)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
            alpha = tl.math.exp2(m_i - m_safe)
            p = tl.math.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + offs_n[:, None] * svs + offs_d[None, :],
                        mask=cmask[:, None] & dmask[None, :], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
            m_i = m_new

    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    tl.store(O + b * sob + h * soh + offs_m[:, None] * sos + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=rmask[:, None] & dmask[None, :])
    tl.store(LSE + bh * S_q + offs_m, lse, mask=rmask)
