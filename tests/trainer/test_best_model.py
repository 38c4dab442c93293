"""load_best_model_at_end: the best evaluated checkpoint is recorded, kept by rotation, survives a resume, and is
what the model holds at the end (so what the launchers export); the argument errors of Hugging Face/PaddleNLP."""

import json

import pytest
import torch

from paddlenlp_ext.trainer import checkpoint as ckpt
from paddlenlp_ext.trainer.arguments import TrainingArguments
from paddlenlp_ext.trainer.trainer import Trainer
from trainer_fixtures import PackDataset, TinyLM


class ScriptedEval(Trainer):
    """Real training and checkpoints; ``evaluate`` reports ``script[step]`` (chosen metric values per step)."""

    script: dict = {}

    def evaluate(self, eval_dataset=None, log=True):
        result = {f"eval_{k}": v for k, v in self.script[self.state.global_step].items()}
        self.last_eval = (self.state.global_step, result)
        return result


def _args(make_args, out, **kw):
    base = dict(output_dir=str(out), max_steps=6, evaluation_strategy="steps", save_strategy="steps", eval_steps=2,
                save_steps=2, load_best_model_at_end=True, save_total_limit=1)
    base.update(kw)
    return make_args(**base)


def _train(args, script, resume=None, seed=0):
    torch.manual_seed(seed)
    t = ScriptedEval(TinyLM(), args, train_dataset=PackDataset(8), eval_dataset=PackDataset(2))
    t.script = script
    t.train(resume_from_checkpoint=resume)
    return t


def _weights_of(path):
    m = TinyLM()
    ckpt.load_model_weights(path, m)
    return m.state_dict()


def _same(model, weights):
    return all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())


SCRIPT = {2: {"loss": 0.5, "accuracy": 0.7}, 4: {"loss": 0.3, "accuracy": 0.2}, 6: {"loss": 0.4, "accuracy": 0.5}}


def test_eval_loss_best_kept_by_rotation_and_loaded_at_the_end(make_args, tmp_path):
    out = tmp_path / "o"
    t = _train(_args(make_args, out), SCRIPT)
    assert sorted(p.name for p in ckpt.list_checkpoints(out)) == ["checkpoint-4", "checkpoint-6"]  # limit 1 + best
    state = json.loads((out / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["best_metric"] == 0.3 and state["best_model_checkpoint"].endswith("checkpoint-4")
    assert state["best_global_step"] == 4
    best = _weights_of(out / "checkpoint-4")
    assert _same(t.model, best) and not _same(t.model, _weights_of(out / "checkpoint-6"))
    assert t.last_eval == (6, {"eval_loss": 0.3, "eval_accuracy": 0.2})  # what the model now measures


def test_greater_is_better_metric_derived_from_its_name(make_args, tmp_path):
    out = tmp_path / "o"
    args = _args(make_args, out, metric_for_best_model="accuracy", save_total_limit=None)
    assert args.greater_is_better is True
    t = _train(args, SCRIPT)
    assert t.state.best_model_checkpoint.endswith("checkpoint-2") and t.state.best_metric == 0.7
    assert _same(t.model, _weights_of(out / "checkpoint-2"))
    assert TrainingArguments(output_dir="x", metric_for_best_model="eval_perplexity").greater_is_better is False


def test_best_survives_resume(make_args, tmp_path):
    out = tmp_path / "o"
    _train(_args(make_args, out, max_steps=4), SCRIPT)
    t = _train(_args(make_args, out), SCRIPT, resume=True)  # step 6 (0.4) does not beat step 4 (0.3)
    assert t.state.best_model_checkpoint.endswith("checkpoint-4")
    assert sorted(p.name for p in ckpt.list_checkpoints(out)) == ["checkpoint-4", "checkpoint-6"]
    assert _same(t.model, _weights_of(out / "checkpoint-4"))


def test_metric_no_evaluation_reports_lists_the_ones_that_exist(make_args, tmp_path):
    args = _args(make_args, tmp_path / "o", metric_for_best_model="bleu4")
    with pytest.raises(ValueError, match=r"reports no eval_bleu4 \(it reports: accuracy, loss\)"):
        _train(args, SCRIPT)


def test_load_best_without_a_dev_set_is_an_error(make_args, tmp_path):
    t = Trainer(TinyLM(), _args(make_args, tmp_path / "o"), train_dataset=PackDataset(8))
    with pytest.raises(ValueError, match="load_best_model_at_end=true needs an evaluation, but there is no dev set"):
        t.train()


def test_eval_and_save_schedules_must_match():
    with pytest.raises(ValueError, match="requires the save and eval strategy to match.*evaluation_strategy='no'"):
        TrainingArguments(output_dir="x", load_best_model_at_end=True, save_strategy="steps")
    with pytest.raises(ValueError, match="save_steps=5, which is not a round multiple of eval_steps=2"):
        TrainingArguments(output_dir="x", load_best_model_at_end=True, save_strategy="steps",
                          evaluation_strategy="steps", eval_steps=2, save_steps=5)
    # PaddleNLP's FlashMask configs: both strategies "no" parse (nothing to choose from; warned)
    assert TrainingArguments(output_dir="x", load_best_model_at_end=True, save_strategy="no").metric_for_best_model \
        == "loss"
