"""ZeroPadding packing and the collator: the worked examples of paddlenlp_spec.md 2.3 / 2.4 and design.md."""

import logging

import pytest
import torch

from paddlenlp_ext.datasets import (
    PackCollator,
    ZeroPaddingIterableDataset,
    ZeroPaddingMapDataset,
    collate_packs,
    concat_records,
    generate_greedy_packs,
    iter_packs,
    shuffled_indices,
    tokenize_sft_example,
)


def rec(n, tag=0):
    """A tokenized record of n tokens whose ids all equal ``tag`` (to follow it through packing)."""
    return {"input_ids": [tag] * n, "labels": [tag] * n, "position_ids": list(range(n)),
            "attn_mask_startend_row_indices": [n] * n}


def lens(packs):
    return [[len(r["input_ids"]) for r in p] for p in packs]


def test_greedy_worked_example():
    packs = generate_greedy_packs([rec(n) for n in [7, 6, 5, 4, 3, 9]], 12)
    assert lens(packs) == [[7, 4], [6, 5], [3, 9]]
    assert lens(iter_packs([rec(n) for n in [7, 6, 5, 4, 3, 9]], 12, greedy=True)) == [[7, 4], [6, 5], [3, 9]]


def test_non_greedy_worked_example_drops_oversize(caplog):
    stats = {}
    with caplog.at_level(logging.WARNING):
        packs = list(iter_packs([rec(n) for n in [7, 6, 5, 4, 3, 9, 13]], 12, greedy=False, stats=stats))
    assert lens(packs) == [[7], [6, 5], [4, 3], [9]]
    assert stats == {"records": 7, "dropped": 1, "packs": 4}
    assert "dropped 1 of 7 records longer than max_length=12" in caplog.text


def test_greedy_buffer_is_500_records():
    # 501 records of 6 tokens with capacity 12: the first buffer packs 500 -> 250 packs, the 501st is alone
    packs = list(iter_packs([rec(6, tag=i) for i in range(501)], 12, greedy=True))
    assert len(packs) == 251 and lens(packs)[-1] == [6]
    assert packs[-1][0]["input_ids"][0] == 500
    # worst-fit inside a buffer: records 0 and 1 share the first pack
    assert [r["input_ids"][0] for r in packs[0]] == [0, 1]


def test_packed_worked_example_A_B(stub_tok):
    """spec 2.3 A + B, packed non-greedy into max_length=12 and collated (design.md section 2)."""
    a = tokenize_sft_example({"src": ["a b c"], "tgt": ["x y"]}, stub_tok, src_length=6, max_length=12)
    b = tokenize_sft_example({"src": ["d e"], "tgt": ["z"]}, stub_tok, src_length=6, max_length=12)
    ds = ZeroPaddingMapDataset([a, b], stub_tok, max_length=12, greedy_zero_padding=False)
    assert len(ds) == 1
    batch = collate_packs([ds[0]], max_length=12, pad_token_id=stub_tok.pad_token_id)
    tok = stub_tok.convert_tokens_to_ids
    ign, pad = -100, stub_tok.pad_token_id
    assert batch["input_ids"].tolist() == [tok(["<s>", "a", "b", "c", "x", "y", "<s>", "d", "e", "z"]) + [pad, pad]]
    assert batch["labels"].tolist() == [[ign, ign, ign, tok("x"), tok("y"), tok("</s>"),
                                         ign, ign, tok("z"), tok("</s>"), ign, ign]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 0, 0]]
    sri = batch["attn_mask_startend_row_indices"]
    assert sri.dtype == torch.int32 and sri.shape == (1, 1, 12, 1)
    assert sri.flatten().tolist() == [6, 6, 6, 6, 6, 6, 10, 10, 10, 10, 0, 0]
    assert batch["input_ids"].dtype == batch["labels"].dtype == batch["position_ids"].dtype == torch.int64


def test_packed_mask_is_block_diagonal_causal():
    """The collated startend, read by the FlashMask oracle (ops/flashmask/dense.py), gives per-example causal
    blocks and fully masked padding rows and columns."""
    from flashmask.dense import to_dense

    batch = collate_packs([concat_records([rec(3), rec(2)])], max_length=7)
    allowed = to_dense(batch["attn_mask_startend_row_indices"], causal=True)[0, 0]  # [7, 7]
    expected = torch.zeros(7, 7, dtype=torch.bool)
    expected[:3, :3] = torch.tril(torch.ones(3, 3, dtype=torch.bool))
    expected[3:5, 3:5] = torch.tril(torch.ones(2, 2, dtype=torch.bool))
    assert torch.equal(allowed, expected)


def test_concat_offsets_index_keys_for_preference_records():
    """DPO-style records: chosen/rejected labels concatenated, response_indexs offset on 3 position entries."""
    r1 = {"input_ids": [1] * 9, "chosen_labels": [5] * 9, "rejected_labels": [6] * 9, "position_ids": list(range(9)),
          "attn_mask_startend_row_indices": [9, 9, 6, 6, 6, 6, 9, 9, 9], "response_indexs": [2, 6, 9, 1]}
    r2 = {"input_ids": [2] * 6, "chosen_labels": [7] * 6, "rejected_labels": [8] * 6,
          "position_ids": [0, 1, 2, 1, 2, 3], "attn_mask_startend_row_indices": [6, 3, 3, 6, 6, 6],
          "response_indexs": [1, 3, 6, 1]}
    pack = concat_records([r1, r2])
    assert pack["attn_mask_startend_row_indices"] == [9, 9, 6, 6, 6, 6, 9, 9, 9, 15, 12, 12, 15, 15, 15]
    assert pack["response_indexs"] == [[2, 6, 9, 1], [10, 12, 15, 1]]
    assert pack["position_ids"] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 1, 2, 3]
    batch = collate_packs([pack], max_length=16, pad_token_id=0)
    assert batch["response_indexs"].tolist() == [[0, 2, 6, 9], [0, 10, 12, 15]]  # spec 2.6 packed example
    assert batch["chosen_labels"][0, -1].item() == -100 and batch["rejected_labels"][0, -1].item() == -100
    assert batch["attn_mask_startend_row_indices"][0, 0, :, 0].tolist()[-1] == 0
    # RM form: two position entries
    rm = concat_records([dict(r1, response_indexs=[7, 11]), dict(r2, response_indexs=[2, 5])],
                        index_keys={"response_indexs": 2})
    assert rm["response_indexs"] == [[7, 11], [11, 14]]


def test_collate_dynamic_padding_and_errors():
    packs = [concat_records([rec(5)]), concat_records([rec(3)])]
    b = collate_packs(packs, max_length=12, pad_token_id=9, pad_to_multiple_of=4)
    assert b["input_ids"].shape == (2, 8)
    assert b["input_ids"][1].tolist() == [0, 0, 0, 9, 9, 9, 9, 9]
    assert b["labels"][1, 3:].tolist() == [-100] * 5
    assert b["attn_mask_startend_row_indices"].shape == (2, 1, 8, 1)
    with pytest.raises(ValueError, match="more than max_length=4"):
        collate_packs(packs, max_length=4)
    with pytest.raises(ValueError, match="no packs"):
        collate_packs([], max_length=4)
    with pytest.raises(ValueError, match="'labels' has length 2, input_ids has 3"):
        concat_records([{"input_ids": [1, 2, 3], "labels": [1, 2]}])
    assert PackCollator(12, 9)(packs)["input_ids"].shape == (2, 12)


def test_iterable_matches_map_and_resumes():
    records = [rec(n, tag=i) for i, n in enumerate([7, 6, 5, 4, 3, 9, 2, 11, 1, 8] * 3)]
    for greedy in (False, True):
        m = ZeroPaddingMapDataset(records, None, 12, greedy)
        it = ZeroPaddingIterableDataset(records, None, 12, greedy)
        full = list(it)
        assert full == [m[i] for i in range(len(m))]
        # consume 4 packs, save, restore into a fresh dataset: continues with pack 4
        it2 = ZeroPaddingIterableDataset(records, None, 12, greedy)
        g = iter(it2)
        for _ in range(4):
            next(g)
        state = it2.state_dict()
        assert state["packs_emitted"] == 4 and state["records_consumed"] >= 4
        it3 = ZeroPaddingIterableDataset(records, None, 12, greedy)
        it3.load_state_dict(state)
        assert list(it3) == full[4:]
        assert list(it3) == full  # the skip applies to one pass only


def test_iterable_sharding_and_callable_source():
    records = [rec(n, tag=i) for i, n in enumerate([7, 6, 5, 4, 3, 9, 2, 11])]
    full = list(ZeroPaddingIterableDataset(lambda: iter(records), None, 12))
    shards = [list(ZeroPaddingIterableDataset(records, None, 12, num_shards=2, shard_index=i)) for i in range(2)]
    assert shards[0] == full[0::2] and shards[1] == full[1::2]
    with pytest.raises(ValueError, match="shard_index"):
        ZeroPaddingIterableDataset(records, None, 12, num_shards=2, shard_index=2)


def test_dataloader_with_workers_covers_each_pack_once():
    records = [rec(n, tag=i) for i, n in enumerate([7, 6, 5, 4, 3, 9, 2, 11, 1, 8])]
    ds = ZeroPaddingIterableDataset(records, None, 12)
    loader = torch.utils.data.DataLoader(ds, batch_size=1, num_workers=2, collate_fn=PackCollator(12))
    seen = sorted(b["input_ids"][0, 0].item() for b in loader)
    assert seen == sorted(p["input_ids"][0] for p in ZeroPaddingMapDataset(records, None, 12).packs)


def test_shuffled_indices_is_seeded():
    a = shuffled_indices(10, seed=42, epoch=0)
    assert a == shuffled_indices(10, seed=42, epoch=0) and sorted(a) == list(range(10))
    assert a != shuffled_indices(10, seed=42, epoch=1)


def test_one_per_pack_mode():
    ds = ZeroPaddingMapDataset([rec(3), rec(4), rec(13)], None, 12, greedy_zero_padding=True, one_per_pack=True)
    assert [p["seq_lens"] for p in ds.packs] == [[3], [4]] and ds.stats["dropped"] == 1
