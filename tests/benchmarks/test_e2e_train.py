"""benchmarks/e2e_train.py: its attention backends equal the FlashMask reference, and a --tiny run on CPU trains
every CPU-capable setup on the same tokens."""

import json

import torch
from flashmask.reference import flashmask_attention_reference


def _packed_qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    b, s, h, hk, d = 2, 48, 4, 2, 16
    q = torch.randn(b, s, h, d, generator=g)
    k, v = torch.randn(b, s, hk, d, generator=g), torch.randn(b, s, hk, d, generator=g)
    # row 0: examples of 20 and 28 tokens; row 1: 30 tokens then 18 padding columns (LTS 0)
    lts = torch.tensor([[20] * 20 + [48] * 28, [30] * 30 + [0] * 18], dtype=torch.int32)
    return q, k, v, lts[:, None, :, None]


def test_sdpa_dense_matches_reference(e2e):
    q, k, v, sri = _packed_qkv()
    ref, _ = flashmask_attention_reference(q, k, v, sri, True, q.shape[-1] ** -0.5, torch.float32)
    out = e2e.sdpa_dense_attention(q, k, v, sri, causal=True)
    real = torch.tensor([[True] * 48, [True] * 30 + [False] * 18])  # padding rows differ by design
    # fp32 both ways: tolerance of fp32 softmax/matmul reassociation
    torch.testing.assert_close(out[real], ref[real], rtol=1e-5, atol=1e-5)


def test_naive_causal_matches_plain_causal(e2e):
    q, k, v, _ = _packed_qkv(1)
    ref, _ = flashmask_attention_reference(q, k, v, None, True, q.shape[-1] ** -0.5, torch.float32)
    torch.testing.assert_close(e2e.naive_causal_attention(q, k, v, None), ref, rtol=1e-5, atol=1e-5)


def test_lengths_follow_the_documented_lognormal(e2e):
    recs = e2e.make_records(4000, 1000, 8192, seed=0)
    lens = torch.tensor([len(r["input_ids"]) for r in recs], dtype=torch.float64)
    assert 600 < lens.median() < 720 and 980 < lens.mean() < 1170  # median 661, mean 1074 (sampling noise)
    r = recs[0]
    assert r["labels"][: len(r["input_ids"]) // 3] == [-100] * (len(r["input_ids"]) // 3)


def test_tiny_cpu_run(e2e, tmp_path):
    out = tmp_path / "e2e.json"
    rep = e2e.main(["--tiny", "--setups", "ours,padded,sdpa_dense,naive_packed,hf_padded", "--pack_len", "256", "--steps", "2",
                    "--warmup", "1", "--out", str(out)])
    table = rep["table"]
    assert all(r["status"] == "ok" for r in table.values()), table
    # same token stream: identical real-token and attention-pair counts for packed and padded setups
    assert len({r["timed_tokens"] for r in table.values()}) == 1
    assert len({r["attn_pairs"] for r in table.values()}) == 1
    assert table["ours"]["timed_tokens"] == rep["meta"]["timed_tokens"]
    assert table["padded"]["timed_batches"] > table["ours"]["timed_batches"]
    # same seed -> same initial weights: ours and the dense-mask path compute the same isolated attention, so
    # their losses after the same packs differ only by bf16 rounding; naive packing (no isolation) differs
    # more. Measured on CPU: |ours - dense| = 4.5e-5, |ours - naive| = 6.5e-4 (loss ~6.26).
    ours, dense, naive = (table[k]["final_loss"] for k in ("ours", "sdpa_dense", "naive_packed"))
    assert abs(ours - dense) < abs(ours - naive) / 4
    assert json.loads(out.read_text())["table"].keys() == table.keys()
