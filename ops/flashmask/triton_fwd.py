"""FlashMask forward kernel (Triton): FlashAttention-2 online softmax over a per-query-block list of key blocks.

One program per (query block, batch * query head). The key blocks to visit come from the tile classification
(``triton_prep.MaskVectors.block_lists``: built on device from the per-key-block min/max of the 4 vectors):
first the partially masked ones (element mask from the 4 column vectors, loaded once per tile), then the
unmasked ones (no mask math). Fully masked blocks are not listed, so their K/V are never loaded. Two
branch-free loops keep Triton's software pipelining intact; when the unmasked blocks form one contiguous run
(``FLO >= 0``, nearly every row of the common masks) the second loop walks that range directly instead of
the list. Source: FlashMask v1 ``compute_attn_1rowblock_flashmask`` (PaddlePaddle/flash-attention
``csrc/flash_attn/src/flash_fwd_kernel.h``)
and V3's per-m-block block list (flashmask.md §2.3-2.4).

Loads: ``EVEN`` launches (S_q, S_k multiples of the tiles, D a power of two) drop every bounds predicate; with
``TMA`` (EVEN launches on Hopper) Q, K and V come through 2-D tensor descriptors over ``[B*S, H*D]``, which
measured 7-9 % faster than pointer loads on the H200 (docs/kernel_notes.md).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_prep import _elem_masked, _load, _store, _visit_list


@triton.jit
def _fwd_tile(acc, m_i, l_i, q, K, V, n, offs_m, offs_d, dmask, sks, svs, S_k, LTS, LTE, UTS, UTE, qk_scale,
              kv_row, kv_col, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
              HAS_MASK: tl.constexpr, HAS_LTE: tl.constexpr, HAS_UT: tl.constexpr, HAS_UTS: tl.constexpr,
              DOT_PREC: tl.constexpr, EVEN: tl.constexpr, TMA: tl.constexpr):
    """One key block of the online softmax; ``MASKED`` tiles get the element mask (log2 units). With ``TMA``,
    K and V are 2-D tensor descriptors over ``[B*S_k, H_k*D]`` and the block sits at ``(kv_row + n*BLOCK_N,
    kv_col)``."""
    offs_n = n * BLOCK_N + tl.arange(0, BLOCK_N)
    if TMA:
        k = K.load([kv_row + n * BLOCK_N, kv_col])  # [BLOCK_N, BLOCK_D]
        v = V.load([kv_row + n * BLOCK_N, kv_col])
    else:
        kv_mask = (offs_n < S_k)[:, None] & dmask[None, :]
        k = _load(K + offs_n[:, None] * sks + offs_d[None, :], kv_mask, 0.0, EVEN)  # [BLOCK_N, BLOCK_D]
        v = _load(V + offs_n[:, None] * svs + offs_d[None, :], kv_mask, 0.0, EVEN)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale  # [BLOCK_M, BLOCK_N]
    if MASKED:
        masked = _elem_masked(offs_m[:, None], offs_n[None, :], S_k, LTS, LTE, UTS, UTE,
                              CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS, EVEN)
        s = tl.where(masked, float("-inf"), s)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = m_new
    alpha = tl.math.exp2(m_i - m_safe)
    p = tl.math.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PREC)
    return acc, m_new, l_i


@triton.jit
def _flashmask_fwd_kernel(
    Q, K, V, O, LSE, LTS, LTE, UTS, UTE, IDX, NPART, NFULL, FLO,
    sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sob, sos, soh,
    S_q, S_k, H_q, H_mask, G, NUM_M, NUM_N, qk_scale,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_LTE: tl.constexpr,
    HAS_UT: tl.constexpr, HAS_UTS: tl.constexpr, DOT_PREC: tl.constexpr, EVEN: tl.constexpr, TMA: tl.constexpr,
):
    """O ``[B, S_q, H_q, D]`` and the natural-log LSE fp32 ``[B, H_q, S_q]`` (-inf on rows with no visible key) of
    one query block of one query head. Grid ``(query blocks, B * H_q)``, the last query blocks first: under a
    causal mask they are the heaviest, so the light ones fill the tail of the launch."""
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
    kv_row = b * S_k  # TMA block coordinates in the [B*S, H*D] views
    kv_col = hk * D
    if TMA:
        q = Q.load([b * S_q + pid_m * BLOCK_M, h * D])  # [BLOCK_M, BLOCK_D]
    else:
        q = _load(Q + b * sqb + h * sqh + offs_m[:, None] * sqs + offs_d[None, :],
                  rmask[:, None] & dmask[None, :], 0.0, EVEN)  # [BLOCK_M, BLOCK_D]
        K += b * skb + hk * skh
        V += b * svb + hk * svh
    vec_off = bm * S_k
    LTS += vec_off
    LTE += vec_off
    UTS += vec_off
    UTE += vec_off
    IDX, n_part, n_full, f_lo = _visit_list(IDX, NPART, NFULL, FLO, pid_m, bm, NUM_M, NUM_N, HAS_MASK)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for i in range(0, n_part):
        n = tl.load(IDX + i)
        acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q, K, V, n, offs_m, offs_d, dmask, sks, svs, S_k,
                                  LTS, LTE, UTS, UTE, qk_scale, kv_row, kv_col, BLOCK_N, True,
                                  CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS, DOT_PREC, EVEN, TMA)
    if f_lo >= 0:  # unmasked blocks form one run: affine addresses, best pipelining
        for n in range(f_lo, f_lo + n_full):
            acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q, K, V, n, offs_m, offs_d, dmask, sks, svs, S_k,
                                      LTS, LTE, UTS, UTE, qk_scale, kv_row, kv_col, BLOCK_N, False,
                                      CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS, DOT_PREC, EVEN, TMA)
    else:
        for i in range(n_part, n_part + n_full):
            n = tl.load(IDX + i)
            acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q, K, V, n, offs_m, offs_d, dmask, sks, svs, S_k,
                                      LTS, LTE, UTS, UTE, qk_scale, kv_row, kv_col, BLOCK_N, False,
                                      CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS, DOT_PREC, EVEN, TMA)

    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    _store(O + b * sob + h * soh + offs_m[:, None] * sos + offs_d[None, :], out.to(O.dtype.element_ty),
           rmask[:, None] & dmask[None, :], EVEN)
    _store(LSE + bh * S_q + offs_m, lse, rmask, EVEN)
