"""The kernel benchmark's table and summary (issue 9) from hand-made rows: runs on CPU, no timing."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")
bench = pytest.importorskip("flashmask.benchmarks.bench_attention")


def _row(mask, s, ours_fb, flex_fb, **extra):
    row = dict(mask=mask, S=s, B=1, density=0.5, ours_fwd_ms=1.0, ours_fwd_tflops=500.0, flex_fwd_ms=1.3,
               flex_fwd_tflops=385.0, ours_fb_ms=ours_fb, ours_fb_tflops=400.0, flex_fb_ms=flex_fb,
               flex_fb_tflops=300.0, flex_build_ms=0.5, ours_build_ms=0.25)
    row.update(extra)
    return row


def test_table_has_both_build_times_and_baselines():
    rows = [_row("causal", 8192, 4.0, 5.0, sdpa_cudnn_fwd_ms=0.9, sdpa_cudnn_fb_ms=3.5), _row("full", 8192, 4.0, 4.4)]
    text = bench.table(rows)
    header, _, first, second = text.splitlines()
    assert "build ms ours / flex" in header
    assert "| 0.25 / 0.50 |" in first and "sdpa-cudnn 0.90/3.50" in first
    assert "1.25x" in first and "1.10x" in second  # fwd+bwd speedup = flex / ours


def test_summary_geomean_and_worst_mask():
    rows = [_row("causal", 8192, 4.0, 5.0, sdpa_cudnn_fwd_ms=0.9, sdpa_cudnn_fb_ms=3.5), _row("full", 8192, 4.0, 4.4)]
    text = bench.summary(rows, 800.0)
    assert "geomean 1.173x" in text  # sqrt(1.25 * 1.10)
    assert "worst full 1.10x" in text
    assert "fwd+bwd 0.88x" in text  # cuDNN 3.5 ms / ours 4.0 ms
    assert "rows >= 1.1x: 2/2" in text
