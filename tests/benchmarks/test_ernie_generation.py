"""benchmarks/ernie_generation.py prints its table for the tiny preset on the CPU (a few tokens)."""

from tests._scripts import load_script


def test_ernie_generation_benchmark_prints_both_rows(capsys):
    rows = load_script("benchmarks/ernie_generation.py").main(["--prompt_len", "8", "--new_tokens", "3",
                                                              "--num_threads", "1"])
    assert [r["kv_cache"] for r in rows] == [True, False] and all(r["tokens"] == 3 for r in rows)
    out = capsys.readouterr().out
    assert "| on | 3 |" in out and "| off | 3 |" in out and "speed-up with the cache" in out
