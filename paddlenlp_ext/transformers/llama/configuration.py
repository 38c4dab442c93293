"""``LlamaConfig``: Llama hyper-parameters under Hugging Face's ``config.json`` key names.

Matches ``transformers.LlamaConfig`` (v4 keys ``rope_theta``/``rope_scaling``; v5's ``rope_parameters`` is read
too) rather than PaddleNLP's ``paddlenlp/transformers/llama/configuration.py``, so a directory written here is
loadable by ``transformers.AutoModelForCausalLM`` and vice versa. Keys this class does not know are kept in
``extra`` and written back unchanged.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from ..model_utils import CONFIG_NAME, read_config_dict, write_json

_LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
# Written by transformers but meaningless here; never copied into ``extra``.
_DROP_KEYS = ("transformers_version", "_name_or_path", "architectures", "rope_parameters", "dtype")


@dataclass
class LlamaConfig:
    """Llama / Llama-3 / SmolLM2 architecture hyper-parameters (Hugging Face field names).

    Attributes (non-obvious ones):
        num_key_value_heads: K/V heads for GQA; None means ``num_attention_heads`` (MHA).
        head_dim: per-head width; None means ``hidden_size // num_attention_heads``.
        rope_theta: RoPE base (SmolLM2: 100000).
        rope_scaling: None, or Llama-3.1 scaling ``{"rope_type": "llama3", "factor", "low_freq_factor",
            "high_freq_factor", "original_max_position_embeddings"}``.
        torch_dtype: dtype name the weights were saved in ("float32", "bfloat16", ...).
        recompute: activation checkpointing per decoder layer (a training switch; not written to config.json).
        extra: unknown ``config.json`` keys, preserved on save.

    Raises:
        ValueError: on inconsistent heads, an unsupported activation or rope scaling type.
    """

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    bos_token_id: int | None = 1
    eos_token_id: int | list | None = 2
    pad_token_id: int | None = None
    torch_dtype: str | None = "float32"
    model_type: str = "llama"
    recompute: bool = False
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(f"LlamaConfig: hidden_size={self.hidden_size} is not divisible by "
                                 f"num_attention_heads={self.num_attention_heads}; set head_dim explicitly")
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"LlamaConfig: num_attention_heads={self.num_attention_heads} must be a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads}")
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig: head_dim must be even for RoPE, got {self.head_dim}")
        if self.hidden_act != "silu":
            raise ValueError(f"LlamaConfig: only hidden_act='silu' (SwiGLU) is supported, got {self.hidden_act!r}")
        if self.model_type != "llama":
            raise ValueError(f"LlamaConfig: model_type must be 'llama', got {self.model_type!r}")
        self.rope_scaling = _normalize_rope_scaling(self.rope_scaling)

    # ------------------------------------------------------------------ dict / json
    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LlamaConfig":
        """Build from a ``config.json`` dict (HF v4 or v5 layout); unknown keys go to ``extra``."""
        d = dict(d)
        rp = d.get("rope_parameters")
        if isinstance(rp, dict):  # transformers v5 folds rope_theta into rope_parameters
            rp = dict(rp)
            d.setdefault("rope_theta", rp.pop("rope_theta", cls.rope_theta))
            if d.get("rope_scaling") is None and rp.get("rope_type", rp.get("type", "default")) != "default":
                d["rope_scaling"] = rp
        if d.get("torch_dtype") is None and isinstance(d.get("dtype"), str):
            d["torch_dtype"] = d["dtype"]
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in d.items() if k in names}
        extra = dict(d.get("extra") or {})
        extra.update({k: v for k, v in d.items() if k not in names and k not in _DROP_KEYS and k != "extra"})
        return cls(**known, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        """HF ``config.json`` dict: ``extra`` keys merged in, ``architectures`` set, ``recompute`` left out."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("extra", "recompute")}
        out = {"architectures": ["LlamaForCausalLM"], **self.extra, **d}
        return dict(sorted(out.items()))

    @classmethod
    def from_pretrained(cls, path: str, **overrides) -> "LlamaConfig":
        """Read ``<path>/config.json`` (or ``path`` itself when it is a file); ``overrides`` replace fields.

        Raises:
            FileNotFoundError: no config.json there.
        """
        d = read_config_dict(path)
        d.update(overrides)
        return cls.from_dict(d)

    def save_pretrained(self, save_dir: str) -> None:
        """Write ``<save_dir>/config.json`` (the directory is created if needed)."""
        os.makedirs(save_dir, exist_ok=True)
        write_json(os.path.join(save_dir, CONFIG_NAME), self.to_dict())


def _normalize_rope_scaling(rs: dict | None) -> dict | None:
    if rs is None:
        return None
    if not isinstance(rs, dict):
        raise ValueError(f"LlamaConfig.rope_scaling must be a dict or None, got {type(rs).__name__}")
    rs = dict(rs)
    rope_type = rs.pop("type", None) or rs.get("rope_type") or "default"
    rs["rope_type"] = rope_type
    if rope_type == "default":
        return None
    if rope_type != "llama3":
        raise ValueError(f"LlamaConfig.rope_scaling: rope_type {rope_type!r} is not supported (only 'llama3'); "
                         f"remove rope_scaling or convert the checkpoint")
    missing = [k for k in _LLAMA3_ROPE_KEYS if k not in rs]
    if missing:
        raise ValueError(f"LlamaConfig.rope_scaling (llama3) is missing keys {missing}; needs {list(_LLAMA3_ROPE_KEYS)}")
    return rs
