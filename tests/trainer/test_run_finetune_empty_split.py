"""llm/run_finetune.py: a split whose every example is dropped by tokenisation (longer than max_length) is an
error naming the split, the data path and the keys to change, before training starts (was the sampler's
"the dataset is empty" with no split named, after the output directory and its TensorBoard run were made)."""

import json

import pytest

from trainer_fixtures import load_run_finetune


def _launcher():
    return load_run_finetune()


@pytest.fixture(scope="module")
def tiny_job(tmp_path_factory, make_tiny_sft_job):
    return make_tiny_sft_job(tmp_path_factory.mktemp("empty_split"), n_train=4, n_dev=2)


def _argv(root, data, out):
    cfg = {"model_name_or_path": str(root / "model"), "dataset_name_or_path": str(data), "output_dir": str(out),
           "per_device_train_batch_size": 1, "max_steps": 1, "max_length": 64, "src_length": 32,
           "flash_mask": True, "do_train": True, "do_eval": True, "disable_tqdm": True, "report_to": ["tensorboard"],
           "chat_after_train": False}
    path = out.parent / f"{out.name}.json"
    path.write_text(json.dumps(cfg))
    return [str(path)]


@pytest.mark.parametrize("split", ["train", "dev"])
def test_split_with_no_example_that_fits(tiny_job, split):
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
