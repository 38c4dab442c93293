"""DPO and the reward model on tiny random ``transformers`` families (FlashMask backend): share-question packs score
exactly as each pair alone (sliding-window layers included), the launchers train, the RM exports the family's
``*ForSequenceClassification``."""

import json
import os
import sys

import pytest
import torch

from paddlenlp_ext.transformers.hf_causal_lm import HFCausalLM
from paddlenlp_ext.trl.dpo_trainer import policy_pair_logps
from paddlenlp_ext.trl.hf_reward_model import HFForScore
from tests._hf_tiny import save_tiny_model_dir, tiny_model
from tests.trl._stub_tokenizer import WordTokenizer
from tests.trl._tiny import make_tiny_model_dir, write_pairs
from test_trl_packed_equivalence import EXAMPLES, _alone_logp, _batch, _pieces, _records

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "llm"))
import run_dpo  # noqa: E402
import run_reward  # noqa: E402


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_dpo_logps_packed_equal_alone(family):
    """Windowed layers (a window shorter than the pack, longer than each pair): packed == alone."""
    model = HFCausalLM(tiny_model(family, "FlashMask", vocab_size=64, sliding_window=16))
    recs = _records(WordTokenizer(), EXAMPLES, "dpo")
    assert max(r["response_indexs"][0][3] for r in recs) <= 16
    with torch.no_grad():
        packed = policy_pair_logps(model, _batch(recs), chunk_size=7)
        alone = []
        for rec in recs:
            prompt, a, b = _pieces(rec, shift=True)
            alone += [_alone_logp(model, prompt, a), _alone_logp(model, prompt, b)]
    torch.testing.assert_close(torch.stack([packed.chosen, packed.rejected], 1).flatten(), torch.stack(alone),
                               atol=1e-4, rtol=1e-5)


def test_pair_longer_than_the_window_is_refused():
    """The rejected answer's positions restart after the prompt: a window shorter than the pair would count
    columns, not positions; refused instead of computed wrongly."""
    from paddlenlp_ext.transformers.hf_attention import FlashMaskUnsupportedError

    model = HFCausalLM(tiny_model("mistral", "FlashMask", vocab_size=64, sliding_window=3))
    with torch.no_grad(), pytest.raises(FlashMaskUnsupportedError, match="sliding window of 3 tokens.*max_seq_len"):
        policy_pair_logps(model, _batch(_records(WordTokenizer(), EXAMPLES, "dpo")))


def test_rm_scores_packed_equal_alone(tmp_path):
    path = _model_dir(tmp_path, "gemma3_text")
    rm = HFForScore.from_pretrained(path)
    recs = _records(WordTokenizer(), EXAMPLES, "rm")
    with torch.no_grad():
        s_c, s_r = rm.pair_scores(_batch(recs))
        alone = []
        for rec in recs:
            prompt, a, b = _pieces(rec, shift=False)
            for resp in (a, b):
                alone.append(rm.score(rm(torch.tensor([prompt + resp]))[0, -1]).squeeze().float())
    torch.testing.assert_close(torch.stack([s_c, s_r], 1).flatten(), torch.stack(alone), atol=1e-5, rtol=1e-5)


def _model_dir(tmp_path, family, **overrides):
    """The word tokenizer of ``tests/trl/_tiny.py`` with a random ``family`` model of its 64-token vocab; windowed
    layers get a window of 32 (longer than each pair, shorter than the 64-token packs)."""
    path = str(tmp_path / family)
    make_tiny_model_dir(path)
    for f in ("model.safetensors", "config.json"):
        os.remove(os.path.join(path, f))
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(path)
    tiny_model(family, vocab_size=64, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id, **{"sliding_window": 32, **overrides}).save_pretrained(path)
    return path


def _launcher_model(tmp_path, family):
    """A random ``family`` model with SmolLM2's tokenizer (a word-level tokenizer beside a non-Llama config is
    re-read by transformers as that family's tokenizer); windows of 100 tokens, shorter than the 128-token packs."""
    return save_tiny_model_dir(family, tmp_path / family, sliding_window=100)


def _common(model, train, dev, out):
    return ["--model_name_or_path", model, "--train_dataset_path", train, "--dev_dataset_path", dev,
            "--output_dir", out, "--max_seq_len", "128", "--max_prompt_len", "64", "--per_device_train_batch_size", "1",
            "--max_steps", "12", "--logging_steps", "4", "--do_train", "true", "--do_eval", "true",
            "--save_strategy", "no", "--seed", "0", "--report_to", "none", "--learning_rate", "3e-3"]


@pytest.mark.parametrize("family,extra", [("qwen2", []), ("mistral", ["--lora", "true", "--lora_rank", "4"])])
def test_run_dpo_trains(tmp_path, family, extra):
    model = _launcher_model(tmp_path, family)
    train, dev = write_pairs(str(tmp_path / "train.jsonl"), 24), write_pairs(str(tmp_path / "dev.jsonl"), 8, seed=1)
    summary = run_dpo.main(_common(model, train, dev, str(tmp_path / "out")) + extra)
    assert summary["dev_after"]["eval_rewards/margins"] > summary["dev_before"]["eval_rewards/margins"]


def test_run_reward_exports_the_family_sequence_classifier(tmp_path):
    import transformers

    model = _launcher_model(tmp_path, "qwen3")
    train, dev = write_pairs(str(tmp_path / "train.jsonl"), 24), write_pairs(str(tmp_path / "dev.jsonl"), 8, seed=1)
    out = str(tmp_path / "rm")
    summary = run_reward.main(_common(model, train, dev, out))
    assert summary["dev_after"]["eval_loss"] < summary["dev_before"]["eval_loss"]
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["architectures"] == ["Qwen3ForSequenceClassification"] and len(cfg["id2label"]) == 1
    assert cfg["pad_token_id"] is not None and cfg["pad_token_id"] != cfg["eos_token_id"]
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    ours = HFForScore.from_pretrained(out)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    text = tok.apply_chat_template([{"role": "user", "content": "hello how are you"},
                                    {"role": "assistant", "content": "fine good"}], tokenize=False).rstrip("\n")
    ids = torch.tensor([tok.encode(text, add_special_tokens=False)])
    with torch.no_grad():
        torch.testing.assert_close(ours.score(ours(ids)[0, -1])[0], hf(ids).logits[0, 0], rtol=1e-5, atol=1e-5)
