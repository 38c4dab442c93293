"""Resuming a checkpoint under a changed config: what the checkpoint's state would silently override.

- :func:`hyperparameters` / :func:`reapply_hyperparameters`: ``optimizer.load_state_dict`` restores every param
  group's ``initial_lr``/``weight_decay``/``betas``/``eps`` and ``LambdaLR`` its ``base_lrs``, so a run resumed
  with another ``learning_rate`` (or ``weight_decay``, ``adam_beta*``, ``adam_epsilon``, ``lora_plus_scale``) kept
  the checkpoint's values. PaddleNLP's optimizer and LR scheduler states hold no such values
  (``paddle.optimizer.lr.LRScheduler.state_dict``: ``last_epoch``, ``last_lr``), so there the config's values
  apply on resume; so they do here, logged. The learning rate of every resumed step is this run's schedule's
  (a larger ``max_steps`` resumes at the new schedule's value, not the 0 a finished decay left), logged when it
  differs from the checkpoint's.
- :func:`convert_data_position`: the saved "micro-batches into the epoch" counts micro-batches of the
  checkpoint's ``per_device_train_batch_size`` x data-parallel size; it is re-expressed in this run's shape (HF and
  PaddleNLP skip ``count`` micro-batches of the NEW size: unseen packs skipped, or seen ones repeated). A train set
  that now packs into another number of packs is warned about.
- :func:`data_order` / :func:`check_data_order`: the keys that decide the train data order (``seed``,
  ``dataloader_shuffle``, and the data keys that decide the packs, :data:`DATA_ORDER_KEYS`) are recorded in
  ``trainer_state.json``; a resume that changes one is warned (the skipped micro-batches are then not the packs
  already trained on). PaddleNLP records none of them and resumes silently; we warn and keep going, as it does.

Used by :meth:`paddlenlp_ext.trainer.trainer.Trainer._load_checkpoint`.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from torch.utils.data import IterableDataset

logger = logging.getLogger("paddlenlp_ext.trainer")

# param-group key -> the config key that sets it
_HYPER_KEYS = {"initial_lr": "learning_rate", "weight_decay": "weight_decay", "betas": "adam_beta1/adam_beta2",
               "eps": "adam_epsilon"}


# Data-argument keys (of SFT's DataArgument and the DPO / RM data arguments) that decide which train packs exist and
# what they hold: the files, the tokenisation (template, cuts) and the packing. The trainer adds seed and
# dataloader_shuffle, which decide the order of the packs.
DATA_ORDER_KEYS = ("dataset_name_or_path", "train_dataset_path", "max_length", "max_seq_len", "src_length",
                   "max_prompt_len", "zero_padding", "greedy_zero_padding", "lazy", "chat_template")


def data_keys(data_args) -> dict[str, Any]:
    """``{key: value}`` of the :data:`DATA_ORDER_KEYS` that ``data_args`` has (a launcher's data dataclass); the
    launchers put it on ``Trainer.data_keys`` so checkpoints record it."""
    return {k: getattr(data_args, k) for k in DATA_ORDER_KEYS if hasattr(data_args, k)}


def data_order(args, keys: dict[str, Any]) -> dict[str, Any]:
    """What decides the train data order: ``seed`` and ``dataloader_shuffle`` of ``args`` (the sampler's
    permutation, ``trainer_utils.ResumableSampler``) plus ``keys`` (:func:`data_keys`). JSON-serialisable; saved
    as ``TrainerState.data_order``."""
    return {"seed": int(args.seed), "dataloader_shuffle": bool(getattr(args, "dataloader_shuffle", True)), **keys}


def check_data_order(saved: dict[str, Any], current: dict[str, Any], state, map_style: bool) -> list[str]:
    """Compare a checkpoint's :func:`data_order` record with this run's; warn when they differ and packs are
    skipped. Returns the changed keys (``[]`` when none, or when ``saved`` is empty: a checkpoint written before
    the record existed resumes without a word).

    ``seed`` counts only when one of the two runs shuffles a map-style dataset (otherwise it does not touch the
    order). ``state``: the resumed ``TrainerState``; when it skips nothing (``micro_batches_in_epoch == 0``: an
    epoch boundary, or ``ignore_data_skip``) the change is logged at INFO only, as no pack is wrongly skipped.
    """
    if not saved:
        return []
    changed = [k for k in current if k in saved and saved[k] != current[k]]
    shuffled = map_style and (bool(saved.get("dataloader_shuffle", True)) or bool(current.get("dataloader_shuffle")))
    if not shuffled:
        changed = [k for k in changed if k not in ("seed", "dataloader_shuffle")]
    if not changed:
        return []
    what = ", ".join(f"{k}={current[k]} (the checkpoint's run: {saved[k]})" for k in changed)
    if state.micro_batches_in_epoch == 0:
        logger.info("resuming with %s: the data order differs from the checkpoint's run; epoch %d is read from its "
                    "start, so no pack is skipped", what, state.epoch)
        return changed
    logger.warning("resuming with %s: the data order differs from the checkpoint's run, so the %d micro-batch(es) "
                   "skipped in epoch %d are not the packs it trained on (some packs of this epoch are never trained "
                   "on, others twice). Resume with the checkpoint's values, set ignore_data_skip true to read epoch "
                   "%d from its start, or start over (overwrite_output_dir true)", what, state.micro_batches_in_epoch,
                   state.epoch, state.epoch)
    return changed


def map_len(dataset) -> int:
    """``len(dataset)`` of a map-style dataset, else 0 (an iterable dataset, or None)."""
    if dataset is None or isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        return 0
    return len(dataset)


def hyperparameters(optimizer, scheduler) -> tuple[list[dict[str, Any]], list[float]]:
    """Per param group ``{initial_lr, weight_decay, betas, eps}`` (floats; betas a tuple of floats) and the
    scheduler's ``base_lrs``: what a checkpoint load overwrites. Take it before the load."""
    groups = [{k: (tuple(float(b) for b in g[k]) if k == "betas" else float(g[k])) for k in _HYPER_KEYS if k in g}
              for g in optimizer.param_groups]
    return groups, [float(b) for b in scheduler.base_lrs]


def reapply_hyperparameters(optimizer, scheduler, configured: tuple[list[dict[str, Any]], list[float]]) -> list[str]:
    """Put ``configured`` (:func:`hyperparameters` before the load) back after a checkpoint load, and set every
    param group's learning rate to THIS run's schedule at the restored step.

    ``optimizer.load_state_dict`` restores each group's ``lr`` as the checkpoint's schedule left it: after a run
    resumed with a larger ``max_steps`` (another ``warmup_*`` or ``lr_scheduler_type``), the first resumed step
    trained at the old schedule's value (0 at the end of a decaying one). The rate is recomputed as ``LambdaLR``
    does (``base_lr * lr_lambda(last_epoch)``). Returns the config keys that differed from the checkpoint's, plus
    ``"schedule"`` when the recomputed rate differs from the restored one (both logged); [] when nothing changed.
    """
    groups, base_lrs = configured
    restored_groups, restored_base = hyperparameters(optimizer, scheduler)
    changed = {_HYPER_KEYS[k] for want, got in zip(groups, restored_groups) for k in want if want[k] != got.get(k)}
    if base_lrs != restored_base:
        changed.add("learning_rate")
    restored_lrs = [float(g["lr"]) for g in optimizer.param_groups]
    for group, want in zip(optimizer.param_groups, groups):
        group.update(want)
    scheduler.base_lrs = list(base_lrs)
    lrs = [base * lam(scheduler.last_epoch) for base, lam in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
    scheduler._last_lr = lrs
    if changed:
        logger.info("resuming with this run's %s (the checkpoint's differ; PaddleNLP's rule): learning rate now %g",
                    ", ".join(sorted(changed)), lrs[0])
    elif not all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12) for a, b in zip(lrs, restored_lrs)):
        changed.add("schedule")
        logger.info("the learning-rate schedule changed on resume (max_steps, warmup or lr_scheduler_type): step %d "
                    "trains at lr %g, this run's schedule at that step (the checkpoint's schedule was at %g)",
                    scheduler.last_epoch + 1, lrs[0], restored_lrs[0])
    return sorted(changed)


def convert_data_position(state, per_device_batch_size: int, data_ranks: int, train_dataset) -> None:
    """Re-express ``state.micro_batches_in_epoch`` (a resumed ``TrainerState``) in this run's micro-batch shape.

    The samplers skip ``count x per_device_train_batch_size`` packs per rank. The epoch's consumed packs (a prefix
    of its order, over all ranks) are kept; when they do not fill whole new micro-batches, the count rounds down (a
    few packs are read again) with a warning. No-op for a checkpoint that did not record its shape.
    """
    packs_now = map_len(train_dataset)
    if state.train_packs and packs_now and packs_now != state.train_packs:
        logger.warning("the train data packs into %d packs, the checkpoint's run had %d (other data files, "
                       "max_length / max_seq_len, src_length or packing keys): the resumed position in epoch %d "
                       "no longer marks the packs already trained on. Resume with the same data keys, or start "
                       "over (overwrite_output_dir true)", packs_now, state.train_packs, state.epoch)
    old_bs, old_dp = state.train_batch_size, state.data_parallel_size
    new_bs, new_dp = int(per_device_batch_size), int(data_ranks)
    if not old_bs or not old_dp or (old_bs, old_dp) == (new_bs, new_dp):
        return
    packs = state.micro_batches_in_epoch * old_bs * old_dp  # of this epoch, over all data ranks
    count, extra = divmod(packs, new_bs * new_dp)
    logger.info("the checkpoint counted %d micro-batch(es) of %d pack(s) x %d data rank(s) in epoch %d; resuming "
                "with %d x %d: %d micro-batch(es) in", state.micro_batches_in_epoch, old_bs, old_dp, state.epoch,
                new_bs, new_dp, count)
    if extra:
        logger.warning("resuming with per_device_train_batch_size=%d x %d data rank(s) (the checkpoint used %d x "
                       "%d): the %d pack(s) read in epoch %d do not fill whole micro-batches, so the last %d are "
                       "read again", new_bs, new_dp, old_bs, old_dp, packs, state.epoch, extra)
    state.micro_batches_in_epoch = count
