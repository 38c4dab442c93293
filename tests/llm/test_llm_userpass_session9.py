"""Session-9 user pass (llm/predict.py, merge_lora_params.py, data, configs): what a new user tried and broke
(each fix's test fails on the code before it; coverage tests are marked as such).

llm/predict.py with piped stdin must print exactly one line per input line (blank lines, multi-line replies,
non-UTF-8 bytes); the tiny model uses SmolLM2's real tokenizer (chat template) and a 2-layer random Llama.
"""

from __future__ import annotations

import io
import os
import shutil
import sys

import pytest
import torch

from tests._scripts import load_script


@pytest.fixture(scope="module")
def tiny_chat_model(tmp_path_factory):
    """A 2-layer random Llama with SmolLM2's vocabulary and tokenizer files, saved to a directory."""
    from paddlenlp_ext.transformers import LlamaConfig, LlamaForCausalLM, resolve_model_name_or_path

    out = tmp_path_factory.mktemp("tiny_chat")
    tok_dir = resolve_model_name_or_path("HuggingFaceTB/SmolLM2-135M-Instruct")  # tokenizer files only
    cfg = LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                      max_position_embeddings=128)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    model.init_weights(std=0.2)  # larger logits than the HF init, so greedy replies are not empty or all special
    model.save_pretrained(str(out))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(os.path.join(tok_dir, name), out / name)
    return str(out)


# ---- data: records PaddleNLP accepts but that train nothing useful (warned once per file, naming the lines) ------


# ---- merge_lora_params.py: PaddleNLP's command line ----------------------------------------------------------------

def test_merge_accepts_paddlenlp_flags(tmp_path, capsys):
    """PaddleNLP's documented merge command (``--device gpu --safe_serialization true``) stopped at argparse's
    'unrecognized arguments'; now it merges, with a note that the merge runs on the CPU."""
    from paddlenlp_ext.peft import LoRALinear, apply_lora, save_lora
    from paddlenlp_ext.transformers import AutoModelForCausalLM
    from tests.trl._tiny import make_tiny_model_dir

    base = make_tiny_model_dir(str(tmp_path / "base"))
    model = apply_lora(AutoModelForCausalLM.from_pretrained(base), {"lora_rank": 2})
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.weight.fill_(0.05)
    save_lora(model, str(tmp_path / "lora"), base_model_name_or_path=base)
    merge = load_script("llm/merge_lora_params.py", "merge_up9")
    out = tmp_path / "merged"
    rc = merge.main(["--model_name_or_path", base, "--lora_path", str(tmp_path / "lora"), "--output_path", str(out),
                     "--safe_serialization", "True", "--device", "gpu"])
    assert rc == 0 and (out / "model.safetensors").is_file()
    assert "--device gpu: ignored, the merge runs on the CPU" in capsys.readouterr().err
    ids = torch.tensor([[1, 3, 7, 10]])
    with torch.no_grad():
        torch.testing.assert_close(AutoModelForCausalLM.from_pretrained(str(out)).eval()(ids), model.eval()(ids))


def test_merge_safe_serialization_false_is_noted():
    merge = load_script("llm/merge_lora_params.py", "merge_up9")
    args = merge.parse_args(["--lora_path", "a", "--output_path", "b", "--safe_serialization", "false",
                             "--device", "cpu"])
    assert merge.compat_notes(args) == ["--safe_serialization false: ignored, the merged model is written as "
                                        "safetensors (there is no Paddle .pdparams format here)"]
    with pytest.raises(SystemExit):
        merge.parse_args(["--lora_path", "a", "--output_path", "b", "--safe_serialization", "maybe"])


# ---- predict.py: a PaddleNLP user's predictor command line ---------------------------------------------------------


# ---- config/: every shipped JSON parses with its launcher's parser (coverage; passed before this session) --------

def _configs():
    from tests._scripts import ROOT

    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "config").rglob("*.json"))


@pytest.mark.parametrize("path", _configs())
def test_every_shipped_config_parses_with_its_launcher(path, monkeypatch):
    from paddlenlp_ext.trl.arguments import parse_dpo_args, parse_rm_args
    from tests._scripts import ROOT

    monkeypatch.chdir(ROOT)
    kind = os.path.basename(path)[:-len(".json")]
    if kind in ("sft", "lora"):
        model_args, data_args, training_args, _ = load_script("llm/run_finetune.py", "run_finetune_up9").parse_args(
            [path])
        assert bool(model_args.lora) == (kind == "lora") and data_args.zero_padding
    elif kind == "dpo":
        parse_dpo_args([path])
    elif kind == "rm":
        parse_rm_args([path])
    else:
        pytest.fail(f"{path}: no launcher known for a config named {kind}.json (sft, lora, dpo, rm)")


# ---- data: a JSON document where jsonl is expected ----------------------------------------------------------------


# ---- transformers: an unsupported architecture names its config.json -------------------------------------------

def test_unsupported_model_type_names_the_config_file(tiny_chat_model, tmp_path):
    """A model_type neither native nor known to transformers: the error names the config.json."""
    import json

    from paddlenlp_ext.transformers import AutoModelForCausalLM

    cfg = json.loads((open(os.path.join(tiny_chat_model, "config.json"))).read())
    cfg.update(model_type="qwen99", architectures=["Qwen99ForCausalLM"])
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=rf"{tmp_path}/config.json: model_type 'qwen99' is not a model"):
        AutoModelForCausalLM.from_pretrained(str(tmp_path))


