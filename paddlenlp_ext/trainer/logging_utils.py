"""Where training metrics go: a tqdm bar, the Python logger, and TensorBoard (``report_to``).

PaddleNLP logs through ``VisualDLCallback``/``TensorBoardCallback`` into ``logging_dir``; here "visualdl" is
mapped to TensorBoard (no VisualDL in PyTorch) and the event files go to ``logging_dir`` or
``output_dir/runs``. Only global rank 0 writes.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

logger = logging.getLogger("paddlenlp_ext.trainer")


def setup_logging(rank: int = 0) -> None:
    """Configure ``paddlenlp_ext`` loggers: INFO on rank 0, WARNING elsewhere (idempotent)."""
    root = logging.getLogger("paddlenlp_ext")
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s] [%(levelname)s] %(name)s: %(message)s",
                                               datefmt="%H:%M:%S"))
        root.addHandler(handler)
    root.setLevel(logging.INFO if rank == 0 else logging.WARNING)


def _report_targets(report_to: Any) -> set[str]:
    if report_to is None:
        return set()
    if isinstance(report_to, str):
        report_to = [r.strip() for r in report_to.replace(",", " ").split()]
    targets = {str(r).lower() for r in report_to}
    if "all" in targets:
        targets.add("tensorboard")
    if "visualdl" in targets:
        targets.add("tensorboard")
    return targets


class MetricsLogger:
    """Progress bar + TensorBoard writer for one training run.

    Args:
        args: reads ``output_dir``, ``logging_dir`` (optional), ``report_to``, ``disable_tqdm``.
        max_steps: total optimizer steps (the bar's length).
        initial_step: global step at start (non-zero after resume).
        is_main: only the main process shows the bar and writes events.
    """

    def __init__(self, args, max_steps: int, initial_step: int = 0, is_main: bool = True):
        self.is_main = is_main
        self.writer = None
        targets = _report_targets(getattr(args, "report_to", None))
        if is_main and "tensorboard" in targets:
            from torch.utils.tensorboard import SummaryWriter

            log_dir = getattr(args, "logging_dir", None) or os.path.join(args.output_dir, "runs")
            self.writer = SummaryWriter(log_dir=log_dir)
            logger.info("TensorBoard events -> %s", log_dir)
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
        if prefix == "train" and not self.bar.disable:
            short = {k: v for k, v in metrics.items() if k in ("loss", "lr", "tokens_per_sec")}
            self.bar.set_postfix({k: (f"{v:.3e}" if k == "lr" else f"{v:.4f}" if k == "loss" else f"{v:.0f}")
                                  for k, v in short.items()}, refresh=False)
        text = ", ".join(f"{k}: {v:.6g}" for k, v in metrics.items())
        if prefix != "train" or self.bar.disable:
            logger.info("[%s] step %d: %s", prefix, step, text)
        else:
            self.bar.write(f"[{prefix}] step {step}: {text}")
        if self.writer is not None:
            for k, v in metrics.items():
                # eval_loss -> eval/loss, eval_rewards/margins -> eval/rewards/margins (HF / PaddleNLP rewrite_logs;
                # the plain f"{prefix}/{k}" wrote eval/eval_loss, which no train/ tag lines up with)
                name = k[len(prefix) + 1:] if k.startswith(prefix + "_") else k
                self.writer.add_scalar(f"{prefix}/{name}", v, step)
            self.writer.flush()

    def close(self) -> None:
        """Close the bar (ending its line, so that what is printed next starts a line of its own), restore the
        log handlers and flush the event file; idempotent."""
        self.bar.close()
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None
        if self.writer is not None:
            self.writer.close()
