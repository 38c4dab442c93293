"""The numpy sample index equals a plain-Python reading of PaddleNLP's algorithm, and the worked examples of the
reference brief (docs/pretraining.md): splits, windows, epochs, separate last epoch, shuffles, blending."""

import numpy as np
import pytest

from _pretrain_reference import ref_blend, ref_blend_targets, ref_index, ref_split, ref_windows
from paddlenlp_ext.datasets.pretraining import (blend_num_samples, blending_indices, build_index, build_sample_idx,
                                                parse_split, split_bounds)

D = [[10, 11, 12, 13, 14], [20, 21, 22], [30, 31, 32, 33]]
SIZES = np.array([5, 3, 4], dtype=np.int32)


@pytest.mark.parametrize("split,size,want", [
    ("949,50,1", 1000, [0, 949, 999, 1000]), ("949,50,1", 100, [0, 95, 100, 100]),
    ("949,50,1", 20, [0, 19, 20, 20]), ("949,50,1", 10, [0, 10, 10, 10]), ("8,1,1", 9, [0, 7, 8, 9]),
    ("98,2,0", 50, [0, 49, 50, 50]), ("1", 5, [0, 5, 5, 5]), ("9/1", 10, [0, 9, 10, 10])])
def test_split_bounds_match_paddlenlp_rounding(split, size, want):
    assert split_bounds(split, size) == want == ref_split(split, size)


@pytest.mark.parametrize("bad", ["a,b", "", "0,0,0", "-1,2,1", "nan"])
def test_split_that_does_not_parse_names_the_value(bad):
    with pytest.raises(ValueError, match="split="):
        parse_split(bad)


def test_windows_cross_documents_one_epoch():
    assert build_sample_idx(SIZES, np.array([0, 1, 2], np.int32), 4, 1, 12).tolist() == [[0, 0], [0, 4], [2, 0]]
    assert build_sample_idx(SIZES, np.array([2, 0, 1], np.int32), 4, 1, 12).tolist() == [[0, 0], [1, 0], [1, 4]]


def test_two_epochs_fixed_doc_order():
    got = build_sample_idx(SIZES, np.array([0, 1, 2, 0, 1, 2], np.int32), 2, 2, 12).tolist()
    assert got == [[0, 0], [0, 2], [0, 4], [1, 1], [2, 0], [2, 2], [3, 0], [3, 2], [3, 4], [4, 1], [5, 0], [5, 2]]


def test_separate_last_epoch_worked_example():
    ix = build_index(SIZES, np.arange(3), 2, 6, 1234)
    assert ix.doc_idx.tolist() == [0, 1, 2, 1, 2, 0]
    assert ix.sample_idx.tolist() == [[0, 0], [0, 2], [0, 4], [1, 1], [2, 0], [2, 2], [3, 0], [3, 2], [4, 1], [4, 3],
                                      [5, 1], [5, 3]]
    assert ix.shuffle_idx.tolist() == [4, 2, 3, 1, 0, 10, 5, 8, 9, 7, 6] and ix.shuffle_idx.dtype == np.uint32
    windows = ref_windows(D, SIZES, [0, 1, 2], 2, 6, 1234)[:6]
    assert windows == [[30, 31, 32], [14, 20, 21], [21, 22, 30], [12, 13, 14], [10, 11, 12], [11, 12, 13]]
    ix = build_index(SIZES, np.arange(3), 2, 11, 1234)  # 11 of 11 samples: one shuffle over both epochs
    assert ix.doc_idx.tolist() == [2, 1, 2, 0, 1, 0]
    assert ix.shuffle_idx.tolist() == [9, 3, 5, 10, 4, 8, 0, 2, 6, 7, 1]


@pytest.mark.parametrize("seed", range(12))
def test_random_corpora_match_reference(seed):
    rng = np.random.RandomState(seed)
    sizes = rng.randint(0 if seed % 3 == 0 else 1, 9, size=rng.randint(3, 12)).astype(np.int32)
    sizes[rng.randint(len(sizes))] = max(2, sizes.max())  # at least one non-empty document
    lo = rng.randint(0, len(sizes) // 2)
    documents = np.arange(lo, len(sizes))
    tokens = int(sizes[documents].sum())
    seq = int(rng.randint(1, max(2, tokens - 1)))
    n = int(rng.randint(1, 40))
    doc_idx, sample_idx, shuffle = ref_index(sizes, list(documents), seq, n, seed)
    ix = build_index(sizes, documents, seq, n, seed)
    assert ix.doc_idx.tolist() == [int(d) for d in doc_idx]
    assert [tuple(r) for r in ix.sample_idx.tolist()] == sample_idx
    assert ix.shuffle_idx.tolist() == [int(s) for s in shuffle]
    assert len(ix) >= n


@pytest.mark.parametrize("weights,size,want_index,want_sample", [
    ([7, 3], 10, [0, 1, 0, 0, 1, 0, 0, 1, 0, 0], [0, 0, 1, 2, 1, 3, 4, 2, 5, 6]),
    ([1, 1, 2], 8, [2, 0, 1, 2, 0, 2, 1, 2], [0, 0, 0, 1, 1, 2, 1, 3])])
def test_blending_worked_examples(weights, size, want_index, want_sample):
    norm, _ = blend_num_samples(weights, 1)
    di, si = blending_indices(norm, size)
    assert di.tolist() == want_index and si.tolist() == want_sample
    assert (di.tolist(), si.tolist()) == ref_blend(weights, size)


def test_blend_targets_and_proportions():
    assert [blend_num_samples([0.7, 0.3], n)[1] for n in (100, 40, 20)] == [[91, 51], [49, 33], [35, 27]]
    rng = np.random.RandomState(0)
    for _ in range(5):
        w = rng.rand(rng.randint(2, 6)) + 0.01
        size = int(rng.randint(50, 3000))
        norm, targets = blend_num_samples(list(w), size)
        assert targets == ref_blend_targets(list(w), size)
        di, _ = blending_indices(norm, size)
        counts = np.bincount(di, minlength=len(w))
        # the greedy rule keeps every prefix of the blend within one sample of its exact share
        for i in (size // 3, size):
            part = np.bincount(di[:i], minlength=len(w))
            assert np.all(np.abs(part - np.asarray(norm) * i) <= 1.0 + 1e-9)
        assert np.all(counts <= np.asarray(targets))
