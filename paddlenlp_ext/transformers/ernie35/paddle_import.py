"""Read and write PaddleNLP ERNIE-3.5-SE checkpoints; ``.pdparams`` go through a restricted unpickler.

PaddleNLP layout (``Ernie35ForCausalLM.state_dict()`` saved by ``paddle.save`` / ``save_pretrained``):
``ernie.embed_tokens.weight [V, H]``, ``ernie.layers.N.<sub>.<proj>.weight [in, out]`` (Paddle ``Linear``),
``ernie.norm.{weight,bias}``, ``lm_head.weight [H, V]`` (``[V, H]`` and shared with the embedding when
``weight_share``), ``lm_head.bias [V]``. Ours: ``model.`` instead of ``ernie.`` and PyTorch ``[out, in]``.
Paddle bf16 tensors become numpy ``uint16`` arrays; they are read back as ``torch.bfloat16``.

A ``.pdparams`` file is a pickle of ``{name: numpy.ndarray}`` (plus ``StructuredToParameterName@@`` and, for
tensors over 1 GiB with protocol < 4, ``UnpackBigParamInfor@@``; see Paddle ``python/paddle/framework/io.py``
``_unpack_saved_dict`` / ``_pack_loaded_dict``). Unpickling runs code named by the file, so
:class:`RestrictedUnpickler` only resolves the globals needed to rebuild numpy arrays and refuses anything else.
"""

from __future__ import annotations

import os
import pickle

import numpy as np
import torch

from ..model_utils import WEIGHTS_INDEX_NAME, WEIGHTS_NAME, weight_files

__all__ = ["RestrictedUnpickler", "UnsafePickleError", "load_pdparams", "paddle_to_ours", "ours_to_paddle",
           "save_paddle_checkpoint", "load_checkpoint_state_dict", "PDPARAMS_NAME"]

PDPARAMS_NAME = "model_state.pdparams"
SAFE_NAME = WEIGHTS_NAME
SAFE_INDEX_NAME = WEIGHTS_INDEX_NAME
_STRUCT_KEY = "StructuredToParameterName@@"
_UNPACK_KEY = "UnpackBigParamInfor@@"

# Exactly what numpy arrays (protocols 2-5) and OrderedDict need. Nothing here can run arbitrary code.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("_codecs", "encode"),  # protocol-2 pickles store array bytes as latin-1 str
    ("collections", "OrderedDict"),
}


class UnsafePickleError(pickle.UnpicklingError):
    """A pickle asked for a global outside the numpy/container allow-list (or a persistent id)."""


class RestrictedUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that builds only numpy arrays, numpy scalars/dtypes and plain containers.

    Raises:
        UnsafePickleError: on any other global (e.g. ``os.system``, ``builtins.eval``) or a persistent id; the
            message names the file and the refused global.
    """

    def __init__(self, file, source: str = "<pickle>"):
        super().__init__(file)
        self.source = source

    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise UnsafePickleError(
            f"{self.source}: refusing to unpickle global '{module}.{name}'. A PaddleNLP .pdparams file may only "
            f"hold numpy arrays in plain dicts/lists; this file would build other objects (possibly run code). "
            f"If it is trusted, convert it with Paddle to safetensors first.")

    def persistent_load(self, pid):
        raise UnsafePickleError(f"{self.source}: refusing persistent id {pid!r} (not a PaddleNLP .pdparams file)")


def load_pdparams(path: str) -> dict[str, np.ndarray]:
    """Read a ``.pdparams`` state dict with :class:`RestrictedUnpickler`: ``{name: ndarray}``.

    Raises:
        UnsafePickleError: the pickle references anything but numpy/container globals.
        ValueError: the top-level object is not a dict, or a value is not a numeric ndarray (key named).
    """
    with open(path, "rb") as f:
        obj = RestrictedUnpickler(f, source=path).load()
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a dict of parameters, got {type(obj).__name__}")
    obj = dict(obj)
    obj.pop(_STRUCT_KEY, None)
    unpack = obj.pop(_UNPACK_KEY, None) or {}
    for key, info in unpack.items():  # Paddle _pack_loaded_dict: re-join slices of tensors > 1 GiB
        parts = [obj.pop(p) for p in info["slices"]]
        obj[key] = np.concatenate(parts).reshape(info["OriginShape"])
    for k, v in obj.items():
        if not isinstance(v, np.ndarray) or v.dtype == object:
            raise ValueError(f"{path}: entry {k!r} is {type(v).__name__}"
                             f"{'' if not isinstance(v, np.ndarray) else ' of dtype object'}, expected a numeric array")
    return obj


def _to_torch(a: np.ndarray) -> torch.Tensor:
    if a.dtype == np.uint16:  # Paddle's numpy form of bfloat16
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16).clone()
    return torch.from_numpy(np.ascontiguousarray(a)).clone()


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16).copy()
    return t.numpy().copy()


def _is_paddle_layout(keys) -> bool:
    return not any(k.startswith("model.") for k in keys)


def paddle_to_ours(sd: dict[str, np.ndarray], config) -> dict[str, torch.Tensor]:
    """PaddleNLP names/layout -> ours: ``ernie.`` -> ``model.`` (bare base-model names get ``model.`` too), every
    2-D Linear weight and the untied ``lm_head.weight`` transposed ``[in, out] -> [out, in]``; a tied
    (``weight_share``) ``lm_head.weight`` is dropped (it is the embedding)."""
    out = {}
    for k, a in sd.items():
        if k == "lm_head.weight" and config.weight_share:
            continue
        name = k[len("ernie."):] if k.startswith("ernie.") else k
        name = name if name.startswith("lm_head.") else "model." + name
        t = _to_torch(a)
        if t.dim() == 2 and not name.endswith("embed_tokens.weight"):
            t = t.t().contiguous()
        out[name] = t
    return out


def ours_to_paddle(sd: dict[str, torch.Tensor], config) -> dict[str, np.ndarray]:
    """Inverse of :func:`paddle_to_ours` (a tied LM head is written as the ``[V, H]`` embedding, as Paddle does)."""
    out = {}
    for k, t in sd.items():
        name = "ernie." + k[len("model."):] if k.startswith("model.") else k
        if t.dim() == 2 and not k.endswith("embed_tokens.weight") and not (k == "lm_head.weight" and config.weight_share):
            t = t.t()
        out[name] = _to_numpy(t)
    return out


def save_paddle_checkpoint(model, save_directory: str, fmt: str = "pdparams") -> None:
    """Write ``model`` as a PaddleNLP checkpoint: ``config.json`` + ``model_state.pdparams`` (pickle protocol 4 of
    ``{name: ndarray}`` plus ``StructuredToParameterName@@``, as ``paddle.save`` writes) or Paddle-layout
    ``model.safetensors`` (``fmt="safetensors"``).

    Raises:
        ValueError: ``fmt`` not in {"pdparams", "safetensors"}.
    """
    if fmt not in ("pdparams", "safetensors"):
        raise ValueError(f"save_paddle_checkpoint: fmt must be 'pdparams' or 'safetensors', got {fmt!r}")
    os.makedirs(save_directory, exist_ok=True)
    model.config.save_pretrained(save_directory)
    sd = ours_to_paddle(model.state_dict(), model.config)
    if fmt == "safetensors":
        from safetensors.numpy import save_file

        save_file(sd, os.path.join(save_directory, SAFE_NAME), metadata={"format": "np"})
        return
    payload = dict(sd)
    payload[_STRUCT_KEY] = {k: k for k in sd}
    with open(os.path.join(save_directory, PDPARAMS_NAME), "wb") as f:
        pickle.dump(payload, f, protocol=4)


def _load_safetensors_dir(directory: str) -> dict[str, np.ndarray] | dict[str, torch.Tensor]:
    """Every tensor of a (single or sharded) safetensors directory: numpy arrays when the checkpoint has Paddle's
    layout (Paddle writes numpy-format files, bf16 as uint16), torch tensors for ours. The layout is decided from
    the keys of all shards together: one shard of ours may hold only ``lm_head.*``."""
    from safetensors import safe_open

    files = weight_files(directory)
    keys = {}
    for fpath in files:
        with safe_open(fpath, framework="np") as f:
            keys[fpath] = list(f.keys())
    framework = "np" if _is_paddle_layout([k for ks in keys.values() for k in ks]) else "pt"
    tensors = {}
    for fpath in files:
        with safe_open(fpath, framework=framework) as f:
            tensors.update({k: f.get_tensor(k) for k in keys[fpath]})
    return tensors


def load_checkpoint_state_dict(directory: str, config) -> dict[str, torch.Tensor]:
    """Our state dict from a checkpoint directory: ours (``model.safetensors`` [+ index]), PaddleNLP
    safetensors (keys ``ernie.*``/``lm_head.*``, ``[in, out]``) or ``model_state.pdparams``.

    Raises:
        FileNotFoundError: no weights file (message lists what was looked for); TP-sharded Paddle files only.
    """
    has_safe = os.path.isfile(os.path.join(directory, SAFE_NAME)) or os.path.isfile(
        os.path.join(directory, SAFE_INDEX_NAME))
    if has_safe:
        tensors = _load_safetensors_dir(directory)
        if _is_paddle_layout(tensors.keys()):
            return paddle_to_ours(tensors, config)
        return tensors
    pd = os.path.join(directory, PDPARAMS_NAME)
    if os.path.isfile(pd):
        return paddle_to_ours(load_pdparams(pd), config)
    shards = [f for f in os.listdir(directory) if f.endswith(".pdparams")] if os.path.isdir(directory) else []
    hint = (f" Found {shards}: tensor-parallel shards must be merged first (PaddleNLP "
            f"save_pretrained(merge_tensor_parallel=True))." if shards else "")
    raise FileNotFoundError(f"{directory}: no {SAFE_NAME}, {SAFE_INDEX_NAME} or {PDPARAMS_NAME}.{hint}")
