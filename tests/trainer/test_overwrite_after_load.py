"""overwrite_output_dir removes the previous run's model only once the new run has loaded its model and data:
a mistake found while loading (here a chat_template path typo, or a data split with nothing that fits) leaves
the previous model in place (not deleted first, then the run failed)."""

import pytest

from trainer_fixtures import load_run_finetune, write_sft_config


def _launcher():
    return load_run_finetune()


@pytest.fixture(scope="module")
def tiny_job(tmp_path_factory, make_tiny_sft_job):
    return make_tiny_sft_job(tmp_path_factory.mktemp("overwrite"), n_train=4, n_dev=2)


_SETTINGS = {"per_device_train_batch_size": 1, "max_steps": 1, "max_length": 64, "src_length": 32,
             "flash_mask": True, "do_train": True, "do_eval": False, "disable_tqdm": True, "save_strategy": "no",
             "chat_after_train": False}


def _argv(root, out, **over):
    return write_sft_config(root, out, _SETTINGS, **over)


def test_failed_rerun_keeps_the_previous_model(tiny_job):
    mod = _launcher()
    out = tiny_job / "out"
    mod.main(_argv(tiny_job, out))
    weights = out / "model.safetensors"
    before = weights.read_bytes()
    with pytest.raises(ValueError, match="chat_template"):
        mod.main(_argv(tiny_job, out, overwrite_output_dir=True, chat_template=str(tiny_job / "typo.jinja")))
    assert weights.read_bytes() == before and (out / "config.json").is_file()
    # a rerun that loads fine still starts over and replaces the model
    summary = mod.main(_argv(tiny_job, out, overwrite_output_dir=True, learning_rate=1e-2))
    assert summary["global_step"] == 1 and weights.read_bytes() != before


def test_run_that_dies_before_saving_keeps_the_previous_model(tiny_job, monkeypatch):
    """overwrite_output_dir moves the old run to output_dir/previous_run/ and deletes it only after the new run
    has saved: a run killed before that (out of memory) keeps the old model."""
    mod = _launcher()
    out = tiny_job / "out_killed"
    mod.main(_argv(tiny_job, out))
    before = (out / "model.safetensors").read_bytes()
    from paddlenlp_ext.trainer.trainer import Trainer

    def killed(self, *a, **k):
        raise RuntimeError("CUDA out of memory (simulated)")

    with monkeypatch.context() as m:
        m.setattr(Trainer, "train", killed)
        with pytest.raises(RuntimeError, match="out of memory"):
            mod.main(_argv(tiny_job, out, overwrite_output_dir=True))
    assert not (out / "model.safetensors").exists()
    assert (out / "previous_run" / "model.safetensors").read_bytes() == before  # the old model, to copy back
    summary = mod.main(_argv(tiny_job, out, overwrite_output_dir=True, learning_rate=1e-2))
    assert summary["global_step"] == 1 and (out / "model.safetensors").read_bytes() != before
    assert not (out / "previous_run").exists()  # deleted once the new run saved
