"""``DPOTrainer``: the shared ``Trainer`` loop with a DPO-family ``compute_loss`` on share-question packs.

Source: PaddleNLP ``paddlenlp/trl/dpo_trainer.py`` (reference modes, ``ref_model_update_steps``, metric names)
and ``paddlenlp/transformers/dpo_criterion.py`` (loss). Differences: see ``dpo_criterion`` (log-prob spans and
length normalisers), plus the optional one-off precomputation of reference log-probs
(``precompute_reference_logps``), which PaddleNLP does not have.

Reference log-probs come from exactly one of (checked in this order):

1. the batch (``reference_chosen_logps`` / ``reference_rejected_logps``, float32 ``[N_pairs]``), when
   :meth:`DPOTrainer.precompute_reference_logps` stored them in the packs;
2. nothing, when ``reference_free`` (zeros);
3. ``ref_model``, a frozen copy of the initial policy;
4. the policy itself with its LoRA adapters disabled (``paddlenlp_ext.peft.disable_lora``), under ``no_grad``.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from paddlenlp_ext.trainer.trainer import Trainer
from paddlenlp_ext.trl.dpo_criterion import DPOCriterion, PairLogps
from paddlenlp_ext.trl.logprobs import pair_logps_from_hidden, pair_logps_from_logits

logger = logging.getLogger(__name__)

REF_KEYS = ("reference_chosen_logps", "reference_rejected_logps")


def policy_pair_logps(model: nn.Module, batch: dict, chunk_size: int = 1024) -> PairLogps:
    """Per-pair log-prob sums of ``model`` on a preference pack (design.md keys).

    When the model has a trunk ``model.model`` and a plain bias-free ``nn.Linear`` ``lm_head``, it takes the
    final hidden states ``[B, L, H]`` and the head weight (``hidden_states_and_head``: works under FSDP2 and TP)
    so only response tokens pass the LM head, in chunks; otherwise the full logits of ``model(...)``.
    """
    from paddlenlp_ext.trainer.progressive import cut_batch, progressive_length

    # a policy that trains on a shorter sequence (ERNIE progressive length) scores the pairs within it; a no-op on
    # the batches the trainer cut already
    batch = cut_batch(batch, progressive_length(model, batch["input_ids"].shape[1]))
    kwargs = dict(position_ids=batch.get("position_ids"),
                  attn_mask_startend_row_indices=batch.get("attn_mask_startend_row_indices"))
    trunk, head = getattr(model, "model", None), getattr(model, "lm_head", None)
    if isinstance(trunk, nn.Module) and type(head) is nn.Linear and head.bias is None:
        from paddlenlp_ext.distributed import hidden_states_and_head

        # the root forward (FSDP hooks fire) with lm_head skipped; a TP vocab-sharded head weight is gathered
        hidden, weight = hidden_states_and_head(model, batch["input_ids"], **kwargs)  # [B, L, H], [V, H]
        return pair_logps_from_hidden(hidden, weight, batch, chunk_size)
    logits = model(batch["input_ids"], **kwargs)
    logits = logits[0] if isinstance(logits, (tuple, list)) else logits
    if hasattr(logits, "full_tensor"):  # vocab-sharded DTensor (TP with tensor_parallel_output, e.g. a LoRA head)
        logits = logits.full_tensor()
    return pair_logps_from_logits(logits, batch, chunk_size)


def _token_counts(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-pair token counts ``[N]`` of chosen and rejected from the labels and ``response_indexs``."""
    ri = batch["response_indexs"]
    pos = torch.arange(batch["chosen_labels"].shape[1], device=ri.device)
    rows = ri[:, 0]
    in_c = (pos[None] >= ri[:, 1:2]) & (pos[None] < ri[:, 2:3])  # [N, L]
    in_r = (pos[None] >= ri[:, 2:3]) & (pos[None] < ri[:, 3:4])
    has_c = batch["chosen_labels"][rows] != -100  # [N, L]
    has_r = batch["rejected_labels"][rows] != -100
    return (in_c & has_c).sum(-1), (in_r & has_r).sum(-1)


class DPOTrainer(Trainer):
    """DPO-family training on preference packs.

    Args:
        model: the policy (``LlamaForCausalLM``-like; LoRA-wrapped when ``dpo_config.lora``).
        args: ``DPOTrainingArguments``.
        dpo_config: ``DPOConfig`` (loss_type, beta, label_smoothing, simpo_gamma, dpop_lambda, pref_loss_ratio,
            sft_loss_ratio, reference_free, ref_model_update_steps, lora, logprob_chunk_size).
        ref_model: frozen reference model, or None (reference-free, LoRA-disabled policy, or precomputed).
        other keyword arguments: as :class:`~paddlenlp_ext.trainer.trainer.Trainer`.

    ``compute_loss`` returns ``(loss_sum, num_pairs, metric_sums)``; reported metrics are pair means named as
    PaddleNLP: ``rewards/chosen``, ``rewards/rejected``, ``rewards/accuracies``, ``rewards/margins``,
    ``logps/chosen``, ``logps/rejected``, ``{loss_type}_loss``, ``sft_loss`` (``eval_`` prefix in evaluation).

    Raises:
        ValueError: no reference source for a loss that needs one.
    """

    def __init__(self, model, args, *, dpo_config, ref_model=None, **kwargs):
        super().__init__(model, args, **kwargs)
        c = dpo_config
        self.dpo_config = c
        self.criterion = DPOCriterion(loss_type=c.loss_type, beta=c.beta, label_smoothing=c.label_smoothing,
                                      simpo_gamma=c.simpo_gamma, dpop_lambda=c.dpop_lambda,
                                      pref_loss_ratio=c.pref_loss_ratio, sft_loss_ratio=c.sft_loss_ratio,
                                      reference_free=c.reference_free)
        self.chunk_size = int(getattr(c, "logprob_chunk_size", 1024))
        self.ref_model = ref_model
        if ref_model is not None:
            ref_model.to(self.device).eval().requires_grad_(False)
        self.use_lora_reference = bool(getattr(c, "lora", False)) and ref_model is None
        self.reference_precomputed = False
        if not (self.criterion.reference_free or ref_model is not None or self.use_lora_reference
                or getattr(c, "precompute_reference_logps", False)):
            raise ValueError(f"loss_type {c.loss_type!r} needs reference log-probs: pass ref_model, set lora=true "
                             "(adapters disabled = reference), precompute_reference_logps=true, or reference_free")

    # ---- reference ---------------------------------------------------------------------------------------------
    @torch.no_grad()
    def reference_pair_logps(self, batch: dict) -> PairLogps | None:
        """Reference ``PairLogps`` for ``batch`` (see the module docstring for the order of sources)."""
        if all(k in batch for k in REF_KEYS):
            nc, nr = _token_counts(batch)
            return PairLogps(batch[REF_KEYS[0]].float(), batch[REF_KEYS[1]].float(), nc, nr)
        if self.criterion.reference_free:
            return None
        if self.ref_model is not None:
            return policy_pair_logps(self.ref_model, batch, self.chunk_size)
        if self.use_lora_reference:
            from paddlenlp_ext.peft import disable_lora

            with disable_lora(self.model):
                return policy_pair_logps(self.model, batch, self.chunk_size)
        raise ValueError("the batch has no reference_chosen_logps/reference_rejected_logps: call "
                         "precompute_reference_logps(dataset) on every dataset before training/evaluation, and use "
                         "a collator that keeps them (paddlenlp_ext.datasets.preference.PreferenceCollator)")

    @torch.no_grad()
    def precompute_reference_logps(self, dataset) -> int:
        """Store reference log-probs in every pack of a map-style ``dataset`` (keys ``REF_KEYS``, one float per
        pair in ``response_indexs`` order), computed with the current model (adapters disabled under LoRA).

        Returns the number of pairs. Call before training. Raises ValueError for a dataset without ``__getitem__``.
        """
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise ValueError("precompute_reference_logps needs a map-style dataset of packs (lazy=false)")
        from tqdm.auto import tqdm

        was_training = self.model.training
        self.model.eval()
        n = 0
        quiet = bool(getattr(self.args, "disable_tqdm", False)) or not self.dp.is_main
        for i in tqdm(range(len(dataset)), desc="reference log-probs", unit="pack", disable=quiet):
            pack = dataset[i]
            batch = self._to_device(self.data_collator([pack]))
            with self._autocast():
                ref = (policy_pair_logps(self.ref_model, batch, self.chunk_size) if self.ref_model is not None
                       else self._lora_or_policy_logps(batch))
            pack[REF_KEYS[0]] = ref.chosen.float().cpu().tolist()
            pack[REF_KEYS[1]] = ref.rejected.float().cpu().tolist()
            n += len(pack[REF_KEYS[0]])
        self.model.train(was_training)
        self.reference_precomputed = True
        logger.info("precomputed reference log-probs of %d pairs", n)
        return n

    def _lora_or_policy_logps(self, batch):
        if self.use_lora_reference:
            from paddlenlp_ext.peft import disable_lora

            with disable_lora(self.model):
                return policy_pair_logps(self.model, batch, self.chunk_size)
        return policy_pair_logps(self.model, batch, self.chunk_size)

    # ---- trainer hooks -----------------------------------------------------------------------------------------
    def count_loss_units(self, batch: dict) -> torch.Tensor:
        """Number of pairs in the micro-batch (rows of ``response_indexs``)."""
        return torch.tensor(batch["response_indexs"].shape[0])

    def forward_backward(self, micro_batches):
        """As the Trainer's, with the SFT term's token mean taken over the whole step: the criterion gets
        ``sft_scale = pairs / chosen tokens`` of all micro-batches and data ranks (see ``DPOCriterion``)."""
        micro_batches = [self.cut_for_training(b) for b in micro_batches]  # progressive length: pairs kept
        pairs = sum(int(b["response_indexs"].shape[0]) for b in micro_batches)
        tokens = sum(int(_token_counts(b)[0].sum()) for b in micro_batches)
        both = self.dp.all_reduce_sum(torch.tensor([pairs, tokens], dtype=torch.int64, device=self.device))
        self.criterion.sft_scale = both[0].double() / both[1].clamp(min=1).double()
        try:
            return super().forward_backward(micro_batches)
        finally:
            self.criterion.sft_scale = None

    def compute_loss(self, model, batch: dict):
        """``(loss_sum, num_pairs, metric_sums)`` of one preference micro-batch."""
        reference = self.reference_pair_logps(batch)
        policy = policy_pair_logps(model, batch, self.chunk_size)
        loss_sum, metrics = self.criterion(policy, reference)
        return loss_sum, batch["response_indexs"].shape[0], metrics

    def _load_checkpoint(self, path) -> None:
        """Resume, then restore the reference of ``ref_model_update_steps``: training set it to the policy of the
        last step ``k * N <= global_step``; only the policy is checkpointed, so that policy is the checkpoint's when
        ``global_step % N == 0`` (else the nearest saved one is used, with a warning). Without this a resumed
        run compared against the initial model again."""
        super()._load_checkpoint(path)
        n = int(getattr(self.dpo_config, "ref_model_update_steps", -1))
        step = self.state.global_step
        if n > 0 and self.ref_model is not None and step >= n:
            if step % n:
                logger.warning("resumed at step %d, not a multiple of ref_model_update_steps=%d: the reference "
                               "should be the policy of step %d, which no checkpoint holds; using step %d's policy "
                               "instead (set save_steps to a multiple of ref_model_update_steps for an exact "
                               "resume)", step, n, step - step % n, step)
            self.ref_model.load_state_dict(self.model.state_dict())

    def training_step(self, micro_batches):
        out = super().training_step(micro_batches)
        n = int(getattr(self.dpo_config, "ref_model_update_steps", -1))
        if n > 0 and self.ref_model is not None and (self.state.global_step + 1) % n == 0:
            self.ref_model.load_state_dict(self.model.state_dict())  # PaddleNLP: set_state_dict every N steps
        return out
