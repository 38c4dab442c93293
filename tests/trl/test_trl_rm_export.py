"""Reward-model export: the saved directory scores padded batches in transformers exactly as our model does."""

import json
import os

import pytest
import torch
import transformers

from paddlenlp_ext.trl.reward_model import LlamaForScore, export_pad_token_id
from tests.trl._tiny import make_tiny_model_dir

CONVS = [[{"role": "user", "content": "hello how are you"}, {"role": "assistant", "content": "fine good"}],
         [{"role": "user", "content": "is the sky blue"}, {"role": "assistant", "content": "yes the sky is blue"}],
         [{"role": "user", "content": "what"}, {"role": "assistant", "content": "no"}]]


def _texts(tok):
    # Our score is read at the response's <|im_end|>; the chat template adds "\n" after it, which HF would score.
    return [tok.apply_chat_template(c, tokenize=False).rstrip("\n") for c in CONVS]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_tiny_model_dir(str(tmp_path_factory.mktemp("rm_base") / "model"))


@pytest.mark.parametrize("smollm2_like", [False, True])
@pytest.mark.parametrize("side", ["right", "left"])
def test_exported_rm_scores_padded_batches_like_ours(base, tmp_path, smollm2_like, side):
    """Base config pad = eos = <|im_end|> (as SmolLM2). Tokenizer pad <pad>, or also <|im_end|> (SmolLM2):
    the export must name a pad that is not the score token, and transformers' batch scores equal ours."""
    tok = transformers.AutoTokenizer.from_pretrained(base)
    if smollm2_like:
        tok.pad_token = "<|im_end|>"
    ours = LlamaForScore.from_pretrained(base).eval()
    out = str(tmp_path / "rm")
    ours.save_pretrained(out, tokenizer=tok)
    assert tok.pad_token == ("<|im_end|>" if smollm2_like else "<pad>")  # the caller's tokenizer is untouched
    cfg = json.load(open(os.path.join(out, "config.json")))
    want_pad = tok.convert_tokens_to_ids("<unk>" if smollm2_like else "<pad>")
    assert cfg["pad_token_id"] == want_pad and cfg["pad_token_id"] != tok.convert_tokens_to_ids("<|im_end|>")

    hf = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert hf_tok.pad_token_id == cfg["pad_token_id"]
    hf_tok.padding_side = side
    texts = _texts(hf_tok)
    batch = hf_tok(texts, padding=True, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        s_hf = hf(**batch).logits[:, 0]  # [3]
        s_ours = torch.stack([ours.score(ours(torch.tensor([hf_tok.encode(t, add_special_tokens=False)]))[0, -1])[0]
                              for t in texts])
    # fp32 both; left padding shifts positions (RoPE is relative) and masks pads: same values to fp32 rounding
    torch.testing.assert_close(s_hf, s_ours, rtol=1e-5, atol=1e-5)
    ids = hf_tok.encode(texts[0], add_special_tokens=False)
    assert ids[-1] == hf_tok.convert_tokens_to_ids("<|im_end|>")  # the score token ends the text


def test_export_pad_token_id_choices():
    assert export_pad_token_id({"pad_token_id": 0, "eos_token_id": 2}) == 0
    assert export_pad_token_id({"pad_token_id": 2, "eos_token_id": 2, "bos_token_id": 1}) == 1
    assert export_pad_token_id({"pad_token_id": 2, "eos_token_id": [2, 3], "bos_token_id": 3}) is None


def test_causal_lm_loader_names_a_reward_model_and_an_adapter_dir(tmp_path):
    """Loading an exported reward model (or a LoRA adapter directory) as a causal LM says what it is."""
    from paddlenlp_ext.transformers import AutoModelForCausalLM

    base = make_tiny_model_dir(str(tmp_path / "base"))
    LlamaForScore.from_pretrained(base).save_pretrained(str(tmp_path / "rm"))
    with pytest.raises(ValueError, match="is a reward model \\(LlamaForSequenceClassification\\)"):
        AutoModelForCausalLM.from_pretrained(str(tmp_path / "rm"))
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="LoRA adapter directory"):
        AutoModelForCausalLM.from_pretrained(str(tmp_path / "adapter"))


def test_rm_export_full_disk_is_one_save_error(base, tmp_path, monkeypatch):
    """ENOSPC while the RM Trainer writes its final model: checkpoint.SaveError naming the directory; the
    temporary directory is removed and an earlier export stays unchanged."""
    import errno
    import types

    from paddlenlp_ext.trainer.checkpoint import SaveError
    from paddlenlp_ext.trl.rm_trainer import RewardTrainer

    out = tmp_path / "rm"
    model = LlamaForScore.from_pretrained(base)
    tok = transformers.AutoTokenizer.from_pretrained(base)
    model.save_pretrained(str(out), tokenizer=tok)
    before = sorted(os.listdir(out))
    trainer = types.SimpleNamespace(model=model, tokenizer=tok, args=types.SimpleNamespace(output_dir=str(out)))

    def enospc(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("safetensors.torch.save_file", enospc)
    with pytest.raises(SaveError, match=f"could not write the reward model to {out}"):
        RewardTrainer.save_model(trainer)
    assert os.listdir(tmp_path) == ["rm"] and sorted(os.listdir(out)) == before
