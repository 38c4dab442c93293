"""Check that a tokenizer's ids fit the model's embedding before anything runs."""

from __future__ import annotations

__all__ = ["check_tokenizer_fits_model"]


def check_tokenizer_fits_model(tokenizer, config, model_name: str, tokenizer_name: str | None = None) -> None:
    """Raise when ``tokenizer`` can produce ids ``>= config.vocab_size``.

    A model's vocabulary may be larger than its tokenizer's (PaddleNLP pads ERNIE's to a multiple of 128, the
    presets keep 32000 rows for the bundled 4,096-piece tokenizer); a smaller one would index past the embedding
    (an opaque index error on the CPU, a device-side assert on a GPU).

    Raises:
        ValueError: naming both sizes, the tokenizer and the model, and the fix.
    """
    vocab = getattr(config, "vocab_size", None)
    if vocab is None or tokenizer is None or not hasattr(tokenizer, "__len__"):
        return
    n = len(tokenizer)
    if n > int(vocab):
        where = tokenizer_name or getattr(tokenizer, "name_or_path", "") or "the tokenizer"
        raise ValueError(
            f"tokenizer {where} has {n} tokens but {model_name} has vocab_size={vocab} (config.json): ids from "
            f"{vocab} on would index past its embedding. Use the tokenizer the model was trained with "
            f"(tokenizer_name_or_path), or a model whose vocab_size is at least {n}")
