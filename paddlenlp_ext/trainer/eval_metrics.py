"""Evaluation metrics of SFT: token accuracy and perplexity from the loss pass; exact match, BLEU-4 and ROUGE-L of
generated answers.

- ``accuracy``: PaddleNLP's SFT ``compute_metrics`` (``llm/utils/utils.py``): the share of supervised tokens
  (label != -100) whose argmax prediction is the label, here counted over all dev tokens at once (no logits kept).
- ``perplexity``: ``exp(eval_loss)`` (token-mean cross entropy in nats).
- generation scores (``eval_with_do_generation``; PaddleNLP reports BLEU-4 and ROUGE there): ``exact_match``
  (whitespace-trimmed strings equal), ``bleu4`` (sacrebleu's corpus BLEU with its ``zh`` tokenizer, which splits
  CJK characters and tokenizes everything else as its default ``13a``; divided by 100), ``rouge_l`` (rouge-score's
  ROUGE-L F1 averaged over examples, on lower-cased words and single CJK characters). All three in ``[0, 1]``.
"""

from __future__ import annotations

import math
import re
from typing import Sequence

import torch
import torch.nn.functional as F

from .loss import IGNORE_INDEX, _labels_for, use_fused_loss

CHUNK_ROWS = 1024  # supervised rows per head matmul in the evaluation pass ([rows, vocab] fp32 at a time)


@torch.no_grad()
def sft_eval_loss(model, batch: dict[str, torch.Tensor]):
    """``(loss_sum, count, {"accuracy": correct})`` of a packed SFT batch, for evaluation (no gradient).

    The same summed cross entropy as ``loss.sft_loss``; ``correct`` counts supervised tokens whose argmax logit is
    the label (the trainer divides it by ``count``). With a plain ``lm_head`` (``loss.use_fused_loss``) the head
    runs on the supervised rows only, ``CHUNK_ROWS`` at a time, so the ``[tokens, vocab]`` logits never exist;
    otherwise (tensor-parallel head) through the model's logits.
    """
    kw = dict(position_ids=batch.get("position_ids"),
              attn_mask_startend_row_indices=batch.get("attn_mask_startend_row_indices"))
    if use_fused_loss(model):
        from torch.distributed.tensor import DTensor

        from paddlenlp_ext.distributed import hidden_states_and_head

        hidden, weight = hidden_states_and_head(model, batch["input_ids"], **kw)
        labels = _labels_for(model, batch["labels"], hidden.shape[:2], "hidden states").reshape(-1)
        bias = model.lm_head.bias
        if isinstance(bias, DTensor):
            bias = bias.full_tensor()
        rows = (labels != IGNORE_INDEX).nonzero().squeeze(1)
        hidden, labels = hidden.reshape(-1, hidden.shape[-1]).index_select(0, rows), labels.index_select(0, rows)
        loss_sum = torch.zeros((), device=hidden.device)
        correct = torch.zeros((), dtype=torch.int64, device=hidden.device)
        for i in range(0, labels.numel(), CHUNK_ROWS):
            logits = F.linear(hidden[i:i + CHUNK_ROWS], weight, bias).float()  # [rows, V]
            target = labels[i:i + CHUNK_ROWS]
            loss_sum = loss_sum + F.cross_entropy(logits, target, reduction="sum")
            correct += (logits.argmax(-1) == target).sum()
        return loss_sum, torch.as_tensor(labels.numel()), {"accuracy": correct}
    logits = model(input_ids=batch["input_ids"], **kw)
    if isinstance(logits, (tuple, list)):
        logits = logits[0]
    labels = _labels_for(model, batch["labels"], logits.shape[:2], "logits")
    loss_sum = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                               reduction="sum")
    if hasattr(logits, "full_tensor"):  # vocab-parallel DTensor logits: the argmax needs the whole vocab
        logits = logits.full_tensor()
    supervised = labels != IGNORE_INDEX
    correct = ((logits.argmax(-1) == labels) & supervised).sum()
    return loss_sum, supervised.sum(), {"accuracy": correct}


def perplexity(loss: float) -> float:
    """``exp(loss)``; ``inf`` past float range, ``nan`` for a ``nan`` loss."""
    try:
        return math.exp(loss)
    except OverflowError:
        return float("inf")


_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_WORDS = re.compile(rf"[{_CJK}]|[^\s{_CJK}\W]+|[^\s\w]", re.UNICODE)


class _Words:
    """rouge-score tokenizer: lower-cased words, each CJK character alone, punctuation marks dropped (its own
    default drops every non-ASCII character, so Chinese answers would score 0)."""

    def tokenize(self, text: str) -> list[str]:
        return [t for t in _WORDS.findall(text.lower()) if re.match(rf"[{_CJK}]|\w", t)]


def generation_scores(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """``{"exact_match", "bleu4", "rouge_l"}`` of ``predictions`` against one reference each, all in ``[0, 1]``
    (see the module docstring). Raises ValueError when the lists differ in length or are empty."""
    if len(predictions) != len(references) or not predictions:
        raise ValueError(f"generation_scores needs as many predictions as references (> 0), got {len(predictions)} "
                         f"and {len(references)}")
    import sacrebleu
    from rouge_score import rouge_scorer

    exact = sum(p.strip() == r.strip() for p, r in zip(predictions, references)) / len(predictions)
    bleu = sacrebleu.corpus_bleu(list(predictions), [list(references)], tokenize="zh").score / 100.0
    scorer = rouge_scorer.RougeScorer(["rougeL"], tokenizer=_Words())
    rouge = sum(scorer.score(r, p)["rougeL"].fmeasure for p, r in zip(predictions, references)) / len(predictions)
    return {"exact_match": exact, "bleu4": bleu, "rouge_l": rouge}
