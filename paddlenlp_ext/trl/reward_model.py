"""Outcome reward model: a decoder trunk plus a scalar ``score`` head, saved as HF ``LlamaForSequenceClassification``.

Source: PaddleNLP ``llm/alignment/rm/reward_model.py`` (``LlamaModelForScore``: ``LlamaModel`` +
``score_head = Linear(hidden, 1, bias=False)``, score read at each response's last token, loss
``-log sigmoid(s_c - s_r)``). Ours names the head ``score`` (Hugging Face ``LlamaForSequenceClassification``'s
name, ``num_labels = 1``), so ``transformers.AutoModelForSequenceClassification.from_pretrained(dir)`` loads a
saved reward model. HF reads the score at each row's last non-pad token, ours at the response's end token: the two
agree for a text that ends at that token (``<|im_end|>``, without the chat template's trailing newline); the
exported ``pad_token_id`` is never an eos id, so padded batches score the same (:func:`export_pad_token_id`).
"""

from __future__ import annotations

import copy
import math
import os

import torch
import torch.nn.functional as F
from torch import nn

from paddlenlp_ext.transformers.model_utils import (
    CONFIG_NAME,
    atomic_save_dir,
    load_state_dict,
    read_config_dict,
    save_state_dict,
    to_torch_dtype,
    write_json,
)


def _trunk_classes(model_type: str):
    if model_type == "llama":
        from paddlenlp_ext.transformers.llama import LlamaConfig, LlamaModel

        return LlamaConfig, LlamaModel
    if model_type == "ernie":
        from paddlenlp_ext.transformers.ernie35 import Ernie35Config, Ernie35Model

        return Ernie35Config, Ernie35Model
    raise ValueError(f"reward model: config.json model_type {model_type!r} is not supported ('llama', 'ernie')")


class LlamaForScore(nn.Module):
    """Trunk (``model``: ``LlamaModel`` or ``Ernie35Model``) + ``score = nn.Linear(hidden, 1, bias=False)``.

    ``forward(input_ids, position_ids, attn_mask_startend_row_indices) -> hidden [B, L, H]`` (the trunk);
    ``score_at(hidden, rows, cols) -> float32 [N]`` reads the scalar score at given positions.
    """

    def __init__(self, config):
        super().__init__()
        self.config = config
        _, trunk = _trunk_classes(config.model_type)
        self.model = trunk(config)
        self.score = nn.Linear(config.hidden_size, 1, bias=False)

    def forward(self, input_ids, position_ids=None, attn_mask_startend_row_indices=None) -> torch.Tensor:
        return self.model(input_ids, position_ids, attn_mask_startend_row_indices)

    def training_seq_len(self, seq_len: int) -> int:
        """Tokens a training step keeps of a ``seq_len``-long pack: the ERNIE-3.5-SE progressive warm-up
        (``use_progressive_seq_len``; the trainer cuts the batch with it), else ``seq_len``."""
        from paddlenlp_ext.transformers.ernie35.positions import training_seq_len

        return training_seq_len(self.config, self.training, getattr(self.model, "global_step", None), seq_len)

    def score_at(self, hidden: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """Scores ``float32 [N]`` at ``hidden[rows[i], cols[i]]`` (int64 ``[N]`` each)."""
        return self.score(hidden[rows, cols]).squeeze(-1).float()

    def pair_scores(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Chosen and rejected scores ``float32 [N]`` of a preference pack (RM layout, design.md keys).

        Each response's score is read at its last token: ``rejected_start - 1`` and ``end - 1``. In training with
        progressive sequence length the pack is first cut (``paddlenlp_ext.trainer.progressive.cut_batch``: only
        the pairs that end within the cut are scored; a no-op on a batch the trainer cut already).
        """
        from paddlenlp_ext.trainer.progressive import cut_batch

        ri = batch["response_indexs"]
        if ri.dim() != 2 or ri.shape[1] != 4:
            raise ValueError(f"response_indexs must be int64 [N_pairs, 4], got shape {tuple(ri.shape)}")
        batch = cut_batch(batch, self.training_seq_len(batch["input_ids"].shape[1]))
        ri = batch["response_indexs"]
        hidden = self(batch["input_ids"], batch.get("position_ids"), batch.get("attn_mask_startend_row_indices"))
        return self.score_at(hidden, ri[:, 0], ri[:, 2] - 1), self.score_at(hidden, ri[:, 0], ri[:, 3] - 1)

    @classmethod
    def from_pretrained(cls, model_dir: str, dtype=torch.float32, **config_overrides) -> "LlamaForScore":
        """Load the trunk from a causal-LM or reward-model HF directory (``lm_head`` ignored), or build a random one
        from an ERNIE-3.5-SE preset name (``ernie/tiny-random-ernie``: no such weights exist).

        ``score.weight`` is loaded when present, else initialised ``N(0, initializer_range)`` (HF's init).

        Raises:
            ValueError: trunk weights missing or mismatched (names listed).
        """
        dtype = to_torch_dtype(dtype)
        from paddlenlp_ext.transformers.ernie35 import from_preset_or_pretrained, is_preset

        if is_preset(model_dir):  # ERNIE-3.5-SE preset name: a random trunk, as the SFT and DPO launchers take it
            lm = from_preset_or_pretrained(model_dir, dtype=dtype, **config_overrides)
            config, sd = lm.config, {k: v for k, v in lm.state_dict().items() if k.startswith("model.")}
        else:
            cfg_dict = read_config_dict(model_dir)
            config_cls, _ = _trunk_classes(cfg_dict.get("model_type"))
            cfg_dict = {k: v for k, v in cfg_dict.items() if k not in ("num_labels", "id2label", "label2id")}
            cfg_dict.update(config_overrides)
            config = config_cls.from_dict(cfg_dict)
            sd = load_state_dict(model_dir, dtype)
        with torch.device("meta"):
            model = cls(config)
        want = model.state_dict()
        trunk = {k: v for k, v in sd.items() if k.startswith("model.") and not k.endswith(".rotary_emb.inv_freq")}
        missing = sorted(k for k in want if k.startswith("model.") and k not in trunk)
        unexpected = sorted(set(trunk) - set(want))
        if missing or unexpected:
            raise ValueError(f"{model_dir}: trunk weights do not match the config: missing {missing[:8]}, "
                             f"unexpected {unexpected[:8]}")
        score = sd.get("score.weight")
        if score is None:
            score = torch.empty(1, config.hidden_size, dtype=dtype or torch.float32).normal_(
                0.0, getattr(config, "initializer_range", 1 / math.sqrt(config.hidden_size)))
        model.load_state_dict({**trunk, "score.weight": score}, strict=True, assign=True)
        return model.eval()

    def save_pretrained(self, save_dir: str, dtype=None, state_dict: dict | None = None, tokenizer=None) -> None:
        """Write a Hugging Face ``LlamaForSequenceClassification`` directory (``num_labels = 1``), atomically.

        Weights: the trunk's ``model.*`` and ``score.weight`` (``[1, hidden]``); no ``lm_head``. ``state_dict``
        replaces ``self.state_dict()`` (a gathered full state dict under FSDP). ``config.json`` gets the
        ``pad_token_id`` chosen by :func:`export_pad_token_id` (never an end-of-sequence id, since the score is
        read at the response's end token and HF scores the last non-pad token). With ``tokenizer`` (a HF
        tokenizer) it is saved too, its pad token set to that id, so ``tokenizer(texts, padding=True)`` pads
        with the token HF skips.
        """
        dtype = to_torch_dtype(dtype)
        sd = self.state_dict() if state_dict is None else state_dict
        sd = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v) for k, v in sd.items()}
        cfg = self.config.to_dict()
        arch = "LlamaForSequenceClassification" if self.config.model_type == "llama" else "Ernie35ForSequenceClassification"
        cfg.update({"architectures": [arch], "num_labels": 1, "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0},
                    "problem_type": "regression"})
        first = next(v for v in sd.values() if v.is_floating_point())
        cfg["torch_dtype"] = str(first.dtype).replace("torch.", "")
        cfg["pad_token_id"] = export_pad_token_id(cfg, tokenizer)
        if not hasattr(tokenizer, "save_pretrained"):  # None, or a stub without files to write
            tokenizer = None
        if tokenizer is not None and cfg["pad_token_id"] is not None and tokenizer.pad_token_id != cfg["pad_token_id"]:
            tokenizer = copy.deepcopy(tokenizer)  # the caller's tokenizer (used in training) keeps its pad
            tokenizer.pad_token = tokenizer.convert_ids_to_tokens(cfg["pad_token_id"])
        with atomic_save_dir(save_dir) as tmp:
            save_state_dict(sd, tmp)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
            write_json(os.path.join(tmp, CONFIG_NAME), cfg)


def export_pad_token_id(config: dict, tokenizer=None) -> int | None:
    """The ``pad_token_id`` written into an exported reward model's ``config.json``.

    HF ``*ForSequenceClassification`` scores each row at its last token that is not ``pad_token_id`` (and refuses
    batches larger than 1 without one); ours is read at the response's end token (eos, ``<|im_end|>`` under
    ChatML). So the pad must exist and must not be an end-of-sequence id: the first of the base config's
    ``pad_token_id``, the tokenizer's pad id, its unk id, ``bos_token_id`` that is not an eos id (config's or
    tokenizer's); None if none qualifies (HF then scores only one unpadded sequence at a time). SmolLM2 (pad =
    eos = ``<|im_end|>``) gets its unk ``<|endoftext|>``.

    Args:
        config: the model's config dict (``pad_token_id``, ``eos_token_id`` int or list, ``bos_token_id``).
        tokenizer: optional HF tokenizer (``pad_token_id``, ``unk_token_id``, ``eos_token_id``).
    """
    eos = config.get("eos_token_id")
    eos_ids = set(eos) if isinstance(eos, (list, tuple)) else {eos}
    tok = (lambda k: getattr(tokenizer, k, None)) if tokenizer is not None else (lambda k: None)
    eos_ids.add(tok("eos_token_id"))
    for cand in (config.get("pad_token_id"), tok("pad_token_id"), tok("unk_token_id"), config.get("bos_token_id"),
                 tok("bos_token_id")):
        if isinstance(cand, int) and cand not in eos_ids:
            return cand
    return None


def bradley_terry_loss(chosen_scores: torch.Tensor, rejected_scores: torch.Tensor) -> torch.Tensor:
    """Per-pair loss ``-log sigmoid(s_c - s_r)``, float ``[N]`` (PaddleNLP ``LlamaModelForScore`` loss)."""
    return -F.logsigmoid(chosen_scores - rejected_scores)
