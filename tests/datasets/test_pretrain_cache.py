"""The index cache is reused only when nothing that shapes the index changed; ``data_cache`` relocates it; blends of
several prefixes hold their weights."""

import os

import numpy as np

from paddlenlp_ext.datasets.pretraining import (BlendableDataset, IndexedTokens, build_split_dataset,
                                                build_train_valid_test_datasets, write_corpus)


def _corpus(path, n_docs=30, seed=0, lo=3, hi=40):
    rng = np.random.RandomState(seed)
    return write_corpus(str(path), [[list(rng.randint(3, 900, size=rng.randint(lo, hi)))] for _ in range(n_docs)])


def _cache_keys(d):
    return sorted(f[:-4] for f in os.listdir(d) if f.endswith(".dsc")) if os.path.isdir(d) else []


def test_cache_reused_only_when_nothing_changed(tmp_path, monkeypatch):
    prefix = _corpus(tmp_path / "c")
    calls = []
    import paddlenlp_ext.datasets.pretraining.dataset as mod

    real = mod.build_index
    monkeypatch.setattr(mod, "build_index", lambda *a, **k: calls.append(a) or real(*a, **k))
    corpus = IndexedTokens(prefix)
    base = dict(num_samples=20, seq_length=16, seed=3, split="9,1,0")
    first = build_split_dataset(corpus, "train", (0, 27), **base)
    again = build_split_dataset(corpus, "train", (0, 27), **base)
    assert len(calls) == 1 and [first[i].tolist() for i in range(20)] == [again[i].tolist() for i in range(20)]
    assert isinstance(again.index.sample_idx, np.memmap)  # loaded memory-mapped from the cache
    for change in (dict(num_samples=21), dict(seq_length=15), dict(seed=4), dict(split="8,2,0")):
        build_split_dataset(corpus, "train", (0, 27), **{**base, **change})
    build_split_dataset(corpus, "train", (0, 26), **base)  # another sequence range
    build_split_dataset(corpus, "valid", (0, 27), **base)
    assert len(calls) == 7
    # the same prefix rewritten with other documents (PaddleNLP's key would reuse the stale index)
    _corpus(tmp_path / "c", seed=1)
    build_split_dataset(IndexedTokens(prefix), "train", (0, 27), **base)
    assert len(calls) == 8
    cache = tmp_path / "index-cache"
    assert len(_cache_keys(cache)) == 8 and not [f for f in os.listdir(cache) if f.endswith(".tmp")]
    names = os.listdir(cache)
    key = _cache_keys(cache)[0]
    assert {f"{key}.dsc", f"{key}_doc_idx.npy", f"{key}_sample_idx.npy", f"{key}_shuffle_idx.npy"} <= set(names)


def test_moved_corpus_keeps_its_cache_and_data_cache_relocates(tmp_path):
    (tmp_path / "a").mkdir()
    prefix = _corpus(tmp_path / "a" / "c")
    rel = tmp_path / "rel"
    build_train_valid_test_datasets(prefix, "9,1,0", 16, (20, 4, 0), seed=1, data_cache=str(rel))
    assert _cache_keys(rel) and not os.path.exists(tmp_path / "a" / "index-cache")
    # a cache found in index-cache next to the data is used before data_cache
    build_train_valid_test_datasets(prefix, "9,1,0", 16, (20, 4, 0), seed=1)
    assert len(_cache_keys(tmp_path / "a" / "index-cache")) == 2
    before = sorted(os.listdir(rel))
    build_train_valid_test_datasets(prefix, "9,1,0", 16, (20, 4, 0), seed=1, data_cache=str(rel))
    assert sorted(os.listdir(rel)) == before


def test_blend_proportions_and_sizes(tmp_path):
    a = _corpus(tmp_path / "a", n_docs=60, seed=1)
    b = _corpus(tmp_path / "b", n_docs=60, seed=2)
    train, valid, test = build_train_valid_test_datasets(f"7 {a} 3 {b}", "949,50,1", 8, (500, 0, 0), seed=5)
    assert isinstance(train, BlendableDataset) and len(train) == 500 and valid is None and test is None
    counts = np.bincount(train.dataset_index, minlength=2)
    assert abs(counts[0] - 350) <= 1 and abs(counts[1] - 150) <= 1  # within one sample of the exact share
    assert [len(d) for d in train.datasets] >= [int(np.ceil(500 * w * 1.005)) + 20 for w in (0.7, 0.3)]
    # an input_dir directory blends every prefix in it with weight 1
    train, _, _ = build_train_valid_test_datasets(str(tmp_path), "949,50,1", 8, (100, 0, 0), seed=5)
    assert [d.corpus.prefix for d in train.datasets] == [str(tmp_path / "a"), str(tmp_path / "b")]
    assert np.bincount(train.dataset_index).tolist() == [50, 50]
    first = train[0]
    assert first.dtype == np.int64 and first.shape == (9,)
