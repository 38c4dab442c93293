"""Mask preprocessing on the device in two Triton launches: per-key-block min/max, then the visit lists.

:class:`flashmask.triton_prep.MaskVectors` calls these; its ``*_reference`` methods are the pure-PyTorch
versions they are tested against (``tests/ops/test_blocklists.py``), bitwise. Built from torch ops, the lists take
about 15 small launches each (argsort, reductions, comparisons): 2-6 ms of host time per batch for the three lists
of a forward+backward on the H200, which the GPU waits for at the start of each batch; here one launch builds the
min/max and one each list (``build ms ours`` in docs/benchmarks.md).

Shapes: L = B*H_mask (1 without a mask), NB key blocks of BLOCK_N columns, R outer x T inner blocks of a list
(query x key blocks for the forward / dQ lists, key x query blocks for the dK/dV list).
Source: FlashMask's ``prepare_block_maxmin`` and V3's per-m-block ``generate_n_block`` list
(flashmask.md §2.2-2.4).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_minmax(VEC, cols, out, slot, default, PRESENT: tl.constexpr):
    """``out[0] = min``, ``out[slot] = max`` of ``VEC[cols]``; both ``default`` when the vector is absent."""
    if PRESENT:
        x = tl.load(VEC + cols)
        tl.store(out, tl.min(x, 0))
        tl.store(out + slot, tl.max(x, 0))
    else:
        tl.store(out, default)
        tl.store(out + slot, default)


@triton.jit
def _block_minmax_kernel(LTS, LTE, UTS, UTE, OUT, S_k, NB, L, S_q,
                         BLOCK_N: tl.constexpr, HAS_LTE: tl.constexpr, HAS_UT: tl.constexpr,
                         HAS_UTS: tl.constexpr):
    """One program per (key block, row of L): min and max of each vector over the block's columns (the tail
    block repeats the last column); absent vectors get their defaults (LTE = S_q, UTS = UTE = 0)."""
    nb = tl.program_id(0)
    row = tl.program_id(1)
    cols = row * S_k + tl.minimum(nb * BLOCK_N + tl.arange(0, BLOCK_N), S_k - 1)
    slot = L * NB  # OUT is [8, L, NB]: rows LTS_MIN, LTS_MAX, LTE_MIN, ..., UTE_MAX
    o = OUT + row * NB + nb
    _store_minmax(LTS, cols, o, slot, 0, True)
    _store_minmax(LTE, cols, o + 2 * slot, slot, S_q, HAS_LTE)
    _store_minmax(UTS, cols, o + 4 * slot, slot, 0, HAS_UTS)
    _store_minmax(UTE, cols, o + 6 * slot, slot, 0, HAS_UT)


@triton.jit
def _classes(MM, l, r, t, T, S_q, S_k, L, NB,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BY_KEY: tl.constexpr, CAUSAL: tl.constexpr,
             HAS_MASK: tl.constexpr, HAS_LTE: tl.constexpr, HAS_UT: tl.constexpr, HAS_UTS: tl.constexpr):
    """``(partial, vec_partial, unmasked, masked)`` bool vectors for inner blocks ``t`` of outer block ``r``
    (entries with ``t >= T`` are all False); ``vec_partial``: the partial blocks the vectors may mask (the others
    need only the causal / key-tail mask). Same conditions as ``MaskVectors.tile_classes_reference``."""
    valid = t < T
    if BY_KEY:  # outer = key block r, inner = query blocks t
        qb = t
        kb = r + t * 0
    else:
        qb = r + t * 0
        kb = t
    r0 = qb * BLOCK_M
    r1 = tl.minimum(r0 + BLOCK_M, S_q)
    c0 = kb * BLOCK_N
    live = valid
    partial = c0 + BLOCK_N > S_k
    vec = t < 0  # no vectors: no block is partial because of them
    if CAUSAL:
        live = live & (c0 <= r1 - 1)
        partial = partial | (c0 + BLOCK_N - 1 > r0)
    if HAS_MASK:
        slot = L * NB
        mm = MM + l * NB + kb
        kb_ok = valid & (kb < NB)
        full = r0 >= tl.load(mm + 1 * slot, mask=kb_ok, other=0)  # LTS max
        part = r1 > tl.load(mm, mask=kb_ok, other=0)  # LTS min
        if HAS_LTE:
            full = full & (r1 <= tl.load(mm + 2 * slot, mask=kb_ok, other=0))  # LTE min
            part = part & (r0 < tl.load(mm + 3 * slot, mask=kb_ok, other=0))  # LTE max
        if HAS_UT:
            up_full = r1 <= tl.load(mm + 6 * slot, mask=kb_ok, other=0)  # UTE min
            up_part = r0 < tl.load(mm + 7 * slot, mask=kb_ok, other=0)  # UTE max
            if HAS_UTS:
                up_full = up_full & (r0 >= tl.load(mm + 5 * slot, mask=kb_ok, other=0))  # UTS max
                up_part = up_part & (r1 > tl.load(mm + 4 * slot, mask=kb_ok, other=0))  # UTS min
            full = full | up_full
            part = part | up_part
        live = live & (full == 0)
        partial = partial | part
        vec = part
    partial = partial & live
    vec = vec & live
    unmasked = live & (partial == 0)
    masked = valid & (live == 0)
    return partial, vec, unmasked, masked


@triton.jit
def _block_lists_kernel(MM, IDX, NPART, NFULL, FLO, NVEC, T, R, S_q, S_k, L, NB,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BY_KEY: tl.constexpr,
                        CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_LTE: tl.constexpr,
                        HAS_UT: tl.constexpr, HAS_UTS: tl.constexpr, CHUNK: tl.constexpr):
    """One program per (outer block r, row l): the inner blocks ordered partial by the vectors, partial by the
    causal / key-tail edge only, unmasked, fully masked (each ascending: a stable sort), their counts, and the
    first unmasked block when the unmasked ones are one run (else -1). Pass 1 counts, pass 2 scatters each block
    to its position by prefix sums."""
    r = tl.program_id(0)
    l = tl.program_id(1)
    n_v = 0
    n_p = 0
    n_f = 0
    first = T
    last = -1
    for c in range(0, T, CHUNK):
        t = c + tl.arange(0, CHUNK)
        partial, vec, unmasked, masked = _classes(MM, l, r, t, T, S_q, S_k, L, NB, BLOCK_M, BLOCK_N, BY_KEY,
                                                  CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)
        n_v += tl.sum(vec.to(tl.int32), 0)
        n_p += tl.sum(partial.to(tl.int32), 0)
        n_f += tl.sum(unmasked.to(tl.int32), 0)
        first = tl.minimum(first, tl.min(tl.where(unmasked, t, T), 0))
        last = tl.maximum(last, tl.max(tl.where(unmasked, t, -1), 0))
    row = l * R + r
    base = IDX + row * T
    seen_v = 0
    seen_e = 0
    seen_f = 0
    seen_m = 0
    for c in range(0, T, CHUNK):
        t = c + tl.arange(0, CHUNK)
        partial, vec, unmasked, masked = _classes(MM, l, r, t, T, S_q, S_k, L, NB, BLOCK_M, BLOCK_N, BY_KEY,
                                                  CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)
        edge = partial & (vec == 0)
        cv = tl.cumsum(vec.to(tl.int32), 0)
        ce = tl.cumsum(edge.to(tl.int32), 0)
        cf = tl.cumsum(unmasked.to(tl.int32), 0)
        cm = tl.cumsum(masked.to(tl.int32), 0)
        pos = tl.where(vec, seen_v + cv - 1,
                       tl.where(edge, n_v + seen_e + ce - 1,
                                tl.where(unmasked, n_p + seen_f + cf - 1, n_p + n_f + seen_m + cm - 1)))
        tl.store(base + pos, t, mask=t < T)
        seen_v += tl.sum(vec.to(tl.int32), 0)
        seen_e += tl.sum(edge.to(tl.int32), 0)
        seen_f += tl.sum(unmasked.to(tl.int32), 0)
        seen_m += tl.sum(masked.to(tl.int32), 0)
    tl.store(NPART + row, n_p)
    tl.store(NFULL + row, n_f)
    tl.store(NVEC + row, n_v)
    first = tl.where(n_f == 0, 0, first)  # the reference's argmax gives 0 when there is no unmasked block
    contiguous = (n_f == 0) | (last - first + 1 == n_f)
    tl.store(FLO + row, tl.where(contiguous, first, -1))


def block_minmax(lts, lte, uts, ute, seq_q: int, block_n: int, has_lte: bool, has_ut: bool,
                 has_uts: bool) -> torch.Tensor:
    """int32 ``[8, L, NB]`` min/max table (rows ``LTS_MIN, LTS_MAX, LTE_MIN, ..., UTE_MAX``) of the vectors
    ``[L, S_k]`` per block of ``block_n`` (a power of two) key columns; one launch."""
    rows, s_k = lts.shape
    nb = triton.cdiv(s_k, block_n)
    out = torch.empty(8, rows, nb, dtype=torch.int32, device=lts.device)
    _block_minmax_kernel[(nb, rows)](lts, lte, uts, ute, out, s_k, nb, rows, seq_q, BLOCK_N=block_n,
                                     HAS_LTE=has_lte, HAS_UT=has_ut, HAS_UTS=has_uts, num_warps=1)
    return out


def block_lists(mm: torch.Tensor, rows: int, seq_q: int, seq_k: int, block_m: int, block_n: int, by_key: bool,
                causal: bool, has_mask: bool, has_lte: bool, has_ut: bool, has_uts: bool):
    """Visit lists from the min/max table ``mm`` ``[8, rows, NB]`` (ignored without a mask): ``(idx int32
    [rows, R, T], n_partial int32 [rows, R], n_full int32 [rows, R], full_lo int32 [rows, R], n_vec_partial int32
    [rows, R])``, one launch.
    Contents as ``MaskVectors.block_lists_reference`` (bitwise).

    Raises:
        ValueError: ``rows * R * T > 2**31``: this kernel and the attention kernels address the list with int32
            arithmetic (``row * T``), which would wrap around.
    """
    tr, tc = triton.cdiv(seq_q, block_m), triton.cdiv(seq_k, block_n)
    r, t = (tc, tr) if by_key else (tr, tc)
    if rows * r * t > 2**31:  # the largest offset, rows * R * T - 1, must fit in int32
        raise ValueError(f"flashmask visit list [B*H_mask={rows}, {r}, {t}] has {rows * r * t} entries, over the "
                         f"int32 indexing limit of 2**31 of the Triton kernels (tiles {block_m} x {block_n}, "
                         f"S_q={seq_q}, S_k={seq_k}); split the batch into smaller calls or use one mask head")
    dev = mm.device
    idx = torch.empty(rows, r, t, dtype=torch.int32, device=dev)
    n_p, n_f, flo, n_v = (torch.empty(rows, r, dtype=torch.int32, device=dev) for _ in range(4))
    chunk = min(1024, max(16, triton.next_power_of_2(t)))
    _block_lists_kernel[(r, rows)](mm, idx, n_p, n_f, flo, n_v, t, r, seq_q, seq_k, rows, mm.shape[-1],
                                   BLOCK_M=block_m, BLOCK_N=block_n, BY_KEY=by_key, CAUSAL=causal,
                                   HAS_MASK=has_mask, HAS_LTE=has_lte, HAS_UT=has_ut, HAS_UTS=has_uts,
                                   CHUNK=chunk, num_warps=4 if chunk >= 512 else 1)
    return idx, n_p, n_f, flo, n_v
