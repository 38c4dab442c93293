"""New-user pass, session 7: each test reproduces one bug found by following README.md as a new user.

CPU only, no model weights (the SmolLM2 tokenizer files at most).
"""

import json
import os

import pytest

from paddlenlp_ext.datasets.jsonl import iter_jsonl
from paddlenlp_ext.datasets.preference import read_preference_jsonl


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOLLM2 = os.path.join(ROOT, "config", "smollm2")


def _write(path, lines):
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def tiny_job(tmp_path_factory, make_tiny_sft_job):
    return make_tiny_sft_job(tmp_path_factory.mktemp("userpass7"), n_train=4, n_dev=2)


def _sft_argv(root, data, out, **kw):
    cfg = {"model_name_or_path": str(root / "model"), "dataset_name_or_path": str(data), "output_dir": str(out),
           "per_device_train_batch_size": 1, "max_steps": 1, "max_length": 64, "src_length": 32,
           "flash_mask": True, "do_train": True, "do_eval": False, "disable_tqdm": True, "report_to": [],
           "chat_after_train": False, **kw}
    path = out.parent / f"{out.name}.json"
    path.write_text(json.dumps(cfg))
    return [str(path)]


def test_sft_do_eval_false_ignores_an_empty_dev_file(tiny_job):
    # was: "dev.json: empty file" stopped a run that never evaluates (the dev split was read and tokenised even
    # with do_eval false; run_dpo.py / run_reward.py already read only the splits they use)
    from trainer_fixtures import load_run_finetune

    data = tiny_job / "data_empty_dev"
    data.mkdir()
    (data / "train.json").write_text((tiny_job / "data" / "train.json").read_text())
    (data / "dev.json").write_text("")
    out = tiny_job / "out_empty_dev"
    summary = load_run_finetune().main(_sft_argv(tiny_job, data, out))
    assert summary["global_step"] == 1 and "dev_loss_after" not in summary
    # with do_eval the empty dev file is still an error naming it
    with pytest.raises(ValueError, match=r"dev\.json: empty file"):
        load_run_finetune().main(_sft_argv(tiny_job, data, tiny_job / "out_empty_dev2", do_eval=True))
    # evaluation_strategy "steps" evaluates during training whatever do_eval says (HF / PaddleNLP), so it reads dev
    with pytest.raises(ValueError, match=r"dev\.json: empty file"):
        load_run_finetune().main(_sft_argv(tiny_job, data, tiny_job / "out_empty_dev3", evaluation_strategy="steps",
                                           eval_steps=1))


def test_used_splits_follow_do_eval_and_evaluation_strategy(make_args):
    # run_dpo.py / run_reward.py read dev only with do_eval, so evaluation_strategy "steps" with do_eval false
    # silently never evaluated (Hugging Face and PaddleNLP evaluate on the way whatever do_eval says)
    from paddlenlp_ext.trainer.launch import used_splits

    assert used_splits(make_args(do_train=True, do_eval=False)) == ["train"]
    assert used_splits(make_args(do_train=True, do_eval=False, evaluation_strategy="steps", eval_steps=2)) == \
        ["train", "dev"]
    assert used_splits(make_args(do_train=False, do_eval=True)) == ["dev"]
    assert used_splits(make_args(do_train=True, do_eval=True)) == ["train", "dev"]


@pytest.fixture(scope="module")
def tiny_pairs(tmp_path_factory):
    from tests.trl._tiny import make_tiny_model_dir, write_pairs

    d = tmp_path_factory.mktemp("userpass7_dpo")
    return make_tiny_model_dir(str(d / "model")), write_pairs(str(d / "train.jsonl"), 16)


def _dpo_argv(tiny_pairs, out, steps, save, *extra):
    model, train = tiny_pairs
    return ["--model_name_or_path", model, "--train_dataset_path", train, "--output_dir", str(out),
            "--max_seq_len", "64", "--max_prompt_len", "24", "--per_device_train_batch_size", "1",
            "--max_steps", str(steps), "--logging_steps", "1", "--do_train", "true", "--do_eval", "false",
            "--save_strategy", save, "--save_steps", "2", "--seed", "0", "--report_to", "none",
            "--learning_rate", "1e-2", "--lr_scheduler_type", "constant", "--warmup_ratio", "0", *extra]


def test_top_p_zero_keeps_only_the_top_token_and_bad_sampling_values_raise():
    # was: top_p=0 (the usual "near greedy") skipped the nucleus filter and sampled the whole distribution;
    # top_p > 1 and top_k < 0 were accepted as "no filter" (llm/predict.py --top_p 0 / 1.5 / --top_k -2)
    import torch

    from paddlenlp_ext.transformers.generation import _filter_logits, generate

    logits = torch.tensor([[0.5, 3.0, 1.0, -2.0]])
    kept = torch.isfinite(_filter_logits(logits, 0, 0.0))[0]
    assert kept.tolist() == [False, True, False, False]
    assert torch.isfinite(_filter_logits(logits, 0, 1.0)).all()  # 1 = no filter

    class Uniformish(torch.nn.Module):
        def forward(self, ids):  # [B, L] -> logits [B, L, 4]: token 1 most likely, all others possible
            return logits.expand(ids.shape[0], ids.shape[1], 4)

    ids = torch.zeros(1, 1, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    out = generate(Uniformish(), ids, 32, do_sample=True, top_p=0.0, use_cache=False, generator=g)
    assert out[0, 1:].tolist() == [1] * 32
    for kw in ({"top_p": 1.5}, {"top_p": -0.1}, {"top_k": -2}):
        with pytest.raises(ValueError, match="0 <= top_p <= 1"):
            generate(Uniformish(), ids, 2, do_sample=True, use_cache=False, **kw)


def test_checkpoint_dir_as_model_name_or_path_says_so(tmp_path):
    # was (run_dpo.py / run_reward.py / run_finetune.py --model_name_or_path <out>/checkpoint-N):
    # "no tokenizer files ...; set tokenizer_name_or_path", then "no config.json": the wrong fix
    from paddlenlp_ext.transformers import AutoTokenizer, resolve_model_name_or_path

    ckpt = tmp_path / "checkpoint-3"
    (ckpt / "distcp").mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text("{}")
    for load in (resolve_model_name_or_path, AutoTokenizer.from_pretrained):
        with pytest.raises(ValueError, match=r"checkpoint-3' is a training checkpoint .* give the run's output_dir"):
            load(str(ckpt))


