"""trainer: arguments and config parser (PaddleNLP names), the training loop, checkpoints, schedules.

Public names (imported lazily, so a partial checkout still imports):

- ``Trainer``, ``TrainerState`` (``trainer.py``): the loop; DPO/RM override ``compute_loss``/``count_loss_units``.
- ``save_checkpoint``, ``load_checkpoint``, ``list_checkpoints``, ``checkpoint_step`` (``checkpoint.py``).
- ``MasterWeights``, ``precision_mode`` (``mixed_precision.py``): AMP O2 (bf16 compute weights, fp32 masters).
- ``build_optimizer``, ``build_lr_scheduler`` (``optimization.py``); ``sft_loss`` (``loss.py``);
  ``set_seed`` (``trainer_utils.py``).
- ``PdArgumentParser`` (``argparser.py``); ``TrainingArguments``, ``SFTConfig``, ``ModelArgument``,
  ``DataArgument``, ``parse_sft_args``, ``finalize_sft_args`` (``arguments.py``).
"""

import importlib

_EXPORTS = {
    "Trainer": "trainer", "TrainerState": "trainer",
    "save_checkpoint": "checkpoint", "load_checkpoint": "checkpoint", "list_checkpoints": "checkpoint",
    "checkpoint_step": "checkpoint",
    "build_optimizer": "optimization", "build_lr_scheduler": "optimization",
    "sft_loss": "loss", "set_seed": "trainer_utils",
    "MasterWeights": "mixed_precision", "precision_mode": "mixed_precision",
    "PdArgumentParser": "argparser",
    "TrainingArguments": "arguments", "SFTConfig": "arguments", "ModelArgument": "arguments",
    "DataArgument": "arguments", "parse_sft_args": "arguments", "finalize_sft_args": "arguments",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
