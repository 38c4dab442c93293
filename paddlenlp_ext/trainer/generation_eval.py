"""``compute_metrics`` of ``run_finetune.py``: perplexity, and with ``eval_with_do_generation`` greedy answers to
the dev prompts scored by exact match, BLEU-4 and ROUGE-L (``eval_metrics.generation_scores``).

PaddleNLP (``llm/run_finetune.py`` with ``eval_with_do_generation``) evaluates every dev example by
``model.generate`` in its ``Trainer.prediction_step`` and scores BLEU-4 / ROUGE. Here the first
``eval_generation_max_examples`` dev records (file order) are answered, ``per_device_eval_batch_size`` prompts
at a time, left-padded with the KV cache (``transformers.batch_generation.generate_batch``), each prompt being the record's conversation up to its
last user turn through the chat template (as ``predict.py`` prompts), its newest ``src_length`` tokens kept; the
reference is the last ``tgt``. The answers go to ``<output_dir>/eval_predictions/step-<N>.jsonl`` beside
``checkpoint-<N>`` (``{"src", "tgt", "output"}`` lines, the ``predict.py --data_file`` format), written atomically
by rank 0. Under torch.distributed every rank decodes the same prompts (FSDP / TP forwards are collective; the
ranks hold the same weights, so their rows end at the same step) and rank 0's scores are broadcast, so every rank
picks the same best checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import torch

from .eval_metrics import generation_scores, perplexity

logger = logging.getLogger("paddlenlp_ext.trainer")

PREDICTIONS_DIR = "eval_predictions"


def dev_prompts(files: list[str], tokenizer, limit: int, src_length: int) -> list[dict[str, Any]]:
    """The first ``limit`` SFT records of ``files`` as ``{"src", "tgt", "prompt_ids", "reference"}``: the prompt is
    ``generation.encode_conversation`` of the turns before the last answer, cut to its newest ``src_length``
    tokens; the reference is the last ``tgt``."""
    from paddlenlp_ext.datasets.jsonl import iter_jsonl
    from paddlenlp_ext.transformers.generation import encode_conversation

    out = []
    for path in files:
        for record in iter_jsonl(path):
            if len(out) >= limit:
                return out
            messages = []
            for i, src in enumerate(record["src"]):
                messages.append({"role": "user", "content": src})
                if i < len(record["src"]) - 1:
                    messages.append({"role": "assistant", "content": record["tgt"][i]})
            ids = encode_conversation(tokenizer, messages)[-src_length:]
            out.append({"src": record["src"], "tgt": record["tgt"], "prompt_ids": ids,
                        "reference": record["tgt"][-1]})
    return out


class SFTMetrics:
    """``Trainer(compute_metrics=SFTMetrics(...))``: ``perplexity`` from ``eval_loss``, plus ``exact_match``,
    ``bleu4`` and ``rouge_l`` of generated answers when ``records`` (from :func:`dev_prompts`) are given.

    Args:
        records: dev prompts and references, or None / [] for no generation (the default evaluation stays one
            loss pass).
        tokenizer: decodes the answers; its ``eos_token_id`` ends them and ``pad_token_id`` pads.
        max_new_tokens: answer length cap (``eval_generation_max_new_tokens``).
        batch_size: prompts decoded together (``per_device_eval_batch_size``).
        output_dir: where ``eval_predictions/step-<N>.jsonl`` goes (None: not written).
    """

    def __init__(self, records, tokenizer, max_new_tokens: int, batch_size: int, output_dir: str | None):
        self.records, self.tokenizer = list(records or []), tokenizer
        self.max_new_tokens, self.batch_size, self.output_dir = int(max_new_tokens), max(int(batch_size), 1), output_dir

    def __call__(self, trainer, metrics: dict[str, float]) -> dict[str, float]:
        out = {"perplexity": perplexity(metrics["eval_loss"])} if "eval_loss" in metrics else {}
        if self.records:
            out.update(self.generate_and_score(trainer))
        return out

    def generate_and_score(self, trainer) -> dict[str, float]:
        from paddlenlp_ext.transformers.batch_generation import generate_batch

        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        eos = self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else (eos or 0)
        outputs = []
        with trainer._autocast():
            for i in range(0, len(self.records), self.batch_size):
                chunk = self.records[i:i + self.batch_size]
                ids = generate_batch(trainer.model, [r["prompt_ids"] for r in chunk], self.max_new_tokens,
                                     eos_token_id=eos, pad_token_id=pad)
                outputs += [self.tokenizer.decode(x, skip_special_tokens=True).strip() for x in ids]
        scores = generation_scores(outputs, [r["reference"] for r in self.records])
        if distributed:  # one set of scores on every rank: the best checkpoint must be the same everywhere
            box = [scores]
            torch.distributed.broadcast_object_list(box, src=0)
            scores = box[0]
        if trainer.dp.is_main and self.output_dir:
            self._write(trainer.state.global_step, outputs)
        return scores

    def _write(self, step: int, outputs: list[str]) -> None:
        folder = os.path.join(self.output_dir, PREDICTIONS_DIR)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"step-{step}.jsonl")
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            for r, o in zip(self.records, outputs):
                f.write(json.dumps({"src": r["src"], "tgt": r["tgt"], "output": o}, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
        logger.info("eval predictions (%d) -> %s", len(outputs), path)
