"""benchmarks/e2e_pretrain.py: the attention-pair count of a document-masked window, and a --tiny CPU run that
fills every row of the side-by-side table (flex_docmask is CUDA-only: FlexAttention compiles for the GPU)."""

import torch

from tests._scripts import load_script


def test_attention_pairs_count_documents():
    bench = load_script("benchmarks/e2e_pretrain.py", "e2e_pretrain_pairs")
    ids = torch.tensor([[5, 2, 7, 8, 2, 9]])
    lts = torch.tensor([[2, 2, 5, 5, 5, 6]], dtype=torch.int32)[:, None, :, None]
    # documents of 2, 3 and 1 tokens: 3 + 6 + 1 causal pairs; the plain window: 21
    assert bench.attention_pairs({"input_ids": ids, "attn_mask_startend_row_indices": lts}) == 10
    assert bench.attention_pairs({"input_ids": ids}) == 21


def test_tiny_run_prints_the_table(tmp_path, capsys):
    bench = load_script("benchmarks/e2e_pretrain.py", "e2e_pretrain_tiny")
    out = bench.main(["--tiny", "--seq", "128", "--setups", "docmask,causal,sdpa_causal", "--out",
                      str(tmp_path / "r.json")])
    rows = out["results"]["128"]
    assert all(rows[s]["status"] == "ok" and rows[s]["tokens_per_s"] > 0 for s in rows)
    assert rows["docmask"]["attn_pairs"] < rows["causal"]["attn_pairs"] == rows["sdpa_causal"]["attn_pairs"]
    assert "| 128 | docmask |" in capsys.readouterr().out
