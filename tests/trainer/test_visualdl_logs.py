"""report_to visualdl writes VisualDL records (read back with visualdl's own reader) holding the same scalars as the
TensorBoard events; without the visualdl package it writes TensorBoard events with one warning."""

import glob
import logging
import os
from types import SimpleNamespace

import pytest

from paddlenlp_ext.trainer.logging_utils import MetricsLogger

STEPS = [{"loss": 2.5, "lr": 1e-3}, {"loss": 2.0, "lr": 9e-4}, {"loss": 1.5, "lr": 8e-4}]


def _write(out_dir, report_to):
    m = MetricsLogger(SimpleNamespace(output_dir=str(out_dir), report_to=report_to, disable_tqdm=True), len(STEPS))
    for step, metrics in enumerate(STEPS, 1):
        m.log(metrics, step)
    m.log({"eval_loss": 1.25}, len(STEPS), prefix="eval")
    m.close()
    return os.path.join(str(out_dir), "runs")


def _tensorboard_scalars(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(log_dir)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_visualdl_records_read_back_equal_tensorboard(tmp_path):
    pytest.importorskip("visualdl")
    from visualdl import LogReader

    log_dir = _write(tmp_path, ["visualdl", "tensorboard"])
    records = glob.glob(os.path.join(log_dir, "vdlrecords.*.log"))
    assert len(records) == 1
    reader = LogReader(file_path=records[0])
    tags = reader.get_tags()["scalar"]
    assert sorted(tags) == ["eval/loss", "train/loss", "train/lr"]
    vdl = {tag: [(r.id, r.value) for r in reader.get_data("scalar", tag)] for tag in tags}
    assert vdl["train/loss"] == [(1, 2.5), (2, 2.0), (3, 1.5)] and vdl["eval/loss"] == [(3, 1.25)]
    tb = _tensorboard_scalars(log_dir)
    assert set(tb) == set(vdl)
    for tag in tb:
        assert [s for s, _ in tb[tag]] == [s for s, _ in vdl[tag]]
        assert [v for _, v in tb[tag]] == pytest.approx([v for _, v in vdl[tag]], rel=1e-6)


def test_visualdl_only_writes_no_tensorboard_events(tmp_path):
    pytest.importorskip("visualdl")
    log_dir = _write(tmp_path, ["visualdl"])
    assert glob.glob(os.path.join(log_dir, "vdlrecords.*")) and not glob.glob(os.path.join(log_dir, "events.*"))


def test_without_visualdl_falls_back_to_tensorboard_with_one_warning(tmp_path, monkeypatch, caplog):
    import paddlenlp_ext.trainer.logging_utils as lu

    installed = lu._installed
    monkeypatch.setattr(lu, "_installed", lambda module: module != "visualdl" and installed(module))
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.trainer"):
        log_dir = _write(tmp_path, ["visualdl"])
    warnings = [r.getMessage() for r in caplog.records if "visualdl package is not installed" in r.getMessage()]
    assert len(warnings) == 1
    assert _tensorboard_scalars(log_dir)["train/loss"] == [(1, 2.5), (2, 2.0), (3, 1.5)]
    assert not glob.glob(os.path.join(log_dir, "vdlrecords.*"))


def test_report_to_unset_writes_visualdl_records_as_paddlenlp_does(tmp_path):
    log_dir = _write(tmp_path, None)
    assert glob.glob(os.path.join(log_dir, "vdlrecords.*")) and not glob.glob(os.path.join(log_dir, "events.*"))
