"""Tiny random ``transformers`` configs of the families the FlashMask backend is tested on, and a helper that
writes one as a local model directory (with the embedded SmolLM2 tokenizer) for launcher tests."""

import json
import os
import shutil

import torch

COMMON = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=128, head_dim=8)

# family -> (config class name, extra fields): every windowed family has a window shorter than the test documents
FAMILIES = {
    "llama": ("LlamaConfig", dict(num_hidden_layers=2)),
    "qwen2": ("Qwen2Config", dict(num_hidden_layers=3, use_sliding_window=True, sliding_window=3,
                                  max_window_layers=1)),
    "qwen3": ("Qwen3Config", dict(num_hidden_layers=2)),
    "mistral": ("MistralConfig", dict(num_hidden_layers=2, sliding_window=4)),
    "gemma3_text": ("Gemma3TextConfig", dict(num_hidden_layers=4, sliding_window=3, query_pre_attn_scalar=12,
                                             layer_types=["sliding_attention", "full_attention"] * 2)),
    "phi3": ("Phi3Config", dict(num_hidden_layers=2, sliding_window=5, pad_token_id=0)),
}


def tiny_config(family: str, **overrides):
    """A random-init-sized config of ``family`` (a key of :data:`FAMILIES`)."""
    import transformers

    cls_name, extra = FAMILIES[family]
    fields = {**COMMON, **extra, **overrides}
    if family == "phi3":
        fields.pop("head_dim")
    return getattr(transformers, cls_name)(**fields)


def tiny_model(family: str, attn_implementation: str = "sdpa", seed: int = 0, **overrides):
    """A random ``AutoModelForCausalLM`` of ``family`` in fp32, eval mode."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, **overrides), attn_implementation=attn_implementation)
    return model.eval()


def _smollm2_dir() -> str:
    from paddlenlp_ext.transformers import resolve_model_name_or_path

    return resolve_model_name_or_path("HuggingFaceTB/SmolLM2-135M-Instruct")


def copy_smollm2_tokenizer(path) -> None:
    """Copy the embedded SmolLM2 tokenizer files into ``path``."""
    src = _smollm2_dir()
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), path)


def smollm2_vocab_size() -> int:
    """The embedded SmolLM2's ``vocab_size`` (from its ``config.json``)."""
    return json.load(open(os.path.join(_smollm2_dir(), "config.json")))["vocab_size"]


def save_tiny_model_dir(family: str, path, **overrides) -> str:
    """Write a random ``family`` model (SmolLM2's vocab and tokenizer files) to ``path``; returns ``str(path)``."""
    model = tiny_model(family, vocab_size=smollm2_vocab_size(), bos_token_id=1, eos_token_id=2, pad_token_id=2,
                       **overrides)
    model.save_pretrained(str(path))
    copy_smollm2_tokenizer(path)
    return str(path)


def save_tiny_llama_dir(path) -> str:
    """Write a random 2-layer ``paddlenlp_ext`` Llama (hidden 32, 4 heads / 2 KV heads, tied embeddings, seed 0) with
    SmolLM2's vocab and tokenizer files to ``path``, for launcher tests; returns ``str(path)``."""
    from paddlenlp_ext.transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=smollm2_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                      max_position_embeddings=256)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(str(path))
    copy_smollm2_tokenizer(path)
    return str(path)
