"""The host-or-device benchmark's table from hand-made rows: runs on CPU, no timing."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")
hvd = pytest.importorskip("flashmask.benchmarks.host_vs_device")


def test_table_names_what_paces_each_call_and_the_flex_ratios():
    rows = [dict(mask="v3_causal_document", impl="ours", device_ms=0.8, b2b_ms=0.9, do_bench_ms=1.0, host_ms=1.1),
            dict(mask="v3_causal_document", impl="flex", device_ms=1.2, b2b_ms=1.35, do_bench_ms=1.3, host_ms=0.5)]
    lines = hvd.table(rows).splitlines()
    assert lines[2] == "| v3_causal_document | ours | 0.800 | 0.900 | 1.000 | 1.100 | host |"
    assert lines[3].endswith("| 0.500 | device |")
    assert lines[4] == "v3_causal_document: flex / ours device 1.50x, b2b 1.50x, do_bench 1.30x"


def test_table_without_a_flex_row_has_no_ratio_line():
    rows = [dict(mask="m", impl="ours", device_ms=1.0, b2b_ms=1.0, do_bench_ms=1.0, host_ms=0.5)]
    assert len(hvd.table(rows).splitlines()) == 3
