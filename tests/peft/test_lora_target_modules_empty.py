"""An explicit empty ``lora_target_modules`` is an error, not silently the default set.

Before: ``--lora_target_modules []`` (or ``""``) fell through ``or`` to every attention and MLP projection.
"""

from __future__ import annotations

import pytest

from paddlenlp_ext.peft.lora import DEFAULT_TARGET_MODULES, LoRAConfig


@pytest.mark.parametrize("empty", [[], ""])
def test_empty_target_modules_is_an_error(empty):
    with pytest.raises(ValueError, match=r"lora_target_modules\) is empty.*leave the key unset"):
        LoRAConfig.from_args({"lora_target_modules": empty})


def test_unset_target_modules_is_the_default():
    assert list(LoRAConfig.from_args({"lora_target_modules": None}).target_modules) == list(DEFAULT_TARGET_MODULES)
    assert list(LoRAConfig.from_args({}).target_modules) == list(DEFAULT_TARGET_MODULES)


def test_given_target_modules_are_kept():
    assert LoRAConfig.from_args({"lora_target_modules": ["q_proj", "v_proj"]}).target_modules == ["q_proj", "v_proj"]
