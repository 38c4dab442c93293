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

__all__ = [
    "DEFAULT_TARGET_MODULES",
    "LoRAConfig",
    "LoRALinear",
    "apply_lora",
    "cast_frozen_base",
    "disable_lora",
    "load_lora",
    "lora_param_groups",
    "lora_state_dict",
    "mark_only_lora_as_trainable",
    "merge_lora",
    "save_lora",
]
