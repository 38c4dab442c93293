"""FlashMask forward in Gluon for Hopper: two consumer warpgroups and a TMA loader.

The Triton forward (``triton_fwd``) runs a 128-row query block on 8 warps that move in lockstep: both
warpgroups issue S = Q K^T, wait, do the softmax arithmetic, issue O += P V, wait, so the tensor cores idle while
the exponentials run. This kernel keeps them busy the way FlashAttention-3 does: one program per (query block of
``BLOCK_M`` = 128 rows, batch * query head) with

- **consumer warpgroups** ``w = 0`` (the default partition) and ``w = 1`` (a worker), 4 warps and 240 registers
  each, each owning 64 query rows and never waiting for the other. For every listed key block ``t`` (``IDX``,
  the forward visit list of ``MaskVectors.block_lists``: partially masked blocks first, then unmasked ones) a
  consumer issues S_t = Q_w K_t^T and O_w += P_{t-1} V_{t-1} asynchronously, then runs the element mask (partial
  blocks only: causal, and FlashMask's LTS/LTE/UTS/UTE on the first ``n_vec_partial`` of them, the blocks the
  vectors may mask) and the online softmax (log2 units) of S_t while the P V product is still on the tensor
  cores (FlashAttention-3's intra-warpgroup overlap), then rescales O_w. At the end O_w / l goes to shared memory
  and out by a TMA store, LSE (natural log, -inf on rows with no visible key) by plain stores;
- **loader** (4 warps, 24 registers): Q once, then K and V of each listed block by TMA into an ``NS``-stage ring
  (separate K and V barriers, so S can start before V lands) that both consumers release. The overlap holds
  two ring slots per consumer (K_t and V_{t-1}), so it needs ``NS = 3`` to keep a load in flight.

Head dims 64, 128 and 256 (:func:`tiles`: 64-key blocks in a two-stage ring at 256). Programs start longest first
(``gluon_bwd.lpt_program`` over ``MaskVectors.visit_order``).

Source: FlashAttention-3's forward (Shah et al., 2024: producer / consumer warp specialisation, intra-warpgroup
overlap of softmax and products) and FlashMask V3's block lists (flashmask.md §2.3-2.4); math, names and outputs
as ``triton_fwd``. Measured on an H200 (docs/kernel_notes.md): 1.01-1.19x the Triton forward at D = 128, the
default on Hopper (``FLASHMASK_FWD``, ``dispatch.gluon_fwd_eligible``); a ping-pong schedule between the consumers
and the products without the overlap measured 0.96-1.14x.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from . import launch_cache
from .gluon_bwd import lpt_program, rows_per_chunk, tensor_desc, visit_list_row

BLOCK_M = gl.constexpr(128)  # query rows per program (64 per consumer warpgroup)
HEAD_DIMS = (64, 128, 256)


def tiles(d: int) -> tuple[int, int, int]:
    """``(BLOCK_M, BLOCK_N, STAGES)`` at head dim ``d``: 128-key blocks in a 3-stage K / V ring (the overlap holds
    two slots per consumer; 2 stages left no load in flight, slower), except D = 256, where a 128-key stage is
    128 KB of shared memory: 64-key blocks, 2 stages (with Q, 192 KB of the 227 KB)."""
    return (BLOCK_M.value, 64, 2) if d == 256 else (BLOCK_M.value, 128, 3)


@gluon.jit
def _key_block(IDX, n_part, f_lo, t):
    """Key block of visit ``t``: listed, or computed when the unmasked blocks form one run (``f_lo >= 0``)."""
    if (t >= n_part) & (f_lo >= 0):
        n = f_lo + (t - n_part)
    else:
        n = gl.load(IDX + t)
    return n


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, v_ready, kv_empty, IDX, n_part, n_tot,
            f_lo, q_row, q_col, kv_row, kv_col):
    NS: gl.constexpr = k_bufs.type.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
    HALF: gl.constexpr = BLOCK_M // 2
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, q_col], q_bar, q_smem.index(0))
    tma.async_copy_global_to_shared(q_desc, [q_row + HALF, q_col], q_bar, q_smem.index(1))
    for t in range(n_tot):
        s = t % NS
        mbarrier.wait(kv_empty.index(s), ((t // NS) & 1) ^ 1)  # both consumers are done with visit t - NS
        n = _key_block(IDX, n_part, f_lo, t)
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv_row + n * BLOCK_N, kv_col], k_ready.index(s), k_bufs.index(s))
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [kv_row + n * BLOCK_N, kv_col], v_ready.index(s), v_bufs.index(s))


@gluon.jit
def _softmax_tile(sc, m_i, l_i, t, rows, IDX, n_part, f_lo, n_vec, LTS, LTE, UTS, UTE, vec_off,
                  CAUSAL: gl.constexpr, HAS_MASK: gl.constexpr, HAS_LTE: gl.constexpr, HAS_UT: gl.constexpr,
                  HAS_UTS: gl.constexpr):
    """Online-softmax step for scores ``sc`` [64, BLOCK_N] (log2 units) of visit ``t``: the element mask on
    partially masked blocks (the vectors only on the first ``n_vec`` visits; rows that see nothing yet keep a
    zero row max), then ``(p, alpha, m_new, l_new)``."""
    if t < n_part:
        BLOCK_N: gl.constexpr = sc.type.shape[1]
        n = _key_block(IDX, n_part, f_lo, t)
        cols = n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, sc.type.layout))
        r = rows[:, None]
        if CAUSAL:
            sc = gl.where(cols[None, :] > r, float("-inf"), sc)
        if HAS_MASK:
            if t < n_vec:  # the other partial blocks (mostly causal diagonals) skip the vector loads
                masked = r >= gl.load(LTS + vec_off + cols)[None, :]
                if HAS_LTE:
                    masked = masked & (r < gl.load(LTE + vec_off + cols)[None, :])
                if HAS_UT:
                    up = r < gl.load(UTE + vec_off + cols)[None, :]
                    if HAS_UTS:
                        up = up & (r >= gl.load(UTS + vec_off + cols)[None, :])
                    masked = masked | up
                sc = gl.where(masked, float("-inf"), sc)
        m_new = gl.maximum(m_i, gl.max(sc, 1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new = gl.maximum(m_i, gl.max(sc, 1))
        m_safe = m_new
    alpha = gl.exp2(m_i - m_safe)
    p = gl.exp2(sc - m_safe[:, None])
    return p, alpha, m_new, l_i * alpha + gl.sum(p, 1)


@gluon.jit
def _consumer(w: gl.constexpr, q_smem, k_bufs, v_bufs, q_bar, k_ready, v_ready, kv_empty, o_desc, LSE, IDX, n_part,
              n_tot, f_lo, n_vec, row0, o_row, o_col, lse_off, LTS, LTE, UTS, UTE, vec_off, qk_scale,
              D: gl.constexpr, CAUSAL: gl.constexpr, HAS_MASK: gl.constexpr, HAS_LTE: gl.constexpr,
              HAS_UT: gl.constexpr, HAS_UTS: gl.constexpr):
    NS: gl.constexpr = k_bufs.type.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
    HALF: gl.constexpr = BLOCK_M // 2
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, BLOCK_N, 16])
    mma_o: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    p_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, mma_s)
    dt: gl.constexpr = q_smem.dtype
    q_w = q_smem.index(w)  # [HALF, D]: this warpgroup's rows; later the staging tile of its output
    rows = row0 + w * HALF + gl.arange(0, HALF, layout=row_s)
    m_i = gl.full([HALF], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.zeros([HALF], gl.float32, layout=row_s)
    acc = gl.zeros([HALF, D], gl.float32, layout=mma_o)
    zero_s = gl.zeros([HALF, BLOCK_N], gl.float32, layout=mma_s)
    mbarrier.wait(q_bar, 0)
    if n_tot > 0:  # FlashAttention-3's intra-warpgroup overlap: O += P_{t-1} V_{t-1} runs under softmax(S_t)
        mbarrier.wait(k_ready.index(0), 0)
        sc = warpgroup_mma(q_w, k_bufs.index(0).permute((1, 0)), zero_s, use_acc=False)
        p, alpha, m_i, l_i = _softmax_tile(sc * qk_scale, m_i, l_i, 0, rows, IDX, n_part, f_lo, n_vec, LTS, LTE,
                                           UTS, UTE, vec_off, CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)
        for t in range(1, n_tot):
            s = t % NS
            sp = (t - 1) % NS
            mbarrier.wait(k_ready.index(s), (t // NS) & 1)
            sc = warpgroup_mma(q_w, k_bufs.index(s).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            mbarrier.wait(v_ready.index(sp), ((t - 1) // NS) & 1)
            acc = warpgroup_mma(gl.convert_layout(p.to(dt), p_op), v_bufs.index(sp), acc, is_async=True)
            sc = warpgroup_mma_wait(1, deps=[sc])  # S_t done; P_{t-1} V_{t-1} may still run
            p, alpha, m_i, l_i = _softmax_tile(sc * qk_scale, m_i, l_i, t, rows, IDX, n_part, f_lo, n_vec, LTS,
                                               LTE, UTS, UTE, vec_off, CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)
            acc = warpgroup_mma_wait(0, deps=[acc])
            mbarrier.arrive(kv_empty.index(sp), count=1)  # one of the two consumers' arrivals
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, mma_o))[:, None]
        last = n_tot - 1
        mbarrier.wait(v_ready.index(last % NS), (last // NS) & 1)
        acc = warpgroup_mma(gl.convert_layout(p.to(dt), p_op), v_bufs.index(last % NS), acc)
        mbarrier.arrive(kv_empty.index(last % NS), count=1)
    empty = l_i == 0.0
    lse = gl.where(empty, float("-inf"), (m_i + gl.log2(gl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    gl.store(LSE + lse_off + rows, lse)
    out = acc / gl.convert_layout(gl.where(empty, 1.0, l_i), gl.SliceLayout(1, mma_o))[:, None]
    q_w.store(out.to(dt))
    fence_async_shared()
    gl.thread_barrier()  # this warpgroup's 4 warps (the partition)
    tma.async_copy_shared_to_global(o_desc, [o_row + w * HALF, o_col], q_w)
    tma.store_wait(0)


@gluon.jit
def flashmask_fwd_gluon_kernel(
    q_desc, k_desc, v_desc, o_desc, LSE, LTS, LTE, UTS, UTE, IDX, NPART, NFULL, FLO, NVEC, ORDER, S_q, S_k, H_q, H_mask,
    NUM_M, NUM_N, ROWS, HC, qk_scale, G: gl.constexpr, D: gl.constexpr, BLOCK_N: gl.constexpr, NS: gl.constexpr,
    CAUSAL: gl.constexpr,
    HAS_MASK: gl.constexpr, HAS_LTE: gl.constexpr, HAS_UT: gl.constexpr, HAS_UTS: gl.constexpr,
):
    """O (stored by TMA) and LSE of one query block of one query head.

    Grid ``(B * H_q * S_q // BLOCK_M,)`` in the order of ``gluon_bwd.lpt_program`` (``ORDER``: ``visit_order`` of
    the lists, int32 ``[L, NUM_M]``; ``ROWS`` = B * H_q, ``HC`` of them per chunk); ``num_warps=4``
    plus two 4-warp workers, ``maxnreg=168`` (the consumers get 240 registers each, the loader 24). Descriptors
    over ``[B*S, H*D]`` views: q / o boxes ``[BLOCK_M // 2, D]``, k / v ``[BLOCK_N, D]``; LSE fp32 ``[B, H_q,
    S_q]``. ``IDX`` / ``NPART`` / ``NFULL`` / ``FLO`` / ``NVEC``: the forward visit lists for ``(BLOCK_M,
    BLOCK_N)`` tiles.
    Needs ``S_q % BLOCK_M == 0``, ``S_k % BLOCK_N == 0``, D in ``HEAD_DIMS`` (tiles: :func:`tiles`).
    """
    rank, bh = lpt_program(gl.program_id(0), NUM_M, HC, ROWS)
    b = bh // H_q
    h = bh % H_q
    hk = h // G
    bm = b * H_mask + h // (H_q // H_mask)
    if HAS_MASK:
        pid_m = gl.load(ORDER + bm * NUM_M + rank)
    else:
        pid_m = gl.load(ORDER + rank)
    IDX_row, n_part, n_tot, f_lo = visit_list_row(IDX, NPART, NFULL, FLO, pid_m, bm, NUM_M, NUM_N, HAS_MASK)
    n_vec = 0  # how many of the partial blocks need the vectors (the rest only the causal mask)
    if HAS_MASK:
        n_vec = gl.load(NVEC + bm * NUM_M + pid_m)
    dt: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dt, [2, BLOCK_M // 2, D], q_desc.layout)
    k_bufs = gl.allocate_shared_memory(dt, [NS, BLOCK_N, D], k_desc.layout)
    v_bufs = gl.allocate_shared_memory(dt, [NS, BLOCK_N, D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(NS):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=2)  # both consumers release a slot
    row0 = pid_m * BLOCK_M
    q_row = b * S_q + row0
    gl.warp_specialize([
        (_consumer, (0, q_smem, k_bufs, v_bufs, q_bar, k_ready, v_ready, kv_empty, o_desc, LSE, IDX_row, n_part,
                     n_tot, f_lo, n_vec, row0, q_row, h * D, bh * S_q, LTS, LTE, UTS, UTE, bm * S_k, qk_scale, D,
                     CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)),
        (_consumer, (1, q_smem, k_bufs, v_bufs, q_bar, k_ready, v_ready, kv_empty, o_desc, LSE, IDX_row, n_part,
                     n_tot, f_lo, n_vec, row0, q_row, h * D, bh * S_q, LTS, LTE, UTS, UTE, bm * S_k, qk_scale, D,
                     CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)),
        (_loader, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, v_ready, kv_empty, IDX_row, n_part,
                   n_tot, f_lo, q_row, h * D, b * S_k, hk * D)),
    ], [4, 4], [240, 24])


def launch(q, k, v, lists, order, mv, causal: bool, scale: float, log2e: float):
    """Host side: descriptors and the launch; returns ``(o, lse)`` like ``triton_fwd`` (o like q, lse fp32
    ``[B, H_q, S_q]`` in natural-log units, -inf on rows with no visible key).

    Args:
        q, k, v: contiguous, 16-byte aligned ``[B, S, H, D]`` bf16 / fp16 on an sm_90 GPU, D in ``HEAD_DIMS``,
            ``S_q % 128 == 0``, ``S_k % 128 == 0`` (``dispatch.gluon_fwd_eligible`` checks all of it).
        lists: ``(idx, n_part, n_full, full_lo, n_vec)``, ``mv.block_lists(BLOCK_M, BLOCK_N, by_key=False)``;
        order: ``mv.visit_order(BLOCK_M, BLOCK_N, by_key=False)``.
        mv: ``triton_prep.MaskVectors`` of the call. causal, scale: as ``flashmask_attention``. log2e: log2(e).

    Raises:
        ValueError: a shape, dtype or layout outside the kernel's scope (named in the message).
    """
    b, s_q, h_q, d = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    bm, bn, stages = tiles(d)
    if d not in HEAD_DIMS or s_q % bm or s_k % bn:
        raise ValueError(f"gluon_fwd.launch: needs head dim 64, 128 or 256, S_q % {bm} == 0 and S_k % {bn} == 0; "
                         f"got D={d}, S_q={s_q}, S_k={s_k}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in (torch.bfloat16, torch.float16) or t.dtype != q.dtype or not t.is_contiguous():
            raise ValueError(f"gluon_fwd.launch: {name} must be contiguous {q.dtype} (bf16 or fp16); got "
                             f"{t.dtype}, strides {t.stride()}")
    o = torch.empty_like(q)
    lse = torch.empty(b, h_q, s_q, dtype=torch.float32, device=q.device)
    idx, n_part, n_full, full_lo, n_vec = lists  # [L, NUM_M, NUM_N], [L, NUM_M] x 4
    g = h_q // h_k
    hc = rows_per_chunk(2 * s_k * d * q.element_size() // g, b * h_q)  # a query head streams its share of K and V
    launch_cache.launch(flashmask_fwd_gluon_kernel, (b * h_q * (s_q // bm),),
        tensor_desc(q, b * s_q, h_q * d, [bm // 2, d]), tensor_desc(k, b * s_k, h_k * d, [bn, d]),
        tensor_desc(v, b * s_k, h_k * d, [bn, d]), tensor_desc(o, b * s_q, h_q * d, [bm // 2, d]), lse, mv.lts,
        mv.lte, mv.uts, mv.ute, idx, n_part, n_full, full_lo, n_vec, order, s_q, s_k, h_q, mv.h_mask, idx.shape[1],
        idx.shape[2], b * h_q, hc, scale * log2e, G=g, D=d, BLOCK_N=bn, NS=stages, CAUSAL=causal,
        HAS_MASK=mv.has_mask, HAS_LTE=mv.has_lte, HAS_UT=mv.has_ut, HAS_UTS=mv.has_uts, num_warps=4, maxnreg=168)
    return o, lse
