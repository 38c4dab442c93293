"""Fused training ops and the switches that turn them on (PaddleNLP's ``use_fused_*`` keys).

- ``linear_cross_entropy.fused_linear_cross_entropy``: chunked linear + CE (``use_fused_linear_cross_entropy``).
- ``elementwise.fused_rms_norm`` / ``fused_rope`` / ``fused_swiglu``: ``torch.compile``d on CUDA, eager elsewhere
  (``use_fused_rms_norm``, ``use_fused_rope``, ``use_fused_swiglu``).
- :func:`set_llm_config`: copy those keys from training arguments onto a model's config (PaddleNLP's
  ``LlmMetaConfig.set_llm_config``); :func:`fused_flag` reads one back with this package's default.
"""

from __future__ import annotations

import contextlib
from typing import Any

from .elementwise import fused_rms_norm, fused_rope, fused_swiglu, rms_norm_eager, rope_eager, swiglu_eager
from .linear_cross_entropy import default_chunk_size, fused_linear_cross_entropy

# Value used when a model config does not carry the key (a model built without set_llm_config). The fused
# cross entropy is numerically the unfused formula (chunked), so it is on by default; the compiled elementwise
# ops follow PaddleNLP's default (off).
FUSED_DEFAULTS = {"use_fused_rms_norm": False, "use_fused_rope": False, "use_fused_swiglu": False,
                  "use_fused_linear_cross_entropy": True}


def fused_flag(config: Any, key: str) -> bool:
    """``config.<key>`` as a bool, or :data:`FUSED_DEFAULTS` ``[key]`` when the config lacks it (or is None).

    Raises:
        KeyError: ``key`` is not one of :data:`FUSED_DEFAULTS`.
    """
    default = FUSED_DEFAULTS[key]
    value = getattr(config, key, None) if config is not None else None
    return default if value is None else bool(value)


def set_llm_config(model_or_config: Any, training_args: Any) -> list:
    """Copy the ``use_fused_*`` keys of ``training_args`` onto the model config(s), in place.

    Mirrors PaddleNLP's ``LlmMetaConfig.set_llm_config(model_config, training_args)`` for the op-fusion flags.
    ``model_or_config``: an ``nn.Module`` (every distinct ``.config`` of it and its submodules is updated: Llama
    layers share one) or a config object. The flags are plain attributes read at forward time, so they can be set
    after ``from_pretrained``, LoRA or FSDP2 wrapping, and they are not written to ``config.json``.

    Returns:
        the configs updated (list).
    """
    import torch.nn as nn

    if isinstance(model_or_config, nn.Module):
        configs, seen = [], set()
        for m in model_or_config.modules():
            c = getattr(m, "config", None)
            if c is not None and id(c) not in seen:
                seen.add(id(c))
                configs.append(c)
    else:
        configs = [model_or_config]
    for c in configs:
        for key in FUSED_DEFAULTS:
            value = getattr(training_args, key, None)
            if value is not None:
                setattr(c, key, bool(value))
    return configs


@contextlib.contextmanager
def without_fused_keys(config: Any):
    """Inside the ``with``: ``config`` without the ``use_fused_*`` attributes :func:`set_llm_config` put on it, so
    that a ``transformers`` ``save_pretrained`` (which writes every attribute to ``config.json``) leaves them out;
    restored afterwards."""
    held = {k: config.__dict__.pop(k) for k in FUSED_DEFAULTS if k in getattr(config, "__dict__", {})}
    try:
        yield config
    finally:
        config.__dict__.update(held)


__all__ = ["FUSED_DEFAULTS", "default_chunk_size", "fused_flag", "fused_linear_cross_entropy", "fused_rms_norm",
           "fused_rope", "fused_swiglu", "rms_norm_eager", "rope_eager", "set_llm_config", "swiglu_eager",
           "without_fused_keys"]
