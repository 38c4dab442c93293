"""llm/predict.py end to end on a tiny random Llama that uses the real SmolLM2 tokenizer (chat template)."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from _llama_testing import tiny_model

from paddlenlp_ext.transformers import AutoTokenizer, resolve_model_name_or_path
from paddlenlp_ext.transformers.generation import chat
from tests._scripts import load_script


def _load_predict():
    return load_script("llm/predict.py", "llm_predict")


def _save_tiny_with_tokenizer(out):
    """A tiny random Llama with SmolLM2's vocabulary saved to ``out`` with the SmolLM2 tokenizer files."""
    tok_dir = resolve_model_name_or_path("HuggingFaceTB/SmolLM2-135M-Instruct")  # converted once, cached
    model = tiny_model(vocab_size=49152, tie_word_embeddings=True)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(os.path.join(tok_dir, name), out / name)
    return model


def test_predict_prompt_prints_the_chat_reply(tmp_path, capsys):
    model = _save_tiny_with_tokenizer(tmp_path / "m")
    rc = _load_predict().main(["--model_name_or_path", str(tmp_path / "m"), "--prompt", "Hello there",
                               "--max_new_tokens", "6", "--num_threads", str(torch.get_num_threads())])
    out = capsys.readouterr()
    assert rc == 0 and "tokens/s" in out.err
    expected = chat(model, AutoTokenizer.from_pretrained(str(tmp_path / "m")), "Hello there", max_new_tokens=6)
    assert out.out == expected + "\n"


def test_predict_on_a_lora_output_directory(tmp_path, capsys):
    """A LoRA run's output (PEFT adapter + tokenizer, no config.json): predict.py loads the base named in
    adapter_config.json, merges the adapter and answers like the base + adapter model."""
    from paddlenlp_ext.peft import apply_lora, save_lora

    base = _save_tiny_with_tokenizer(tmp_path / "base")
    model = apply_lora(base, {"lora_rank": 4})
    torch.manual_seed(1)
    with torch.no_grad():  # a non-zero adapter, so merging it changes the answer's logits
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    save_lora(model, str(tmp_path / "lora"), base_model_name_or_path=str(tmp_path / "base"))
    rc = _load_predict().main(["--model_name_or_path", str(tmp_path / "lora"), "--prompt", "Hello there",
                               "--max_new_tokens", "6", "--num_threads", str(torch.get_num_threads())])
    out = capsys.readouterr()
    assert rc == 0 and "LoRA adapter" in out.err
    expected = chat(model, AutoTokenizer.from_pretrained(str(tmp_path / "base")), "Hello there", max_new_tokens=6)
    assert out.out == expected + "\n"


@pytest.mark.parametrize("argv,msg", [(["--max_new_tokens", "0"], "--max_new_tokens must be >= 1"),
                                      (["--device", "cuda"], "use --device cpu")])
def test_predict_bad_options(argv, msg):
    if "cuda" in argv and torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    with pytest.raises(ValueError, match=msg):
        _load_predict().main(["--prompt", "hi"] + argv)


@pytest.mark.parametrize("prompt", ["", "   "])
def test_predict_blank_prompt_is_an_empty_reply_without_a_model_call(tmp_path, capsys, prompt):
    """As a blank piped line: one empty stdout line and a note, no generation (was: the model answered it)."""
    _save_tiny_with_tokenizer(tmp_path / "m")
    rc = _load_predict().main(["--model_name_or_path", str(tmp_path / "m"), "--prompt", prompt,
                               "--max_new_tokens", "6"])
    out = capsys.readouterr()
    assert rc == 0 and out.out == "\n"
    assert "--prompt is blank" in out.err and "tokens/s" not in out.err


def test_predict_sampling_flags_without_sampling_are_named(tmp_path, capsys):
    """--temperature / --top_p without --do_sample: greedy decoding, and stderr says the flags did nothing (they
    were ignored silently); with --do_sample no such note."""
    _save_tiny_with_tokenizer(tmp_path / "m")
    predict = _load_predict()
    common = ["--model_name_or_path", str(tmp_path / "m"), "--prompt", "Hi", "--max_new_tokens", "3"]
    assert predict.main(common + ["--temperature", "0.2", "--top_p", "0.5"]) == 0
    err = capsys.readouterr().err
    assert "--temperature, --top_p only apply when sampling" in err
    assert predict.main(common + ["--do_sample", "--temperature", "0.2"]) == 0
    assert "only apply when sampling" not in capsys.readouterr().err
