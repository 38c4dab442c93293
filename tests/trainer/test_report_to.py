"""``report_to``: TensorBoard and VisualDL writers, and a clear error when the package a logger needs is missing."""

import glob
import sys
import types

import pytest

from paddlenlp_ext.trainer.argparser import PdArgumentParser
from paddlenlp_ext.trainer.logging_utils import MetricsLogger, writer_kinds


def _hide(monkeypatch, *modules):
    """Make ``modules`` look not installed (``find_spec`` returns None, ``import`` raises ImportError)."""
    for m in modules:
        monkeypatch.setitem(sys.modules, m, None)


def test_tensorboard_missing_is_a_config_error_naming_the_extra(make_args, monkeypatch):
    _hide(monkeypatch, "tensorboard")
    with pytest.raises(ValueError, match=r"report_to tensorboard needs the tensorboard package.*"
                                         r"paddlenlp-ext\[tensorboard\].*report_to \[\]"):
        make_args(report_to=["tensorboard"])
    assert make_args(report_to=[]).report_to == []  # no logger: nothing to install


def test_benchmark_mode_clears_report_to_so_a_missing_logger_is_no_error(make_args, monkeypatch):
    _hide(monkeypatch, "tensorboard")
    make_args(report_to=["tensorboard"], benchmark=True)


def test_visualdl_without_visualdl_writes_tensorboard_events(make_args, monkeypatch, tmp_path):
    _hide(monkeypatch, "visualdl")
    assert writer_kinds(["visualdl"]) == ["tensorboard"]
    args = make_args(report_to=["visualdl"], logging_dir=str(tmp_path / "logs"))
    metrics = MetricsLogger(args, max_steps=1)
    metrics.log({"loss": 1.5}, step=1)
    metrics.close()
    assert glob.glob(str(tmp_path / "logs" / "events.out.tfevents.*"))


def test_visualdl_with_neither_package_names_both_extras(monkeypatch):
    _hide(monkeypatch, "visualdl", "tensorboard")
    with pytest.raises(ValueError, match=r"paddlenlp-ext\[visualdl\].*paddlenlp-ext\[tensorboard\]"):
        writer_kinds(["visualdl"])


def test_visualdl_installed_gets_a_logwriter_with_paddlenlp_tags(make_args, monkeypatch, tmp_path):
    """VisualDL's API (``LogWriter(logdir=)``, ``add_scalar(tag, value, step)``, ``flush``, ``close``), recorded."""
    calls = []

    class LogWriter:
        def __init__(self, logdir):
            calls.append(("open", logdir))

        def add_scalar(self, tag, value, step):
            calls.append((tag, value, step))

        def flush(self):
            pass

        def close(self):
            calls.append(("close",))

    fake = types.ModuleType("visualdl")
    fake.LogWriter = LogWriter
    fake.__spec__ = types.SimpleNamespace(name="visualdl")
    monkeypatch.setitem(sys.modules, "visualdl", fake)
    assert writer_kinds(["tensorboard", "visualdl"]) == ["tensorboard", "visualdl"]
    args = make_args(report_to=["visualdl"], logging_dir=str(tmp_path / "vdl"))
    metrics = MetricsLogger(args, max_steps=2)
    metrics.log({"eval_loss": 0.5}, step=2, prefix="eval")
    metrics.close()
    assert calls == [("open", str(tmp_path / "vdl")), ("eval/loss", 0.5, 2), ("close",)]
    assert not glob.glob(str(tmp_path / "vdl" / "events.out.tfevents.*"))  # VisualDL only


def test_yaml_config_without_pyyaml_names_the_package(monkeypatch, tmp_path):
    cfg = tmp_path / "sft.yaml"
    cfg.write_text("output_dir: o\n")
    _hide(monkeypatch, "yaml")
    with pytest.raises(ValueError, match=r"sft.yaml: a YAML config needs PyYAML.*pip install pyyaml.*JSON"):
        PdArgumentParser._load_yaml(str(cfg))


def test_report_to_unset_is_visualdl_and_falls_back_to_tensorboard_with_one_warning(make_args, monkeypatch,
                                                                                   tmp_path, caplog):
    """PaddleNLP's default logger is VisualDL; without the package, TensorBoard events and one warning."""
    _hide(monkeypatch, "visualdl")
    assert writer_kinds(None) == ["tensorboard"]
    args = make_args(logging_dir=str(tmp_path / "logs"), report_to=None)  # unset (make_args turns loggers off)
    assert args.report_to is None
    with caplog.at_level("WARNING", logger="paddlenlp_ext"):
        metrics = MetricsLogger(args, max_steps=1)
        metrics.log({"loss": 1.5}, step=1)
        metrics.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "report_to unset" in warnings[0] and "TensorBoard" in warnings[0]
    assert glob.glob(str(tmp_path / "logs" / "events.out.tfevents.*"))


def test_report_to_unset_with_neither_package_writes_no_logs_and_no_error(make_args, monkeypatch, tmp_path):
    _hide(monkeypatch, "visualdl", "tensorboard")
    assert writer_kinds(None) == []
    metrics = MetricsLogger(make_args(logging_dir=str(tmp_path / "logs"), report_to=None), max_steps=1)
    metrics.log({"loss": 1.5}, step=1)
    metrics.close()
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").iterdir())
