"""Which data splits a launcher reads, and llm/run_finetune.py's errors about them: dev is read only when the run
evaluates (do_eval, or evaluation_strategy "steps"/"epoch", which evaluate whatever do_eval says, as in HF and
PaddleNLP); a split whose every example is dropped by tokenisation (longer than max_length) is an error naming the
split, the data path and the keys to change, before the output directory and its TensorBoard run are made."""

import json

import pytest

from trainer_fixtures import load_run_finetune


def _launcher():
    return load_run_finetune()


@pytest.fixture(scope="module")
def tiny_job(tmp_path_factory, make_tiny_sft_job):
    return make_tiny_sft_job(tmp_path_factory.mktemp("empty_split"), n_train=4, n_dev=2)


def _argv(root, data, out, **kw):
    cfg = {"model_name_or_path": str(root / "model"), "dataset_name_or_path": str(data), "output_dir": str(out),
           "per_device_train_batch_size": 1, "max_steps": 1, "max_length": 64, "src_length": 32,
           "flash_mask": True, "do_train": True, "do_eval": True, "disable_tqdm": True, "report_to": ["tensorboard"],
           "chat_after_train": False, **kw}
    path = out.parent / f"{out.name}.json"
    path.write_text(json.dumps(cfg))
    return [str(path)]


@pytest.mark.parametrize("split", ["train", "dev"])
def test_split_with_no_example_that_fits_is_an_error_before_any_output(tiny_job, split):
    data = tiny_job / f"data_{split}_too_long"
    data.mkdir()
    long = json.dumps({"src": "word " * 200, "tgt": "answer " * 200}) + "\n"
    for name in ("train", "dev"):
        src = long if name == split else (tiny_job / "data" / f"{name}.json").read_text()
        (data / f"{name}.json").write_text(src if name != split else long * 3)
    out = tiny_job / f"out_{split}"
    with pytest.raises(ValueError, match=rf"{split} split of .*{data.name}.* no example left.*max_length=64"):
        _launcher().main(_argv(tiny_job, data, out))
    assert not (out / "runs").exists()  # refused before the trainer made its TensorBoard run


def test_do_eval_false_reads_no_dev_file(tiny_job):
    data = tiny_job / "data_empty_dev"
    data.mkdir()
    (data / "train.json").write_text((tiny_job / "data" / "train.json").read_text())
    (data / "dev.json").write_text("")
    out = tiny_job / "out_empty_dev"
    summary = load_run_finetune().main(_argv(tiny_job, data, out, do_eval=False, report_to=[]))
    assert summary["global_step"] == 1 and "dev_loss_after" not in summary
    # with do_eval the empty dev file is still an error naming it
    with pytest.raises(ValueError, match=r"dev\.json: empty file"):
        load_run_finetune().main(_argv(tiny_job, data, tiny_job / "out_empty_dev2", report_to=[]))
    # evaluation_strategy "steps" evaluates during training whatever do_eval says (HF / PaddleNLP), so it reads dev
    with pytest.raises(ValueError, match=r"dev\.json: empty file"):
        load_run_finetune().main(_argv(tiny_job, data, tiny_job / "out_empty_dev3", do_eval=False, report_to=[],
                                       evaluation_strategy="steps", eval_steps=1))


def test_used_splits_follow_do_eval_and_evaluation_strategy(make_args):
    # the launchers read dev for evaluation_strategy "steps" with do_eval false too: it evaluates on the way
    from paddlenlp_ext.trainer.launch import used_splits

    assert used_splits(make_args(do_train=True, do_eval=False)) == ["train"]
    assert used_splits(make_args(do_train=True, do_eval=False, evaluation_strategy="steps", eval_steps=2)) == \
        ["train", "dev"]
    assert used_splits(make_args(do_train=False, do_eval=True)) == ["dev"]
    assert used_splits(make_args(do_train=True, do_eval=True)) == ["train", "dev"]
