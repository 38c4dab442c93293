"""``Ernie35Config``: ERNIE-3.5-SE hyper-parameters with PaddleNLP's field names, defaults and presets.

Source: PaddleNLP ``llm/experimental/ernie-3.5-se/configuration.py`` (``Ernie35Config``,
``ERNIE_PRETRAINED_INIT_CONFIGURATION``). Quirk kept: ``tie_word_embeddings`` always equals ``weight_share``
(a ``tie_word_embeddings`` key in a config is overwritten). Fields that only steer Paddle kernels or
parallelism (``use_flash_attention``, ``fuse_ln``, ``fuse_linear``, ``use_recompute*``, ``sequence_parallel``,
``seqlen``, ``virtual_pp_degree``, ``tensor_parallel_output``) are kept for round trips and ignored by the model:
attention always goes through ``flashmask.flashmask_attention``.
"""

from __future__ import annotations

import copy
import json
import os

__all__ = ["Ernie35Config", "ERNIE_PRETRAINED_INIT_CONFIGURATION", "CONFIG_NAME"]

CONFIG_NAME = "config.json"

# PaddleNLP ERNIE_PRETRAINED_INIT_CONFIGURATION, verbatim. No weights exist for either name in any reachable
# registry: both build randomly initialised models.
ERNIE_PRETRAINED_INIT_CONFIGURATION = {
    "ernie/tiny-random-ernie": {
        "fuse_linear": False,
        "fuse_ln": False,
        "hidden_size": 768,
        "ignored_index": -100,
        "initializer_range": 0.02,
        "intermediate_size": 2048,
        "max_position_embeddings": 4096,
        "model_type": "ernie",
        "num_attention_heads": 12,
        "num_hidden_layers": 3,
        "pad_token_id": 0,
        "parallel_attn_hatf": True,
        "enable_random_position_ids": True,
        "use_progressive_seq_len": False,
        "layer_norm_eps": 1e-06,
        "tensor_parallel_output": True,
        "tie_word_embeddings": False,
        "use_bias": True,
        "use_flash_attention": True,
        "use_recompute": False,
        "use_recompute_attn": False,
        "vocab_size": 32000,
        "weight_share_add_bias": True,
    },
    "baidu/ernie-3.5-se-3b": {
        "fuse_linear": False,
        "fuse_ln": False,
        "hidden_size": 3072,
        "ignored_index": -100,
        "initializer_range": 0.02,
        "intermediate_size": 8192,
        "max_position_embeddings": 32768,
        "model_type": "ernie",
        "num_attention_heads": 24,
        "num_hidden_layers": 32,
        "pad_token_id": 0,
        "parallel_attn_hatf": True,
        "enable_random_position_ids": True,
        "use_progressive_seq_len": True,
        "layer_norm_eps": 1e-06,
        "tensor_parallel_output": True,
        "tie_word_embeddings": False,
        "use_bias": True,
        "use_flash_attention": True,
        "use_recompute": False,
        "use_recompute_attn": False,
        "vocab_size": 32000,
        "weight_share_add_bias": True,
    },
}

# PaddleNLP Ernie35Config.__init__ defaults, in its order.
_DEFAULTS = dict(
    vocab_size=65536,
    hidden_size=768,
    intermediate_size=11008,
    max_position_embeddings=2048,
    num_hidden_layers=2,
    num_attention_heads=2,
    initializer_range=0.02,  # overwritten by Ernie35ForCausalLM: sqrt(0.3333 / hidden_size)
    layer_norm_eps=1e-6,
    use_cache=True,
    use_flash_attention=True,
    use_recompute=False,
    use_recompute_attn=False,
    fuse_ln=False,
    tensor_parallel_output=True,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    use_bias=False,
    sequence_parallel=False,
    weight_share=False,
    weight_share_add_bias=True,
    fuse_linear=False,
    seqlen=False,
    virtual_pp_degree=1,
    ignored_index=-100,
    parallel_attn_hatf=True,
    enable_random_position_ids=False,
    use_progressive_seq_len=False,
)

# Keys of Paddle/HF config files that carry no architecture information; kept as attributes, never validated.
_PASSTHROUGH = {"architectures", "dtype", "torch_dtype", "paddlenlp_version", "transformers_version",
                "_name_or_path", "tensor_parallel_degree", "tensor_parallel_rank", "model_type"}


class Ernie35Config:
    """ERNIE-3.5-SE configuration (PaddleNLP ``Ernie35Config``).

    Every field of PaddleNLP's ``__init__`` is accepted with its default (see ``_DEFAULTS``): notably
    ``use_bias=False``, ``parallel_attn_hatf=True``, ``enable_random_position_ids=False``,
    ``use_progressive_seq_len=False``, ``layer_norm_eps=1e-6``, ``weight_share=False``,
    ``weight_share_add_bias=True``. ``tie_word_embeddings`` is set from ``weight_share``. Unknown keys are kept as
    attributes (PaddleNLP ``PretrainedConfig`` does the same) and written back by :meth:`save_pretrained`.

    Raises:
        ValueError: ``hidden_size`` not divisible by ``num_attention_heads``, odd ``head_dim`` (RoPE needs pairs),
            or ``parallel_attn_hatf`` with fewer than 2 layers.
    """

    model_type = "ernie"

    def __init__(self, **kwargs):
        tie = kwargs.pop("tie_word_embeddings", None)
        for k, v in _DEFAULTS.items():
            setattr(self, k, kwargs.pop(k, v))
        if self.use_recompute_attn:
            self.use_recompute = False  # PaddleNLP: use_recompute_attn disables use_recompute
        # PaddleNLP: kwargs["tie_word_embeddings"] = weight_share (an explicit tie_word_embeddings is overwritten)
        del tie
        self.tie_word_embeddings = bool(self.weight_share)
        self.extra_keys = sorted(kwargs)
        for k, v in kwargs.items():
            setattr(self, k, v)
        self.model_type = "ernie"
        self._validate()

    def _validate(self) -> None:
        h, n = self.hidden_size, self.num_attention_heads
        if h % n:
            raise ValueError(f"Ernie35Config: hidden_size={h} must be divisible by num_attention_heads={n}")
        if (h // n) % 2:
            raise ValueError(f"Ernie35Config: head_dim={h // n} must be even for RoPE")
        if self.parallel_attn_hatf and self.num_hidden_layers < 2:
            raise ValueError(f"Ernie35Config: parallel_attn_hatf needs num_hidden_layers >= 2 (first layer "
                             f"attention-only, last FFN-only), got {self.num_hidden_layers}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_dict(self) -> dict:
        """All fields, PaddleNLP names; ``tie_word_embeddings`` and ``weight_share`` both present."""
        d = {k: getattr(self, k) for k in _DEFAULTS}
        d.update({k: getattr(self, k) for k in self.extra_keys})
        d["tie_word_embeddings"] = self.tie_word_embeddings
        d["model_type"] = "ernie"
        return copy.deepcopy(d)

    def save_pretrained(self, save_directory: str) -> None:
        """Write ``<dir>/config.json``."""
        os.makedirs(save_directory, exist_ok=True)
        d = self.to_dict()
        d.setdefault("architectures", ["Ernie35ForCausalLM"])
        with open(os.path.join(save_directory, CONFIG_NAME), "w") as f:
            json.dump(d, f, indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict, **overrides) -> "Ernie35Config":
        d = {**d, **overrides}
        mt = d.get("model_type", "ernie")
        if mt != "ernie":
            raise ValueError(f"Ernie35Config: model_type is {mt!r}, expected 'ernie'")
        return cls(**d)

    @classmethod
    def from_pretrained(cls, name_or_dir: str, **overrides) -> "Ernie35Config":
        """A preset name (``ernie/tiny-random-ernie``, ``baidu/ernie-3.5-se-3b``) or a directory with config.json.

        Raises:
            FileNotFoundError: neither a preset nor a directory holding ``config.json`` (message lists presets).
        """
        if name_or_dir in ERNIE_PRETRAINED_INIT_CONFIGURATION:
            return cls.from_dict(ERNIE_PRETRAINED_INIT_CONFIGURATION[name_or_dir], **overrides)
        path = os.path.join(name_or_dir, CONFIG_NAME) if os.path.isdir(name_or_dir) else name_or_dir
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"Ernie35Config: {name_or_dir!r} is neither a preset {sorted(ERNIE_PRETRAINED_INIT_CONFIGURATION)} "
                f"nor a directory containing {CONFIG_NAME}")
        with open(path) as f:
            d = json.load(f)
        for k in _PASSTHROUGH - {"model_type"}:
            d.pop(k, None)
        if "weight_share" not in d and "tie_word_embeddings" in d:
            # PaddleNLP's Ernie35Config keeps no weight_share attribute, so the config.json it writes records the
            # tying only as tie_word_embeddings; read that back as weight_share (PaddleNLP itself would drop it).
            d["weight_share"] = bool(d["tie_word_embeddings"])
        return cls.from_dict(d, **overrides)

    def __repr__(self) -> str:
        return f"Ernie35Config({json.dumps(self.to_dict(), sort_keys=True)})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Ernie35Config) and self.to_dict() == other.to_dict()
