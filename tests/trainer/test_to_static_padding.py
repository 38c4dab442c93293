"""``to_static`` with dynamic padding warns (``finalize_sft_args`` rule 8).

Measured before the rule (tiny Llama, ``zero_padding: false``, ``flash_mask: false``, 12 steps on the CPU): 16
recompiles, then ``torch._dynamo hit config.recompile_limit (8)`` and the layers ran eagerly, without a word from
the launcher. Fixed-length batches (packing or ``pad_to_max_length``) compile once.
"""

from __future__ import annotations

import logging

import pytest

from paddlenlp_ext.trainer.arguments import DataArgument, ModelArgument, SFTConfig, finalize_sft_args


def _args(tmp_path, **data):
    model = ModelArgument(model_name_or_path="m")
    training = SFTConfig(output_dir=str(tmp_path), to_static=True)
    return model, DataArgument(**data), training


@pytest.mark.parametrize("data, warned", [
    ({"zero_padding": False}, True),
    ({"zero_padding": False, "pad_to_max_length": True}, False),
    ({"zero_padding": True}, False),
])
def test_to_static_with_dynamic_padding_warns(tmp_path, caplog, data, warned):
    model, data_args, training = _args(tmp_path, **data)
    with caplog.at_level(logging.WARNING):
        msgs = finalize_sft_args(model, data_args, training)
    hit = [m for m in msgs if m.startswith("to_static=True with dynamic padding")]
    assert bool(hit) == warned, msgs
    if warned:
        assert "pad_to_max_length true" in hit[0] and hit[0] in caplog.text


def test_flash_mask_packs_so_no_warning(tmp_path):
    model, data_args, training = _args(tmp_path, zero_padding=False)
    model.flash_mask = True  # forces zero_padding (rule 1): fixed-length packs
    assert not [m for m in finalize_sft_args(model, data_args, training) if "to_static" in m]
