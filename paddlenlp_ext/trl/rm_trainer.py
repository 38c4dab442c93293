"""``RewardTrainer``: Bradley-Terry reward-model training on share-question packs.

Source: PaddleNLP ``llm/alignment/rm/reward_trainer.py`` and ``reward_model.py`` (``LlamaModelForScore``):
scores read at each response's last token, loss ``-mean(log sigmoid(s_c - s_r))``, metric ``accuracy``.
Here the loss is a pair mean over the whole optimizer step (all micro-batches and ranks), not per micro-batch.
"""

from __future__ import annotations

import torch

from paddlenlp_ext.trainer.trainer import Trainer
from paddlenlp_ext.trl.reward_model import bradley_terry_loss


class RewardTrainer(Trainer):
    """Trains a :class:`~paddlenlp_ext.trl.reward_model.LlamaForScore` on RM-layout preference packs.

    ``compute_loss`` returns ``(loss_sum, num_pairs, metric_sums)`` with metrics (pair means once reported)
    ``accuracy`` (``s_c > s_r``), ``chosen_score``, ``rejected_score``, ``margin``.
    """

    def count_loss_units(self, batch: dict) -> torch.Tensor:
        """Number of pairs in the micro-batch (rows of ``response_indexs``)."""
        return torch.tensor(batch["response_indexs"].shape[0])

    def compute_loss(self, model, batch: dict):
        """``(loss_sum, num_pairs, metric_sums)`` of one RM micro-batch."""
        s_c, s_r = model.pair_scores(batch)  # [N] each, float32
        loss = bradley_terry_loss(s_c, s_r)
        with torch.no_grad():
            metrics = {"accuracy": (s_c > s_r).float().sum(), "chosen_score": s_c.sum(),
                       "rejected_score": s_r.sum(), "margin": (s_c - s_r).sum()}
        return loss.sum(), s_c.shape[0], metrics

    def save_model(self, output_dir: str | None = None) -> str:
        """:meth:`LlamaForScore.save_pretrained` with the tokenizer, so the exported config is the
        ``*ForSequenceClassification`` one and its ``pad_token_id`` and the saved tokenizer's pad agree (see
        ``export_pad_token_id``). Distributed (collective): whole tensors are gathered from the FSDP / TP shards
        (``full_state_dict``) and global rank 0 writes the same directory one process would. An OS-level write
        failure (disk full) raises ``checkpoint.SaveError`` naming the directory and the fix."""
        from paddlenlp_ext.trainer.checkpoint import explain_write_errors

        output_dir = output_dir or self.args.output_dir
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            from paddlenlp_ext.distributed.checkpoint import full_state_dict

            sd = full_state_dict(self.model)  # every rank takes part; rank 0 gets the tensors
            if torch.distributed.get_rank() == 0:
                with explain_write_errors(output_dir, "the reward model"):
                    self.model.save_pretrained(output_dir, state_dict=sd, tokenizer=self.tokenizer)
            torch.distributed.barrier()
            return output_dir
        with explain_write_errors(output_dir, "the reward model"):  # model, config and tokenizer: one atomic dir
            self.model.save_pretrained(output_dir, tokenizer=self.tokenizer)
        return output_dir
