"""Gathered (unsharded) exports of a parallelized model: the final HF directory and whole LoRA adapters.

Training checkpoints (sharded, reshardable on load) are written by ``paddlenlp_ext.trainer.checkpoint`` with
``torch.distributed.checkpoint`` + ``get_state_dict``/``set_state_dict``; this module covers the other case:
one merged copy written by rank 0, like PaddleNLP's ``save_pretrained(merge_tensor_parallel=True)`` /
unified checkpoint (paddlenlp/trainer/unified_checkpoint/), which gathers TP shards into whole HF tensors.

Every function here is collective when torch.distributed is initialised: call it on all ranks.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def full_state_dict(model: nn.Module, trainable_only: bool = False) -> dict[str, torch.Tensor]:
    """Whole (unsharded) CPU tensors of ``model``, on rank 0; an empty dict on other ranks.

    Works for plain modules, FSDP2 shards and TP ``DTensor`` s alike (``get_model_state_dict`` with
    ``full_state_dict=True, cpu_offload=True`` all-gathers each tensor and keeps it only on rank 0).

    Args:
        model: any module, parallelized or not.
        trainable_only: drop parameters with ``requires_grad=False`` (LoRA: only the adapters remain).

    Returns:
        ``{HF name: tensor}`` with the model's own parameter names (FSDP/TP wrappers add no prefixes).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not (dist.is_available() and dist.is_initialized()):
        sd = model.state_dict()
        if trainable_only:
            trainable = {n for n, p in model.named_parameters() if p.requires_grad}
            sd = {k: v for k, v in sd.items() if k in trainable}
        return {k: v.detach().cpu() for k, v in sd.items()}
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only)
    sd = get_model_state_dict(model, options=opts)
    return sd if _rank() == 0 else {}


def save_full_model(model: nn.Module, save_dir: str, dtype: torch.dtype | str | None = None,
                    max_shard_bytes: int | None = None) -> None:
    """Write one Hugging Face directory (``config.json`` + safetensors, sharded with an index when large).

    All ranks take part in the gather; rank 0 writes through ``paddlenlp_ext.transformers.model_utils``
    (the same writer as ``save_pretrained``), dropping ``lm_head.weight`` when embeddings are tied.

    Args:
        model: a (possibly parallelized) model whose ``config`` has ``save_pretrained`` and
            ``tie_word_embeddings``.
        save_dir: output directory (written atomically).
        dtype: cast floating tensors on save (e.g. ``torch.bfloat16``); None keeps the parameter dtype.
        max_shard_bytes: shard size; None uses the model_utils default.
    """
    from paddlenlp_ext.transformers.model_utils import (DEFAULT_MAX_SHARD_BYTES, atomic_save_dir, dtype_name,
                                                        save_state_dict, to_torch_dtype)

    sd = full_state_dict(model)
    if _rank() == 0:
        config = model.config
        if getattr(config, "tie_word_embeddings", False):
            sd.pop("lm_head.weight", None)
        dtype = to_torch_dtype(dtype)
        if dtype is not None:
            sd = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in sd.items()}
        with atomic_save_dir(save_dir) as tmp:
            save_state_dict(sd, tmp, max_shard_bytes or DEFAULT_MAX_SHARD_BYTES)
            if hasattr(config, "save_pretrained"):
                first = next((v for v in sd.values() if v.is_floating_point()), None)
                if first is not None and hasattr(config, "torch_dtype"):
                    config = type(config).from_dict(config.to_dict())
                    config.torch_dtype = dtype_name(first.dtype)
                config.save_pretrained(tmp)
    _barrier()


def save_full_adapters(model: nn.Module, save_dir: str, save_fn: Any = None,
                       base_model_name_or_path: str | None = None) -> dict[str, torch.Tensor]:
    """Gather the trainable parameters (LoRA adapters) whole and write them from rank 0.

    Under FSDP each adapter matrix is sharded on dim 0, under TP ``lora_B`` of a column-parallel layer is
    split on ``out`` and ``lora_A`` of a row-parallel layer on ``in`` (PaddleNLP ``ColumnParallelLoRALinear``
    / ``RowParallelLoRALinear``); the gather undoes both, so the saved adapter is what a single process
    would save.

    Args:
        model: parallelized model whose trainable parameters are the adapters.
        save_dir: output directory.
        save_fn: ``save_fn(state_dict, save_dir)`` that writes the adapter; default: the PEFT format of
            ``paddlenlp_ext.peft.lora.save_lora`` (``adapter_model.safetensors`` with ``base_model.model.``
            keys + ``adapter_config.json``).
        base_model_name_or_path: written into ``adapter_config.json`` (default: the model config's
            ``_name_or_path`` / ``name_or_path`` when present), as ``save_lora`` does.

    Returns:
        The gathered ``{name: tensor}`` on rank 0 (empty elsewhere).
    """
    sd = full_state_dict(model, trainable_only=True)
    if _rank() == 0:
        (save_fn or _write_peft_adapter(model, base_model_name_or_path))(sd, save_dir)
    _barrier()
    return sd


def _write_peft_adapter(model: nn.Module, base: str | None = None):
    """A writer for the PEFT layout of ``paddlenlp_ext.peft.save_lora``, from gathered tensors."""
    from paddlenlp_ext.peft import save_lora

    def write(sd: dict[str, torch.Tensor], save_dir: str) -> None:
        save_lora(model, save_dir, base_model_name_or_path=base, state_dict=sd)

    return write
