"""Triton mask preprocessing (``flashmask.triton_blocklists``) against its pure-PyTorch reference
(``MaskVectors.*_reference``): min/max tables and visit lists bitwise equal, every mode, vector count, tile shape
and orientation, lengths that are not multiples of the tiles, inner lists longer than one chunk."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
from flashmask import masks as M  # noqa: E402
from flashmask.triton_prep import MaskVectors  # noqa: E402
from test_triton import DEV, random_sri  # noqa: E402

TILES = [(16, 16), (16, 32), (32, 16), (64, 128)]


def _check(sri, causal, s_q, s_k, tiles=TILES, orientations=(False, True)):
    mv = MaskVectors(sri, causal, s_q, s_k, torch.device(DEV))
    for bm, bn in tiles:
        assert torch.equal(mv.block_minmax(bn), mv.block_minmax_reference(bn)), (bm, bn)
        for by_key in orientations:
            got = mv.block_lists(bm, bn, by_key)
            ref = mv.block_lists_reference(bm, bn, by_key)
            for name, a, b in zip(("idx", "n_partial", "n_full", "full_lo", "n_vec_partial"), got, ref, strict=True):
                assert a.dtype == torch.int32 and a.shape == b.shape, (name, a.shape, b.shape)
                assert torch.equal(a, b), f"{name} differs: tiles {bm}x{bn} by_key={by_key}"


@pytest.mark.parametrize("causal,c", [(True, 1), (True, 2), (False, 2), (False, 4)])
@pytest.mark.parametrize("b,s", [(2, 1), (2, 37), (1, 300)])
def test_random_masks_match_reference(causal, c, b, s):
    """``b`` x 2 mask rows; one batch row at S = 300, where the interpreter's cost (one program per row and outer
    block) is highest: the kernels treat the B * H_mask rows alike. There, every mode but the non-causal C = 2 (no
    unmasked block) has rows whose unmasked blocks form more than one run (``full_lo`` = -1)."""
    gen = torch.Generator().manual_seed(s * 10 + c + causal)
    sri = random_sri(b, 2, s, causal, c, gen=gen).to(DEV)
    _check(sri, causal, s, s)
    if s == 300 and (causal or c == 4):
        mv = MaskVectors(sri, causal, s, s, torch.device(DEV))
        assert any(bool((mv.block_lists_reference(bm, bn, k)[3] < 0).any()) for bm, bn in TILES for k in (False, True))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("s", [1, 100, 257])
def test_no_mask_matches_reference(causal, s):
    _check(None, causal, s, s)


def test_cross_attention_lengths():
    """S_q != S_k (non-causal only): query and key block counts differ in both orientations."""
    gen = torch.Generator().manual_seed(3)
    _check(random_sri(1, 2, 90, False, 4, s_q=50, gen=gen).to(DEV), False, 50, 90)


@pytest.mark.parametrize("name", ["causal_document", "share_question", "sliding_window", "global_sliding"])
def test_builder_masks_and_long_lists(name):
    """Structured masks (contiguous unmasked runs, so ``full_lo`` >= 0 on most rows) and, at 16-wide tiles
    over 2200 tokens, 138 inner blocks per list; the 2-chunk path is forced with S = 20000 below."""
    s = 2200
    m = {"causal_document": lambda: M.causal_document_mask([[700, 900, 600]]),
         "share_question": lambda: M.share_question_mask([[(500, [300, 400]), (600, [200, 200])]], seq_len=s),
         "sliding_window": lambda: M.sliding_window_mask(s, 256),
         "global_sliding": lambda: M.global_sliding_window_mask(s, 32, (128, 128))}[name]()
    _check(m.startend_row_indices.to(DEV), m.causal, s, s, tiles=[(16, 16), (64, 128)])


def test_inner_list_longer_than_one_chunk():
    """More than 1024 inner blocks per outer block: the kernel walks its inner blocks in chunks."""
    s = 20000
    m = M.causal_document_mask([[9000, 11000]])
    sri = m.startend_row_indices.to(DEV)
    _check(sri, True, s, s, tiles=[(16, 4096)], orientations=(True,))  # 1250 query blocks per key block


@pytest.mark.parametrize("by_key", [False, True])
def test_visit_order_starts_the_most_work_first(by_key):
    """``visit_order``: per row, a permutation of the outer blocks by 2 x unmasked + 3 x partial visits,
    descending, ties in block order; the no-mask table has one row."""
    gen = torch.Generator().manual_seed(3)
    for sri, causal in [(random_sri(2, 2, 300, True, 2, gen=gen).to(DEV), True),
                        (M.causal_document_mask([[100, 37, 163]]).startend_row_indices.to(DEV), True),
                        (None, True), (None, False)]:
        mv = MaskVectors(sri, causal, 300, 300, torch.device(DEV))
        _, n_p, n_f, _, _ = mv.block_lists(16, 32, by_key)
        order = mv.visit_order(16, 32, by_key)
        assert order.dtype == torch.int32 and order.shape == n_p.shape and order.is_contiguous()
        work = 2 * n_f + 3 * n_p
        for row in range(order.shape[0]):
            o = order[row].long()
            assert sorted(o.tolist()) == list(range(o.numel()))
            w = work[row, o]
            assert bool((w[:-1] >= w[1:]).all())
            ties = (w[:-1] == w[1:])
            assert bool((o[:-1][ties] < o[1:][ties]).all())
        assert mv.visit_order(16, 32, by_key) is order  # cached


def test_vector_partial_blocks_come_first():
    """``n_vec_partial``: the partial blocks the vectors may mask are listed first; the rest are the blocks that
    only the causal diagonal (or the key tail) cuts. Causal with an all-``S`` LTS vector: no block needs the
    vectors. Sliding window of 256 at 64 x 64 tiles: each query block has its diagonal block (causal only) and one
    window-edge block (vectors) partial."""
    s, dev = 1024, torch.device(DEV)
    all_s = torch.full((1, 1, s, 1), s, dtype=torch.int32, device=dev)
    mv = MaskVectors(all_s, True, s, s, dev)
    idx, n_p, n_f, _, n_v = mv.block_lists(64, 64, False)
    assert bool((n_v == 0).all()) and bool((n_p == 1).all())
    assert torch.equal(idx[0, :, 0], torch.arange(s // 64, dtype=torch.int32, device=dev))  # the diagonal
    m = M.sliding_window_mask(s, 256)
    mv = MaskVectors(m.startend_row_indices.to(DEV), m.causal, s, s, dev)
    idx, n_p, _, _, n_v = mv.block_lists(64, 64, False)
    rows = torch.arange(s // 64, device=dev)
    assert torch.equal(n_v[0, 4:], torch.ones_like(n_v[0, 4:])) and torch.equal(n_p[0, 4:], 2 * n_v[0, 4:])
    assert torch.equal(idx[0, 4:, 0].long(), rows[4:] - 4)  # the window edge, then the diagonal
    assert torch.equal(idx[0, 4:, 1].long(), rows[4:])


@pytest.mark.parametrize("causal,c", [(True, 1), (True, 2), (False, 2), (False, 4)])
def test_blocks_after_the_vector_partial_ones_have_no_vector_masked_element(causal, c):
    """Soundness of ``n_vec_partial``: the kernels skip the vectors on the partial blocks listed after the first
    ``n_vec_partial``, so none of their elements may be masked by the vectors alone (checked element by element,
    both orientations, tails, S_q != S_k)."""
    gen = torch.Generator().manual_seed(7 + c + causal)
    checked = 0
    for s_q, s_k in [(150, 150)] if causal else [(150, 150), (70, 130), (130, 70)]:
        sri = random_sri(2, 2, s_k, causal, c, s_q=s_q, gen=gen).to(DEV)
        mv = MaskVectors(sri, causal, s_q, s_k, torch.device(DEV))
        r = torch.arange(s_q, device=DEV)[None, :, None]
        lte = mv.lte if mv.has_lte else torch.full_like(mv.lts, s_q)
        by_vec = (r >= mv.lts[:, None, :]) & (r < lte[:, None, :])  # [L, S_q, S_k]
        if mv.has_ut:
            uts = mv.uts if mv.has_uts else torch.zeros_like(mv.ute)
            by_vec |= (r >= uts[:, None, :]) & (r < mv.ute[:, None, :])
        for bm, bn in [(16, 16), (32, 16), (16, 32)]:
            for by_key in (False, True):
                idx, n_p, _, _, n_v = mv.block_lists(bm, bn, by_key)
                for row in range(idx.shape[0]):
                    for outer in range(idx.shape[1]):
                        for pos in range(int(n_v[row, outer]), int(n_p[row, outer])):
                            inner = int(idx[row, outer, pos])
                            qb, kb = (inner, outer) if by_key else (outer, inner)
                            tile = by_vec[row, qb * bm:(qb + 1) * bm, kb * bn:(kb + 1) * bn]
                            assert not bool(tile.any()), (s_q, s_k, bm, bn, by_key, row, qb, kb)
                            checked += 1
    assert checked > 0
