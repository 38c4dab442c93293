"""``tune_blocks`` helpers that run without a GPU: argument stripping and the across-process aggregation."""

from flashmask.benchmarks.tune_blocks import _strip, aggregate


def test_strip_removes_flags_and_values():
    argv = ["--seq", "8192", "--processes", "3", "--json=x.json", "--masks", "a,b", "--json", "y.json"]
    assert _strip(argv, ("--processes", "--json")) == ["--seq", "8192", "--masks", "a,b"]


def test_aggregate_takes_medians_per_job_and_mask():
    def run(a, b):
        return [{"variant": "new", "kind": "bwd-d", "config": "c", "ms": {"m1": a, "m2": b}}]

    rows = aggregate([run(1.0, 5.0), run(3.0, 4.0), run(2.0, 9.0)], ["m1", "m2"])
    assert rows[0]["ms"] == {"m1": 2.0, "m2": 5.0}
    assert rows[0]["ms_per_process"] == {"m1": [1.0, 3.0, 2.0], "m2": [5.0, 4.0, 9.0]}
    assert rows[0]["config"] == "c" and rows[0]["kind"] == "bwd-d"
