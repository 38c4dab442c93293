"""do_train false, do_eval true (evaluate a model): each launcher evaluates the dev set once and reports it as the
"after" figure, not twice (a "before" and an identical "after") with nothing trained between."""

import json
import os
import sys

import pytest

from paddlenlp_ext.trainer.trainer import Trainer
from tests._scripts import load_script
from tests.trl._tiny import make_tiny_model_dir, write_pairs

LLM = os.path.join(os.path.dirname(__file__), "..", "..", "llm")
sys.path.insert(0, LLM)
import run_dpo  # noqa: E402
import run_reward  # noqa: E402


def _run_finetune():
    return load_script("llm/run_finetune.py")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("evalonly")
    model = make_tiny_model_dir(str(d / "model"))
    return d, model, write_pairs(str(d / "dev.jsonl"), 6, seed=1)


@pytest.fixture
def count_evals(monkeypatch):
    calls = []
    original = Trainer.evaluate

    def counted(self, *a, **k):
        calls.append(1)
        return original(self, *a, **k)

    monkeypatch.setattr(Trainer, "evaluate", counted)
    return calls


def _pref_args(model, dev, out):
    return ["--model_name_or_path", model, "--dev_dataset_path", dev, "--output_dir", out, "--max_seq_len", "64",
            "--max_prompt_len", "24", "--do_train", "false", "--do_eval", "true", "--report_to", "none"]


@pytest.mark.parametrize("launcher,key", [(run_dpo, "eval_loss"), (run_reward, "eval_accuracy")])
def test_preference_launchers(tiny, tmp_path, count_evals, launcher, key):
    _, model, dev = tiny
    summary = launcher.main(_pref_args(model, dev, str(tmp_path / "out")))
    assert len(count_evals) == 1 and "dev_before" not in summary and key in summary["dev_after"]


def test_run_finetune(tiny, tmp_path, count_evals):
    d, model, _ = tiny
    data = tmp_path / "data"
    data.mkdir()
    (data / "dev.json").write_text("".join(json.dumps({"src": f"q{i}", "tgt": f"a{i}"}) + "\n" for i in range(4)))
    summary = _run_finetune().main([
        "--model_name_or_path", model, "--dataset_name_or_path", str(data), "--output_dir", str(tmp_path / "out"),
        "--max_length", "64", "--src_length", "32", "--do_train", "false", "--do_eval", "true",
        "--chat_after_train", "false"])
    assert len(count_evals) == 1 and "dev_loss_before" not in summary and summary["dev_loss_after"] > 0
