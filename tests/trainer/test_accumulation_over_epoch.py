"""A step that needs more micro-batches than one epoch holds (gradient_accumulation_steps x batch > packs) repeats
packs within the step; the trainer says so once instead of doing it silently (the log only showed epoch: 4 after
one step of "num_train_epochs: 1")."""

import logging

from paddlenlp_ext.trainer.trainer import Trainer

from trainer_fixtures import PackDataset


def test_warns_when_one_step_spans_several_epochs(make_args, tiny_model, caplog):
    t = Trainer(tiny_model(), make_args(gradient_accumulation_steps=4, per_device_train_batch_size=1, max_steps=1),
                train_dataset=PackDataset(2))
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.trainer"):
        t.train()
    msgs = [r.getMessage() for r in caplog.records if "repeats" in r.getMessage()]
    assert len(msgs) == 1 and "gradient_accumulation_steps=4" in msgs[0] and "2 micro-batch" in msgs[0], msgs


def test_no_warning_when_an_epoch_covers_a_step(make_args, tiny_model, caplog):
    t = Trainer(tiny_model(), make_args(gradient_accumulation_steps=2, per_device_train_batch_size=1, max_steps=1),
                train_dataset=PackDataset(2))
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.trainer"):
        t.train()
    assert not [r for r in caplog.records if "repeats" in r.getMessage()]
