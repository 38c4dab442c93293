"""Fixtures of the launcher-script tests (``llm/*.py``)."""

import os
import shutil

import pytest
import torch

from tests._scripts import load_script


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory):
    """A 2-layer random Llama (SmolLM2's vocabulary, tied embeddings, ``max_position_embeddings`` 128) saved with
    SmolLM2's tokenizer files and chat template; one directory for the whole test session (tests only read it)."""
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


@pytest.fixture
def predict():
    """``llm/predict.py`` loaded as a fresh module (a test may monkeypatch its globals)."""
    return load_script("llm/predict.py", "llm_predict")
