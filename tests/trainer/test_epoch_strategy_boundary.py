"""evaluation_strategy / save_strategy "epoch" when an epoch ends exactly at a step boundary: the evaluation and
checkpoint come at that step. They came one step late (the epoch counter only moved when the next epoch's first
micro-batch was drawn), so checkpoint-<k> held a step of the next epoch and the epoch-1 eval saw it too."""

import os

from paddlenlp_ext.trainer.trainer import Trainer

from trainer_fixtures import PackDataset


def test_epoch_end_on_a_step_boundary(make_args, tiny_model, tmp_path):
    ds = PackDataset(4)  # bs 2 -> 2 micro-batches per epoch; gas 1 -> epochs end after steps 2, 4, 6
    t = Trainer(tiny_model(), make_args(max_steps=-1, num_train_epochs=3, evaluation_strategy="epoch",
                                        save_strategy="epoch"), train_dataset=ds, eval_dataset=ds)
    calls = []
    orig = t.evaluate
    t.evaluate = lambda *a, **k: calls.append(t.state.global_step) or orig(*a, **k)
    t.train()
    assert t.state.global_step == 6 and calls == [2, 4, 6]
    assert sorted(os.listdir(tmp_path / "out")) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
