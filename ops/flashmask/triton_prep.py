"""FlashMask preprocessing (SoA vectors, per-key-block min/max, tile classes and block lists) + the element mask.

Shape legend: B batch, H_mask mask heads, S_k keys, C vectors per column, NB = ceil(S_k / BLOCK_N).

Preprocessing (FlashMask ``prepare_sparsemask`` / ``scanMaxMinGpu`` in PaddlePaddle/flash-attention
``csrc/flash_attn/src/mask.h``; V3 ``prepare_block_maxmin``): the ``[..., C]`` tensor is de-interleaved into
structure-of-arrays int32 vectors ``[B*H_mask, S_k]`` and reduced to per-key-block min/max, O(S_k) work.
Tile classification follows ``SPARSE_MASKED_DOWN/UP`` of ``flash_fwd_kernel.h`` (flashmask.md §2.2); the
classes become per-block visit lists (partial first, then unmasked) that the kernels loop over.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import triton_blocklists as tl_lists

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
            self._mm, self._lists = {}, {}
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
        self._mm, self._lists = {}, {}

    def block_minmax(self, block_n: int) -> torch.Tensor:
        """int32 ``[8, B*H_mask, NB]`` min/max of each vector per key block of ``block_n`` columns (cached; one
        Triton launch, ``triton_blocklists.block_minmax``; ``[8, 1, 1]`` zeros without a mask).

        Absent vectors hold their defaults (LTE = S_q, UTS = 0, UTE = 0). The tail block is padded by
        repeating the last column, which leaves min and max unchanged.
        """
        if block_n not in self._mm:
            if self.has_mask:
                self._mm[block_n] = tl_lists.block_minmax(self.lts, self.lte, self.uts, self.ute, self.seq_q,
                                                          block_n, self.has_lte, self.has_ut, self.has_uts)
            else:
                self._mm[block_n] = torch.zeros(8, 1, 1, dtype=torch.int32, device=self.lts.device)
        return self._mm[block_n]

    def block_minmax_reference(self, block_n: int) -> torch.Tensor:
        """Pure-PyTorch :meth:`block_minmax` (uncached; the tests' reference)."""
        if not self.has_mask:
            return torch.zeros(8, 1, 1, dtype=torch.int32, device=self.lts.device)
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
        return out

    def tile_classes_reference(self, block_m: int, block_n: int):
        """Tile classes on the ``[Tr, Tc]`` grid of ``block_m`` x ``block_n`` tiles, from the min/max only.

        Returns bool ``(live, partial, vec_partial)``, each ``[L, Tr, Tc]`` with L = B*H_mask (1 without a mask):
        live = not fully masked (and not above the causal diagonal); partial = live and needs the element mask
        (interval overlap, causal diagonal, or key tail); vec_partial = partial because of the vectors (interval
        overlap; the other partial tiles need only the causal / key-tail mask). Conservative as in FlashMask
        §2.2: exact results either way.
        """
        dev = self.lts.device
        tr, tc = triton.cdiv(self.seq_q, block_m), triton.cdiv(self.seq_k, block_n)
        r0 = (torch.arange(tr, device=dev) * block_m).view(1, tr, 1)
        r1 = torch.clamp(r0 + block_m, max=self.seq_q)
        c0 = (torch.arange(tc, device=dev) * block_n).view(1, 1, tc)
        live = torch.ones(1, tr, tc, dtype=torch.bool, device=dev)
        partial = (c0 + block_n > self.seq_k).expand(1, tr, tc)
        vec = torch.zeros(1, tr, tc, dtype=torch.bool, device=dev)
        if self.causal:
            live = live & (c0 <= r1 - 1)
            partial = partial | (c0 + block_n - 1 > r0)
        if self.has_mask:
            mm = self.block_minmax_reference(block_n)[:, :, None, :]  # [8, L, 1, Tc]
            full = r0 >= mm[LTS_MAX]
            part = r1 > mm[LTS_MIN]
            if self.has_lte:
                full = full & (r1 <= mm[LTE_MIN])
                part = part & (r0 < mm[LTE_MAX])
            if self.has_ut:
                up_full = r1 <= mm[UTE_MIN]
                up_part = r0 < mm[UTE_MAX]
                if self.has_uts:
                    up_full = up_full & (r0 >= mm[UTS_MAX])
                    up_part = up_part & (r1 > mm[UTS_MIN])
                full = full | up_full
                part = part | up_part
            live = live & ~full
            partial = partial | part
            vec = part
        return live, partial & live, vec & live

    def block_lists(self, block_m: int, block_n: int, by_key: bool):
        """Per outer block, the inner blocks to visit: partial ones first, then unmasked ones (cached; one Triton
        launch, ``triton_blocklists.block_lists``, equal to :meth:`block_lists_reference`).

        ``by_key=False`` (forward, dQ): outer = query blocks, inner = key blocks; ``True`` (dK/dV): outer =
        key blocks, inner = query blocks. Returns ``(idx int32 [L, R, T], n_partial int32 [L, R],
        n_full int32 [L, R], full_lo int32 [L, R], n_vec_partial int32 [L, R])``; fully masked inner blocks are
        never listed, so the kernels never load them. ``full_lo`` is the first unmasked inner block when the
        unmasked ones form one contiguous run (causal, document, sliding-window and share-question masks: nearly
        every row), else -1: the kernels then loop ``range(full_lo, full_lo + n_full)`` with affine addresses, which
        Triton's software pipeliner prefetches better than the indirect list. The partial blocks start with the
        ``n_vec_partial`` ones that the vectors may mask; the others need only the causal / key-tail mask (mostly
        the diagonal blocks of causal masks), which the Gluon forward applies without reading the vectors. Like
        FlashMask V3's per-m-block ``generate_n_block`` list (flashmask.md §2.4), built on the device from the O(N)
        min/max in O(Tr*Tc) without evaluating any element.
        """
        key = (block_m, block_n, by_key)
        if key not in self._lists:
            self._lists[key] = tl_lists.block_lists(
                self.block_minmax(block_n), self.lts.shape[0] if self.has_mask else 1, self.seq_q, self.seq_k,
                block_m, block_n, by_key, self.causal, self.has_mask, self.has_lte, self.has_ut, self.has_uts)
        return self._lists[key]

    def visit_order(self, block_m: int, block_n: int, by_key: bool) -> torch.Tensor:
        """int32 ``[L, R]``: the outer blocks of :meth:`block_lists` from the most to the least work (cached), the
        longest-processing-time-first order in which the Gluon kernels start their programs, so that the last
        programs to start are short ones and the GPU's tail is short (FlashAttention-3's LPT scheduling for
        causal masks, here for every mask). Work = 2 x unmasked + 3 x partial blocks: a partial block also
        evaluates the element mask. Ties keep block order."""
        key = ("order", block_m, block_n, by_key)
        if key not in self._lists:
            _, n_p, n_f, _, _ = self.block_lists(block_m, block_n, by_key)
            self._lists[key] = torch.argsort(2 * n_f + 3 * n_p, dim=-1, descending=True,
                                             stable=True).to(torch.int32).contiguous()
        return self._lists[key]

    def block_lists_reference(self, block_m: int, block_n: int, by_key: bool):
        """Pure-PyTorch :meth:`block_lists` (uncached; the tests' reference): tile classes, then a stable argsort
        of the 0/1/2/3 key (partial by the vectors / partial by the edge only / unmasked / fully masked)."""
        live, partial, vec = self.tile_classes_reference(block_m, block_n)
        if by_key:
            live, partial, vec = live.transpose(1, 2), partial.transpose(1, 2), vec.transpose(1, 2)
        order = torch.where(vec, 0, torch.where(partial, 1, torch.where(live, 2, 3))).to(torch.int8)
        idx = torch.argsort(order, dim=-1, stable=True).to(torch.int32).contiguous()
        n_p = partial.sum(-1, dtype=torch.int32).contiguous()
        unmasked = live & ~partial
        n_f = unmasked.sum(-1, dtype=torch.int32).contiguous()
        t = unmasked.shape[-1]
        first = unmasked.to(torch.int8).argmax(-1).to(torch.int32)  # first True (0 when none)
        last = (t - 1) - unmasked.flip(-1).to(torch.int8).argmax(-1).to(torch.int32)
        contiguous = (n_f == 0) | (last - first + 1 == n_f)
        full_lo = torch.where(contiguous, first, torch.full_like(first, -1)).contiguous()
        n_v = vec.sum(-1, dtype=torch.int32).contiguous()
        return idx, n_p, n_f, full_lo, n_v


@triton.jit
def _visit_list(IDX, NPART, NFULL, FLO, row, bm, NUM_ROWS, NUM_INNER, HAS_MASK: tl.constexpr):
    """Outer block ``row``'s entry of :meth:`MaskVectors.block_lists` (one table per (batch, mask head) ``bm``
    with a mask, a single shared table without): ``(IDX row pointer, n_partial, n_full, full_lo)``."""
    lrow = row
    if HAS_MASK:
        lrow += bm * NUM_ROWS
    return IDX + lrow * NUM_INNER, tl.load(NPART + lrow), tl.load(NFULL + lrow), tl.load(FLO + lrow)


@triton.jit
def _load(ptrs, mask, other, EVEN: tl.constexpr):
    """``tl.load`` with the bounds mask only when the tile may cross an edge; ``EVEN`` (the lengths are
    multiples of the tile and D equals the padded head dim) drops the predicate from every load."""
    if EVEN:
        x = tl.load(ptrs)
    else:
        x = tl.load(ptrs, mask=mask, other=other)
    return x


@triton.jit
def _store(ptrs, x, mask, EVEN: tl.constexpr):
    """``tl.store`` counterpart of :func:`_load`."""
    if EVEN:
        tl.store(ptrs, x)
    else:
        tl.store(ptrs, x, mask=mask)


@triton.jit
def _load_mask_cols(cols, S_k, LTS, LTE, UTS, UTE,
                    HAS_MASK: tl.constexpr, HAS_LTE: tl.constexpr, HAS_UT: tl.constexpr, HAS_UTS: tl.constexpr,
                    EVEN: tl.constexpr):
    """The 4 mask vectors at ``cols`` (any shape); absent ones come back as a dummy 0 (never read)."""
    lts = 0
    lte = 0
    uts = 0
    ute = 0
    if HAS_MASK:
        cm = cols < S_k
        lts = _load(LTS + cols, cm, 0, EVEN)
        if HAS_LTE:
            lte = _load(LTE + cols, cm, 0, EVEN)
        if HAS_UT:
            ute = _load(UTE + cols, cm, 0, EVEN)
            if HAS_UTS:
                uts = _load(UTS + cols, cm, 0, EVEN)
    return lts, lte, uts, ute


@triton.jit
def _masked_from_cols(rows, cols, S_k, lts, lte, uts, ute,
                      CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_LTE: tl.constexpr,
                      HAS_UT: tl.constexpr, HAS_UTS: tl.constexpr):
    """Element mask from already-loaded column vectors (shaped like ``cols``); columns past S_k are masked."""
    masked = cols >= S_k
    if CAUSAL:
        masked = masked | (cols > rows)
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


@triton.jit
def _elem_masked(rows, cols, S_k, LTS, LTE, UTS, UTE,
                 CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_LTE: tl.constexpr,
                 HAS_UT: tl.constexpr, HAS_UTS: tl.constexpr, EVEN: tl.constexpr):
    """Element mask of a tile; ``rows`` and ``cols`` broadcast against each other ([M,1]x[1,N] or transposed).

    Vector pointers are already offset to the (batch, mask head) row. Columns past S_k count as masked.
    """
    lts, lte, uts, ute = _load_mask_cols(cols, S_k, LTS, LTE, UTS, UTE, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS, EVEN)
    return _masked_from_cols(rows, cols, S_k, lts, lte, uts, ute, CAUSAL, HAS_MASK, HAS_LTE, HAS_UT, HAS_UTS)
