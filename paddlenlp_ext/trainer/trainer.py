"""The training loop shared by SFT, DPO and RM: one explicit ``train()``.

Behaviour follows ``paddlenlp/trainer/trainer.py`` (``Trainer.train``/``evaluate``/``_save_checkpoint``) with
two deliberate differences:

- Loss reduction: the loss of an optimizer step is the token mean over all its micro-batches and all
  data-parallel ranks (``sum(loss_sum) / sum(count)``); PaddleNLP averages per-micro-batch means (spec section 6,
  trap 10). ``compute_loss`` returns sums; ``count_loss_units`` gives the denominator before any forward.
- Epoch boundaries: micro-batches stream across epochs, so an accumulation window can span two epochs
  (PaddleNLP/HF cut the last window of an epoch short). ``max_steps <= 0`` gives
  ``ceil(num_train_epochs * micro_batches_per_epoch / gradient_accumulation_steps)`` steps.

Subclass hooks (DPO / RM): ``compute_loss``, ``count_loss_units``, ``reduce_metrics``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset

from . import best_model
from . import checkpoint as ckpt
from .logging_utils import LogWindow, MetricsLogger
from .eval_metrics import sft_eval_loss
from .loss import count_label_tokens, count_real_tokens, sft_loss
from .mixed_precision import MasterWeights, precision_mode
from .optimization import build_lr_scheduler, build_optimizer
from .progressive import cut_batch, progressive_length
from .resume_config import (check_data_order, convert_data_position, data_order, hyperparameters, map_len,
                            reapply_hyperparameters)
from .trainer_utils import DataParallelView, ResumableSampler, ShardedIterable

logger = logging.getLogger("paddlenlp_ext.trainer")


@dataclass
class TrainerState:
    """Progress saved in ``trainer_state.json`` (PaddleNLP ``TrainerState`` subset)."""

    global_step: int = 0
    max_steps: int = 0
    epoch: int = 0  # data epoch being read
    micro_batches_in_epoch: int = 0  # micro-batches of that epoch already consumed on this rank
    log_history: list[dict[str, Any]] = field(default_factory=list)
    trainer: str = ""  # the Trainer class that wrote it (Trainer, DPOTrainer, RewardTrainer): checked on resume
    # the micro-batch shape that micro_batches_in_epoch counts in (0 = unknown, a checkpoint from before they were
    # saved): a resume with another per_device_train_batch_size or data-parallel size converts the count
    train_batch_size: int = 0  # per device
    data_parallel_size: int = 0
    train_packs: int = 0  # len(train_dataset) (map-style; 0 = unknown): a resume on other packs is warned
    # what decides the data order (resume_config.data_order: seed, dataloader_shuffle, the launcher's data keys);
    # {} = unknown (a checkpoint from before it was saved): a resume that changes one is warned
    data_order: dict[str, Any] = field(default_factory=dict)
    # load_best_model_at_end / metric_for_best_model (best_model.py; Hugging Face's names)
    best_metric: float | None = None
    best_model_checkpoint: str | None = None
    best_global_step: int | None = None


def _default_collator(items):
    if isinstance(items[0], dict) and all(isinstance(v, torch.Tensor) for v in items[0].values()):
        return {k: torch.stack([it[k] for it in items]) for k in items[0]}
    raise ValueError("no data_collator given and items are not dicts of equal-shape tensors; pass "
                     "data_collator (e.g. paddlenlp_ext.datasets.collate_packs)")


class Trainer:
    """Trains ``model`` on packed batches; see the module docstring for the loss contract.

    Args:
        model: ``nn.Module`` (already parallelised by ``paddlenlp_ext.distributed.parallelize_model`` when
            distributed). Parameters should be fp32: bf16 on CUDA runs through autocast (``fp16_opt_level``
            O1), plus bf16 compute weights with fp32 master weights and gradients (O2, ``mixed_precision.py``).
        args: ``TrainingArguments``-like object (PaddleNLP names: output_dir, per_device_train_batch_size,
            gradient_accumulation_steps, learning_rate, max_steps, num_train_epochs, logging_steps, ...).
        train_dataset / eval_dataset: map-style datasets of packs (``ZeroPaddingMapDataset``) or iterables
            (``ZeroPaddingIterableDataset``, needs ``max_steps > 0``).
        data_collator: ``list[item] -> dict[str, Tensor]`` packed batch (docs/design.md section 2).
        tokenizer: saved next to the final model by ``save_model``.
        parallel_dims: ``paddlenlp_ext.distributed.ParallelDims`` or None (one process).

    ``compute_metrics``: ``(trainer, eval_metrics) -> {name: float}``, called on every rank at the end of
    ``evaluate`` with its ``eval_*`` results; what it returns is added with the ``eval_`` prefix (SFT:
    ``generation_eval.SFTMetrics``: perplexity and generation scores).

    ``data_keys``: the data arguments that decide the train packs (``resume_config.data_keys(data_args)``, set by
    the launchers; ``{}`` by default), recorded in checkpoints with ``seed`` and ``dataloader_shuffle`` so that a
    resume that changes the data order is warned.
    """

    def __init__(self, model, args, train_dataset=None, eval_dataset=None, data_collator=None, tokenizer=None,
                 parallel_dims=None, compute_metrics=None):
        self.model, self.args, self.tokenizer = model, args, tokenizer
        self.compute_metrics = compute_metrics
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.data_collator = data_collator or _default_collator
        self.parallel_dims = parallel_dims
        self.dp = DataParallelView.from_parallel_dims(parallel_dims)
        self.device = self._pick_device()
        self.master_weights: MasterWeights | None = None  # built at the first forward_backward under O2
        self.precision, self.amp_dtype = self._pick_precision()
        self.state = TrainerState(trainer=type(self).__name__)
        self.optimizer = self.lr_scheduler = None
        self.last_eval: tuple[int, dict[str, float]] | None = None  # (global_step, metrics) of the latest evaluate()
        self.data_keys: dict[str, Any] = {}
        self._progressive_logged: int | None = None  # the last progressive cut length logged
        # Models that draw per-step randomness (ERNIE-3.5-SE random position ids) seed it with the data-parallel
        # replica index, so replicas differ while tensor-parallel ranks of one replica agree.
        for module in model.modules():
            if hasattr(module, "replica_rank"):
                module.replica_rank = self.dp.rank

    # ---- setup -------------------------------------------------------------------------------------------------
    def _pick_device(self) -> torch.device:
        param = next(self.model.parameters())
        if param.device.type != "cpu":
            return param.device
        if torch.cuda.is_available() and str(getattr(self.args, "device", "gpu")) != "cpu":
            self.model.to(torch.cuda.current_device())
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _pick_precision(self) -> tuple[str, torch.dtype | None]:
        """``(mode, autocast dtype)``: ``mixed_precision.precision_mode`` for these args and model, logged."""
        if bool(getattr(self.args, "fp16", False)) and self.device.type == "cuda":
            logger.warning("fp16 is not supported (no loss scaling here); computing in bf16 instead")
        mode, reason = precision_mode(self.args, self.device, self.model)
        if reason and mode != "fp32":
            logger.warning("%s", reason)
        lines = {"fp32": "fp32 on %s" + (f" ({reason})" if reason else ""),
                 "o1": "O1: bf16 autocast on %s, fp32 parameters, gradients and AdamW states",
                 "o2": "O2: bf16 compute weights with fp32 master weights, fp32 gradient accumulation and AdamW "
                       "states (MasterWeights), bf16 autocast on %s",
                 "o2_fsdp": "O2 under FSDP: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) with fp32 "
                            "sharded master weights, bf16 autocast on %s"}
        logger.info("precision: " + lines[mode], self.device)
        return mode, (None if mode == "fp32" else torch.bfloat16)

    def _compute_context(self):
        """Around a forward AND its backward: ``MasterWeights.compute()`` under O2, else nothing."""
        if self.precision != "o2":
            return contextlib.nullcontext()
        if self.master_weights is None:  # after parallelisation and any resume; the optimizer hook marks steps
            self.master_weights = MasterWeights(self.model, torch.bfloat16, self.optimizer)
        return self.master_weights.compute()

    def _autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def _loss_context(self):
        if self.parallel_dims is None:
            return contextlib.nullcontext()
        from paddlenlp_ext.distributed.parallelize import loss_parallel_context

        return loss_parallel_context(self.parallel_dims)

    def _loader(self, dataset, batch_size: int, *, shuffle: bool, epoch: int = 0, skip: int = 0,
                drop_last: bool | None = None, pad: bool = True) -> DataLoader:
        """DataLoader over this rank's slice; ``skip`` micro-batches of ``epoch`` already consumed.
        ``drop_last`` defaults to ``args.dataloader_drop_last`` (evaluation passes False); ``pad=False`` keeps a
        map-style dataset's rank slices unpadded (see ``ResumableSampler``)."""
        workers = int(getattr(self.args, "dataloader_num_workers", 0) or 0)
        if drop_last is None:
            drop_last = bool(getattr(self.args, "dataloader_drop_last", False))
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__"):
            if workers:
                logger.warning("dataloader_num_workers=%d ignored for an iterable dataset: the data-rank slicing "
                               "and the resume skip need one reader", workers)
                workers = 0
            shard = ShardedIterable(dataset, batch_size, self.dp.size, self.dp.rank, epoch, skip * batch_size)
            return DataLoader(shard, batch_size=batch_size, collate_fn=self.data_collator, num_workers=workers)
        sampler = ResumableSampler(len(dataset), self.dp.size, self.dp.rank, shuffle=shuffle,
                                   seed=int(self.args.seed), epoch=epoch, skip=skip * batch_size, drop_last=drop_last,
                                   pad=pad)
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=self.data_collator,
                          num_workers=workers, drop_last=drop_last)

    def micro_batches_per_epoch(self) -> int | None:
        """Micro-batches one epoch gives this rank, or None for an iterable dataset."""
        if isinstance(self.train_dataset, IterableDataset) or not hasattr(self.train_dataset, "__len__"):
            return None
        return len(self._loader(self.train_dataset, self.args.per_device_train_batch_size, shuffle=False))

    def compute_max_steps(self) -> int:
        """``max_steps`` if > 0, else from ``num_train_epochs``; ValueError when neither is usable."""
        if self.args.max_steps and self.args.max_steps > 0:
            return int(self.args.max_steps)
        per_epoch = self.micro_batches_per_epoch()
        if per_epoch is None:
            raise ValueError("max_steps must be > 0 with an iterable (lazy=true) train dataset: its length is "
                             "unknown; set --max_steps")
        steps = math.ceil(float(self.args.num_train_epochs) * per_epoch / self.args.gradient_accumulation_steps)
        if steps <= 0:
            raise ValueError(f"num_train_epochs={self.args.num_train_epochs} gives 0 optimizer steps; "
                             "set num_train_epochs > 0 or max_steps > 0")
        return steps

    def create_optimizer_and_scheduler(self, max_steps: int) -> None:
        """AdamW + LR schedule (``optimization.py``); call after parallelising the model."""
        if self.optimizer is None:
            low = sorted({str(p.dtype) for p in self.model.parameters()
                          if p.requires_grad and p.dtype != torch.float32})
            if low:
                logger.warning("trainable parameters in %s: AdamW states will be kept in that dtype too; load the "
                               "model in fp32 (bf16 is applied by autocast / FSDP mixed precision)", low)
            self.optimizer = build_optimizer(self.model, self.args)
        if self.lr_scheduler is None:
            self.lr_scheduler = build_lr_scheduler(self.optimizer, self.args, max_steps)

    # ---- subclass hooks ----------------------------------------------------------------------------------------
    def compute_loss(self, model, batch: dict[str, torch.Tensor]):
        """``(loss_sum, count, metrics)`` of one micro-batch: fp32 scalar sum, int scalar, dict of per-unit
        sums (reported divided by the total count). SFT: summed token cross entropy (``loss.sft_loss``); without
        gradients (evaluation) also the correctly predicted supervised tokens, reported as ``accuracy``
        (``eval_metrics.sft_eval_loss``)."""
        if not torch.is_grad_enabled():
            return sft_eval_loss(model, batch)
        return sft_loss(model, batch)

    def count_loss_units(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Denominator units in ``batch`` (int64 scalar, computed on the host batch before any forward):
        label tokens for SFT (of the batch as cut by :meth:`cut_for_training`). DPO/RM override this with the number
        of pairs."""
        return count_label_tokens(self.cut_for_training(batch))

    def cut_for_training(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``batch`` cut to the length the model trains on at this step (ERNIE-3.5-SE ``use_progressive_seq_len``:
        512/1024/2048 tokens before steps 500/1000/1500; ``progressive.cut_batch``), else ``batch`` itself.
        Applied to every micro-batch before counting and before the forward, so labels, positions, FlashMask
        vectors and response spans all match what the model sees."""
        length = progressive_length(self.model, batch["input_ids"].shape[1])
        if length >= batch["input_ids"].shape[1]:
            return batch
        if length != self._progressive_logged:
            self._progressive_logged = length
            logger.info("progressive sequence length (use_progressive_seq_len): training on the first %d tokens of "
                        "each pack from step %d (preference pairs that end past them are left out)", length,
                        self.state.global_step + 1)
        return cut_batch(batch, length)

    def reduce_metrics(self, loss_sum: float, count: float, metric_sums: dict[str, float]) -> dict[str, float]:
        """Turn globally summed quantities into reported metrics: ``loss = loss_sum / count`` and each
        metric divided by ``count``."""
        denom = max(count, 1.0)
        return {"loss": loss_sum / denom, **{k: v / denom for k, v in metric_sums.items()}}

    # ---- one optimizer step ------------------------------------------------------------------------------------
    def _to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: (v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v)
                for k, v in batch.items()}

    def forward_backward(self, micro_batches: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
        """Forward/backward every micro-batch with weight ``1 / total_count`` (gradients accumulate).

        ``total_count`` = ``count_loss_units`` summed over the micro-batches and all-reduced over data ranks, so
        the accumulated gradient is that of the global token mean. Returns device tensors (no host sync):
        local ``loss_sum``, global ``count``, local non-pad ``tokens`` and local metric sums.
        """
        micro_batches = [self.cut_for_training(b) for b in micro_batches]
        counts = torch.stack([torch.as_tensor(self.count_loss_units(b)) for b in micro_batches])
        total = self.dp.all_reduce_sum(counts.sum().to(self.device, torch.int64)).float()  # exact integer sum
        inv_total = 1.0 / total.clamp(min=1.0)
        loss_sum = torch.zeros((), device=self.device)
        tokens = torch.stack([torch.as_tensor(count_real_tokens(b)) for b in micro_batches]).sum()
        metric_sums: dict[str, torch.Tensor] = {}
        sync = getattr(self.model, "set_requires_gradient_sync", None)
        with self._compute_context():  # O2: bf16 weights in, fp32 accumulated gradients out
            for i, batch in enumerate(micro_batches):
                if sync is not None and len(micro_batches) > 1:
                    sync(i == len(micro_batches) - 1)  # FSDP: reduce gradients once, on the last micro-batch
                batch = self._to_device(batch)
                with self._loss_context():
                    with self._autocast():
                        mb_loss, _, metrics = self.compute_loss(self.model, batch)
                    mb_loss = _local(mb_loss)  # replicated DTensor under loss_parallel -> plain tensor
                    (mb_loss * inv_total).backward()
                loss_sum += mb_loss.detach().float()
                for k, v in metrics.items():
                    metric_sums[k] = metric_sums.get(k, 0.0) + torch.as_tensor(v).detach().float()
        return {"loss_sum": loss_sum, "count": total, "tokens": tokens, "metrics": metric_sums}

    def optimizer_step(self) -> torch.Tensor | None:
        """Clip to ``max_grad_norm`` (returns the pre-clip norm, or None when disabled), step, zero grads."""
        grad_norm = None
        if self.args.max_grad_norm and self.args.max_grad_norm > 0:
            params = [p for p in self.model.parameters() if p.grad is not None]
            grad_norm = torch.nn.utils.clip_grad_norm_(params, self.args.max_grad_norm)
        self.optimizer.step()
        if self.master_weights is not None:
            self.master_weights.mark_dirty()  # also done by its optimizer hook, unless the optimizer was swapped
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def training_step(self, micro_batches: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
        """One optimizer step over ``gradient_accumulation_steps`` micro-batches (device tensors, no sync)."""
        out = self.forward_backward(micro_batches)
        out["grad_norm"] = self.optimizer_step()
        return out

    # ---- data stream -------------------------------------------------------------------------------------------
    def _micro_batch_stream(self) -> Iterator[dict[str, torch.Tensor]]:
        """Endless micro-batches from ``state.epoch`` / ``state.micro_batches_in_epoch`` on, across epochs."""
        bs = self.args.per_device_train_batch_size
        shuffle = bool(getattr(self.args, "dataloader_shuffle", True))
        while True:
            loader = self._loader(self.train_dataset, bs, shuffle=shuffle, epoch=self.state.epoch,
                                  skip=self.state.micro_batches_in_epoch)
            for batch in loader:
                self.state.micro_batches_in_epoch += 1
                yield batch
            if self.state.micro_batches_in_epoch == 0:
                detail = ""
                if hasattr(self.train_dataset, "__len__"):
                    drop = " with dataloader_drop_last=true" if getattr(self.args, "dataloader_drop_last", False) else ""
                    detail = (f": {len(self.train_dataset)} pack(s) for {self.dp.size} rank(s) x "
                              f"per_device_train_batch_size={bs}{drop}")
                raise ValueError("the train dataset yields no batch (empty after packing, or fewer packs than "
                                 f"data-parallel ranks x batch size{detail}); lower per_device_train_batch_size, set "
                                 "dataloader_drop_last false, or add data")
            self.state.epoch += 1
            self.state.micro_batches_in_epoch = 0

    # ---- the loop ----------------------------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: Any = None, evaluate_first: bool = False) -> dict[str, Any]:
        """Run to ``max_steps``; returns ``{"global_step", "train_loss", "train_runtime", "tokens_per_sec",
        "eval_before"}``.

        ``resume_from_checkpoint``: a checkpoint path, or True for the latest in ``output_dir``; None falls
        back to ``args.resume_from_checkpoint``.
        ``evaluate_first``: with an ``eval_dataset`` and steps left to train, ``evaluate()`` once after any
        checkpoint has loaded and before the first step, so a resumed run measures the model it resumes (the
        launchers' "dev loss before"); ``result["eval_before"]`` holds those metrics, None when not run.
        (Ours: PaddleNLP's launchers have no "before" evaluation.)
        """
        args = self.args
        if self.train_dataset is None:
            raise ValueError("Trainer.train() needs train_dataset")
        best_model.check_can_track(self)
        max_steps = self.compute_max_steps()
        self.create_optimizer_and_scheduler(max_steps)
        resume = resume_from_checkpoint if resume_from_checkpoint is not None else getattr(
            args, "resume_from_checkpoint", None)
        resume_path = ckpt.resolve_resume_path(resume, args.output_dir)
        if resume_path is not None:
            self._load_checkpoint(resume_path)
        self.state.max_steps = max_steps  # this run's, also when the checkpoint was saved under another max_steps
        acc_steps = int(args.gradient_accumulation_steps)
        per_epoch = self.micro_batches_per_epoch()
        if self.state.global_step >= max_steps:
            logger.warning("the checkpoint %s is already at step %d of max_steps=%d: nothing to train (raise "
                           "max_steps, or start over with --overwrite_output_dir true)", resume_path,
                           self.state.global_step, max_steps)
        else:
            logger.info("training: steps %d..%d of max_steps=%d, %d micro-batch(es) of %d per step, %d data "
                        "rank(s)",
                        self.state.global_step + 1, max_steps, max_steps, acc_steps,
                        args.per_device_train_batch_size, self.dp.size)
            if per_epoch is not None and per_epoch < acc_steps:
                logger.warning("each step takes gradient_accumulation_steps=%d micro-batches but an epoch holds %d "
                               "micro-batch(es) of %d on this rank: every step repeats packs (lower "
                               "gradient_accumulation_steps or per_device_train_batch_size, or add data)",
                               acc_steps, per_epoch, args.per_device_train_batch_size)
        eval_before = None
        if evaluate_first and self.eval_dataset is not None and self.state.global_step < max_steps:
            eval_before = self.evaluate()  # the model as resumed, before any new step (none of its time is timed)
            best_model.check_metric(args, eval_before)
        metrics_logger = MetricsLogger(args, max_steps, self.state.global_step, is_main=self.dp.is_main)
        stream = self._micro_batch_stream()
        window = LogWindow(self.device)
        window.t0 = time.perf_counter()
        total_tokens, total_loss, total_count, train_time = 0, 0.0, 0.0, 0.0
        self.model.train()
        try:  # the bar is closed also on Ctrl-C or an error, so that their message starts a new line
            while self.state.global_step < max_steps:
                epochs_before = self._epochs_completed(per_epoch)
                micro = [next(stream) for _ in range(acc_steps)]
                # PaddleNLP's Trainer publishes the step this way; ERNIE's random position ids are seeded with it.
                os.environ["TRAINER_GLOBAL_STEP"] = str(self.state.global_step)
                out = self.training_step(micro)
                self.state.global_step += 1
                step = self.state.global_step
                window.add(out)
                metrics_logger.step()
                if step % max(int(args.logging_steps), 1) == 0 or step == max_steps:
                    logs = window.pop(self)
                    logs["lr"] = self.lr_scheduler.get_last_lr()[0]
                    in_epoch = self.state.micro_batches_in_epoch / per_epoch if per_epoch else 0.0
                    logs["epoch"] = self.state.epoch + in_epoch
                    total_loss, total_count = total_loss + logs.pop("_loss_sum"), total_count + logs.pop("_count")
                    total_tokens, train_time = total_tokens + logs.pop("_tokens"), train_time + logs.pop("_elapsed")
                    self.state.log_history.append({"step": step, **logs})
                    metrics_logger.log(logs, step)
                epoch_done = self._epochs_completed(per_epoch) != epochs_before or step == max_steps
                if self._due(getattr(args, "evaluation_strategy", "no"), args.eval_steps or args.logging_steps,
                             step, epoch_done) and self.eval_dataset is not None:
                    with window.paused():  # eval time stays out of tokens/s and train_runtime
                        eval_metrics = self.evaluate(log=False)
                    best_model.check_metric(args, eval_metrics)
                    self.state.log_history.append({"step": step, **eval_metrics})
                    metrics_logger.log(eval_metrics, step, prefix="eval")
                if self._due(getattr(args, "save_strategy", "steps"), args.save_steps, step, epoch_done):
                    with window.paused():
                        self.save_checkpoint()
        finally:
            metrics_logger.close()
        best = best_model.load_best(self)  # the final export is the best checkpoint's weights
        # train_runtime: time inside optimizer steps (eval and checkpoint writes excluded)
        # None (not 0.0) when this call trained nothing (a resumed run already at max_steps)
        result = {"global_step": self.state.global_step, "train_runtime": train_time,
                  "train_loss": total_loss / total_count if total_count else None,
                  "tokens_per_sec": total_tokens * self.dp.size / train_time if train_time > 0 else None}
        logger.info("training done: %s", json.dumps(result))
        result["eval_before"] = eval_before
        result["best"] = best
        return result

    def _epochs_completed(self, per_epoch: int | None) -> int:
        """Epochs fully read, counting the current one once its last micro-batch is drawn (the epoch counter
        itself moves only when the next epoch's first micro-batch is drawn, one step later)."""
        last_drawn = per_epoch is not None and self.state.micro_batches_in_epoch >= per_epoch
        return self.state.epoch + int(last_drawn)

    @staticmethod
    def _due(strategy: Any, every: int | None, step: int, epoch_done: bool) -> bool:
        strategy = str(strategy).split(".")[-1].lower()
        if strategy == "steps":
            return bool(every) and every > 0 and step % int(every) == 0
        if strategy == "epoch":
            return epoch_done
        if strategy in ("no", "none", ""):
            return False
        raise ValueError(f"strategy {strategy!r} is not one of 'no', 'steps', 'epoch' "
                         "(evaluation_strategy / save_strategy)")

    # ---- evaluation ---------------------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, eval_dataset=None, log: bool = True) -> dict[str, float]:
        """Mean loss over the dev packs: ``sum(loss_sum) / sum(count)`` over all batches and data ranks.

        Returns ``{"eval_loss": float, "eval_<metric>": float, ...}``. Raises ValueError without a dataset.
        """
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("evaluate() needs eval_dataset (dev set); set dev data or pass eval_dataset")
        was_training = self.model.training
        self.model.eval()
        sums: dict[str, torch.Tensor] = {}
        loss_sum = torch.zeros((), device=self.device, dtype=torch.float64)
        count = torch.zeros((), device=self.device, dtype=torch.float64)
        for batch, real in self._eval_batches(dataset):
            batch = self._to_device(batch)
            with self._loss_context(), self._autocast():
                ls, c, metrics = self.compute_loss(self.model, batch)
            # every pass names its metrics, a filler one too: a rank whose dev share is filler only (fewer dev
            # packs than data ranks) must all-reduce the same [loss, count, *metrics] vector as the others, or
            # the ranks' all_reduce sizes differ and the collective hangs
            for k in metrics:
                sums.setdefault(k, torch.zeros((), device=self.device, dtype=torch.float64))
            if not real:  # a filler pass: keeps FSDP/TP collectives in step across data ranks, counts nothing
                continue
            loss_sum += _local(ls).detach().double()  # replicated DTensor under loss_parallel -> plain tensor
            count += torch.as_tensor(c, device=self.device).double()
            for k, v in metrics.items():
                sums[k] = sums[k] + torch.as_tensor(v, device=self.device).detach().double()
        keys = sorted(sums)
        packed = self.dp.all_reduce_sum(torch.stack([loss_sum, count, *[sums[k] for k in keys]]))
        values = packed.tolist()
        if values[1] == 0:
            logger.warning("evaluate(): the dev set has no loss unit (no label token / pair); eval_loss is nan")
            values[0] = float("nan")
        reduced = self.reduce_metrics(values[0], values[1], dict(zip(keys, values[2:])))
        result = {f"eval_{k}": v for k, v in reduced.items()}
        if self.compute_metrics is not None:
            result.update({f"eval_{k}": v for k, v in self.compute_metrics(self, dict(result)).items()})
        self.last_eval = (self.state.global_step, result)
        self.model.train(was_training)
        if log:
            logger.info("eval: %s", json.dumps(result))
        return result

    def evaluate_final(self, trained: bool) -> dict[str, float]:
        """:meth:`evaluate` of the final model, reusing an evaluation at the last step (``eval_steps``) when this
        call ``trained`` (a resume that trained nothing evaluates anew)."""
        if trained and self.last_eval is not None and self.last_eval[0] == self.state.global_step:
            return self.last_eval[1]
        return self.evaluate()

    def _eval_batches(self, dataset):
        """``(batch, real)`` over this data rank's share of the dev set, every item exactly once overall.

        A map-style dev set is split without the wrap-around padding of training (which would count repeated
        packs twice in the mean); ranks left with fewer batches run filler passes on an already-seen batch with
        ``real=False``, so every rank makes the same number of forward calls (FSDP/TP collectives). Iterable dev
        sets keep ``ShardedIterable``'s rule (an incomplete last global batch is dropped when data ranks > 1).
        """
        bs = self.args.per_device_eval_batch_size
        done, last = 0, None
        for batch in self._loader(dataset, bs, shuffle=False, drop_last=False, pad=False):
            done, last = done + 1, batch
            yield batch, True
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__"):
            return
        most = math.ceil(math.ceil(len(dataset) / self.dp.size) / bs)  # batches of the rank with the most items
        if done < most and last is None:  # fewer dev items than data ranks: borrow item 0 for the filler passes
            last = self.data_collator([dataset[0]])
        for _ in range(most - done):
            yield last, False

    # ---- checkpoints -------------------------------------------------------------------------------------------
    def save_checkpoint(self) -> str:
        """Write ``output_dir/checkpoint-<global_step>`` (see ``checkpoint.py``); returns its path."""
        self.state.train_batch_size = int(self.args.per_device_train_batch_size)
        self.state.data_parallel_size = int(self.dp.size)
        self.state.train_packs = map_len(self.train_dataset)
        self.state.data_order = data_order(self.args, self.data_keys)
        data_state = {"epoch": self.state.epoch, "micro_batches_in_epoch": self.state.micro_batches_in_epoch}
        target = os.path.join(self.args.output_dir, f"{ckpt.PREFIX}-{self.state.global_step}")
        best_model.record_checkpoint(self.state, self.args, self.last_eval, target)
        path = ckpt.save_checkpoint(self.args.output_dir, self.state.global_step, self.model, self.optimizer,
                                    self.lr_scheduler, asdict(self.state), data_state,
                                    getattr(self.args, "save_total_limit", None),
                                    keep=best_model.best_checkpoint_path(self.state, self.args.output_dir) or
                                    self.state.best_model_checkpoint)
        logger.info("saved checkpoint %s", path)
        if self.dp.is_main:
            ckpt.drop_previous_run(self.args.output_dir)  # overwrite_output_dir's old run: this one has saved now
        return str(path)

    def _load_checkpoint(self, path) -> None:
        with open(os.path.join(path, ckpt.TRAINER_STATE), encoding="utf-8") as f:
            wrote = json.load(f).get("trainer")
        if wrote and wrote != type(self).__name__:  # same shapes would load: an SFT run resumed by DPO
            raise ValueError(f"{path} was written by {wrote}, not {type(self).__name__} (another kind of job in the "
                             "same output_dir): choose another output_dir, or set overwrite_output_dir true to "
                             "start over")
        configured = hyperparameters(self.optimizer, self.lr_scheduler)  # a load overwrites them: put them back
        trainer_state, data_state = ckpt.load_checkpoint(path, self.model, self.optimizer, self.lr_scheduler)
        reapply_hyperparameters(self.optimizer, self.lr_scheduler, configured)
        if self.master_weights is not None:
            self.master_weights.mark_dirty()
        self.state = TrainerState(**{k: v for k, v in trainer_state.items() if k in TrainerState.__dataclass_fields__})
        self.state.trainer = type(self).__name__
        if data_state is not None:
            self.state.epoch = int(data_state["epoch"])
            self.state.micro_batches_in_epoch = int(data_state["micro_batches_in_epoch"])
        convert_data_position(self.state, self.args.per_device_train_batch_size, self.dp.size, self.train_dataset)
        if bool(getattr(self.args, "ignore_data_skip", False)):
            self.state.micro_batches_in_epoch = 0  # PaddleNLP: restart the epoch's data from its beginning
        map_style = not isinstance(self.train_dataset, IterableDataset) and hasattr(self.train_dataset, "__getitem__")
        check_data_order(self.state.data_order, data_order(self.args, self.data_keys), self.state, map_style)
        logger.info("resumed from %s at step %d (epoch %d, %d micro-batches in)", path, self.state.global_step,
                    self.state.epoch, self.state.micro_batches_in_epoch)
        later = [c.name for c in ckpt.list_checkpoints(self.args.output_dir)
                 if ckpt.checkpoint_step(c) > self.state.global_step]
        if later:
            logger.warning("%s holds later checkpoints of another run (%s): they are replaced as this run reaches "
                           "their steps; until then a rerun without resume_from_checkpoint resumes the latest of them",
                           self.args.output_dir, ", ".join(later))

    def save_model(self, output_dir: str | None = None) -> str:
        """Save the final model as a Hugging Face directory plus the tokenizer files; returns the directory.

        One process: ``model.save_pretrained``. Distributed (collective): ``paddlenlp_ext.distributed.checkpoint
        .save_full_model`` gathers whole tensors (FSDP shards / TP DTensors) and rank 0 writes the same format.
        An OS-level write failure (disk full) raises ``checkpoint.SaveError`` naming the directory and the fix.
        """
        output_dir = output_dir or self.args.output_dir
        with ckpt.explain_write_errors(output_dir, "the final model"):
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                from paddlenlp_ext.distributed.checkpoint import save_full_model

                save_full_model(self.model, output_dir)
            else:
                self.model.save_pretrained(output_dir)
        if self.dp.is_main and self.tokenizer is not None and hasattr(self.tokenizer, "save_pretrained"):
            with ckpt.explain_tokenizer_write_errors(self.tokenizer, output_dir):
                self.tokenizer.save_pretrained(output_dir)
        if self.dp.is_main and os.path.abspath(output_dir) == os.path.abspath(self.args.output_dir):
            ckpt.drop_previous_run(output_dir)
        return output_dir


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") and hasattr(t, "placements") else t

