"""User pass, session 11: a run without a model gives one error line (SFT and DPO, as reward models did).

CPU only, tiny random models; each test a few seconds.
"""

import pytest

from tests._scripts import load_script
from trainer_fixtures import load_run_finetune, write_sft_config

_SFT = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, "learning_rate": 1e-2,
        "max_length": 96, "src_length": 48, "do_train": True, "do_eval": False, "disable_tqdm": True,
        "chat_after_train": False, "report_to": "none"}


@pytest.fixture(scope="module")
def sft_job(tmp_path_factory, make_tiny_sft_job):
    return make_tiny_sft_job(tmp_path_factory.mktemp("up11_sft"), n_train=4, n_dev=2)


def test_sft_without_a_model_is_one_error(sft_job, tmp_path):
    # was: TypeError 'expected str, bytes or os.PathLike object, not NoneType' from the tokenizer, before
    # require_model_path ran (run_reward.py checked first)
    import json

    argv = write_sft_config(sft_job, tmp_path / "out", _SFT, max_steps=1)
    cfg = json.loads(open(argv[0]).read())
    del cfg["model_name_or_path"]  # the key left out (its default is None)
    open(argv[0], "w").write(json.dumps(cfg))
    with pytest.raises(ValueError, match="model_name_or_path is required"):
        load_run_finetune().main(argv)


def test_dpo_without_a_model_is_one_error(tmp_path):
    from tests.trl._tiny import write_pairs

    train = write_pairs(str(tmp_path / "train.jsonl"), 4)
    argv = ["--train_dataset_path", train, "--dev_dataset_path", train, "--output_dir", str(tmp_path / "out"),
            "--max_seq_len", "64", "--max_prompt_len", "24", "--max_steps", "1", "--report_to", "none"]
    with pytest.raises(ValueError, match="model_name_or_path is required"):
        load_script("llm/run_dpo.py").main(argv)
