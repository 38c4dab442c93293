"""benchmarks/e2e_hf_models.py --tiny: every CPU setup trains and the table compares them."""

from tests._scripts import load_script


def test_tiny_run_prints_the_side_by_side_table(capsys):
    bench = load_script("benchmarks/e2e_hf_models.py")
    results = bench.main(["--tiny", "--setups", "ours,ours_fused,hf_sdpa_padded,hf_sdpa_packed,native_llama,hf_llama",
                          "--steps", "1", "--warmup", "0", "--pack_len", "512"])
    assert all(r["tokens_per_sec"] > 0 for r in results.values())
    out = capsys.readouterr().out
    assert "| ours |" in out and "vs best hf packed" in out and "generic path (hf_llama) / native Llama" in out
