"""Experimental: a warp-specialised FlashAttention-3-style backward in Gluon (Hopper), session 10. Not used by the API.

Why it exists: the Triton backward issues seven GEMM-sized products per tile pair (dK/dV kernel: S, dP, dV, dK;
dQ kernel: S, dP, dQ); FlashAttention-3 and FlashMask V3 issue five, with dQ reduced from another warp
(``docs/kernel_notes.md``, v7). This kernel is that structure, written in Triton's Gluon dialect, to measure it:

- one program per (key block of ``BLOCK_N`` = 128 keys, batch * head); MHA; D = 128; bf16; S % 128 == 0;
  masks: none or causal (``CAUSAL``: the query range starts at the diagonal, which alone is masked per element);
- **default partition** (8 warps = two warpgroups of 64 keys each), per query block of ``BLOCK_M`` = 64 rows:
  S^T = K Q^T and dP^T = V dO^T (async wgmma, K / V / Q / dO in shared memory), P^T = exp2(S^T scale - LSE),
  dV += P^T dO, dS^T = P^T (dP^T - Delta), dK += dS^T Q, then dQ_tile = dS K from dS^T in shared memory, handed to
  the worker through a ring of fp32 tiles;
- **worker partition** (4 warps, 48 registers): TMA loads of Q, dO, LSE and Delta into a two-stage ring, and the
  fp32 atomic adds of each dQ tile into ``dq_accum [B*H, S, D]`` (Gluon 3.6 exposes no TMA reduce-add in its
  ``tma`` module; the library kernel ``gluon_bwd`` calls the builder's op since session 11).

Math and names as ``triton_bwd`` (LSE in log2 units, Delta = rowsum(dO * O)). Measured on one H200 (session 10,
``benchmarks/results/gluon_bwd_v8_h200.log``): correct (dK / dV bitwise equal to the Triton kernels', dQ within
the bf16 tolerance), but 7-18 % slower than the Triton split backward; see ``docs/kernel_notes.md`` (v8 row).

Constexpr variants (all measured): ``SMEM_OPERANDS`` (P^T and dS^T reach the dV / dK products through shared
memory instead of registers), ``DP_EARLY`` (dP^T issued together with S^T), ``ACC_INIT`` (the products start from
-LSE/scale and -Delta, so the subtractions run on the tensor cores), ``NDQ`` (dQ ring depth); diagnostics that give
wrong dQ on purpose: ``NO_DQ`` (the fifth product left out), ``NO_ATOMIC`` (the worker drops the dQ tiles).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from ..gluon_bwd import _issue_loads


@gluon.jit
def _red_v4(ptrs, vals):
    """fp32 atomic adds, four contiguous values per instruction (``red.global.add.v4.f32``, sm_90)."""
    return gl.inline_asm_elementwise(
        "red.global.add.v4.f32 [$4], {$8, $9, $10, $11};\n"
        "mov.b32 $0, 0;\nmov.b32 $1, 0;\nmov.b32 $2, 0;\nmov.b32 $3, 0;",
        "=r,=r,=r,=r,l,l,l,l,r,r,r,r", [ptrs, vals], dtype=gl.int32, is_pure=False, pack=4)


@gluon.jit
def _reduce_dq(dq_bufs, dq_ready, dq_empty, dq_accum, m_lo, it, BLOCK_M: gl.constexpr, D: gl.constexpr,
               WARPS: gl.constexpr, NO_ATOMIC: gl.constexpr, VEC_RED: gl.constexpr):
    NDQ: gl.constexpr = dq_bufs.type.shape[0]
    CH: gl.constexpr = 8  # rows of a dQ tile per pass
    blk: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [WARPS, 1], [1, 0])
    offs = (gl.arange(0, CH, layout=gl.SliceLayout(1, blk))[:, None] * D
            + gl.arange(0, D, layout=gl.SliceLayout(0, blk))[None, :])
    t = it % NDQ
    mbarrier.wait(dq_ready.index(t), (it // NDQ) & 1)
    if not NO_ATOMIC:
        base = dq_accum + (m_lo + it) * BLOCK_M * D
        for r in gl.static_range(0, BLOCK_M, CH):
            vals = dq_bufs.index(t).slice(r, CH, dim=0).load(blk)
            if VEC_RED:
                _red_v4(base + r * D + offs, vals.to(gl.int32, bitcast=True))
            else:
                gl.atomic_add(base + r * D + offs, vals, sem="relaxed")
    gl.thread_barrier()
    mbarrier.arrive(dq_empty.index(t), count=1)


@gluon.jit
def _worker(q_desc, do_desc, lse_desc, delta_desc, q_bufs, do_bufs, lse_bufs, delta_bufs, q_ready, q_empty, dq_bufs,
            dq_ready, dq_empty, dq_accum, q_row0, q_col, lse_row0, m_lo, n_m, BLOCK_M: gl.constexpr,
            D: gl.constexpr, NO_ATOMIC: gl.constexpr, VEC_RED: gl.constexpr, LOAD: gl.constexpr,
            REDUCE: gl.constexpr, WARPS: gl.constexpr):
    """Loads (``LOAD``) and / or dQ reductions (``REDUCE``): one partition doing both, or two partitions."""
    NS: gl.constexpr = q_bufs.type.shape[0]
    if LOAD:
        for i in gl.static_range(NS - 1):  # prologue: the first NS - 1 query blocks
            _issue_loads(q_desc, do_desc, lse_desc, delta_desc, q_bufs, do_bufs, lse_bufs, delta_bufs,
                         q_ready.index(i), i, q_row0 + (m_lo + i) * BLOCK_M, q_col, lse_row0 + m_lo + i, i < n_m)
    for it in range(n_m):
        if LOAD:
            j = it + NS - 1  # load query block j while the compute partition works on block it
            if j < n_m:
                s = j % NS
                mbarrier.wait(q_empty.index(s), ((j // NS) & 1) ^ 1)
                _issue_loads(q_desc, do_desc, lse_desc, delta_desc, q_bufs, do_bufs, lse_bufs, delta_bufs,
                             q_ready.index(s), s, q_row0 + (m_lo + j) * BLOCK_M, q_col, lse_row0 + m_lo + j, True)
        if REDUCE:
            _reduce_dq(dq_bufs, dq_ready, dq_empty, dq_accum, m_lo, it, BLOCK_M, D, WARPS, NO_ATOMIC, VEC_RED)


@gluon.jit
def _compute(k_smem, v_smem, q_bufs, do_bufs, lse_bufs, delta_bufs, q_ready, q_empty, ds_smem, dq_bufs, dq_ready,
             dq_empty, n, m_lo, n_m, qk_scale, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr,
             CAUSAL: gl.constexpr, SMEM_OPERANDS: gl.constexpr, DP_EARLY: gl.constexpr, ACC_INIT: gl.constexpr,
             NO_DQ: gl.constexpr):
    NS: gl.constexpr = q_bufs.type.shape[0]
    NDQ: gl.constexpr = dq_bufs.type.shape[0]
    # [128 keys, 64 queries] score tiles and [128 keys, D] accumulators: warpgroup w owns keys 64w..64w+63;
    # the [64 queries, D] dQ tile is split by columns (warpgroup w computes D/2 of them)
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                    instr_shape=[16, BLOCK_M, 16])
    mma_kd: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1], instr_shape=[16, D, 16])
    mma_dq: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                     instr_shape=[16, D // 2, 16])
    a_kd: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_kd, k_width=2)
    dk = gl.zeros([BLOCK_N, D], gl.float32, layout=mma_kd)
    dv = gl.zeros([BLOCK_N, D], gl.float32, layout=mma_kd)
    zero_s = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma_s)
    zero_dq = gl.zeros([BLOCK_M, D], gl.float32, layout=mma_dq)
    offs_q = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, mma_s))
    offs_k = n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma_s))
    inv_scale = 1.0 / qk_scale
    for it in range(n_m):
        m = m_lo + it
        s = it % NS
        mbarrier.wait(q_ready.index(s), (it // NS) & 1)
        q_s = q_bufs.index(s)
        do_s = do_bufs.index(s)
        if ACC_INIT:  # the tensor cores subtract: S^T - LSE / scale and dP^T - Delta
            s_init = zero_s - lse_bufs.index(s).load(mma_s) * inv_scale
            sT_t = warpgroup_mma(k_smem, q_s.permute((1, 0)), s_init, is_async=True)
        else:
            sT_t = warpgroup_mma(k_smem, q_s.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        if DP_EARLY:
            if ACC_INIT:
                dpT_t = warpgroup_mma(v_smem, do_s.permute((1, 0)), zero_s - delta_bufs.index(s).load(mma_s),
                                      is_async=True)
            else:
                dpT_t = warpgroup_mma(v_smem, do_s.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            sT = warpgroup_mma_wait(1, deps=[sT_t])
        else:
            sT = warpgroup_mma_wait(0, deps=[sT_t])
        if ACC_INIT:
            pT = gl.exp2(sT * qk_scale)
        else:
            pT = gl.exp2(sT * qk_scale - lse_bufs.index(s).load(mma_s))
        if CAUSAL:
            if it < BLOCK_N // BLOCK_M:  # only the diagonal tiles (the first of the range) are partial
                pT = gl.where((m * BLOCK_M + offs_q)[None, :] >= offs_k[:, None], pT, 0.0)
        pT_b = pT.to(gl.bfloat16)
        if SMEM_OPERANDS:  # P^T through shared memory (the dS^T buffer): no registers held by dV's A operand
            ds_smem.store(pT_b)
            fence_async_shared()
            gl.thread_barrier()
            p_op = ds_smem
        else:
            p_op = gl.convert_layout(pT_b, a_kd)
        if not DP_EARLY:
            if ACC_INIT:
                dpT_t = warpgroup_mma(v_smem, do_s.permute((1, 0)), zero_s - delta_bufs.index(s).load(mma_s),
                                      is_async=True)
            else:
                dpT_t = warpgroup_mma(v_smem, do_s.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        dv_t = warpgroup_mma(p_op, do_s, dv, is_async=True)
        dpT = warpgroup_mma_wait(1, deps=[dpT_t])
        if ACC_INIT:
            dsT_b = (pT * dpT).to(gl.bfloat16)
        else:
            dsT_b = (pT * (dpT - delta_bufs.index(s).load(mma_s))).to(gl.bfloat16)
        if SMEM_OPERANDS:
            dv = warpgroup_mma_wait(0, deps=[dv_t])
            gl.thread_barrier()  # both warpgroups' dV products have read P^T
            ds_smem.store(dsT_b)
            fence_async_shared()
            gl.thread_barrier()
            dk_t = warpgroup_mma(ds_smem, q_s, dk, is_async=True)
        else:
            dk_t = warpgroup_mma(gl.convert_layout(dsT_b, a_kd), q_s, dk, is_async=True)
            ds_smem.store(dsT_b)
            fence_async_shared()
            gl.thread_barrier()  # both halves of dS^T are in shared memory before the dQ product reads them
        if NO_DQ:
            if SMEM_OPERANDS:
                dk = warpgroup_mma_wait(0, deps=[dk_t])
            else:
                dv, dk = warpgroup_mma_wait(0, deps=[dv_t, dk_t])
            dq = zero_dq
        else:
            dq_t = warpgroup_mma(ds_smem.permute((1, 0)), k_smem, zero_dq, use_acc=False, is_async=True)
            if SMEM_OPERANDS:
                dk = warpgroup_mma_wait(1, deps=[dk_t])
            else:
                dv, dk = warpgroup_mma_wait(1, deps=[dv_t, dk_t])
            dq = warpgroup_mma_wait(0, deps=[dq_t])
        gl.thread_barrier()  # both warpgroups are done with Q, dO and dS^T
        mbarrier.arrive(q_empty.index(s), count=1)
        t = it % NDQ
        mbarrier.wait(dq_empty.index(t), ((it // NDQ) & 1) ^ 1)
        dq_bufs.index(t).store(dq)
        gl.thread_barrier()
        mbarrier.arrive(dq_ready.index(t), count=1)
    return dk, dv


@gluon.jit
def gluon_bwd_ws_kernel(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, lse_desc, delta_desc, dq_accum, S, H,
                        qk_scale, sm_scale, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr,
                        NS: gl.constexpr, NDQ: gl.constexpr, CAUSAL: gl.constexpr, SMEM_OPERANDS: gl.constexpr,
                        DP_EARLY: gl.constexpr, ACC_INIT: gl.constexpr, NO_DQ: gl.constexpr,
                        NO_ATOMIC: gl.constexpr, SPLIT_WORKER: gl.constexpr, VEC_RED: gl.constexpr):
    """Grid ``(S // BLOCK_N, B * H)``, 8 warps + a 4-warp worker (launch with ``maxnreg=168``: 12 warps share the
    register file; the default partition then gets 240 registers, the worker 48).

    Descriptors: q / do ``[B*S, H*D]`` bf16 blocks ``[BLOCK_M, D]``; k / v / dk / dv ``[B*S, H*D]`` blocks
    ``[BLOCK_N, D]``; lse (log2 units) / delta fp32 viewed as ``[B*H*S/BLOCK_M, BLOCK_M]``, blocks ``[1, BLOCK_M]``.
    ``dq_accum``: zeroed fp32 ``[B*H, S, D]``, unscaled (dQ = sm_scale * dq_accum).
    """
    n = gl.program_id(0)
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    m_lo = (n * BLOCK_N) // BLOCK_M if CAUSAL else 0
    n_m = S // BLOCK_M - m_lo
    k_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, D], v_desc.layout)
    q_bufs = gl.allocate_shared_memory(gl.bfloat16, [NS, BLOCK_M, D], q_desc.layout)
    do_bufs = gl.allocate_shared_memory(gl.bfloat16, [NS, BLOCK_M, D], do_desc.layout)
    lse_bufs = gl.allocate_shared_memory(gl.float32, [NS, 1, BLOCK_M], lse_desc.layout)
    delta_bufs = gl.allocate_shared_memory(gl.float32, [NS, 1, BLOCK_M], delta_desc.layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], gl.bfloat16)
    ds_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, BLOCK_M], ds_layout)
    dq_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, D], gl.float32)
    dq_bufs = gl.allocate_shared_memory(gl.float32, [NDQ, BLOCK_M, D], dq_layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    dq_ready = gl.allocate_shared_memory(gl.int64, [NDQ, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [NDQ, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(NS):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=1)
    for i in gl.static_range(NDQ):
        mbarrier.init(dq_ready.index(i), count=1)
        mbarrier.init(dq_empty.index(i), count=1)
    kv_row = b * S + n * BLOCK_N
    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [kv_row, h * D], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [kv_row, h * D], kv_bar, v_smem)
    mbarrier.wait(kv_bar, 0)
    dq_head = dq_accum + bh * S * D
    lse_row0 = bh * (S // BLOCK_M)
    if SPLIT_WORKER:  # a 1-warp loader that never waits for the reductions, and a 2-warp reducer
        dk, dv = gl.warp_specialize([
            (_compute, (k_smem, v_smem, q_bufs, do_bufs, lse_bufs, delta_bufs, q_ready, q_empty, ds_smem, dq_bufs,
                        dq_ready, dq_empty, n, m_lo, n_m, qk_scale, BLOCK_M, BLOCK_N, D, CAUSAL, SMEM_OPERANDS,
                        DP_EARLY, ACC_INIT, NO_DQ)),
            (_worker, (q_desc, do_desc, lse_desc, delta_desc, q_bufs, do_bufs, lse_bufs, delta_bufs, q_ready, q_empty,
                       dq_bufs, dq_ready, dq_empty, dq_head, b * S, h * D, lse_row0, m_lo, n_m, BLOCK_M, D, NO_ATOMIC,
                       VEC_RED, True, False, 1)),
            (_worker, (q_desc, do_desc, lse_desc, delta_desc, q_bufs, do_bufs, lse_bufs, delta_bufs, q_ready, q_empty,
                       dq_bufs, dq_ready, dq_empty, dq_head, b * S, h * D, lse_row0, m_lo, n_m, BLOCK_M, D, NO_ATOMIC,
                       VEC_RED, False, True, 2)),
        ], [1, 2], [24, 48])
    else:  # one 4-warp worker: loads, then the reduction of the previous dQ tile
        dk, dv = gl.warp_specialize([
            (_compute, (k_smem, v_smem, q_bufs, do_bufs, lse_bufs, delta_bufs, q_ready, q_empty, ds_smem, dq_bufs,
                        dq_ready, dq_empty, n, m_lo, n_m, qk_scale, BLOCK_M, BLOCK_N, D, CAUSAL, SMEM_OPERANDS,
                        DP_EARLY, ACC_INIT, NO_DQ)),
            (_worker, (q_desc, do_desc, lse_desc, delta_desc, q_bufs, do_bufs, lse_bufs, delta_bufs, q_ready, q_empty,
                       dq_bufs, dq_ready, dq_empty, dq_head, b * S, h * D, lse_row0, m_lo, n_m, BLOCK_M, D, NO_ATOMIC,
                       VEC_RED, True, True, 4)),
        ], [4], [48])
    # K and V are no longer read: their buffers stage dK and dV for the TMA stores
    k_smem.store((dk * sm_scale).to(gl.bfloat16))
    v_smem.store(dv.to(gl.bfloat16))
    fence_async_shared()
    tma.async_copy_shared_to_global(dk_desc, [kv_row, h * D], k_smem)
    tma.async_copy_shared_to_global(dv_desc, [kv_row, h * D], v_smem)
    tma.store_wait(0)
