"""FlashMask backward in Gluon for Hopper at head dim 256: FlashAttention-3's split of a 64-key block.

At D = 256 the layout of :mod:`gluon_bwd` (each consumer warpgroup owning 64 keys' dK and dV) needs 256 fp32
accumulator registers per thread, over the 240 a consumer has. FlashAttention-3 runs its head-dim-256 backward
on blocks of 64 keys and splits them differently, and so does this kernel. One program per (key block of
``BLOCK_N`` = 64 keys, batch * KV head); two consumer warpgroups ``w`` (4 warps, 240 registers each) and a loader
(4 warps, 24 registers):

- **S and dP by keys:** consumer ``w`` computes S = Q K_w^T and dP = dO V_w^T for its 32 keys and all 64
  queries of the visited block ([64, 32] accumulators), P and dS = P (dP - Delta) from them (element mask on
  partial blocks only; LSE and Delta are per query row, two values per thread), and writes P^T and dS^T into its
  32 rows of one shared [64 keys, 64 queries] tile each (``ds_ready`` / ``ds_free`` mbarriers, two arrivals each);
- **dV, dK and dQ by head dims:** consumer ``w`` owns head dims ``[128 w, 128 w + 128)`` of the block's dV and dK
  (dV += P^T dO, dK += dS^T Q over all 64 keys: 2 x 64 accumulator registers) and of dQ = dS K, computed as two
  64 x 64 tiles (``triton_bwd.DQ_TILE_BASES``), each added into the fp32 ``dq_accum`` by one 16 KB TMA reduce-add
  from the consumer's staging tile while the next product runs;
- **loader:** TMA loads of Q, LSE and Delta into a two-stage ring and of dO into one stage (shared memory: K, V
  64 KB, Q 64 KB, dO 32 KB, P^T and dS^T 16 KB, dQ staging 32 KB = 208 of the 227 KB; a second dO stage does not
  fit). Each consumer releases dO as soon as its dV product is done, so the next dO load runs under the dK and
  dQ products.

The visit lists, their order (longest first) and the dQ accumulator are those of :mod:`gluon_bwd`, at tiles
(64, 64). dQ is summed by reduce-adds in the order the tiles finish, so it is not bitwise reproducible:
``deterministic=True`` keeps the Triton kernels.

Source: FlashAttention-3's head-dim-256 backward (Shah et al., 2024; ``hopper/flash_bwd_launch_template.h``,
64 x 64 tiles, two MMA warpgroups, dK / dV split by head dim) and FlashMask V3's block lists (flashmask.md
§2.5-2.6); math and names as ``triton_bwd``.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from . import launch_cache
from .gluon_bwd import (DQ_BOX, _tma_reduce_add, _visit, check_operands, dq_tile_layout, element_mask,
                        key_block_program, mask_columns, rows_per_chunk, tensor_desc)
from .triton_bwd import DQ_TILE as _DQ_TILE
from .triton_launch import dq_from_tiles

BLOCK_M = gl.constexpr(64)  # query rows per visited block
BLOCK_N = gl.constexpr(64)  # keys per program (32 per consumer warpgroup in S and dP)
HEAD_DIM = 256
DQ_TILE = gl.constexpr(_DQ_TILE)  # rows and columns of a dQ accumulator tile
NS_Q = gl.constexpr(2)  # stages of the Q / LSE / Delta ring; dO has one


@gluon.jit
def _load_q(t, q_desc, lse_desc, delta_desc, q_bufs, lse_bufs, delta_bufs, q_ready, IDX, n_part, n_tot, f_lo, b, hk,
            S_q, H_q, G: gl.constexpr, D: gl.constexpr, pred):
    g, i, m = _visit(IDX, n_part, n_tot, f_lo, t)
    h = hk * G + g
    s = t % NS_Q
    bar = q_ready.index(s)
    lse_row = (b * H_q + h) * (S_q // BLOCK_M) + m
    mbarrier.expect(bar, q_desc.block_type.nbytes + 2 * lse_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(q_desc, [b * S_q + m * BLOCK_M, h * D], bar, q_bufs.index(s), pred=pred)
    tma.async_copy_global_to_shared(lse_desc, [lse_row, 0], bar, lse_bufs.index(s), pred=pred)
    tma.async_copy_global_to_shared(delta_desc, [lse_row, 0], bar, delta_bufs.index(s), pred=pred)


@gluon.jit
def _loader(q_desc, do_desc, lse_desc, delta_desc, q_bufs, do_buf, lse_bufs, delta_bufs, q_ready, q_empty, do_ready,
            do_empty, IDX, n_part, n_tot, f_lo, b, hk, S_q, H_q, G: gl.constexpr, D: gl.constexpr):
    n_visits = G * n_tot
    _load_q(0, q_desc, lse_desc, delta_desc, q_bufs, lse_bufs, delta_bufs, q_ready, IDX, n_part, n_tot, f_lo, b, hk,
            S_q, H_q, G, D, n_visits > 0)
    for t in range(n_visits):
        # dO of visit t once both consumers finished visit t - 1's dV, then Q of visit t + 1 (its slot is freed
        # later, by visit t - 1's dK)
        g, i, m = _visit(IDX, n_part, n_tot, f_lo, t)
        mbarrier.wait(do_empty, (t & 1) ^ 1)
        mbarrier.expect(do_ready, do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(do_desc, [b * S_q + m * BLOCK_M, (hk * G + g) * D], do_ready, do_buf)
        j = t + 1
        if j < n_visits:
            mbarrier.wait(q_empty.index(j % NS_Q), ((j // NS_Q) & 1) ^ 1)
            _load_q(j, q_desc, lse_desc, delta_desc, q_bufs, lse_bufs, delta_bufs, q_ready, IDX, n_part, n_tot, f_lo,
                    b, hk, S_q, H_q, G, D, True)


@gluon.jit
def _dq_tile(dq, dq_w, dq_desc, tile):
    """Stage a [64, 64] dQ product in this warpgroup's tile and add it into ``dq_accum`` (tile number ``tile``)."""
    tma.store_wait(0)  # the previous reduce-add has read dq_w
    dq_w._reinterpret(gl.float32, [DQ_TILE, DQ_TILE], dq_tile_layout()).store(dq)
    fence_async_shared()
    gl.thread_barrier()  # this warpgroup's 4 warps (the partition) stored and fenced
    _tma_reduce_add(dq_desc, [tile * dq_w.shape[0], 0], dq_w)


@gluon.jit
def _consumer(w: gl.constexpr, kv_bar, k_smem, v_smem, q_bufs, do_buf, lse_bufs, delta_bufs, q_ready, q_empty,
              do_ready, do_empty, pt_smem, dst_smem, ds_ready, ds_free, dq_bufs, dq_desc, dq_tile0, NUM_M, dk_desc,
              dv_desc, kv_row, kv_col, IDX, n_part, n_tot, f_lo, n, LTS, LTE, UTS, UTE, vec_off, qk_scale, sm_scale,
              G: gl.constexpr, D: gl.constexpr, CAUSAL: gl.constexpr, HAS_MASK: gl.constexpr,
              HAS_LTE: gl.constexpr, HAS_UT: gl.constexpr, HAS_UTS: gl.constexpr):
    KW: gl.constexpr = BLOCK_N // 2  # keys of this warpgroup's S and dP columns
    DW: gl.constexpr = D // 2  # head dims of this warpgroup's dK, dV and dQ
    mbarrier.wait(kv_bar, 0)  # K / V in shared memory (each reader observes the barrier itself)
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, KW, 16])
    mma_kd: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DW, 16])
    mma_dq: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                     instr_shape=[16, DQ_TILE, 16])
    row_l: gl.constexpr = gl.SliceLayout(1, mma_s)
    dt: gl.constexpr = q_bufs.dtype
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    k_w = k_smem.slice(w * KW, KW, dim=0)  # [KW keys, D]
    v_w = v_smem.slice(w * KW, KW, dim=0)
    dq_w = dq_bufs.index(w)  # this warpgroup's fp32 dQ tile as the reduce-add moves it: [16, 256], unswizzled
    NPARTS: gl.constexpr = D // DQ_TILE
    dk = gl.zeros([BLOCK_N, DW], gl.float32, layout=mma_kd)
    dv = gl.zeros([BLOCK_N, DW], gl.float32, layout=mma_kd)
    zero_s = gl.zeros([BLOCK_M, KW], gl.float32, layout=mma_s)
    zero_dq = gl.zeros([BLOCK_M, DQ_TILE], gl.float32, layout=mma_dq)
    offs_q = gl.arange(0, BLOCK_M, layout=row_l)
    keys = n * BLOCK_N + w * KW + gl.arange(0, KW, layout=gl.SliceLayout(0, mma_s))
    lts, lte, uts, ute = mask_columns(LTS, LTE, UTS, UTE, vec_off, keys, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)
    n_visits = G * n_tot
    for t in range(n_visits):
        g, i, m = _visit(IDX, n_part, n_tot, f_lo, t)
        s = t % NS_Q
        mbarrier.wait(q_ready.index(s), (t // NS_Q) & 1)
        q_s = q_bufs.index(s)
        s_acc = warpgroup_mma(q_s, k_w.permute((1, 0)), zero_s, use_acc=False)  # [BLOCK_M queries, KW keys]
        lse = lse_bufs.index(s)._reinterpret(gl.float32, [BLOCK_M], flat).load(row_l)  # log2 units, +inf if empty
        p = gl.exp2(s_acc * qk_scale - lse[:, None])
        if i < n_part:  # a partially masked block: the element mask (FlashMask's LTS/LTE/UTS/UTE, causal)
            masked = element_mask((m * BLOCK_M + offs_q)[:, None], keys[None, :], lts[None, :], lte[None, :],
                                  uts[None, :], ute[None, :], CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)
            p = gl.where(masked, 0.0, p)
        mbarrier.wait(do_ready, t & 1)
        dp = warpgroup_mma(do_buf, v_w.permute((1, 0)), zero_s, use_acc=False)
        delta = delta_bufs.index(s)._reinterpret(gl.float32, [BLOCK_M], flat).load(row_l)
        ds = (p * (dp - delta[:, None])).to(dt)
        # P^T and dS^T of this warpgroup's keys into its rows of the shared tiles; the other warpgroup's rows
        # complete them
        mbarrier.wait(ds_free, (t & 1) ^ 1)
        pt_smem.slice(w * KW, KW, dim=0).permute((1, 0)).store(p.to(dt))
        dst_smem.slice(w * KW, KW, dim=0).permute((1, 0)).store(ds)
        fence_async_shared()
        gl.thread_barrier()  # this warpgroup's 4 warps (the partition) stored and fenced
        mbarrier.arrive(ds_ready, count=1)
        mbarrier.wait(ds_ready, t & 1)
        dv = warpgroup_mma(pt_smem, do_buf.slice(w * DW, DW, dim=1), dv, is_async=True)
        dk = warpgroup_mma(dst_smem, q_s.slice(w * DW, DW, dim=1), dk, is_async=True)
        dq = warpgroup_mma(dst_smem.permute((1, 0)), k_smem.slice(w * DW, DQ_TILE, dim=1), zero_dq, use_acc=False,
                           is_async=True)
        dv = warpgroup_mma_wait(2, deps=[dv])
        mbarrier.arrive(do_empty, count=1)  # one of the two consumers' arrivals: the next dO may load
        dq, dk = warpgroup_mma_wait(0, deps=[dq, dk])
        mbarrier.arrive(q_empty.index(s), count=1)
        tile = (dq_tile0 + g * NUM_M + m) * NPARTS + 2 * w
        _dq_tile(dq, dq_w, dq_desc, tile)
        dq = warpgroup_mma(dst_smem.permute((1, 0)), k_smem.slice(w * DW + DQ_TILE, DQ_TILE, dim=1), zero_dq,
                           use_acc=False, is_async=True)
        dq = warpgroup_mma_wait(0, deps=[dq])
        mbarrier.arrive(ds_free, count=1)
        _dq_tile(dq, dq_w, dq_desc, tile + 1)
    # K and V stage this warpgroup's head dims of dK and dV for the TMA stores, once the other warpgroup's last
    # products (which read all of K and V) are done
    if n_visits > 0:
        mbarrier.wait(ds_free, (n_visits - 1) & 1)
    k_out = k_smem.slice(w * DW, DW, dim=1)
    v_out = v_smem.slice(w * DW, DW, dim=1)
    k_out.store((dk * sm_scale).to(dt))
    v_out.store(dv.to(dt))
    fence_async_shared()
    gl.thread_barrier()
    tma.async_copy_shared_to_global(dk_desc, [kv_row, kv_col + w * DW], k_out)
    tma.async_copy_shared_to_global(dv_desc, [kv_row, kv_col + w * DW], v_out)
    tma.store_wait(0)


@gluon.jit
def flashmask_bwd_gluon_d256_kernel(
    q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, lse_desc, delta_desc, dq_desc, LTS, LTE, UTS, UTE,
    IDX, NPART, NFULL, FLO, ORDER, S_q, S_k, H_q, H_k, H_mask, NUM_N, NUM_M, ROWS, HC, qk_scale, sm_scale,
    G: gl.constexpr, D: gl.constexpr, CAUSAL: gl.constexpr, HAS_MASK: gl.constexpr, HAS_LTE: gl.constexpr,
    HAS_UT: gl.constexpr, HAS_UTS: gl.constexpr,
):
    """dK, dV (scaled, stored) and the unscaled fp32 dQ sum of one 64-key block of one KV head, D = 256.

    Grid ``(B * H_k * S_k // BLOCK_N,)`` in the order of ``gluon_bwd.lpt_program``; ``num_warps=4`` plus two 4-warp
    workers, ``maxnreg=168`` (consumers 240 registers each, loader 24). Descriptors over ``[B*S, H*D]`` views:
    q / do / k / v boxes ``[64, 256]``, dk / dv ``[64, 128]``; lse (log2 units, +inf on empty rows) and delta fp32
    ``[B*H_q*S_q/64, 64]``, unswizzled boxes ``[1, 64]``; dq as in ``gluon_bwd`` (unswizzled ``[16, 256]`` boxes
    over the tiled accumulator). Lists and order: ``MaskVectors.block_lists(64, 64, by_key=True)`` and
    ``visit_order(64, 64, by_key=True)``. Needs ``S_q % 64 == 0``, ``S_k % 64 == 0``.
    """
    b, hk, bm, n, IDX_row, n_part, n_tot, f_lo = key_block_program(ORDER, IDX, NPART, NFULL, FLO, NUM_N, NUM_M, ROWS,
                                                                    HC, H_q, H_k, H_mask, G, HAS_MASK)
    dt: gl.constexpr = q_desc.dtype
    k_smem = gl.allocate_shared_memory(dt, [BLOCK_N, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dt, [BLOCK_N, D], v_desc.layout)
    q_bufs = gl.allocate_shared_memory(dt, [NS_Q, BLOCK_M, D], q_desc.layout)
    do_buf = gl.allocate_shared_memory(dt, [BLOCK_M, D], do_desc.layout)
    lse_bufs = gl.allocate_shared_memory(gl.float32, [NS_Q, 1, BLOCK_M], lse_desc.layout)
    delta_bufs = gl.allocate_shared_memory(gl.float32, [NS_Q, 1, BLOCK_M], delta_desc.layout)
    pd_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dt)
    pt_smem = gl.allocate_shared_memory(dt, [BLOCK_N, BLOCK_M], pd_layout)  # P^T of the visit
    dst_smem = gl.allocate_shared_memory(dt, [BLOCK_N, BLOCK_M], pd_layout)  # dS^T of the visit
    dq_bufs = gl.allocate_shared_memory(gl.float32, [2] + dq_desc.block_type.shape, dq_desc.layout)  # per warpgroup
    ds_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    do_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [NS_Q, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [NS_Q, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    mbarrier.init(do_ready, count=1)
    for i in gl.static_range(NS_Q):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=2)  # both consumers release a slot
    mbarrier.init(do_empty, count=2)
    mbarrier.init(ds_ready, count=2)
    mbarrier.init(ds_free, count=2)
    kv_row = b * S_k + n * BLOCK_N
    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [kv_row, hk * D], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [kv_row, hk * D], kv_bar, v_smem)
    vec_off = bm * S_k
    dq_tile0 = (b * H_q + hk * G) * NUM_M  # the dQ tile of query head hk * G, query block 0 (times D // 64)
    gl.warp_specialize([
        (_consumer, (0, kv_bar, k_smem, v_smem, q_bufs, do_buf, lse_bufs, delta_bufs, q_ready, q_empty, do_ready,
                     do_empty, pt_smem, dst_smem, ds_ready, ds_free, dq_bufs, dq_desc, dq_tile0, NUM_M, dk_desc,
                     dv_desc, kv_row, hk * D, IDX_row, n_part, n_tot, f_lo, n, LTS, LTE, UTS, UTE, vec_off, qk_scale,
                     sm_scale, G, D, CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)),
        (_consumer, (1, kv_bar, k_smem, v_smem, q_bufs, do_buf, lse_bufs, delta_bufs, q_ready, q_empty, do_ready,
                     do_empty, pt_smem, dst_smem, ds_ready, ds_free, dq_bufs, dq_desc, dq_tile0, NUM_M, dk_desc,
                     dv_desc, kv_row, hk * D, IDX_row, n_part, n_tot, f_lo, n, LTS, LTE, UTS, UTE, vec_off, qk_scale,
                     sm_scale, G, D, CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)),
        (_loader, (q_desc, do_desc, lse_desc, delta_desc, q_bufs, do_buf, lse_bufs, delta_bufs, q_ready, q_empty,
                   do_ready, do_empty, IDX_row, n_part, n_tot, f_lo, b, hk, S_q, H_q, G, D)),
    ], [4, 4], [240, 24])


def launch(do, q, k, v, lse2, delta, dq_accum, lists, order, mv, causal: bool, scale: float, log2e: float):
    """Host side of the D = 256 kernel, as ``gluon_bwd.launch``: returns ``(dq, dk, dv)`` like q, k, v.

    ``lists`` / ``order``: ``mv.block_lists(64, 64, by_key=True)`` / ``mv.visit_order(64, 64, by_key=True)``.

    Raises:
        ValueError: D other than 256, ``S_q`` or ``S_k`` not a multiple of 64, or a tensor that is not contiguous
            bf16 / fp16 (named in the message).
    """
    bm, bn = BLOCK_M.value, BLOCK_N.value
    b, s_q, h_q, d = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    if d != HEAD_DIM or s_q % bm or s_k % bn:
        raise ValueError(f"gluon_bwd256.launch: needs head dim {HEAD_DIM}, S_q % {bm} == 0 and S_k % {bn} == 0; "
                         f"got D={d}, S_q={s_q}, S_k={s_k}")
    check_operands("gluon_bwd256.launch", do, q, k, v)
    desc = tensor_desc
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    idx, n_part, n_full, full_lo, _ = lists  # [L, NUM_N, NUM_M], [L, NUM_N] x 4
    lrows = b * h_q * s_q // bm
    g = h_q // h_k
    hc = rows_per_chunk(2 * g * s_q * d * q.element_size(), b * h_k)  # a KV head streams its group's Q and dO
    launch_cache.launch(flashmask_bwd_gluon_d256_kernel, (b * h_k * (s_k // bn),),
        desc(q, b * s_q, h_q * d, [bm, d]), desc(k, b * s_k, h_k * d, [bn, d]), desc(v, b * s_k, h_k * d, [bn, d]),
        desc(do, b * s_q, h_q * d, [bm, d]), desc(dk, b * s_k, h_k * d, [bn, d // 2]),
        desc(dv, b * s_k, h_k * d, [bn, d // 2]), desc(lse2, lrows, bm, [1, bm], swizzle=False),
        desc(delta, lrows, bm, [1, bm], swizzle=False),
        desc(dq_accum, dq_accum.numel() // DQ_BOX[1], DQ_BOX[1], DQ_BOX, swizzle=False), mv.lts, mv.lte, mv.uts,
        mv.ute, idx, n_part, n_full, full_lo, order, s_q, s_k, h_q, h_k, mv.h_mask, idx.shape[1], idx.shape[2],
        b * h_k, hc, scale * log2e, scale, G=g, D=d, CAUSAL=causal, HAS_MASK=mv.has_mask, HAS_LTE=mv.has_lte,
        HAS_UT=mv.has_ut, HAS_UTS=mv.has_uts, num_warps=4, maxnreg=168)
    return dq_from_tiles(dq_accum, scale, q.dtype, q.shape), dk, dv
