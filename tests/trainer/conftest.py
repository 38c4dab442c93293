"""Fixtures of the trainer tests (helpers live in ``trainer_fixtures.py``)."""

import pytest
import torch

from paddlenlp_ext.trainer.arguments import TrainingArguments
from trainer_fixtures import TinyLM


@pytest.fixture
def make_args(tmp_path):
    def _make(**kw):
        base = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, per_device_eval_batch_size=4,
                    gradient_accumulation_steps=1, learning_rate=1e-2, max_steps=6, logging_steps=1,
                    save_strategy="no", evaluation_strategy="no", warmup_steps=1, weight_decay=0.01,
                    disable_tqdm=True, seed=7, device="cpu", report_to=[])  # no logger unless a test asks
        base.update(kw)
        return TrainingArguments(**base)
    return _make


@pytest.fixture
def tiny_model():
    def _make(seed: int = 0):
        torch.manual_seed(seed)
        return TinyLM()
    return _make
