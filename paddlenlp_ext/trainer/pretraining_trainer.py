"""``PretrainingTrainer``: the trainer with PaddleNLP's pretraining evaluation (loss and perplexity on a fixed number
of validation batches).

PaddleNLP's ``PretrainingTrainer.evaluate`` keeps one iterator over the validation split, so each evaluation reads
the next ``eval_iters`` batches: successive numbers are measured on different samples and restart after a resume.
Here every evaluation reads the same first ``eval_iters`` global batches, so the curve (and "before" vs "after")
compares like with like; the validation split is still sized as PaddleNLP sizes it.
"""

from __future__ import annotations

import math

from torch.utils.data import Subset

from .trainer import Trainer


def eval_subset(dataset, batch_size: int, data_ranks: int, iters: int):
    """The first ``iters`` global batches of ``dataset`` (``batch_size`` x ``data_ranks`` samples each), or None."""
    if dataset is None:
        return None
    return Subset(dataset, range(min(len(dataset), batch_size * data_ranks * iters)))


def perplexity(loss: float) -> float:
    """``exp(loss)``, ``inf`` past float range, ``nan`` for a nan loss."""
    try:
        return math.exp(loss)
    except OverflowError:
        return float("inf")


class PretrainingTrainer(Trainer):
    """:class:`Trainer` whose evaluations also report ``eval_ppl = exp(eval_loss)`` (the token-mean loss over the
    evaluated batches and data ranks)."""

    def evaluate(self, eval_dataset=None, log: bool = True) -> dict[str, float]:
        result = super().evaluate(eval_dataset, log=False)
        result["eval_ppl"] = perplexity(result["eval_loss"])
        self.last_eval = (self.state.global_step, result)
        if log:
            import json
            import logging

            logging.getLogger("paddlenlp_ext.trainer").info("eval: %s", json.dumps(result))
        return result
