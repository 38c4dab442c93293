"""FlashMask preprocessing and shared Triton helpers (tile classification, element mask, key/row ranges).

Shape legend: B batch, H_mask mask heads, S_k keys, C vectors per column, NB = ceil(S_k / BLOCK_N).

Preprocessing (FlashMask ``prepare_sparsemask`` / ``scanMaxMinGpu`` in PaddlePaddle/flash-attention
``csrc/flash_attn/src/mask.h``; V3 ``prepare_block_maxmin``): the ``[..., C]`` tensor is de-interleaved into
structure-of-arrays int32 vectors ``[B*H_mask, S_k]`` and reduced to per-key-block min/max, O(S_k) work.
Tile classification follows ``SPARSE_MASKED_DOWN/UP`` of ``flash_fwd_kernel.h`` (flashmask.md §2.2).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Row order of the min/max table: [vector, stat] -> row index.
LTS_MIN, LTS_MAX, LTE_MIN, LTE_MAX, UTS_MIN, UTS_MAX, UTE_MIN, UTE_MAX = range(8)


class MaskVectors:
    """SoA view of ``startend_row_indices``: which vectors exist and their contiguous int32 copies.

    Attributes:
        lts, lte, uts, ute: int32 ``[B*H_mask, S_k]`` (absent ones alias ``lts`` and are never read).
        has_mask / has_lte / has_ut / has_uts: constexpr flags for the kernels.
        h_mask: H_mask (1 when there is no mask).
    """

    def __init__(self, sri: torch.Tensor | None, causal: bool, seq_q: int, seq_k: int, device):
        self.seq_q, self.seq_k, self.causal = seq_q, seq_k, causal
        if sri is None:
            self.has_mask = self.has_lte = self.has_ut = self.has_uts = False
            self.h_mask = 1
            self.lts = self.lte = self.uts = self.ute = torch.zeros(1, dtype=torch.int32, device=device)
            self._mm = {}
            return
        b, hm, s_k, c = sri.shape
        self.h_mask = hm
        cols = sri.reshape(b * hm, s_k, c).to(torch.int32)
        vec = [cols[..., i].contiguous() for i in range(c)]  # each [B*H_mask, S_k]
        self.has_mask = True
        self.lts = vec[0]
        self.has_lte = (causal and c == 2) or c == 4
        self.has_ut = not causal
        self.has_uts = c == 4
        self.lte = vec[1] if self.has_lte else self.lts
        self.uts = vec[2] if self.has_uts else self.lts
        self.ute = (vec[1] if c == 2 else vec[3]) if self.has_ut else self.lts
        self._mm = {}

    def block_minmax(self, block_n: int) -> torch.Tensor:
        """int32 ``[8, B*H_mask, NB]`` min/max of each vector per key block of ``block_n`` columns (cached).

        Absent vectors hold their defaults (LTE = S_q, UTS = 0, UTE = 0). The tail block is padded by
        repeating the last column, which leaves min and max unchanged.
        """
        if block_n in self._mm:
            return self._mm[block_n]
        if not self.has_mask:
            mm = torch.zeros(8, 1, 1, dtype=torch.int32, device=self.lts.device)
            self._mm[block_n] = mm
            return mm
        bh, s_k = self.lts.shape
        nb = triton.cdiv(s_k, block_n)
        idx = torch.arange(nb * block_n, device=self.lts.device).clamp_(max=s_k - 1)
        out = torch.empty(8, bh, nb, dtype=torch.int32, device=self.lts.device)
        defaults = {1: None, 2: self.seq_q, 3: 0, 4: 0}  # vector slot -> default value when absent
        present = [True, self.has_lte, self.has_uts, self.has_ut]
        for slot, (vec, here) in enumerate(zip((self.lts, self.lte, self.uts, self.ute), present)):
            if here:
                blocks = vec[:, idx].view(bh, nb, block_n)
                out[2 * slot] = blocks.amin(-1)
                out[2 * slot + 1] = blocks.amax(-1)
            else:
                out[2 * slot : 2 * slot + 2] = defaults[slot + 1]
        self._mm[block_n] = out
        return out


@triton.jit
def _fully_masked(r0, r1, lts_max, lte_min, uts_max, ute_min,
                  HAS_LTE: tl.constexpr, HAS_UT: tl.constexpr, HAS_UTS: tl.constexpr):
    """True where every row of [r0, r1) is masked for every column of the block (conservative)."""
    res = r0 >= lts_max
    if HAS_LTE:
        res = res & (r1 <= lte_min)
    if HAS_UT:
        up = r1 <= ute_min
        if HAS_UTS:
            up = up & (r0 >= uts_max)
        res = res | up
    return res


@triton.jit
def _partly_masked(r0, r1, lts_min, lte_max, uts_min, ute_max,
                   HAS_LTE: tl.constexpr, HAS_UT: tl.constexpr, HAS_UTS: tl.constexpr):
    """True where some element of the tile may be masked by the column intervals (needs element math)."""
    res = r1 > lts_min
    if HAS_LTE:
        res = res & (r0 < lte_max)
    if HAS_UT:
        up = r0 < ute_max
        if HAS_UTS:
            up = up & (r1 > uts_min)
        res = res | up
    return res


@triton.jit
def _elem_masked(rows, cols, S_k, LTS, LTE, UTS, UTE,
                 CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_LTE: tl.constexpr,
                 HAS_UT: tl.constexpr, HAS_UTS: tl.constexpr):
    """Element mask of a tile; ``rows`` and ``cols`` broadcast against each other ([M,1]x[1,N] or transposed).

    Vector pointers are already offset to the (batch, mask head) row. Columns past S_k count as masked.
    """
    cm = cols < S_k
    masked = cols >= S_k
    if CAUSAL:
        masked = masked | (cols > rows)
    if HAS_MASK:
        down = rows >= tl.load(LTS + cols, mask=cm, other=0)
        if HAS_LTE:
            down = down & (rows < tl.load(LTE + cols, mask=cm, other=0))
        masked = masked | down
        if HAS_UT:
            up = rows < tl.load(UTE + cols, mask=cm, other=0)
            if HAS_UTS:
                up = up & (rows >= tl.load(UTS + cols, mask=cm, other=0))
            masked = masked | up
    return masked


@triton.jit
def _key_block_range(r0, r1, MM, mm_vec_stride, NB, BLOCK_N: tl.constexpr, NB_POW2: tl.constexpr,
                     CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_LTE: tl.constexpr,
                     HAS_UT: tl.constexpr, HAS_UTS: tl.constexpr):
    """``[lo, hi)`` key blocks that are not fully masked for query rows ``[r0, r1)`` (forward / dQ)."""
    hi = NB
    if CAUSAL:
        hi = tl.minimum(NB, (r1 + BLOCK_N - 1) // BLOCK_N)  # keys j <= r1 - 1
    lo = 0
    if HAS_MASK:
        nidx = tl.arange(0, NB_POW2)
        valid = nidx < hi
        full = _fully_masked(r0, r1,
                             tl.load(MM + LTS_MAX_ * mm_vec_stride + nidx, mask=valid, other=0),
                             tl.load(MM + LTE_MIN_ * mm_vec_stride + nidx, mask=valid, other=0),
                             tl.load(MM + UTS_MAX_ * mm_vec_stride + nidx, mask=valid, other=0),
                             tl.load(MM + UTE_MIN_ * mm_vec_stride + nidx, mask=valid, other=0),
                             HAS_LTE, HAS_UT, HAS_UTS)
        live = valid & (full == 0)
        lo = tl.min(tl.where(live, nidx, NB_POW2), axis=0)
        hi = tl.max(tl.where(live, nidx + 1, 0), axis=0)
    return lo, hi


@triton.jit
def _row_block_range(c0, MM, mm_vec_stride, n, S_q, NM, BLOCK_M: tl.constexpr, NM_POW2: tl.constexpr,
                     CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_LTE: tl.constexpr,
                     HAS_UT: tl.constexpr, HAS_UTS: tl.constexpr):
    """``[lo, hi)`` query blocks that are not fully masked for key block ``n`` starting at column ``c0``."""
    lo = 0
    if CAUSAL:
        lo = c0 // BLOCK_M  # rows below c0 see none of this block's columns
    hi = NM
    if HAS_MASK:
        midx = tl.arange(0, NM_POW2)
        r0 = midx * BLOCK_M
        r1 = tl.minimum(r0 + BLOCK_M, S_q)
        full = _fully_masked(r0, r1,
                             tl.load(MM + LTS_MAX_ * mm_vec_stride + n),
                             tl.load(MM + LTE_MIN_ * mm_vec_stride + n),
                             tl.load(MM + UTS_MAX_ * mm_vec_stride + n),
                             tl.load(MM + UTE_MIN_ * mm_vec_stride + n),
                             HAS_LTE, HAS_UT, HAS_UTS)
        live = (midx < NM) & (midx >= lo) & (full == 0)
        lo = tl.min(tl.where(live, midx, NM_POW2), axis=0)
        hi = tl.max(tl.where(live, midx + 1, 0), axis=0)
    return lo, hi


# constexpr copies of the row indices for use inside jit code
LTS_MIN_ = tl.constexpr(LTS_MIN)
LTS_MAX_ = tl.constexpr(LTS_MAX)
LTE_MIN_ = tl.constexpr(LTE_MIN)
LTE_MAX_ = tl.constexpr(LTE_MAX)
UTS_MIN_ = tl.constexpr(UTS_MIN)
UTS_MAX_ = tl.constexpr(UTS_MAX)
UTE_MIN_ = tl.constexpr(UTE_MIN)
UTE_MAX_ = tl.constexpr(UTE_MAX)


@triton.jit
def _tile_class(r0, r1, c0, n, MM, mm_vec_stride, S_k, BLOCK_N: tl.constexpr,
                CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_LTE: tl.constexpr,
                HAS_UT: tl.constexpr, HAS_UTS: tl.constexpr):
    """(skip, need_mask) scalars for tile rows [r0, r1) x key block n (columns [c0, c0 + BLOCK_N))."""
    need = (c0 + BLOCK_N) > S_k
    if CAUSAL:
        need = need | ((c0 + BLOCK_N - 1) > r0)
    skip = r0 >= r1  # always False for a real tile; gives a tensor of the right type
    if HAS_MASK:
        skip = _fully_masked(r0, r1,
                             tl.load(MM + LTS_MAX_ * mm_vec_stride + n),
                             tl.load(MM + LTE_MIN_ * mm_vec_stride + n),
                             tl.load(MM + UTS_MAX_ * mm_vec_stride + n),
                             tl.load(MM + UTE_MIN_ * mm_vec_stride + n),
                             HAS_LTE, HAS_UT, HAS_UTS)
        need = need | _partly_masked(r0, r1,
                                     tl.load(MM + LTS_MIN_ * mm_vec_stride + n),
                                     tl.load(MM + LTE_MAX_ * mm_vec_stride + n),
                                     tl.load(MM + UTS_MIN_ * mm_vec_stride + n),
                                     tl.load(MM + UTE_MAX_ * mm_vec_stride + n),
                                     HAS_LTE, HAS_UT, HAS_UTS)
    return skip, need
