"""Reward model on any ``transformers`` family: its ``*ForSequenceClassification`` (trunk ``model`` + scalar
``score`` head, ``num_labels = 1``) trained on share-question packs through the FlashMask attention backend.

Same interface as :class:`~paddlenlp_ext.trl.reward_model.LlamaForScore` (``forward -> hidden``, ``score_at``,
``pair_scores``, ``save_pretrained``), so :class:`~paddlenlp_ext.trl.rm_trainer.RewardTrainer` runs it unchanged;
the saved directory loads in ``transformers.AutoModelForSequenceClassification`` (the score is read at each
response's end token here and at the last non-pad token there: equal for a text that ends at that token).
"""

from __future__ import annotations

import copy
import os

import torch
from torch import nn

from paddlenlp_ext.ops import without_fused_keys
from paddlenlp_ext.transformers.hf_attention import FLASHMASK, STARTEND_KEY, register_flashmask_attention
from paddlenlp_ext.transformers.hf_causal_lm import (check_hf_config, enable_activation_checkpointing,
                                                     mirror_setattr)
from paddlenlp_ext.transformers.model_utils import atomic_save_dir, to_torch_dtype

from .reward_model import LlamaForScore, export_pad_token_id


class HFForScore(LlamaForScore):
    """A ``transformers`` ``*ForSequenceClassification`` (children ``model`` and ``score`` shared, names kept)."""

    is_hf_model = True

    def __init__(self, hf_model: nn.Module):
        nn.Module.__init__(self)
        for name, child in hf_model.named_children():
            self.add_module(name, child)
        object.__setattr__(self, "hf", hf_model)
        self.config = hf_model.config

    def __setattr__(self, name, value):
        mirror_setattr(self, name, value)

    def forward(self, input_ids, position_ids=None, attn_mask_startend_row_indices=None) -> torch.Tensor:
        """Final hidden states ``[B, L, H]`` of the trunk (after its final norm)."""
        kwargs = {} if attn_mask_startend_row_indices is None else {STARTEND_KEY: attn_mask_startend_row_indices}
        return self.model(input_ids=input_ids, position_ids=position_ids, use_cache=False, **kwargs)[0]

    @classmethod
    def from_pretrained(cls, model_dir: str, dtype=torch.float32, *, recompute: bool = False,
                        trust_remote_code: bool = False) -> "HFForScore":
        """The trunk of a causal-LM or reward-model directory; ``score`` loaded when present, else ``transformers``'
        initialisation.

        Raises:
            ValueError: the family has no ``*ForSequenceClassification`` in ``transformers``, or
                :func:`~paddlenlp_ext.transformers.hf_causal_lm.check_hf_config` refuses it.
        """
        import transformers

        register_flashmask_attention()
        where = os.path.join(model_dir, "config.json")
        config = transformers.AutoConfig.from_pretrained(model_dir, local_files_only=True,
                                                         trust_remote_code=trust_remote_code)
        check_hf_config(config, where)
        config.num_labels = 1
        try:
            hf = transformers.AutoModelForSequenceClassification.from_pretrained(
                model_dir, config=config, dtype=to_torch_dtype(dtype), attn_implementation=FLASHMASK,
                local_files_only=True, trust_remote_code=trust_remote_code)
        except ValueError as e:
            if "Unrecognized configuration class" in str(e):
                raise ValueError(f"{where}: model_type {config.model_type!r} has no ForSequenceClassification class "
                                 f"in transformers {transformers.__version__}, so its reward model could not be "
                                 "exported; train a reward model on another family") from None
            raise
        if recompute:
            enable_activation_checkpointing(hf)
        model = cls(hf)
        if not isinstance(getattr(model, "score", None), nn.Linear) or model.score.out_features != 1:
            raise ValueError(f"{type(hf).__name__}: expected a `score` linear head with one output")
        return model.eval()

    def save_pretrained(self, save_dir: str, dtype=None, state_dict: dict | None = None, tokenizer=None) -> None:
        """The family's ``*ForSequenceClassification`` directory (``num_labels = 1``, ``problem_type``
        regression, the ``pad_token_id`` of :func:`export_pad_token_id`), atomically; ``state_dict`` replaces the
        model's own (a gathered one under FSDP)."""
        dtype = to_torch_dtype(dtype)
        sd = self.hf.state_dict() if state_dict is None else state_dict
        sd = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v) for k, v in sd.items()}
        self.config.problem_type = "regression"
        pad = export_pad_token_id(self.config.to_dict(), tokenizer)
        self.config.pad_token_id = pad
        if not hasattr(tokenizer, "save_pretrained"):
            tokenizer = None
        if tokenizer is not None and pad is not None and tokenizer.pad_token_id != pad:
            tokenizer = copy.deepcopy(tokenizer)
            tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad)
        with atomic_save_dir(save_dir) as tmp, without_fused_keys(self.hf.config):
            self.hf.save_pretrained(tmp, state_dict=sd)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)


def reward_model_class(model_name_or_path: str, model_implementation: str = "auto",
                       trust_remote_code: bool = False):
    """``HFForScore`` when the directory loads through ``transformers`` (see
    :func:`paddlenlp_ext.transformers.auto.uses_transformers`), else ``LlamaForScore``."""
    from paddlenlp_ext.transformers.auto import uses_transformers
    from paddlenlp_ext.transformers.ernie35 import is_preset
    from paddlenlp_ext.transformers.model_utils import read_config_dict

    if is_preset(model_name_or_path):
        return LlamaForScore
    where = os.path.join(model_name_or_path, "config.json")
    use_hf = uses_transformers(read_config_dict(model_name_or_path), where, model_implementation, trust_remote_code)
    return HFForScore if use_hf else LlamaForScore
