"""Where training metrics go: a tqdm bar, the Python logger, and TensorBoard / VisualDL (``report_to``).

PaddleNLP logs through ``TensorBoardCallback`` / ``VisualDLCallback`` into ``logging_dir``; so do we, to
``logging_dir`` or ``output_dir/runs``: "tensorboard" writes TensorBoard events (``torch.utils.tensorboard``, extra
``tensorboard``), "visualdl" VisualDL records (``visualdl.LogWriter``, extra ``visualdl``) or, without VisualDL,
TensorBoard events. ``report_to`` unset is "visualdl", PaddleNLP's default; it writes nothing (with one warning)
when neither package is installed. Only global rank 0 writes.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any

import torch

from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

if TYPE_CHECKING:
    from .trainer import Trainer

logger = logging.getLogger("paddlenlp_ext.trainer")

# evaluation metrics shown on the progress bar (all of them go to the log line and TensorBoard)
_BAR_EVAL_KEYS = ("eval_loss", "eval_accuracy", "eval_perplexity", "eval_bleu4", "eval_rouge_l", "eval_exact_match",
                  "eval_rewards/accuracies")


class _StderrHandler(logging.StreamHandler):
    """A StreamHandler that writes to the current ``sys.stderr``, not the one at set-up (a replaced stderr, e.g. a
    test's capture, may be closed by the time a later record arrives)."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def setup_logging(rank: int = 0) -> None:
    """Configure ``paddlenlp_ext`` loggers: INFO on rank 0, WARNING elsewhere (idempotent)."""
    root = logging.getLogger("paddlenlp_ext")
    if not root.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s] [%(levelname)s] %(name)s: %(message)s",
                                               datefmt="%H:%M:%S"))
        root.addHandler(handler)
    root.setLevel(logging.INFO if rank == 0 else logging.WARNING)


def _report_targets(report_to: Any) -> set[str]:
    if report_to is None:  # PaddleNLP's default logger
        return {"visualdl"}
    if isinstance(report_to, str):
        report_to = [r.strip() for r in report_to.replace(",", " ").split()]
    targets = {str(r).lower() for r in report_to}
    if "all" in targets:
        targets.add("tensorboard")
    return targets


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def writer_kinds(report_to: Any) -> list[str]:
    """The event writers ``report_to`` asks for: a sorted subset of ``["tensorboard", "visualdl"]``.

    "visualdl" is VisualDL when the ``visualdl`` package is installed, else TensorBoard events (PaddleNLP's default
    logger, readable by TensorBoard).

    Raises:
        ValueError: the package a writer needs is not installed (the message names the ``pip install`` extra and
            ``report_to []``).
    """
    targets = _report_targets(report_to)
    kinds = set()
    if "visualdl" in targets:
        if _installed("visualdl"):
            kinds.add("visualdl")
        elif _installed("tensorboard"):
            kinds.add("tensorboard")
        elif report_to is not None:  # unset: the default logger is skipped with a warning (MetricsLogger)
            raise ValueError("report_to visualdl needs VisualDL or TensorBoard, and neither is installed: "
                             "pip install 'paddlenlp-ext[visualdl]' (VisualDL records) or 'paddlenlp-ext[tensorboard]' "
                             "(TensorBoard events), or set report_to [] for no logger")
    if "tensorboard" in targets:
        if not _installed("tensorboard"):
            raise ValueError("report_to tensorboard needs the tensorboard package, which is not installed: "
                             "pip install 'paddlenlp-ext[tensorboard]' (or pip install tensorboard), or set "
                             "report_to [] for no logger")
        kinds.add("tensorboard")
    return sorted(kinds)


def _open_writer(kind: str, log_dir: str):
    """A writer with ``add_scalar(tag, value, step)``, ``flush()`` and ``close()``."""
    if kind == "visualdl":
        from visualdl import LogWriter

        return LogWriter(logdir=log_dir)
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=log_dir)


class MetricsLogger:
    """Progress bar + TensorBoard / VisualDL writers for one training run.

    Args:
        args: reads ``output_dir``, ``logging_dir`` (optional), ``report_to``, ``disable_tqdm``.
        max_steps: total optimizer steps (the bar's length).
        initial_step: global step at start (non-zero after resume).
        is_main: only the main process shows the bar and writes events.

    Raises:
        ValueError: ``report_to`` names a logger whose package is not installed (:func:`writer_kinds`).
    """

    def __init__(self, args, max_steps: int, initial_step: int = 0, is_main: bool = True):
        self.is_main = is_main
        self._train_postfix: dict[str, str] = {}
        self._eval_postfix: dict[str, str] = {}
        self.writers = []
        if is_main:
            log_dir = getattr(args, "logging_dir", None) or os.path.join(args.output_dir, "runs")
            kinds = writer_kinds(getattr(args, "report_to", None))
            report_to = getattr(args, "report_to", None)
            if "visualdl" in _report_targets(report_to) and "visualdl" not in kinds:
                what = "report_to visualdl" if report_to is not None else "report_to unset (PaddleNLP's default: visualdl)"
                instead = f"writing TensorBoard events to {log_dir} instead" if kinds else "writing no event logs"
                logger.warning("%s: the visualdl package is not installed (pip install 'paddlenlp-ext[visualdl]'); "
                               "%s (report_to [] turns this off)", what, instead)
            for kind in kinds:
                self.writers.append(_open_writer(kind, log_dir))
                logger.info("%s -> %s", "VisualDL records" if kind == "visualdl" else "TensorBoard events", log_dir)
        disable = bool(getattr(args, "disable_tqdm", False)) or not is_main
        self.bar = tqdm(total=max_steps, initial=initial_step, disable=disable, desc="train", dynamic_ncols=True)
        # while the bar is shown, log records go through tqdm.write (one line each, the bar redrawn below them)
        # instead of being written onto the end of the bar's line
        self._redirect = None if disable else logging_redirect_tqdm(loggers=[logging.getLogger("paddlenlp_ext")])
        if self._redirect is not None:
            self._redirect.__enter__()

    def step(self, n: int = 1) -> None:
        """Advance the bar by ``n`` optimizer steps."""
        self.bar.update(n)

    def log(self, metrics: dict[str, float], step: int, prefix: str = "train") -> None:
        """Show ``metrics`` on the bar (train) or the logger (eval), and write ``prefix/<name>`` scalars (a key's own
        ``<prefix>_`` is dropped: ``eval_loss`` is written as ``eval/loss``, as Hugging Face and PaddleNLP do)."""
        if not self.is_main:
            return
        if prefix == "eval":  # the latest evaluation stays on the bar beside the training numbers
            self._eval_postfix = {k: f"{v:.4g}" for k, v in metrics.items() if k in _BAR_EVAL_KEYS}
        if not self.bar.disable and (prefix == "train" or self._eval_postfix):
            if prefix == "train":
                short = {k: v for k, v in metrics.items() if k in ("loss", "lr", "tokens_per_sec")}
                self._train_postfix = {k: (f"{v:.3e}" if k == "lr" else f"{v:.4f}" if k == "loss" else f"{v:.0f}")
                                       for k, v in short.items()}
            self.bar.set_postfix({**self._train_postfix, **self._eval_postfix}, refresh=False)
        text = ", ".join(f"{k}: {v:.6g}" for k, v in metrics.items())
        if prefix != "train" or self.bar.disable:
            logger.info("[%s] step %d: %s", prefix, step, text)
        else:
            self.bar.write(f"[{prefix}] step {step}: {text}")
        for writer in self.writers:
            for k, v in metrics.items():
                # eval_loss -> eval/loss, eval_rewards/margins -> eval/rewards/margins (HF / PaddleNLP rewrite_logs:
                # the tag then lines up with its train/ counterpart)
                name = k[len(prefix) + 1:] if k.startswith(prefix + "_") else k
                writer.add_scalar(f"{prefix}/{name}", v, step)
            writer.flush()

    def close(self) -> None:
        """Close the bar (ending its line, so that what is printed next starts a line of its own), restore the
        log handlers and flush the event file; idempotent."""
        self.bar.close()
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None
        for writer in self.writers:
            writer.close()
        self.writers = []


class LogWindow:
    """The training steps since the last log (the Trainer's ``logging_steps`` window): device-side sums of their
    losses, metrics and tokens, reduced with one host sync per log.

    Its clock runs from the previous log to this one, less the time spent in :meth:`paused` blocks (eval,
    checkpoint writes) that fall inside the window.
    """

    def __init__(self, device):
        self.device, self.outs, self.t0 = device, [], time.perf_counter()

    def add(self, out: dict[str, Any]) -> None:
        self.outs.append(out)

    @contextlib.contextmanager
    def paused(self):
        """Stop the window's clock for the block. The device is synchronised first, so the training work still
        queued from this window's steps is charged to the window and not to the pause. (Restarting the clock
        after an eval instead would drop the earlier steps' time but keep their tokens: the window after a
        mid-window eval would read 2x too fast, 135K-182K tokens/s on an H200 for a 1B model.)"""
        if self.device is not None and torch.device(self.device).type == "cuda":
            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.t0 += time.perf_counter() - start

    def pop(self, trainer: Trainer) -> dict[str, float]:
        """Reduce the window's sums (the one host sync) and time it: the clock is read after the sync, so the
        window is charged for its own device work (an earlier clock read let the host run ahead of the GPU and
        moved the queued work into the next window, and the last window's out of ``train_runtime``)."""
        outs, self.outs = self.outs, []
        keys = sorted({k for o in outs for k in o["metrics"]})
        local = torch.stack([sum(o["loss_sum"] for o in outs).double(),
                             *[sum(torch.as_tensor(o["metrics"].get(k, 0.0), device=self.device)
                                   for o in outs).double() for k in keys]])
        values = trainer.dp.all_reduce_sum(local).tolist()
        count = float(sum(o["count"] for o in outs).item())
        tokens = int(sum(int(o["tokens"]) for o in outs))
        now = time.perf_counter()  # after the sync above
        logs = trainer.reduce_metrics(values[0], count, dict(zip(keys, values[1:])))
        norms = [o["grad_norm"] for o in outs if o["grad_norm"] is not None]
        if norms:
            logs["grad_norm"] = float(norms[-1].full_tensor() if hasattr(norms[-1], "full_tensor") else norms[-1])
        elapsed = max(now - self.t0, 1e-9)
        logs["tokens_per_sec"] = tokens * trainer.dp.size / elapsed  # all data ranks, non-pad tokens
        self.t0 = now
        logs.update({"_loss_sum": values[0], "_count": count, "_tokens": tokens, "_elapsed": elapsed})
        return logs
