"""run_dpo.py / run_reward.py end to end on a tiny random model (seconds), the HF round trip of the RM, the ERNIE
preset as an RM trunk, and the use_fused_* keys reaching the model."""

import json
import os
import sys

import pytest
import torch

from tests.trl._tiny import make_tiny_model_dir, write_pairs

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "llm"))
import run_dpo  # noqa: E402
import run_reward  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    model = make_tiny_model_dir(str(d / "model"))
    return model, write_pairs(str(d / "train.jsonl"), 48), write_pairs(str(d / "dev.jsonl"), 12, seed=1)


def _common(model, train, dev, out):
    return ["--model_name_or_path", model, "--train_dataset_path", train, "--dev_dataset_path", dev,
            "--output_dir", out, "--max_seq_len", "64", "--max_prompt_len", "24", "--per_device_train_batch_size", "1",
            "--max_steps", "25", "--logging_steps", "5", "--do_train", "true", "--do_eval", "true",
            "--save_strategy", "no", "--seed", "0", "--report_to", "none"]


@pytest.mark.parametrize("extra", [
    ["--loss_type", "sigmoid"],
    ["--loss_type", "ipo", "--precompute_reference_logps", "true"],
    ["--loss_type", "orpo"],
    ["--lora", "true", "--lora_rank", "4"],
])
def test_run_dpo_tiny(tiny, tmp_path, extra):
    model, train, dev = tiny
    summary = run_dpo.main(_common(model, train, dev, str(tmp_path / "out")) + ["--learning_rate", "3e-3"] + extra)
    before, after = summary["dev_before"], summary["dev_after"]
    assert summary["global_step"] == 25
    assert after["eval_rewards/margins"] > before["eval_rewards/margins"]
    if "--lora" in extra:
        assert os.path.isfile(tmp_path / "out" / "adapter_config.json")
    else:
        assert os.path.isfile(tmp_path / "out" / "model.safetensors")


def test_run_reward_tiny_and_hf_loads_it(tiny, tmp_path):
    model, train, dev = tiny
    out = str(tmp_path / "rm")
    summary = run_reward.main(_common(model, train, dev, out) + ["--learning_rate", "3e-3"])
    assert summary["dev_after"]["eval_accuracy"] > summary["dev_before"]["eval_accuracy"] or \
        summary["dev_after"]["eval_accuracy"] == 1.0
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["architectures"] == ["LlamaForSequenceClassification"] and cfg["num_labels"] == 1
    # base pad = eos = <|im_end|> (the score token): the export pads with the tokenizer's <pad> instead
    assert cfg["pad_token_id"] == 0  # "<pad>" of tests/trl/_tiny.py (not null: transformers batch scoring works)

    import transformers

    from paddlenlp_ext.trl.reward_model import LlamaForScore

    hf = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    ours = LlamaForScore.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    text = tok.apply_chat_template([{"role": "user", "content": "hello how are you"},
                                    {"role": "assistant", "content": "fine good"}], tokenize=False).rstrip("\n")
    ids = torch.tensor([tok.encode(text, add_special_tokens=False)])
    with torch.no_grad():
        s_hf = hf(ids).logits[0, 0]
        s_ours = ours.score(ours(ids)[0, -1])[0]
    torch.testing.assert_close(s_ours, s_hf, rtol=1e-5, atol=1e-5)


def test_reward_model_trains_on_an_ernie_preset(tiny, tmp_path):
    # run_reward.py takes the ERNIE preset like run_finetune.py / run_dpo.py (the README lists ERNIE for the RM)
    from paddlenlp_ext.trl.reward_model import LlamaForScore

    _, train, _ = tiny
    out = tmp_path / "rm"
    summary = run_reward.main(["--model_name_or_path", "ernie/tiny-random-ernie", "--train_dataset_path", train,
                               "--output_dir", str(out), "--max_seq_len", "64", "--max_prompt_len", "24",
                               "--max_steps", "1", "--do_train", "true", "--do_eval", "false", "--report_to", "none"])
    assert summary["global_step"] == 1
    saved = LlamaForScore.from_pretrained(str(out))
    assert saved.config.model_type == "ernie" and saved.score.weight.shape == (1, saved.config.hidden_size)
    assert torch.isfinite(saved.score.weight).all()


@pytest.mark.parametrize("script", ["run_dpo", "run_reward"])
def test_dpo_and_rm_act_on_the_use_fused_keys(tiny, tmp_path, monkeypatch, script):
    # the use_fused_* keys reach the model config (PaddleNLP's run_dpo.py copies them: LlmMetaConfig.set_llm_config)
    import paddlenlp_ext.distributed as distributed
    from tests._scripts import load_script

    seen = []
    original = distributed.parallelize_model

    def spy(model, *a, **kw):
        seen.append(model)
        return original(model, *a, **kw)

    monkeypatch.setattr(distributed, "parallelize_model", spy)
    model_dir, train, _ = tiny
    load_script(f"llm/{script}.py").main([
        "--model_name_or_path", model_dir, "--train_dataset_path", train, "--output_dir", str(tmp_path / "out"),
        "--max_seq_len", "64", "--max_prompt_len", "24", "--max_steps", "1", "--do_train", "true",
        "--do_eval", "false", "--report_to", "none", "--use_fused_rms_norm", "true", "--use_fused_swiglu", "true"])
    config = seen[0].config
    assert config.use_fused_rms_norm and config.use_fused_swiglu and not config.use_fused_rope
