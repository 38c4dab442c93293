"""FlashMask backward in Gluon for Hopper: five products per tile, warp-specialised.

The Triton backward (``triton_bwd``) issues seven GEMM-sized products per (query block, key block) pair: S, dP,
dV, dK in the dK/dV kernel and S, dP, dQ again in the dQ kernel. FlashAttention-3 / FlashMask V3 issue five, with
dQ reduced outside the products' critical path. Triton cannot express that schedule (every way to issue five
products in one Triton kernel measured slower: docs/kernel_notes.md); Triton's Gluon dialect can. One program
per (key block of ``BLOCK_N`` = 128 keys, batch * KV head):

- **consumer warpgroups** ``w = 0`` (the default partition) and ``w = 1`` (a worker), 4 warps and 240 registers
  each, each owning 64 keys' dK and dV: for every listed query block (``IDX``, the dK/dV visit list of
  ``MaskVectors.block_lists``: partially masked blocks first, then unmasked ones; every query head of the GQA
  group in turn), S^T = K_w Q^T, P^T (element mask on partial blocks only), dP^T = V_w dO^T, dV += P^T dO
  (asynchronous, under the dS arithmetic), dS^T = P^T (dP^T - Delta), dK += dS^T Q (asynchronous, under the dS
  exchange). dQ is split by head-dim halves as in FlashAttention-3: both warpgroups write their dS^T rows into
  one double-buffered [128 keys, 64 queries] tile (``ds_ready`` / ``ds_free`` mbarriers, two arrivals each),
  then warpgroup ``w`` computes dQ[:, w*64 : w*64+64] = dS K[:, those columns] over all 128 keys and adds it
  into the fp32 ``dq_accum`` by one TMA reduce-add (``cp.reduce.async.bulk.tensor``) of 16 KB from its own fp32
  staging tile; the scaled cast to the output dtype is one pass afterwards (``triton_launch.dq_from_tiles``);
- **loader** (4 warps, 24 registers): TMA loads of Q, dO, LSE and Delta into a two-stage ring that both
  consumers release.

Why dQ is split by head-dim halves: each consumer adds one [64, 64] tile and nothing sums the two consumers'
partial tiles, so the reduce-add traffic is half that of per-consumer [64, 128] tiles (1.12-1.13x faster on an
H200); dV and dK run under the dS arithmetic and the dS exchange. At D = 64 a half (32 columns, 64 bytes) is
narrower than the 128-byte swizzle of a bf16 row and cannot be an MMA operand: there each consumer computes dQ
over its own 64 keys and all head dims from its own dS^T (no exchange) and both add their [64, 64] tiles.
``dq_accum`` holds one contiguous 64 x 64 tile per (batch, query head, query block, 64 head dims) in the order a
warpgroup's accumulator registers store without bank conflicts (``triton_bwd.DQ_TILE_BASES``; FlashAttention-3's
dQaccum): against q's ``[B, S, H, D]`` layout, which needs two reduce-adds per tile and two-way bank conflicts in
the staging stores, 1.047x forward+backward over V3's masks at 8K. It is zeroed by the Delta preprocessing pass.
Programs start longest first (:func:`lpt_program` over ``MaskVectors.visit_order``).

Source: FlashAttention-3's backward (Shah et al., 2024; ``hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp``) and
FlashMask V3's block lists (flashmask.md §2.5-2.6); math and names as ``triton_bwd``. Measured on an H200 at
D = 128: 1.28-1.33x the Triton backward (docs/kernel_notes.md). dQ is summed by reduce-adds in the order the tiles
finish, so it is not bitwise reproducible: ``deterministic=True`` keeps the Triton kernels.
"""

from __future__ import annotations

import torch
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime.jit import constexpr_function

from . import launch_cache
from .triton_bwd import DQ_TILE, DQ_TILE_BASES
from .triton_launch import dq_from_tiles

BLOCK_M = gl.constexpr(64)  # query rows per visited block
BLOCK_N = gl.constexpr(128)  # keys per program (64 per consumer warpgroup)
HEAD_DIMS = (64, 128)
DQ_BOX = [DQ_TILE * DQ_TILE // 256, 256]  # one dQ tile as one TMA box: 256 elements is a box's longest dimension


@builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """``tensor_desc[coord] += src`` (a shared-memory tile) by TMA (``cp.reduce.async.bulk.tensor ... .add``),
    asynchronous like ``tma.async_copy_shared_to_global``: ``tma.store_wait`` before ``src`` is written again.
    Gluon 3.6 has the op in its builder but not in ``gluon.language.nvidia.hopper.tma``; a Triton without it fails
    to compile, and ``dispatch.backward`` then falls back to the Triton backward."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@constexpr_function
def dq_tile_layout():
    """The shared layout of a 64 x 64 dQ tile staged for its reduce-add: the accumulator's own order
    (``triton_bwd.DQ_TILE_BASES``), so that each 8-byte store of a warp writes 256 contiguous bytes."""
    return gl.SharedLinearLayout([list(b) for b in DQ_TILE_BASES])


@gluon.jit
def visit_list_row(IDX, NPART, NFULL, FLO, blk, bm, NUM_BLK, NUM_OTHER, HAS_MASK: gl.constexpr):
    """The visit list of outer block ``blk`` (a key block here, a query block in ``gluon_fwd``):
    ``(IDX row, n_part, n_tot, f_lo)`` from ``MaskVectors.block_lists`` (one table of ``NUM_BLK`` rows per (batch,
    mask head) ``bm`` with a mask, one shared table without; each row ``NUM_OTHER`` long)."""
    lrow = blk
    if HAS_MASK:
        lrow += bm * NUM_BLK
    n_part = gl.load(NPART + lrow)
    return IDX + lrow * NUM_OTHER, n_part, n_part + gl.load(NFULL + lrow), gl.load(FLO + lrow)


@gluon.jit
def lpt_program(pid, NUM_BLK, HC, ROWS):
    """``(rank, row)`` of program ``pid`` of a 1-D grid of ``ROWS * NUM_BLK`` programs: the rows (batch x head)
    in chunks of ``HC`` whose operands fit in L2 together, and within a chunk rank-major (the ``rank``-th
    longest outer block of every row of the chunk, then the next rank): longest-processing-time-first order
    (``MaskVectors.visit_order`` maps the rank to the block) without spreading one wave over every head's Q."""
    per_chunk = HC * NUM_BLK
    c = pid // per_chunk
    r = pid - c * per_chunk
    hc = gl.minimum(HC, ROWS - c * HC)  # the last chunk may hold fewer rows
    rank = r // hc
    return rank, c * HC + (r - rank * hc)


@gluon.jit
def key_block_program(ORDER, IDX, NPART, NFULL, FLO, NUM_N, NUM_M, ROWS, HC, H_q, H_k, H_mask, G: gl.constexpr,
                      HAS_MASK: gl.constexpr):
    """What a backward program works on: ``(b, hk, bm, n, IDX row, n_part, n_tot, f_lo)``: its batch, KV head, mask
    head (every query head of the GQA group maps to it), key block (:func:`lpt_program` rank through ``ORDER``)
    and that block's visit list (:func:`visit_list_row`)."""
    rank, bhk = lpt_program(gl.program_id(0), NUM_N, HC, ROWS)
    b = bhk // H_k
    hk = bhk % H_k
    bm = b * H_mask + (hk * G) // (H_q // H_mask)
    if HAS_MASK:
        n = gl.load(ORDER + bm * NUM_N + rank)
    else:
        n = gl.load(ORDER + rank)
    IDX_row, n_part, n_tot, f_lo = visit_list_row(IDX, NPART, NFULL, FLO, n, bm, NUM_N, NUM_M, HAS_MASK)
    return b, hk, bm, n, IDX_row, n_part, n_tot, f_lo


def rows_per_chunk(row_bytes: int, rows: int) -> int:
    """``HC`` of :func:`lpt_program`: how many rows' streamed operands (``row_bytes`` each) share
    ``LPT_L2_BYTES`` of L2."""
    return max(1, min(rows, LPT_L2_BYTES // max(1, row_bytes)))


LPT_L2_BYTES = 16 << 20  # a third of an H100 / H200's 50 MB L2: the rest holds K, V, the lists and dQ traffic


@gluon.jit
def mask_columns(LTS, LTE, UTS, UTE, vec_off, keys, HAS_MASK: gl.constexpr, HAS_LTE: gl.constexpr,
                 HAS_UT: gl.constexpr, HAS_UTS: gl.constexpr):
    """``(lts, lte, uts, ute)`` of the keys ``keys`` (a program's columns, loaded once; a vector the mask does not
    have is never read and stands in as ``keys``)."""
    lts = keys
    lte = keys
    uts = keys
    ute = keys
    if HAS_MASK:
        lts = gl.load(LTS + vec_off + keys)
        if HAS_LTE:
            lte = gl.load(LTE + vec_off + keys)
        if HAS_UT:
            ute = gl.load(UTE + vec_off + keys)
            if HAS_UTS:
                uts = gl.load(UTS + vec_off + keys)
    return lts, lte, uts, ute


@gluon.jit
def element_mask(rows, keys, lts, lte, uts, ute, CAUSAL: gl.constexpr, HAS_MASK: gl.constexpr,
                 HAS_LTE: gl.constexpr, HAS_UT: gl.constexpr, HAS_UTS: gl.constexpr):
    """Which (query row, key) pairs FlashMask masks: the causal cut and the LTS/LTE/UTS/UTE intervals of each key
    column. ``rows`` and ``keys`` / the vectors come broadcast against each other (a tile in either orientation)."""
    masked = rows < 0
    if CAUSAL:
        masked = masked | (keys > rows)
    if HAS_MASK:
        down = rows >= lts
        if HAS_LTE:
            down = down & (rows < lte)
        masked = masked | down
        if HAS_UT:
            up = rows < ute
            if HAS_UTS:
                up = up & (rows >= uts)
            masked = masked | up
    return masked


@gluon.jit
def _visit(IDX, n_part, n_tot, f_lo, t):
    """Visit ``t`` of a program: (query head offset g in the GQA group, list position i, query block m).

    Unmasked blocks that form one contiguous run (``f_lo >= 0``, nearly every key block of the common masks) are
    computed, not loaded. A program with an empty list (n_tot = 0) issues no visit (its prologue is predicated
    off)."""
    g = t // gl.maximum(n_tot, 1)
    i = t - g * n_tot
    if (i >= n_part) & (f_lo >= 0):
        m = f_lo + (i - n_part)
    else:
        m = gl.load(IDX + i)
    return g, i, m


@gluon.jit
def _issue_loads(q_desc, do_desc, lse_desc, delta_desc, q_bufs, do_bufs, lse_bufs, delta_bufs, bar, slot, q_row,
                 q_col, lse_row, pred):
    nbytes: gl.constexpr = 2 * q_desc.block_type.nbytes + 2 * lse_desc.block_type.nbytes
    mbarrier.expect(bar, nbytes, pred=pred)
    tma.async_copy_global_to_shared(q_desc, [q_row, q_col], bar, q_bufs.index(slot), pred=pred)
    tma.async_copy_global_to_shared(do_desc, [q_row, q_col], bar, do_bufs.index(slot), pred=pred)
    tma.async_copy_global_to_shared(lse_desc, [lse_row, 0], bar, lse_bufs.index(slot), pred=pred)
    tma.async_copy_global_to_shared(delta_desc, [lse_row, 0], bar, delta_bufs.index(slot), pred=pred)


@gluon.jit
def _loads_for(t, q_desc, do_desc, lse_desc, delta_desc, q_bufs, do_bufs, lse_bufs, delta_bufs, q_ready, IDX, n_part,
               n_tot, f_lo, b, hk, S_q, H_q, G: gl.constexpr, D: gl.constexpr, pred):
    NS: gl.constexpr = q_bufs.type.shape[0]
    g, i, m = _visit(IDX, n_part, n_tot, f_lo, t)
    h = hk * G + g
    s = t % NS
    _issue_loads(q_desc, do_desc, lse_desc, delta_desc, q_bufs, do_bufs, lse_bufs, delta_bufs, q_ready.index(s), s,
                 b * S_q + m * BLOCK_M, h * D, (b * H_q + h) * (S_q // BLOCK_M) + m, pred)


@gluon.jit
def _loader(q_desc, do_desc, lse_desc, delta_desc, q_bufs, do_bufs, lse_bufs, delta_bufs, q_ready, q_empty, IDX, n_part,
            n_tot, f_lo, b, hk, S_q, H_q, G: gl.constexpr, D: gl.constexpr):
    NS: gl.constexpr = q_bufs.type.shape[0]
    n_visits = G * n_tot
    for t in gl.static_range(NS - 1):  # prologue: the first NS - 1 visits
        _loads_for(t, q_desc, do_desc, lse_desc, delta_desc, q_bufs, do_bufs, lse_bufs, delta_bufs, q_ready, IDX,
                   n_part, n_tot, f_lo, b, hk, S_q, H_q, G, D, t < n_visits)
    for t in range(n_visits):
        j = t + NS - 1  # load visit j while the consumers work on visit t
        if j < n_visits:
            mbarrier.wait(q_empty.index(j % NS), ((j // NS) & 1) ^ 1)
            _loads_for(j, q_desc, do_desc, lse_desc, delta_desc, q_bufs, do_bufs, lse_bufs, delta_bufs, q_ready, IDX,
                       n_part, n_tot, f_lo, b, hk, S_q, H_q, G, D, True)


@gluon.jit
def _consumer(w: gl.constexpr, kv_bar, k_smem, v_smem, q_bufs, do_bufs, lse_bufs, delta_bufs, q_ready, q_empty, ds_bufs,
              ds_ready, ds_free, dq_bufs, dq_desc, dq_tile0, NUM_M, dk_desc, dv_desc, kv_row, kv_col, IDX, n_part, n_tot,
              f_lo, n, LTS, LTE, UTS, UTE, vec_off, qk_scale, sm_scale, G: gl.constexpr, D: gl.constexpr,
              CAUSAL: gl.constexpr, HAS_MASK: gl.constexpr, HAS_LTE: gl.constexpr, HAS_UT: gl.constexpr,
              HAS_UTS: gl.constexpr):
    NS: gl.constexpr = q_bufs.type.shape[0]
    KW: gl.constexpr = BLOCK_N // 2  # keys of this warpgroup (its dK / dV rows)
    SPLIT_KEYS: gl.constexpr = D < 128  # dQ split by keys: D = 64 columns cannot be halved in a swizzled tile
    DQ_N: gl.constexpr = D if SPLIT_KEYS else D // 2  # dQ columns of this warpgroup
    mbarrier.wait(kv_bar, 0)  # K / V in shared memory (each reader observes the barrier itself)
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, BLOCK_M, 16])
    mma_kd: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    mma_dq: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                     instr_shape=[16, DQ_N, 16])
    a_kd: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_kd, k_width=2)
    dt: gl.constexpr = q_bufs.dtype
    k_w = k_smem.slice(w * KW, KW, dim=0)
    v_w = v_smem.slice(w * KW, KW, dim=0)
    k_cols = k_smem.slice(w * DQ_N, DQ_N, dim=1) if not SPLIT_KEYS else k_w  # [keys, DQ_N] of this dQ part
    dq_w = dq_bufs.index(w)  # this warpgroup's fp32 dQ tile as the reduce-add moves it: [16, 256], unswizzled
    dq_tile = dq_w._reinterpret(gl.float32, [BLOCK_M, DQ_N], dq_tile_layout())  # the same bytes by (query, dim)
    NPARTS: gl.constexpr = D // DQ_N
    dk = gl.zeros([KW, D], gl.float32, layout=mma_kd)
    dv = gl.zeros([KW, D], gl.float32, layout=mma_kd)
    zero_s = gl.zeros([KW, BLOCK_M], gl.float32, layout=mma_s)
    zero_dq = gl.zeros([BLOCK_M, DQ_N], gl.float32, layout=mma_dq)
    offs_q = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, mma_s))
    keys = n * BLOCK_N + w * KW + gl.arange(0, KW, layout=gl.SliceLayout(1, mma_s))
    lts, lte, uts, ute = mask_columns(LTS, LTE, UTS, UTE, vec_off, keys, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)
    n_visits = G * n_tot
    for t in range(n_visits):
        g, i, m = _visit(IDX, n_part, n_tot, f_lo, t)
        s = t % NS
        mbarrier.wait(q_ready.index(s), (t // NS) & 1)
        q_s = q_bufs.index(s)
        do_s = do_bufs.index(s)
        sT = warpgroup_mma(k_w, q_s.permute((1, 0)), zero_s, use_acc=False)  # [KW keys, BLOCK_M queries]
        pT = gl.exp2(sT * qk_scale - lse_bufs.index(s).load(mma_s))  # LSE in log2 units, +inf on empty rows
        if i < n_part:  # a partially masked block: the element mask (FlashMask's LTS/LTE/UTS/UTE, causal)
            masked = element_mask((m * BLOCK_M + offs_q)[None, :], keys[:, None], lts[:, None], lte[:, None],
                                  uts[:, None], ute[:, None], CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)
            pT = gl.where(masked, 0.0, pT)
        dpT = warpgroup_mma(v_w, do_s.permute((1, 0)), zero_s, use_acc=False)
        dv = warpgroup_mma(gl.convert_layout(pT.to(dt), a_kd), do_s, dv, is_async=True)  # runs under dS
        dsT = (pT * (dpT - delta_bufs.index(s).load(mma_s))).to(dt)
        dk = warpgroup_mma(gl.convert_layout(dsT, a_kd), q_s, dk, is_async=True)  # runs under the dS exchange
        ds_all = ds_bufs.index(t % 2)  # [BLOCK_N, BLOCK_M]: dS^T
        if SPLIT_KEYS:  # dQ partial = dS[:, own keys] K[own keys, :]: no exchange, two reduce-adds per tile
            ds_own = ds_all.slice(w * KW, KW, dim=0)
            ds_own.store(dsT)
            fence_async_shared()
            gl.thread_barrier()  # this warpgroup's 4 warps (the partition) stored and fenced
            dq = warpgroup_mma(ds_own.permute((1, 0)), k_cols, zero_dq, use_acc=False, is_async=True)
            dq, dk, dv = warpgroup_mma_wait(0, deps=[dq, dk, dv])
        else:
            # dS of all 128 keys into shared memory (double-buffered by visit; the other warpgroup read this
            # buffer two visits ago), then dQ[:, w*D/2 : (w+1)*D/2] = dS K[:, those columns]: FlashAttention-3's
            # split
            mbarrier.wait(ds_free.index(t % 2), ((t // 2) & 1) ^ 1)
            ds_all.slice(w * KW, KW, dim=0).store(dsT)
            fence_async_shared()
            gl.thread_barrier()  # this warpgroup's 4 warps (the partition) stored and fenced
            mbarrier.arrive(ds_ready.index(t % 2), count=1)
            mbarrier.wait(ds_ready.index(t % 2), (t // 2) & 1)  # and the other warpgroup's half is there
            dq = warpgroup_mma(ds_all.permute((1, 0)), k_cols, zero_dq, use_acc=False, is_async=True)
            dq, dk, dv = warpgroup_mma_wait(0, deps=[dq, dk, dv])
            mbarrier.arrive(ds_free.index(t % 2), count=1)
        mbarrier.arrive(q_empty.index(s), count=1)  # one of the two consumers' arrivals
        tma.store_wait(0)  # the previous visit's reduce-add has read dq_w
        dq_tile.store(dq)
        fence_async_shared()
        gl.thread_barrier()
        tile = (dq_tile0 + g * NUM_M + m) * NPARTS + (0 if SPLIT_KEYS else w)
        _tma_reduce_add(dq_desc, [tile * dq_w.shape[0], 0], dq_w)
    # K_w and V_w stage this warpgroup's dK and dV for the TMA stores, once the other warpgroup's last dQ product
    # (which reads all of K) is done
    if not SPLIT_KEYS:
        if n_visits > 0:
            mbarrier.wait(ds_free.index((n_visits - 1) % 2), ((n_visits - 1) // 2) & 1)
    k_w.store((dk * sm_scale).to(dt))
    v_w.store(dv.to(dt))
    fence_async_shared()
    gl.thread_barrier()
    tma.async_copy_shared_to_global(dk_desc, [kv_row + w * KW, kv_col], k_w)
    tma.async_copy_shared_to_global(dv_desc, [kv_row + w * KW, kv_col], v_w)
    tma.store_wait(0)


@gluon.jit
def flashmask_bwd_gluon_kernel(
    q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, lse_desc, delta_desc, dq_desc, LTS, LTE, UTS, UTE,
    IDX, NPART, NFULL, FLO, ORDER, S_q, S_k, H_q, H_k, H_mask, NUM_N, NUM_M, ROWS, HC, qk_scale, sm_scale,
    G: gl.constexpr, D: gl.constexpr, NS: gl.constexpr, CAUSAL: gl.constexpr, HAS_MASK: gl.constexpr,
    HAS_LTE: gl.constexpr, HAS_UT: gl.constexpr, HAS_UTS: gl.constexpr,
):
    """dK, dV (scaled, stored) and the unscaled fp32 dQ sum of one key block of one KV head.

    Grid ``(B * H_k * S_k // BLOCK_N,)`` in the order of :func:`lpt_program` (``ORDER``: ``visit_order`` of the
    lists, int32 ``[L, NUM_N]``; ``ROWS`` = B * H_k, ``HC`` of them per chunk); ``num_warps=4`` plus two 4-warp
    workers, ``maxnreg=168`` (12 warps share the register file: the consumers get 240 registers each, the loader
    24).
    Descriptors over ``[B*S, H*D]`` views: q / do boxes ``[BLOCK_M, D]``, k / v ``[BLOCK_N, D]``, dk / dv
    ``[BLOCK_N // 2, D]``; lse (log2 units, +inf on empty rows) and delta fp32 ``[B*H_q*S_q/BLOCK_M, BLOCK_M]``,
    boxes ``[1, BLOCK_M]``; dq over the zeroed tiled fp32 accumulator (``triton_bwd.DQ_TILE_BASES``) seen as
    ``[B*S_q*H_q*D/256, 256]``, unswizzled boxes ``[16, 256]`` (one 64 x 64 tile).
    ``IDX`` / ``NPART`` / ``NFULL`` / ``FLO``: the dK/dV visit lists for tiles ``(BLOCK_M, BLOCK_N)`` (one table
    per (batch, mask head) with a mask, one shared table without). Needs ``S_q % BLOCK_M == 0``, ``S_k % BLOCK_N == 0``,
    D in ``HEAD_DIMS``.
    """
    b, hk, bm, n, IDX_row, n_part, n_tot, f_lo = key_block_program(ORDER, IDX, NPART, NFULL, FLO, NUM_N, NUM_M, ROWS,
                                                                    HC, H_q, H_k, H_mask, G, HAS_MASK)
    dt: gl.constexpr = q_desc.dtype
    k_smem = gl.allocate_shared_memory(dt, [BLOCK_N, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dt, [BLOCK_N, D], v_desc.layout)
    q_bufs = gl.allocate_shared_memory(dt, [NS, BLOCK_M, D], q_desc.layout)
    do_bufs = gl.allocate_shared_memory(dt, [NS, BLOCK_M, D], do_desc.layout)
    lse_bufs = gl.allocate_shared_memory(gl.float32, [NS, 1, BLOCK_M], lse_desc.layout)
    delta_bufs = gl.allocate_shared_memory(gl.float32, [NS, 1, BLOCK_M], delta_desc.layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dt)
    ds_bufs = gl.allocate_shared_memory(dt, [2, BLOCK_N, BLOCK_M], ds_layout)  # dS^T of two visits
    DQ_N: gl.constexpr = D if D < 128 else D // 2
    dq_bufs = gl.allocate_shared_memory(gl.float32, [2] + dq_desc.block_type.shape, dq_desc.layout)  # per warpgroup
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(NS):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=2)  # both consumers release a slot
    for i in gl.static_range(2):  # both consumers arrive on each
        mbarrier.init(ds_ready.index(i), count=2)
        mbarrier.init(ds_free.index(i), count=2)
    kv_row = b * S_k + n * BLOCK_N
    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [kv_row, hk * D], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [kv_row, hk * D], kv_bar, v_smem)
    vec_off = bm * S_k
    dq_tile0 = (b * H_q + hk * G) * NUM_M  # the dQ tile of query head hk * G, query block 0 (times D // DQ_N)
    gl.warp_specialize([
        (_consumer, (0, kv_bar, k_smem, v_smem, q_bufs, do_bufs, lse_bufs, delta_bufs, q_ready, q_empty, ds_bufs,
                     ds_ready, ds_free, dq_bufs, dq_desc, dq_tile0, NUM_M, dk_desc, dv_desc, kv_row, hk * D,
                     IDX_row, n_part, n_tot, f_lo, n, LTS, LTE, UTS, UTE, vec_off, qk_scale, sm_scale, G, D, CAUSAL,
                     HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)),
        (_consumer, (1, kv_bar, k_smem, v_smem, q_bufs, do_bufs, lse_bufs, delta_bufs, q_ready, q_empty, ds_bufs,
                     ds_ready, ds_free, dq_bufs, dq_desc, dq_tile0, NUM_M, dk_desc, dv_desc, kv_row, hk * D,
                     IDX_row, n_part, n_tot, f_lo, n, LTS, LTE, UTS, UTE, vec_off, qk_scale, sm_scale, G, D, CAUSAL,
                     HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)),
        (_loader, (q_desc, do_desc, lse_desc, delta_desc, q_bufs, do_bufs, lse_bufs, delta_bufs, q_ready, q_empty,
                   IDX_row, n_part, n_tot, f_lo, b, hk, S_q, H_q, G, D)),
    ], [4, 4], [240, 24])


def _nvmma_layout(block: tuple, dtype, swizzle: bool = True):
    """The default NVMMA shared layout of a ``block`` box of torch ``dtype``, or the unswizzled one (built once per
    descriptor geometry: :func:`tensor_desc` keeps the fields)."""
    dt = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}[dtype]
    if not swizzle:
        return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=dt.primitive_bitwidth, rank=len(block))
    return gl.NVMMASharedLayout.get_default_for(list(block), dt)


_DESC_FIELDS: dict = {}  # (rows, cols, block, dtype, swizzle) -> the fields of a validated descriptor, no base


def tensor_desc(t, rows: int, cols: int, block: list[int], swizzle: bool = True):
    """A Gluon TMA descriptor over ``t`` viewed as ``[rows, cols]`` with ``block`` boxes and the default
    NVMMA shared layout (unswizzled with ``swizzle=False``); ``t`` contiguous bf16 / fp16 / fp32 with
    ``rows * cols`` elements (``ValueError`` otherwise). Triton validates the first descriptor of each geometry;
    later ones copy its fields (with their ``launch_cache`` key: the same geometry on an aligned base) and swap the
    base (a launch builds up to nine, and validation is most of their host cost)."""
    if not t.is_contiguous() or t.numel() != rows * cols:
        raise ValueError(f"gluon_bwd.tensor_desc: a contiguous tensor of {rows} x {cols} elements is needed; got "
                         f"shape {tuple(t.shape)}, strides {t.stride()}")
    key = (rows, cols, tuple(block), t.dtype, swizzle)
    fields = _DESC_FIELDS.get(key)
    if fields is None or t.data_ptr() % 16:
        layout = _nvmma_layout(tuple(block), t.dtype, swizzle)
        desc = TensorDescriptor(t, [rows, cols], [cols, 1], list(block), layout)
        if hasattr(desc, "__dict__") and t.data_ptr() % 16 == 0:  # the kept fields include the launch key
            setattr(desc, launch_cache.LAUNCH_KEY, launch_cache.descriptor_key(desc))
            _DESC_FIELDS[key] = dict(desc.__dict__, base=None)
        return desc
    desc = object.__new__(TensorDescriptor)
    desc.__dict__.update(fields)
    desc.base = t
    return desc


def check_operands(where: str, do, q, k, v) -> None:
    """``ValueError`` (naming ``where`` and the tensor) unless do, q, k, v are contiguous and all bf16 or all fp16."""
    for name, t in (("do", do), ("q", q), ("k", k), ("v", v)):
        if t.dtype not in (torch.bfloat16, torch.float16) or t.dtype != q.dtype or not t.is_contiguous():
            raise ValueError(f"{where}: {name} must be contiguous {q.dtype} (bf16 or fp16); got {t.dtype}, "
                             f"strides {t.stride()}")


def tiles(d: int) -> tuple[int, int]:
    """``(BLOCK_M, BLOCK_N)`` of the backward at head dim ``d``: 128-key programs, 64-key ones at D = 256
    (:mod:`gluon_bwd256`)."""
    if d == 256:
        from . import gluon_bwd256

        return gluon_bwd256.BLOCK_M.value, gluon_bwd256.BLOCK_N.value
    return BLOCK_M.value, BLOCK_N.value


def launch(do, q, k, v, lse2, delta, dq_accum, lists, order, mv, causal: bool, scale: float, log2e: float):
    """Host side: descriptors and the launch; returns ``(dq, dk, dv)`` like q, k, v. D = 256 runs
    :mod:`gluon_bwd256` (lists and order at :func:`tiles`).

    Args:
        do, q, k, v: contiguous, 16-byte aligned ``[B, S, H, D]`` bf16 / fp16 on an sm_90 GPU, D in ``HEAD_DIMS``
            or 256, ``S_q % 64 == 0``, ``S_k % 128 == 0`` (``dispatch.gluon_bwd_eligible`` checks all of it).
        lse2, delta: fp32 ``[B, H_q, S_q]`` from ``triton_launch.preprocess``.
        dq_accum: zeroed fp32, ``B * S_q * H_q * D`` elements (``preprocess`` zeroes it in its pass over O and
            dO), written as tiles (``triton_bwd.DQ_TILE_BASES``).
        lists: ``(idx, n_part, n_full, full_lo, n_vec_partial)``, ``mv.block_lists(BLOCK_M, BLOCK_N,
            by_key=True)`` (``n_vec_partial`` unused: the backward applies the whole mask on every partial block);
        order: ``mv.visit_order(BLOCK_M, BLOCK_N, by_key=True)``.
        mv: ``triton_prep.MaskVectors`` of the call. causal, scale: as the forward. log2e: log2(e).

    Raises:
        ValueError: a shape or layout outside the kernel's scope (named in the message): the tail of a
            sequence that is not a multiple of the tile would otherwise be left uncomputed.
    """
    if q.shape[-1] == 256:
        from . import gluon_bwd256

        return gluon_bwd256.launch(do, q, k, v, lse2, delta, dq_accum, lists, order, mv, causal, scale, log2e)
    bm, bn = BLOCK_M.value, BLOCK_N.value
    b, s_q, h_q, d = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    if d not in HEAD_DIMS or s_q % bm or s_k % bn:
        raise ValueError(f"gluon_bwd.launch: needs head dim 64, 128 or 256, S_q % {bm} == 0 and S_k % {bn} == 0; "
                         f"got D={d}, S_q={s_q}, S_k={s_k}")
    check_operands("gluon_bwd.launch", do, q, k, v)
    desc = tensor_desc
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    idx, n_part, n_full, full_lo, _ = lists  # [L, NUM_N, NUM_M], [L, NUM_N] x 4
    lrows = b * h_q * s_q // bm
    g = h_q // h_k
    hc = rows_per_chunk(2 * g * s_q * d * q.element_size(), b * h_k)  # a KV head streams its group's Q and dO
    launch_cache.launch(flashmask_bwd_gluon_kernel, (b * h_k * (s_k // bn),),
        desc(q, b * s_q, h_q * d, [bm, d]), desc(k, b * s_k, h_k * d, [bn, d]), desc(v, b * s_k, h_k * d, [bn, d]),
        desc(do, b * s_q, h_q * d, [bm, d]), desc(dk, b * s_k, h_k * d, [bn // 2, d]),
        desc(dv, b * s_k, h_k * d, [bn // 2, d]), desc(lse2, lrows, bm, [1, bm]), desc(delta, lrows, bm, [1, bm]),
        desc(dq_accum, dq_accum.numel() // DQ_BOX[1], DQ_BOX[1], DQ_BOX, swizzle=False), mv.lts, mv.lte, mv.uts,
        mv.ute, idx, n_part, n_full, full_lo, order, s_q, s_k, h_q, h_k, mv.h_mask, idx.shape[1], idx.shape[2],
        b * h_k, hc, scale * log2e, scale, G=g, D=d, NS=2, CAUSAL=causal, HAS_MASK=mv.has_mask,
        HAS_LTE=mv.has_lte, HAS_UT=mv.has_ut, HAS_UTS=mv.has_uts, num_warps=4, maxnreg=168)
    return dq_from_tiles(dq_accum, scale, q.dtype, q.shape), dk, dv
