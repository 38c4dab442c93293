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


def load_merged_lora(lora_path: str, base: str, dtype="float32", **load_kwargs):
    """``(model, tokenizer)``: ``base`` loaded in ``dtype`` with the adapter of ``lora_path`` folded in
    (:func:`load_lora` + :func:`merge_lora`: ``W + scaling * B @ A`` in fp32, rounded once to ``dtype``).
    The tokenizer comes from ``lora_path`` when it holds tokenizer files, else from ``base``. ``load_kwargs``
    (``model_implementation``, ``trust_remote_code``) go to ``AutoModelForCausalLM.from_pretrained``.

    Raises:
        FileNotFoundError / ValueError: from the loaders, naming the directory and what is missing or mismatched.
        ValueError: ``base`` is a random-init ERNIE preset name: a new load is another random model, not the one
            the adapter was trained on.
        FileNotFoundError: ``base`` is the adapter's own ``base_model_name_or_path`` and no longer exists (names
            ``adapter_config.json`` and the two fixes).
    """
    from paddlenlp_ext.transformers import AutoModelForCausalLM, AutoTokenizer
    from paddlenlp_ext.transformers.auto import local_model_dir
    from paddlenlp_ext.transformers.ernie35 import is_preset

    if is_preset(base):
        raise ValueError(f"{lora_path}: the adapter's base {base!r} is a random-init ERNIE preset whose weights were "
                         "never saved; loading it again builds a different random model, so the adapter cannot be "
                         "merged into the weights it was trained with. Train with merge_weights: true (the run "
                         "merges into its own base and writes <output_dir>/merged), or train LoRA on a saved model "
                         "directory (e.g. an SFT run's output_dir)")
    if base == adapter_base_model(lora_path) and local_model_dir(base) is None:
        # name the file the base came from: the user typed the adapter directory, not this base path
        raise FileNotFoundError(
            f"{os.path.join(lora_path, ADAPTER_CONFIG_NAME)}: the adapter's base model {base!r} "
            "(base_model_name_or_path) is not a local directory (moved or deleted?). Give the base explicitly "
            "(llm/merge_lora_params.py --model_name_or_path <base dir>), or set base_model_name_or_path in that file "
            "to where the base model is now")
    model = merge_lora(load_lora(AutoModelForCausalLM.from_pretrained(base, dtype=dtype, **load_kwargs), lora_path))
    has_tok = any(os.path.isfile(os.path.join(lora_path, f)) for f in TOKENIZER_FILES)
    return model, AutoTokenizer.from_pretrained(lora_path if has_tok else base)
