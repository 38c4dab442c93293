"""Parameter-efficient fine-tuning: LoRA (PaddleNLP ``paddlenlp.peft`` behaviour, PEFT file format)."""

from .lora import (
    DEFAULT_TARGET_MODULES,
    LoRAConfig,
    LoRALinear,
    apply_lora,
    cast_frozen_base,
    disable_lora,
    load_lora,
    lora_param_groups,
    lora_state_dict,
    mark_only_lora_as_trainable,
    merge_lora,
    save_lora,
)
from .merge import adapter_base_model, load_merged_lora

__all__ = [
    "DEFAULT_TARGET_MODULES",
    "LoRAConfig",
    "LoRALinear",
    "adapter_base_model",
    "apply_lora",
    "cast_frozen_base",
    "disable_lora",
    "load_lora",
    "load_merged_lora",
    "lora_param_groups",
    "lora_state_dict",
    "mark_only_lora_as_trainable",
    "merge_lora",
    "save_lora",
]
