"""Loading and saving Hugging Face style model directories (config.json + safetensors), shared by all models.

Layout written/read (the same as ``transformers``' ``save_pretrained``):

- ``config.json``
- ``model.safetensors``, or when the weights exceed ``max_shard_bytes``: ``model-00001-of-0000N.safetensors`` ...
  plus ``model.safetensors.index.json`` (``{"metadata": {"total_size": bytes}, "weight_map": {name: file}}``).

Models use it through :class:`PretrainedMixin`: a class sets ``config_class`` (with ``from_pretrained(dir)``,
``save_pretrained(dir)`` and a ``tie_word_embeddings`` attribute) and implements ``tie_weights()``.
Counterpart of PaddleNLP's ``paddlenlp/transformers/model_utils.py`` (safetensors only, no Paddle pdparams).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from typing import Any

import torch
from huggingface_hub import save_torch_state_dict, split_torch_state_dict_into_shards
from safetensors import safe_open

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
WEIGHTS_PATTERN = "model{suffix}.safetensors"  # huggingface_hub: suffix "" or "-00001-of-00003"
DEFAULT_MAX_SHARD_BYTES = 2 * 1000**3  # ~2 GB per file
# Buffers some HF checkpoints store that our modules compute on the fly.
IGNORED_CHECKPOINT_SUFFIXES = (".rotary_emb.inv_freq",)

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
           "half": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float64": torch.float64}


def read_config_dict(path: str) -> dict[str, Any]:
    """Load a ``config.json`` (``path`` is the directory or the file) as a dict.

    Raises:
        FileNotFoundError: the file does not exist; ValueError: it is not valid JSON.
    """
    file = path if os.path.isfile(path) else os.path.join(path, CONFIG_NAME)
    if not os.path.isfile(file):
        hint = ""
        if os.path.isfile(os.path.join(path, "adapter_config.json")):
            hint = (" (it is a LoRA adapter directory: give its base model as model_name_or_path and this "
                    "directory as lora_path, use its merged/ subdirectory, or llm/merge_lora_params.py)")
        raise FileNotFoundError(f"no {CONFIG_NAME} in {path!r}: expected a Hugging Face model directory{hint}")
    with open(file, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{file}: invalid JSON at line {e.lineno}: {e.msg}") from e


def write_json(file: str, obj: Any) -> None:
    """Write ``obj`` as indented JSON (UTF-8, trailing newline)."""
    with open(file, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def to_torch_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """``"bfloat16"``/``"bf16"``/``torch.bfloat16`` -> ``torch.bfloat16``; None stays None.

    Raises:
        ValueError: unknown dtype name (the message lists the valid ones).
    """
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).replace("torch.", "")
    if key not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}")
    return _DTYPES[key]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (the spelling config.json uses)."""
    return str(dtype).replace("torch.", "")


def weight_files(model_dir: str) -> list[str]:
    """Safetensors files of a model directory: ``[model.safetensors]`` or the shards named in the index (sorted).

    The one reader of the layout: :func:`load_state_dict` and ERNIE's Paddle import use it.

    Raises:
        FileNotFoundError: neither ``model.safetensors`` nor ``model.safetensors.index.json`` exists, or the index
            names a shard that does not exist; ValueError: the index is not JSON with a ``weight_map``.
    """
    single = os.path.join(model_dir, WEIGHTS_NAME)
    index = os.path.join(model_dir, WEIGHTS_INDEX_NAME)
    if os.path.isfile(single):
        return [single]
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            try:
                names = set(json.load(f)["weight_map"].values())
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
                raise ValueError(f"{index}: not a safetensors index (JSON with a \"weight_map\" of tensor name -> "
                                 f"file): {e}") from None
        files = [os.path.join(model_dir, n) for n in sorted(names)]
        absent = [p for p in files if not os.path.isfile(p)]
        if absent:
            raise FileNotFoundError(f"{index} names shard files that do not exist: {absent}")
        return files
    raise FileNotFoundError(f"no {WEIGHTS_NAME} or {WEIGHTS_INDEX_NAME} in {model_dir!r} (only safetensors "
                            f"checkpoints are supported; convert .bin/.pdparams with transformers first)")


def load_state_dict(model_dir: str, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Read every tensor of a (single or sharded) safetensors checkpoint on CPU, cast to ``dtype`` if given."""
    out: dict[str, torch.Tensor] = {}
    for file in weight_files(model_dir):
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                out[name] = t.to(dtype) if dtype is not None and t.is_floating_point() else t
    return out


def load_into_model(model: torch.nn.Module, state_dict: dict[str, torch.Tensor], tied: bool) -> None:
    """Assign ``state_dict`` to ``model`` (which may live on the meta device), then re-tie embeddings.

    ``lm_head.weight`` may be absent when ``tied``; a stored copy of it is ignored then.

    Raises:
        ValueError: names missing from or unexpected in the checkpoint, or a shape mismatch (names listed).
    """
    sd = {k: v for k, v in state_dict.items() if not k.endswith(IGNORED_CHECKPOINT_SUFFIXES)}
    if tied:
        sd.pop("lm_head.weight", None)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    if tied:
        expected.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(sd))
    unexpected = sorted(set(sd) - set(expected))
    bad_shape = [f"{k}: checkpoint {tuple(sd[k].shape)} vs model {tuple(s)}"
                 for k, s in expected.items() if k in sd and tuple(sd[k].shape) != tuple(s)]
    if missing or unexpected or bad_shape:
        raise ValueError("checkpoint does not match the model config: "
                         f"missing {missing[:8]}{'...' if len(missing) > 8 else ''}; "
                         f"unexpected {unexpected[:8]}{'...' if len(unexpected) > 8 else ''}; "
                         f"shape mismatches {bad_shape[:8]}")
    model.load_state_dict(sd, strict=False, assign=True)
    if tied:
        model.tie_weights()


def make_readable(directory: str) -> None:
    """chmod a freshly written directory 0755 and its files 0644 (mkdtemp and safetensors create them private)."""
    os.chmod(directory, 0o755)
    for name in os.listdir(directory):
        os.chmod(os.path.join(directory, name), 0o644)


@contextlib.contextmanager
def atomic_save_dir(save_dir: str):
    """Yield a temporary directory; on success move its files into ``save_dir``, atomically per file.

    A new ``save_dir`` appears at once (one directory rename). An existing one keeps its other files
    (e.g. a tokenizer saved earlier); when the new save holds model weights, stale weight files of a previous
    model save are removed (an adapter-only save leaves a full model beside it alone). On an exception the
    temporary directory is deleted and ``save_dir`` is untouched.
    """
    save_dir = os.path.abspath(save_dir)
    parent = os.path.dirname(save_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(save_dir)}.tmp-", dir=parent)
    try:
        yield tmp
        make_readable(tmp)
        if not os.path.exists(save_dir):
            os.rename(tmp, save_dir)
            return
        new = set(os.listdir(tmp))
        if new & {WEIGHTS_NAME, WEIGHTS_INDEX_NAME}:  # a model save: drop stale weights of an earlier one
            for name in os.listdir(save_dir):  # (differently sharded); an adapter save leaves a model alone
                if name not in new and (name in (WEIGHTS_NAME, WEIGHTS_INDEX_NAME)
                                        or (name.startswith("model-") and name.endswith(".safetensors"))):
                    os.remove(os.path.join(save_dir, name))
        for name in sorted(new, key=lambda n: n == CONFIG_NAME):  # config.json last
            os.replace(os.path.join(tmp, name), os.path.join(save_dir, name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _owning(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a compact copy when it is a view into a larger storage (a gathered FSDP or TP buffer, a slice of a
    fused weight): ``huggingface_hub`` refuses tensors that share or only partly cover a storage."""
    if t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone(memory_format=torch.contiguous_format)


def save_state_dict(state_dict: dict[str, torch.Tensor], save_dir: str,
                    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> list[str]:
    """Write tensors as ``model.safetensors``, or as shards + index when larger than ``max_shard_bytes``.

    ``huggingface_hub.save_torch_state_dict`` writes them (transformers' file names, index and sharding rule: shards
    filled in key order, a tensor larger than ``max_shard_bytes`` in a shard of its own). Tensors must be distinct
    (drop tied duplicates first: a shared one would be dropped from the file) and may live on any device (they are
    copied to CPU). Returns the file names written.
    """
    sd = {name: _owning(t.detach().to("cpu")) for name, t in state_dict.items()}
    split = split_torch_state_dict_into_shards(sd, filename_pattern=WEIGHTS_PATTERN, max_shard_size=max_shard_bytes)
    save_torch_state_dict(sd, save_dir, filename_pattern=WEIGHTS_PATTERN, max_shard_size=max_shard_bytes)
    return list(split.filename_to_tensors) + ([WEIGHTS_INDEX_NAME] if split.is_sharded else [])


class PretrainedMixin:
    """``from_pretrained`` / ``save_pretrained`` for an ``nn.Module`` built as ``cls(config)``.

    The subclass defines ``config_class`` and ``tie_weights()``; tied checkpoints omit ``lm_head.weight``.
    """

    config_class = None

    @classmethod
    def from_pretrained(cls, model_dir: str, dtype: str | torch.dtype = torch.float32, config=None, **config_overrides):
        """Build the model from a HF directory (config.json + single or sharded safetensors) on CPU.

        Args:
            model_dir: local directory, or ``HuggingFaceTB/SmolLM2-135M-Instruct`` (the embedded default model,
                see :func:`paddlenlp_ext.transformers.resolve_model_name_or_path`); no hub downloads.
            dtype: parameter dtype after loading (default fp32).
            config: use this config instead of ``<model_dir>/config.json``.
            config_overrides: fields replaced in the loaded config (e.g. ``recompute=True``).

        Raises:
            FileNotFoundError: missing config.json / weights; ValueError: weights do not fit the config, or
            ``model_dir`` is neither a directory nor the embedded model's name.
        """
        dtype = to_torch_dtype(dtype)
        if not os.path.isdir(model_dir):  # the embedded default model's name, or a clear "no hub" error
            from .auto import resolve_model_name_or_path

            model_dir = resolve_model_name_or_path(model_dir)
        if config is None:
            config = cls.config_class.from_pretrained(model_dir, **config_overrides)
        archs = read_config_dict(model_dir).get("architectures") or []
        if any(a.endswith("ForSequenceClassification") for a in archs) and not cls.__name__.endswith("ForScore"):
            raise ValueError(f"{model_dir} is a reward model ({archs[0]}), not a {cls.__name__}: score with "
                             "paddlenlp_ext.trl.reward_model.LlamaForScore or transformers; to fine-tune or chat, "
                             "start from the causal LM it was trained from")
        with torch.device("meta"):  # no double allocation: tensors are assigned from the checkpoint
            model = cls(config)
        load_into_model(model, load_state_dict(model_dir, dtype), tied=bool(config.tie_word_embeddings))
        still_meta = [n for n, p in model.named_parameters() if p.is_meta]
        if still_meta:
            raise ValueError(f"{model_dir}: parameters not in the checkpoint: {still_meta[:8]}")
        return model.eval()

    def save_pretrained(self, save_dir: str, dtype: str | torch.dtype | None = None,
                        max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> None:
        """Write ``config.json`` and safetensors weights to ``save_dir`` atomically (temp dir, then rename).

        Args:
            dtype: cast floating weights to this dtype on save (None keeps the parameter dtype); recorded
                as ``torch_dtype`` in config.json.
            max_shard_bytes: shard when the weights exceed this many bytes.
        """
        dtype = to_torch_dtype(dtype)
        sd = self.state_dict()
        if self.config.tie_word_embeddings:
            sd.pop("lm_head.weight", None)
        if dtype is not None:
            sd = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in sd.items()}
        first = next((v for v in sd.values() if v.is_floating_point()), None)
        config = type(self.config).from_dict(self.config.to_dict())
        if first is not None:
            config.torch_dtype = dtype_name(first.dtype)
        with atomic_save_dir(save_dir) as tmp:
            save_state_dict(sd, tmp, max_shard_bytes)
            config.save_pretrained(tmp)
