"""The kernel benchmark's tables and summary from hand-made rows, and its V3 masks: runs on CPU, no timing."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")
bench = pytest.importorskip("flashmask.benchmarks.bench_attention")


def _row(mask, s, ours_fb, flex_fb, **extra):
    row = dict(mask=mask, S=s, B=1, H=32, H_kv=32, D=128, density=0.5, ours_fwd_ms=1.0, ours_fwd_tflops=500.0, flex_fwd_ms=1.3,
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


def test_causal_rows_say_whether_a_vector_was_given():
    rows = [_row("causal", 8192, 4.0, 5.0), _row("causal_vec", 8192, 4.2, 5.0)]
    first, second = bench.table(rows).splitlines()[2:]
    assert first.startswith("| causal [None] | 8192 |") and second.startswith("| causal [LTS=S] | 8192 |")


def test_v3_table_puts_v3_ratios_beside_ours():
    """``--v3`` rows: ours / flex and the reference's V3 / flex per row (fwd and fwd+bwd), ours / V3 estimated as
    their ratio, '-' where the reference has no figure; geometric means over the rows V3 has and the rows below
    0.95 of V3's fwd+bwd ratio."""
    rows = [_row("causal_vec", 8192, 4.0, 5.8),  # fwd+bwd 1.45x = V3's 1.45x
            _row("v3_causal_document", 8192, 1.0, 1.2),  # 1.20x against V3's 1.52x: below 0.95 of it
            _row("causal", 8192, 3.5, 5.2),  # no V3 figure (V3 takes vectors)
            _row("v3_sliding_window_1024", 16384, 2.0, 2.9)]  # the reference lost its 16K rows after causal_document
    text = bench.v3_table(rows)
    lines = text.splitlines()
    assert lines[0].startswith("| mask | S | ours fwd ms | flex fwd ms | ours/flex fwd | V3/flex fwd |")
    vec, doc, none, sw16 = lines[2:6]
    assert vec.startswith("| causal [LTS=S] | 8192 |")
    assert "| 1.30x | 1.33x |" in vec  # forward: ours 1.3 / 1.0 ms, V3 1.33x
    assert vec.endswith("| 1.45x | 1.45x | 1.00 |")
    assert doc.endswith("| 1.20x | 1.52x | 0.79 |")
    assert none.startswith("| causal [None] | 8192 |") and none.endswith("| 1.49x | - | - |")
    assert sw16.endswith("| 1.45x | - | - |") and "| - |" in sw16.split("1.30x", 1)[1]
    summary = lines[-1]
    assert "rows with a V3 figure: 2;" in summary
    assert "fwd+bwd over flex geomean ours 1.319x, V3 1.485x" in summary  # sqrt(1.45 * 1.2), sqrt(1.45 * 1.52)
    assert "fwd over flex geomean ours 1.300x, V3 1.360x" in summary  # sqrt(1.33 * 1.39)
    assert summary.endswith("rows below 0.95 of V3's fwd+bwd ratio: v3_causal_document 8192")


def test_v3_table_at_another_head_dim_has_no_v3_figures():
    """The same masks at D = 64 (``--v3 --head-dim 64``): V3's figures are for D = 128, H = 32 only."""
    text = bench.v3_table([_row("v3_causal_document", 8192, 1.0, 1.2, D=64, H_kv=8)])
    assert text.splitlines()[2].endswith("| 1.20x | - | - |")
    assert text.splitlines()[-1] == "all rows: fwd+bwd over flex geomean 1.200x, fwd 1.300x"


def test_v3_masks_match_the_reference_definitions(monkeypatch):
    """The V3 masks on CPU (the builder's ``.cuda()`` made a no-op): vector shapes, modes and values as the
    reference defines them."""
    monkeypatch.setattr(bench.torch.Tensor, "cuda", lambda self, *a, **k: self)
    s = 8192
    lens = bench.v3_doc_lengths(s)
    assert sum(lens) == s and all(256 <= n < 2048 for n in lens[:-1])
    sri, causal = bench.build_v3_mask("v3_sliding_window_1024", s)
    assert causal and sri.shape == (1, 1, s, 1) and sri.dtype == bench.torch.int32
    assert int(sri[0, 0, 0, 0]) == 1024 and int(sri[0, 0, s - 1, 0]) == s
    sri, causal = bench.build_v3_mask("v3_prefix_lm_1/4", s)
    assert not causal and sri.shape[-1] == 2
    assert int(sri[0, 0, s // 4 - 1, 1]) == 0 and int(sri[0, 0, s // 4, 1]) == s // 4 and int(sri[..., 0].min()) == s
    sri, causal = bench.build_v3_mask("v3_share_question", s)
    p, a = s // 4, (s - s // 4) // 3
    assert causal and int(sri[0, 0, 0, 0]) == s and int(sri[0, 0, p, 0]) == p + a and int(sri[0, 0, s - 1, 0]) == s
    sri, causal = bench.build_v3_mask("v3_document_bidir", s)
    assert not causal and int(sri[0, 0, 0, 0]) == lens[0] and int(sri[0, 0, lens[0], 1]) == lens[0]
    sri, causal = bench.build_v3_mask("causal_vec", s)
    assert causal and sri.shape == (1, 1, s, 1) and int(sri.min()) == int(sri.max()) == s
    assert bench.build_v3_mask("causal", s) == (None, True)


def test_rounds_reverse_the_order_and_keep_each_minimum(monkeypatch):
    calls, times = [], {"a": iter([2.0, 1.5]), "b": iter([1.0, 3.0])}

    def fake_bench(fn, grads=None, warmup=10, rep=50):
        key = fn()
        calls.append((key, warmup, rep))
        return next(times[key])

    monkeypatch.setattr(bench, "bench", fake_bench)
    best = bench.bench_rounds([("a", lambda: "a", None), ("b", lambda: "b", None)], 2, 25, 150)
    assert [c[0] for c in calls] == ["a", "b", "b", "a"]
    assert all(c[1:] == (25, 150) for c in calls)
    assert best == {"a": 1.5, "b": 1.0}
