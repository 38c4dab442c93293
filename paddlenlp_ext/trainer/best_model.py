"""The best checkpoint: ``load_best_model_at_end``, ``metric_for_best_model``, ``greater_is_better``.

Hugging Face's rules (``Trainer._determine_best_metric`` / ``_load_best_model``; PaddleNLP's Trainer is the same):

- the metric is the evaluation's ``eval_<metric_for_best_model>`` (the ``eval_`` prefix is optional in the key;
  default ``loss``), compared at every checkpoint whose step was evaluated; only a strictly better value moves it;
- ``greater_is_better`` unset: False for names ending in ``loss`` (and here also ``perplexity`` / ``ppl``, which
  Hugging Face's rule would call greater-is-better), else True;
- ``TrainerState.best_metric`` / ``best_model_checkpoint`` / ``best_global_step`` (HF's field names) are saved in
  ``trainer_state.json``, so they survive a resume; rotation by ``save_total_limit`` never deletes the best
  checkpoint;
- at the end of training the best checkpoint's model weights are loaded back, so the final export (full model
  or adapter) holds them.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

logger = logging.getLogger("paddlenlp_ext.trainer")


def lower_is_better(metric: str) -> bool:
    """True for metric names whose smaller values are better: ending in ``loss``, ``perplexity`` or ``ppl``."""
    return str(metric).lower().endswith(("loss", "perplexity", "ppl"))


def metric_key(args) -> str | None:
    """``eval_<metric_for_best_model>`` (Hugging Face adds the prefix when missing), or None when no metric is
    tracked (neither ``load_best_model_at_end`` nor ``metric_for_best_model`` set)."""
    name = getattr(args, "metric_for_best_model", None)
    if not name:
        return "eval_loss" if getattr(args, "load_best_model_at_end", False) else None
    return name if name.startswith("eval_") else f"eval_{name}"


def check_metric(args, metrics: dict[str, float]) -> None:
    """ValueError when an evaluation's ``metrics`` lack the tracked metric, listing the ones it reports (Hugging
    Face raises a KeyError with the same content)."""
    key = metric_key(args)
    if key is None or key in metrics:
        return
    have = ", ".join(k[len("eval_"):] for k in sorted(metrics) if k.startswith("eval_"))
    raise ValueError(f"metric_for_best_model={args.metric_for_best_model!r}: the evaluation reports no {key} (it "
                     f"reports: {have}); set metric_for_best_model to one of those")


def is_better(value: float, best: float | None, greater: bool) -> bool:
    """``value`` strictly better than ``best`` (None: nothing yet); NaN is never better."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    if best is None:
        return True
    return value > best if greater else value < best


def record_checkpoint(state, args, last_eval: tuple[int, dict[str, float]] | None, path: str) -> bool:
    """Before ``checkpoint-<state.global_step>`` is written at ``path``: when the latest evaluation measured this
    step and its metric beats ``state.best_metric``, make it the best (``best_metric``, ``best_model_checkpoint``,
    ``best_global_step``), so the checkpoint's own ``trainer_state.json`` holds it. Returns True when it did."""
    key = metric_key(args)
    if key is None or last_eval is None or last_eval[0] != state.global_step:
        return False
    value = last_eval[1].get(key)
    greater = getattr(args, "greater_is_better", None)
    greater = (not lower_is_better(key)) if greater is None else bool(greater)
    if value is None or not is_better(float(value), state.best_metric, greater):
        return False
    state.best_metric, state.best_model_checkpoint, state.best_global_step = float(value), str(path), state.global_step
    logger.info("best checkpoint so far: %s (%s=%.6g)", os.path.basename(str(path)), key, value)
    return True


def best_checkpoint_path(state, output_dir: str) -> str | None:
    """``state.best_model_checkpoint`` if that directory exists, else the same ``checkpoint-<step>`` under
    ``output_dir`` (a run moved to another path), else None."""
    path = getattr(state, "best_model_checkpoint", None)
    if not path:
        return None
    if os.path.isdir(path):
        return path
    moved = os.path.join(output_dir, os.path.basename(path))
    return moved if os.path.isdir(moved) else None


def eval_at(state, step: int) -> dict[str, Any] | None:
    """The evaluation metrics logged at ``step`` in ``state.log_history`` (the last such entry), or None."""
    found = [h for h in state.log_history if h.get("step") == step and any(k.startswith("eval_") for k in h)]
    return {k: v for k, v in found[-1].items() if k.startswith("eval_")} if found else None


def check_can_track(trainer) -> None:
    """ValueError when ``load_best_model_at_end`` is set, evaluation is scheduled, but the trainer has no dev set
    (nothing would ever be evaluated, and the last step's model would silently be the final one)."""
    args = trainer.args
    strategy = str(getattr(args, "evaluation_strategy", "no")).split(".")[-1].lower()
    if getattr(args, "load_best_model_at_end", False) and strategy not in ("no", "") and trainer.eval_dataset is None:
        raise ValueError("load_best_model_at_end=true needs an evaluation, but there is no dev set (the data has no "
                         "dev split: dev.json / dev/*.json for SFT, dev_dataset_path for DPO and RM): add one, or set "
                         "load_best_model_at_end false")


def load_best(trainer) -> dict[str, Any] | None:
    """End of training with ``load_best_model_at_end``: load the best checkpoint's model weights into
    ``trainer.model`` (collective under torch.distributed) unless the model already is that step's, and point
    ``trainer.last_eval`` at that step's logged evaluation. Returns ``{"best_model_checkpoint", "best_metric",
    "best_global_step"}`` (None when nothing was tracked, or the checkpoint is gone, which is warned)."""
    from . import checkpoint as ckpt

    state, args = trainer.state, trainer.args
    if not getattr(args, "load_best_model_at_end", False) or state.best_model_checkpoint is None:
        return None
    path = best_checkpoint_path(state, args.output_dir)
    if path is None:
        logger.warning("load_best_model_at_end: the best checkpoint %s no longer exists; the final model is the last "
                       "step's", state.best_model_checkpoint)
        return None
    step = state.best_global_step or ckpt.checkpoint_step(path)
    key = metric_key(args)
    if step != state.global_step:
        ckpt.load_model_weights(path, trainer.model)
        if trainer.master_weights is not None:
            trainer.master_weights.mark_dirty()
        metrics = eval_at(state, step)
        if metrics is not None:
            trainer.last_eval = (state.global_step, metrics)  # the model now is the one measured then
        else:
            trainer.last_eval = None
    logger.info("load_best_model_at_end: the final model is %s, step %d (%s=%.6g, the best evaluation)",
                os.path.basename(path), step, key, state.best_metric)
    return {"best_model_checkpoint": path, "best_metric": state.best_metric, "best_global_step": step}
