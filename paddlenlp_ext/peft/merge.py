"""Base model + LoRA adapter directory -> one merged model, as ``llm/predict.py`` and ``llm/merge_lora_params.py``
load it (PaddleNLP ``llm/tools/merge_lora_params.py``)."""

from __future__ import annotations

import json
import os

from .lora import ADAPTER_CONFIG_NAME, load_lora, merge_lora

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def adapter_base_model(lora_path: str) -> str | None:
    """``base_model_name_or_path`` of ``<lora_path>/adapter_config.json`` (None when empty).

    Raises:
        FileNotFoundError: no ``adapter_config.json`` in ``lora_path``.
    """
    with open(os.path.join(lora_path, ADAPTER_CONFIG_NAME)) as f:
        return json.load(f).get("base_model_name_or_path") or None


def load_merged_lora(lora_path: str, base: str, dtype="float32"):
    """``(model, tokenizer)``: ``base`` loaded in ``dtype`` with the adapter of ``lora_path`` folded in
    (:func:`load_lora` + :func:`merge_lora`: ``W + scaling * B @ A`` in fp32, rounded once to ``dtype``).
    The tokenizer comes from ``lora_path`` when it holds tokenizer files, else from ``base``.

    Raises:
        FileNotFoundError / ValueError: from the loaders, naming the directory and what is missing or mismatched.
    """
    from paddlenlp_ext.transformers import AutoModelForCausalLM, AutoTokenizer

    model = merge_lora(load_lora(AutoModelForCausalLM.from_pretrained(base, dtype=dtype), lora_path))
    has_tok = any(os.path.isfile(os.path.join(lora_path, f)) for f in TOKENIZER_FILES)
    return model, AutoTokenizer.from_pretrained(lora_path if has_tok else base)
