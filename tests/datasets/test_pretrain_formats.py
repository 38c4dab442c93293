"""Token files: the .bin/.idx bytes of PaddleNLP's and Megatron-LM's writer, the .npy/.npz pair, the same samples
from both, and one clear error (naming the file and the fix) for each kind of broken corpus."""

import os
import struct

import numpy as np
import pytest

from _pretrain_reference import ref_windows
from paddlenlp_ext.datasets.pretraining import (CorpusError, IndexedTokens, build_train_valid_test_datasets,
                                                token_dtype, write_corpus)


def _megatron_bytes(path, docs, dtype=np.uint16, code=8):
    """Write ``path.bin`` / ``path.idx`` byte for byte from the spec (not through our writer)."""
    flat = [t for d in docs for t in d]
    with open(str(path) + ".bin", "wb") as f:
        f.write(np.asarray(flat, dtype=dtype).tobytes())
    sizes = [len(d) for d in docs]
    pointers = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) * np.dtype(dtype).itemsize
    with open(str(path) + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code))
        f.write(struct.pack("<Q", len(docs)) + struct.pack("<Q", len(docs) + 1))
        f.write(np.asarray(sizes, np.int32).tobytes() + pointers.tobytes())
        f.write(np.arange(len(docs) + 1, dtype=np.int64).tobytes())
    return str(path)


def test_idx_bytes_match_the_spec(tmp_path):
    write_corpus(str(tmp_path / "c"), [[[1, 2, 3]], [[4, 5]]], np.uint16)
    assert (tmp_path / "c.bin").read_bytes() == bytes.fromhex("01000200030004000500")
    idx = (tmp_path / "c.idx").read_bytes()
    want = (b"MMIDIDX\x00\x00" + bytes([1] + [0] * 7) + bytes([8]) + struct.pack("<QQ", 2, 3)
            + struct.pack("<2i", 3, 2) + struct.pack("<2q", 0, 6) + struct.pack("<3q", 0, 1, 2))
    assert len(idx) == 82 and idx == want
    _megatron_bytes(tmp_path / "m", [[1, 2, 3], [4, 5]])
    assert (tmp_path / "m.idx").read_bytes() == idx


def test_files_written_by_megatron_layout_load(tmp_path):
    docs = [[7, 8, 9, 1], [3], [4, 5, 6]]
    c = IndexedTokens(_megatron_bytes(tmp_path / "m", docs, np.int32, 4))
    assert c.format == "mmap" and c.dtype == np.int32 and len(c) == 3 and c.num_tokens == 8
    assert [c.get(i).tolist() for i in range(3)] == docs
    assert c.get(2, 1, 1).tolist() == [5] and c.get(0, 2).tolist() == [9, 1]
    assert isinstance(c.tokens, np.memmap)


def test_npy_and_bin_give_the_same_samples(tmp_path):
    rng = np.random.RandomState(0)
    docs = [list(rng.randint(3, 500, size=rng.randint(1, 30))) for _ in range(60)]
    for impl in ("mmap", "npy"):
        d = tmp_path / impl
        d.mkdir()
        write_corpus(str(d / "corpus"), [[x] for x in docs], np.uint16, data_impl=impl)
    (tmp_path / "npy" / "corpus.bin").write_bytes(b"")  # ignored: the .npy pair wins, as in PaddleNLP
    out = {}
    for impl in ("mmap", "npy"):
        train, valid, test = build_train_valid_test_datasets(str(tmp_path / impl), "8,1,1", 16, (40, 5, 3), seed=7)
        out[impl] = [[ds[i].tolist() for i in range(len(ds))] for ds in (train, valid, test)]
        assert train.corpus.format == impl
    assert out["mmap"] == out["npy"]
    sizes = np.array([len(x) for x in docs])
    # and the samples are the reference algorithm's windows
    assert out["mmap"][0] == ref_windows(docs, sizes, list(range(0, 48)), 16, 40, 7)


def test_token_dtype_counts_added_tokens():
    assert token_dtype(49152) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.int32 and token_dtype(151_665) == np.int32


def test_missing_token_file_names_it(tmp_path):
    write_corpus(str(tmp_path / "c"), [[[1, 2, 3]]])
    os.remove(tmp_path / "c.bin")
    with pytest.raises(CorpusError, match=r"c\.bin is missing.*create_pretraining_data"):
        IndexedTokens(str(tmp_path / "c"))


def test_truncated_token_file_names_it(tmp_path):
    write_corpus(str(tmp_path / "c"), [[[1, 2, 3]], [[4, 5]]])
    (tmp_path / "c.bin").write_bytes((tmp_path / "c.bin").read_bytes()[:6])
    with pytest.raises(CorpusError, match=r"c\.bin holds 6 bytes.*truncated.*rebuild"):
        IndexedTokens(str(tmp_path / "c"))
    write_corpus(str(tmp_path / "n"), [[[1, 2, 3]], [[4, 5]]], data_impl="npy")
    raw = (tmp_path / "n_ids.npy").read_bytes()
    (tmp_path / "n_ids.npy").write_bytes(raw[:-4])
    with pytest.raises(CorpusError, match=r"n_ids\.npy"):
        IndexedTokens(str(tmp_path / "n"))


def test_truncated_index_names_it(tmp_path):
    write_corpus(str(tmp_path / "c"), [[[1, 2, 3]], [[4, 5]]])
    (tmp_path / "c.idx").write_bytes((tmp_path / "c.idx").read_bytes()[:50])
    with pytest.raises(CorpusError, match=r"c\.idx is truncated"):
        IndexedTokens(str(tmp_path / "c"))


def test_sizes_that_do_not_sum_to_the_tokens(tmp_path):
    write_corpus(str(tmp_path / "n"), [[[1, 2, 3]], [[4, 5]]], data_impl="npy")
    np.savez(tmp_path / "n_idx.npz", lens=np.array([3, 3], np.int32), docs=np.array([0, 1, 2], np.int64))
    with pytest.raises(CorpusError, match=r"n_idx\.npz: 'lens' sums to 6 tokens but .*n_ids\.npy holds 5"):
        IndexedTokens(str(tmp_path / "n"))
    _megatron_bytes(tmp_path / "m", [[1, 2, 3], [4, 5]])
    with open(tmp_path / "m.bin", "ab") as f:
        f.write(b"\x00\x00")
    with pytest.raises(CorpusError, match=r"m\.bin holds 12 bytes but .*m\.idx lists 2 sequences"):
        IndexedTokens(str(tmp_path / "m"))


def test_token_ids_past_the_vocabulary(tmp_path):
    write_corpus(str(tmp_path / "c"), [[list(range(1, 20))], [[3, 500, 4] * 5]])
    train, _, _ = build_train_valid_test_datasets(str(tmp_path / "c"), "1", 8, (4, 0, 0), seed=1, vocab_size=100)
    with pytest.raises(CorpusError, match=r"c\.bin: sequence 1 holds token id 500, outside .*\[0, 100\)"):
        [train[i] for i in range(len(train))]


def test_tokenizer_and_data_mismatch_from_the_recorded_vocabulary(tmp_path):
    write_corpus(str(tmp_path / "c"), [[list(range(1, 40))]], meta={"vocab_size": 50000, "tokenizer": "big"})
    with pytest.raises(CorpusError, match=r"c\.meta\.json: .*vocabulary of 50000 tokens \(big\), the tokenizer of "
                                          r"this run has 49152.*tokenizer_name_or_path"):
        build_train_valid_test_datasets(str(tmp_path / "c"), "1", 8, (4, 0, 0), seed=1, tokenizer_vocab_size=49152)
    train, _, _ = build_train_valid_test_datasets(str(tmp_path / "c"), "1", 8, (4, 0, 0), seed=1,
                                                  tokenizer_vocab_size=50000)
    assert len(train) >= 4


def test_corpus_shorter_than_one_window(tmp_path):
    write_corpus(str(tmp_path / "c"), [[[1, 2, 3]], [[4, 5]]])
    with pytest.raises(ValueError, match=r"train split of .*c .* holds 5 tokens, fewer than one window of "
                                         r"max_seq_length \+ 1 = 9"):
        build_train_valid_test_datasets(str(tmp_path / "c"), "1", 8, (4, 0, 0), seed=1)


def test_split_leaving_the_training_split_empty(tmp_path):
    write_corpus(str(tmp_path / "c"), [[list(range(1, 30))] for _ in range(10)])
    with pytest.raises(ValueError, match=r"split='0,1,0' leaves the train split of .*c empty"):
        build_train_valid_test_datasets(str(tmp_path / "c"), "0,1,0", 8, (4, 0, 0), seed=1)
    with pytest.raises(ValueError, match=r"split='949,50,1' leaves the valid split .*do_eval false"):
        build_train_valid_test_datasets(str(tmp_path / "c"), "949,50,1", 8, (4, 4, 0), seed=1)


def test_unknown_prefix_in_the_weighted_list(tmp_path):
    write_corpus(str(tmp_path / "a"), [[list(range(1, 30))]])
    with pytest.raises(CorpusError, match=r"input_dir lists the prefix '.*nope'.*fix the prefix"):
        build_train_valid_test_datasets(f"1 {tmp_path}/a 2 {tmp_path}/nope", "1", 8, (4, 0, 0), seed=1)
    with pytest.raises(ValueError, match=r"pairs 'weight prefix"):
        build_train_valid_test_datasets(f"1 {tmp_path}/a 2", "1", 8, (4, 0, 0), seed=1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"input_dir=.*empty' holds no corpus"):
        build_train_valid_test_datasets(str(tmp_path / "empty"), "1", 8, (4, 0, 0), seed=1)
    with pytest.raises(ValueError, match=r"is neither a directory of token files, nor a corpus prefix"):
        build_train_valid_test_datasets(str(tmp_path / "missing"), "1", 8, (4, 0, 0), seed=1)
