"""Pieces the launchers (``llm/run_finetune.py``, ``run_dpo.py``, ``run_reward.py``) share.

Each launcher keeps its own flow readable top to bottom; what is the same in all three lives here: the
process layout, where to resume (and what an existing output_dir means), the LoRA+ optimizer, the adapter save
(gathered whole under FSDP/TP) and the closing summary.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time

import torch

try:
    import fcntl
except ImportError:  # not POSIX: no output_dir lock (see output_dir_lock)
    fcntl = None

logger = logging.getLogger(__name__)

LOCK_NAME = ".lock"


class OutputDirLock:
    """Advisory lock ``<output_dir>/.lock`` held by one training run: ``fcntl.flock`` on the open file, which holds
    ``{"pid", "host"}`` of the holder. Use as a context manager (or ``acquire`` / ``release``).

    The OS drops a ``flock`` when its process dies (killed, out of memory), so a ``.lock`` left behind by a dead
    run is stale by construction: the next run takes it over with a warning naming the old pid and host.
    ``release`` (at exit of the ``with``, also on an exception or Ctrl-C) removes the file, and ``output_dir``
    too when this lock created it and it is still empty. Forked children (DataLoader workers) never release it.

    Not in PaddleNLP or Hugging Face (they let two runs share an ``output_dir``). Over NFS, Linux maps ``flock``
    to NFS byte-range locks; a file system that refuses locks gives a warning and no lock.

    Raises (``acquire``):
        ValueError: another live process holds the lock: the message names ``output_dir``, its pid and host; or
            ``output_dir`` / the lock file cannot be created (read-only, no permission).
    """

    def __init__(self, output_dir: str):
        self.output_dir = output_dir
        self.path = os.path.join(output_dir, LOCK_NAME)
        self._fd: int | None = None
        self._pid: int | None = None
        self._created: list[str] = []

    def acquire(self) -> "OutputDirLock":
        self._created = _missing_dirs(self.output_dir)
        for _ in range(10):
            try:
                os.makedirs(self.output_dir, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:  # read-only or not ours: the run could not save anything there either
                raise ValueError(f"output_dir {self.output_dir}: cannot create the lock file {self.path} "
                                 f"({e.strerror}); choose a writable output_dir") from e
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _lock_holder(fd)
                os.close(fd)
                self._remove_created_dir()
                raise ValueError(
                    f"output_dir {self.output_dir} is in use by another training run ({holder}; lock file "
                    f"{self.path}): two runs in one output_dir overwrite and delete each other's checkpoints. "
                    "Wait for that run to end (or stop it), or choose another output_dir") from None
            except OSError as e:  # e.g. ENOLCK: the file system has no locks
                os.close(fd)
                logger.warning("output_dir %s: cannot lock %s (%s); running without the lock that keeps a second "
                               "run out of this directory", self.output_dir, self.path, e)
                return self
            try:  # its previous holder may have removed the file between our open and flock: lock the path's file
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        else:
            raise ValueError(f"output_dir {self.output_dir}: {self.path} keeps being replaced by another process; "
                             "is another run starting in this directory? Choose another output_dir")
        stale = _lock_holder(fd, default="")
        if stale:
            logger.warning("output_dir %s: taking over the stale lock of %s (that process ended without releasing "
                           "it, e.g. killed; a lock file is only left behind that way)", self.output_dir, stale)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode(), 0)
        self._fd, self._pid = fd, os.getpid()
        return self

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None or os.getpid() != self._pid:  # not held, or a forked child: the parent's lock stays
            return
        try:
            if os.path.samestat(os.fstat(fd), os.stat(self.path)):
                os.unlink(self.path)  # while still locked, so a waiting opener sees the file is gone and retries
        except OSError:
            pass
        finally:
            os.close(fd)  # drops the flock
        self._remove_created_dir()

    def _remove_created_dir(self) -> None:
        # a run that failed before writing anything leaves no empty output_dir behind, nor the empty parents that
        # makedirs created for it (./checkpoints/ of a run started from the wrong folder)
        for d in self._created:  # deepest first; a folder with anything in it stops the walk
            try:
                os.rmdir(d)
            except OSError:
                break

    def __enter__(self) -> "OutputDirLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _missing_dirs(path: str) -> list[str]:
    """``path`` and those of its ancestors that do not exist yet, deepest first (what ``os.makedirs`` creates)."""
    out, path = [], os.path.abspath(path)
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        out.append(path)
        path = os.path.dirname(path)
    return out


def _lock_holder(fd: int, default: str = "holder unknown") -> str:
    """``"pid N on host H"`` from a lock file's JSON (its raw text if it is not ours), or ``default`` if empty."""
    raw = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
    if not raw:
        return default
    try:
        info = json.loads(raw)
        return f"pid {info['pid']} on host {info['host']}"
    except (ValueError, KeyError, TypeError):
        return f"lock file content {raw[:200]!r}"


def output_dir_lock(training_args):
    """The launchers' ``with output_dir_lock(training_args):`` around the whole job: an :class:`OutputDirLock` on
    ``output_dir`` for a training run (``do_train``), taken by rank 0 only (``RANK``, set by torchrun); a no-op
    context for evaluation-only runs, other ranks, or a platform without ``fcntl``.

    Taken before anything loads, so a second run into a busy ``output_dir`` fails at once (ValueError naming the
    directory and the holder's pid and host), before ``overwrite_output_dir`` could delete the first run's
    checkpoints. ``clear_previous_run`` leaves ``.lock`` in place; a rerun after the first run ended (resume) takes
    the lock again.
    """
    if not training_args.do_train or int(os.environ.get("RANK", "0")) != 0 or fcntl is None:
        return contextlib.nullcontext()
    return OutputDirLock(training_args.output_dir)


def init_parallel_dims(training_args):
    """``ParallelDims`` under torchrun (``WORLD_SIZE > 1``), else None (one process, nothing parallelized; a
    warning when the config asks for more than one rank in some dimension)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        asked = {k: getattr(training_args, k, 1) for k in ("tensor_parallel_degree", "sharding_parallel_degree",
                                                            "data_parallel_degree")}
        asked = {k: v for k, v in asked.items() if isinstance(v, int) and v > 1}
        if asked:
            logger.warning("%s %s for several processes, but this is one process: training runs unparallelized. "
                           "Launch with torchrun --nproc_per_node N (N = the product of the degrees).",
                           ", ".join(f"{k}={v}" for k, v in asked.items()), "asks" if len(asked) == 1 else "ask")
        return None
    from paddlenlp_ext.distributed import init_distributed

    return init_distributed(training_args)


_RUN: dict = {}  # output_dir and overwrite_output_dir of this process's run (resume_target), for run_cli's message


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that it unwinds like Ctrl-C (``finally`` blocks, context managers)."""


def _raise_terminated(signum, frame):
    raise _Terminated()


def run_cli(main, resumable: bool = False) -> None:
    """``main(sys.argv[1:])`` for a launcher's ``__main__``: user errors (bad config, data or paths: ValueError,
    FileNotFoundError, NotADirectoryError; a failed checkpoint/model write: ``checkpoint.SaveError``) print
    ``error: <message>`` (and the JSON config file the run was given, when the message does not name it) and exit
    2 instead of a traceback; Ctrl-C prints one line (with ``resumable``, the
    training launchers: how to resume or, after ``overwrite_output_dir``, where the replaced run is kept) and exits 130;
    SIGTERM (``timeout``, Slurm, Kubernetes) is handled the same way (the same cleanup, e.g. the ``output_dir``
    lock released) and exits 143, where the handler is still the default;
    ``PADDLENLP_EXT_TRACEBACK=1`` shows the traceback."""
    import signal
    import sys
    import threading

    _RUN.clear()
    own_sigterm = (threading.current_thread() is threading.main_thread()
                   and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
    if own_sigterm:
        signal.signal(signal.SIGTERM, _raise_terminated)  # timeout, Slurm, Kubernetes: clean up as on Ctrl-C
    try:
        _run_main(main, sys.argv[1:], resumable)
    finally:
        if own_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run_main(main, argv, resumable: bool) -> None:
    """:func:`run_cli`'s body: ``main(argv)`` with its errors and interrupts turned into one line and an exit code."""
    import sys

    from paddlenlp_ext.trainer.checkpoint import PREVIOUS_RUN_DIR, SaveError, list_checkpoints

    try:
        main(argv)
    except BrokenPipeError:  # `--help | head`: the reader left; end quietly with the shell's status for SIGPIPE
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(141) from None
    except (ValueError, FileNotFoundError, NotADirectoryError, SaveError) as e:
        if os.environ.get("PADDLENLP_EXT_TRACEBACK", "0") not in ("", "0"):
            raise
        config = next((a for a in sys.argv[1:2] if a.endswith(".json") and os.path.isfile(a)), None)
        where = f"config: {config}; " if config and config not in str(e) else ""
        print(f"error: {e}\n({where}PADDLENLP_EXT_TRACEBACK=1 shows the traceback)", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt as e:
        if os.environ.get("PADDLENLP_EXT_TRACEBACK", "0") not in ("", "0"):
            raise
        # checkpoints are written atomically, so the newest checkpoint-<step> in output_dir is complete
        hint = (": rerun the same command to resume from the latest checkpoint-<step> in output_dir (if one was "
                "saved), or add --overwrite_output_dir true to start over") if resumable else ""
        out = _RUN.get("output_dir") if resumable else None
        keep = os.path.join(out, PREVIOUS_RUN_DIR) if out else None
        if keep and os.path.isdir(keep):
            hint = (f": nothing was saved; the run that overwrite_output_dir replaced is kept in {keep} (move its "
                    "contents back to restore it); the same command starts over")
        elif resumable and _RUN.get("overwrite"):
            hint = (": rerun with overwrite_output_dir false to resume from the latest checkpoint-<step> in "
                    "output_dir (if one was saved); the same command starts over")
        elif out and not _RUN.get("resume") and not list_checkpoints(out):  # e.g. save_strategy "no" (LoRA)
            hint = (f": no checkpoint-<step> was saved in {out} yet (save_strategy / save_steps), so the same "
                    "command starts over")
        terminated = isinstance(e, _Terminated)
        print(f"{'terminated (SIGTERM)' if terminated else 'interrupted'}{hint}", file=sys.stderr)
        raise SystemExit(143 if terminated else 130) from None


def require_model_path(model_args) -> str:
    """``model_args.model_name_or_path``, or a ValueError saying what it may be."""
    if not model_args.model_name_or_path:
        raise ValueError("model_name_or_path is required: a local Hugging Face model directory, or "
                         "'HuggingFaceTB/SmolLM2-135M-Instruct' (the embedded default)")
    return model_args.model_name_or_path


def warn_if_longer_than_model(model, data_args, model_name_or_path: str) -> bool:
    """Warn once (rank 0) when the data's length key exceeds the model config's ``max_position_embeddings``.

    The key is ``max_length`` (SFT ``DataArgument``) or ``max_seq_len`` (DPO / RM data arguments): an example of
    up to that many tokens gets RoPE positions up to ``key - 1`` (positions restart per example in a pack), past the
    range the model was trained on when the key is larger. The warning names both keys, their values and the
    model's ``config.json`` (or the preset name); training goes on (PaddleNLP does not check this). Call it with
    the unwrapped model (before ``parallelize_model``), whose ``config`` is read. Returns True when it warned.
    """
    key = next((k for k in ("max_length", "max_seq_len") if hasattr(data_args, k)), None)
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if key is None or not isinstance(limit, int) or getattr(data_args, key) <= limit:
        return False
    if int(os.environ.get("RANK", "0")) != 0:
        return True
    from paddlenlp_ext.transformers import resolve_model_name_or_path
    from paddlenlp_ext.transformers.ernie35 import is_preset

    where = (f"the preset {model_name_or_path!r}" if is_preset(model_name_or_path)
             else os.path.join(resolve_model_name_or_path(model_name_or_path), "config.json"))
    value = getattr(data_args, key)
    logger.warning("%s=%d (data) is larger than max_position_embeddings=%d of the model (%s): examples longer "
                   "than %d tokens get RoPE positions %d..%d, past the range the model was trained on (quality "
                   "may drop). Lower %s to %d or less, or use a model configured for longer sequences", key, value,
                   limit, where, limit, limit, value - 1, key, limit)
    return True


def is_distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def lora_plus_optimizer(model, model_args, training_args, lora: bool):
    """AdamW with LoRA+ groups (``lr * lora_plus_scale`` for ``lora_B``) when LoRA is on and the scale is not 1;
    None otherwise (the trainer then builds its default AdamW). Build it after ``parallelize_model``."""
    if not (lora and model_args.lora_plus_scale != 1.0):
        return None
    from paddlenlp_ext.peft import lora_param_groups

    groups = lora_param_groups(model, training_args.learning_rate, model_args.lora_plus_scale,
                               training_args.weight_decay)
    return torch.optim.AdamW(groups, lr=training_args.learning_rate, eps=training_args.adam_epsilon,
                             betas=(training_args.adam_beta1, training_args.adam_beta2))


def save_adapter(trainer, model_args, output_dir: str) -> None:
    """PEFT-format adapter (``adapter_config.json`` + ``adapter_model.safetensors``) and the tokenizer.

    Under torchrun the adapter tensors are gathered whole from their FSDP/TP shards (``save_full_adapters``)
    and written by rank 0, so the file equals what one process would save.
    """
    from paddlenlp_ext.peft import save_lora
    from paddlenlp_ext.trainer.checkpoint import explain_tokenizer_write_errors, explain_write_errors

    with explain_write_errors(output_dir, "the LoRA adapter"):  # disk full: SaveError naming output_dir
        if is_distributed():
            from paddlenlp_ext.distributed.checkpoint import save_full_adapters

            save_full_adapters(trainer.model, output_dir, base_model_name_or_path=model_args.model_name_or_path)
        else:
            save_lora(trainer.model, output_dir, base_model_name_or_path=model_args.model_name_or_path)
    if trainer.dp.is_main and trainer.tokenizer is not None:
        with explain_tokenizer_write_errors(trainer.tokenizer, output_dir, "The adapter files"):
            trainer.tokenizer.save_pretrained(output_dir)
    from paddlenlp_ext.transformers.ernie35 import is_preset

    if is_preset(model_args.model_name_or_path) and not getattr(model_args, "merge_weights", False):
        logger.warning("the LoRA adapter in %s sits on the random-init preset %s, whose weights are never saved: it "
                       "cannot be merged or reloaded later (llm/merge_lora_params.py and predict.py refuse it). For "
                       "a usable result train with merge_weights: true (SFT) or on a saved model directory",
                       output_dir, model_args.model_name_or_path)


def resume_target(training_args, model_path: str | None = None):
    """Where ``Trainer.train`` resumes from, and what an existing ``output_dir`` means (all three launchers).

    - An explicit ``resume_from_checkpoint`` wins (PaddleNLP / Hugging Face rule).
    - Else, training without ``overwrite_output_dir``: the latest ``checkpoint-<step>`` of ``output_dir``
      (rerunning a job continues it; a checkpoint of another kind of job is refused by ``Trainer``). With no
      checkpoint but a final model already there (full weights or a LoRA adapter, whatever kind this run
      writes), ValueError: training would overwrite it silently, or leave a full model and an adapter side by
      side, which ``transformers`` (adapter applied) and ``predict.py`` (adapter ignored) read differently.
    - Else, with no checkpoint but ``output_dir/previous_run/`` (what an ``overwrite_output_dir`` run that was
      stopped before its first save moved aside: :func:`clear_previous_run`): ValueError, for the same reason;
      a plain run would delete it at its first save.
    - Training with ``overwrite_output_dir``: start over (None). The old run's outputs are removed later, by
      :func:`clear_previous_run` right before training, so that a mistake found while loading the model or the
      data leaves them in place.

    ``model_path``: the model being fine-tuned; an ``output_dir`` that is that directory is refused with
    ``overwrite_output_dir`` (its weights would be removed before they are loaded).

    Returns a checkpoint path, ``True``/a path string given by the user, or None (fresh start).
    """
    _RUN.update(output_dir=training_args.output_dir, overwrite=bool(training_args.overwrite_output_dir)
                and training_args.resume_from_checkpoint is None,
                resume=training_args.resume_from_checkpoint not in (None, False))
    if training_args.resume_from_checkpoint is not None:
        if training_args.overwrite_output_dir:
            logger.warning("resume_from_checkpoint=%s is given: it is resumed, and overwrite_output_dir removes "
                           "nothing (the Hugging Face rule)", training_args.resume_from_checkpoint)
        return training_args.resume_from_checkpoint
    if not training_args.do_train:
        return None
    from paddlenlp_ext.trainer.checkpoint import PREVIOUS_RUN_DIR, list_checkpoints

    out = training_args.output_dir
    ckpts = list_checkpoints(out)
    if training_args.overwrite_output_dir and ckpts and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        # the elastic agent restarted this worker group (launch --max_restarts): continue this run, do not start over
        logger.warning("restart %s of the worker group: resuming at %s (overwrite_output_dir applies to the first "
                       "attempt only)", os.environ["TORCHELASTIC_RESTART_COUNT"], ckpts[-1])
        _RUN["overwrite"] = False
        training_args.resume_from_checkpoint = str(ckpts[-1])  # and clear_previous_run leaves it in place
        return str(ckpts[-1])
    if training_args.overwrite_output_dir:
        if model_path and os.path.isdir(model_path) and os.path.isdir(out) and os.path.samefile(model_path, out):
            raise ValueError(f"output_dir {out} is the model directory being fine-tuned (model_name_or_path): "
                             "overwrite_output_dir would delete it; choose another output_dir")
        return None
    if ckpts:
        logger.info("Checkpoint detected, resuming training at %s (set overwrite_output_dir to start over)",
                    ckpts[-1])
        return str(ckpts[-1])
    keep = os.path.join(out, PREVIOUS_RUN_DIR)
    if os.path.isdir(keep):
        raise ValueError(f"output_dir {out} holds {PREVIOUS_RUN_DIR}/, the run that an interrupted "
                         "overwrite_output_dir run moved aside before it saved anything: rerun with "
                         "overwrite_output_dir true to train again (previous_run/ is deleted once the new run saves), "
                         f"or restore it first (mv {keep}/* {out}/ && rmdir {keep}), or choose another output_dir")
    final = _final_model_files(out)
    if final:
        raise ValueError(f"output_dir {out} already holds a trained model ({final[0]}) and no checkpoint to "
                         "resume: set overwrite_output_dir true to train again and replace it, or choose another "
                         "output_dir")
    return None


def clear_previous_run(training_args) -> None:
    """With ``do_train`` and ``overwrite_output_dir`` (and no ``resume_from_checkpoint``), move the old run's
    outputs out of the way (rank 0; logged): its ``checkpoint-*`` directories (left there, the next rerun
    would resume the old run, and ``save_total_limit`` would delete the new run's lower-numbered checkpoints
    before the old ones), its final weights of either kind with their config, ``merged/``, the TensorBoard
    ``runs/`` and the saved chat template (``chat_template.jinja`` / ``.json``: a tokenizer without one, trained with
    ``chat_template: none``, would not overwrite it, and transformers would load it back). Other tokenizer files
    and anything else stay. The launchers call it right before ``Trainer.train``, after
    the model and data have loaded, so a bad config, model path or data file never costs the previous model.

    They go to ``output_dir/previous_run/`` and are deleted by ``checkpoint.drop_previous_run`` once the new run has
    saved its first checkpoint or its final model, so a run that dies before that (out of memory, killed) leaves
    the previous model there to copy back. If ``previous_run/`` already exists, the run that moved it never saved
    anything: it still holds the last saved run and is kept, and that unsaved run's own files (``runs/``) are
    removed instead. (PaddleNLP's ``overwrite_output_dir`` only skips the resume; it leaves old checkpoints in
    place, where its rotation and a later resume can mix them with the new run's.)
    """
    if not (training_args.do_train and training_args.overwrite_output_dir) \
            or training_args.resume_from_checkpoint is not None:
        return
    from paddlenlp_ext.trainer.checkpoint import PREVIOUS_RUN_DIR, list_checkpoints

    out = training_args.output_dir
    old = [str(p) for p in list_checkpoints(out)] + _previous_outputs(out)
    if old and (not is_distributed() or torch.distributed.get_rank() == 0):
        import shutil

        keep = os.path.join(out, PREVIOUS_RUN_DIR)
        names = ", ".join(os.path.basename(p) for p in old)
        if os.path.isdir(keep):
            logger.warning("overwrite_output_dir=true: %s holds a run that an earlier overwrite replaced and that "
                           "run never saved; keeping it, removing the unsaved run's outputs: %s", keep, names)
            for p in old:
                shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
        else:
            logger.warning("overwrite_output_dir=true: moving the previous run's outputs (%s) to %s; they are "
                           "deleted once this run saves its first checkpoint or its final model", names, keep)
            os.makedirs(keep)
            for p in old:
                os.replace(p, os.path.join(keep, os.path.basename(p)))
    if is_distributed():
        torch.distributed.barrier()


def _previous_outputs(output_dir: str) -> list[str]:
    """Paths of a finished run's outputs in ``output_dir`` (weights of either kind, their configs, ``merged/``,
    ``runs/``, the chat template files), for ``overwrite_output_dir``."""
    from paddlenlp_ext.peft.lora import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME
    from paddlenlp_ext.transformers.model_utils import CONFIG_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

    if not os.path.isdir(output_dir):
        return []
    names = {CONFIG_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME, ADAPTER_WEIGHTS_NAME, ADAPTER_CONFIG_NAME, "merged", "runs",
             "chat_template.jinja", "chat_template.json"}  # the new run's tokenizer writes its own template, if any
    return sorted(os.path.join(output_dir, n) for n in os.listdir(output_dir)
                  if n in names or (n.startswith("model-") and n.endswith(".safetensors")))


def _final_model_files(output_dir: str, lora: bool | None = None) -> list[str]:
    """Final-model weight files in ``output_dir``: a LoRA adapter's (``lora=True``), a full model's (False), or
    either (None)."""
    from paddlenlp_ext.peft.lora import ADAPTER_WEIGHTS_NAME
    from paddlenlp_ext.transformers.model_utils import WEIGHTS_INDEX_NAME, WEIGHTS_NAME

    full, adapter = (WEIGHTS_NAME, WEIGHTS_INDEX_NAME), (ADAPTER_WEIGHTS_NAME,)
    names = adapter if lora else full if lora is False else full + adapter
    return [n for n in names if os.path.isfile(os.path.join(output_dir, n))]


def keep_final_model(result: dict, output_dir: str, lora: bool = False) -> bool:
    """True when this call trained nothing (it resumed a checkpoint already at ``max_steps``) and ``output_dir``
    already holds a final model (``model.safetensors`` / its index, or ``adapter_model.safetensors`` for LoRA):
    saving again would overwrite it with the checkpoint's weights, which may be older (a run trained further
    before, with a larger ``max_steps``). Logs a warning when it keeps the model."""
    if result.get("train_runtime"):  # > 0 exactly when a step ran in this call: save
        return False
    found = _final_model_files(output_dir, lora)
    if found:
        logger.warning("nothing trained in this run: the final model already in %s (%s) is kept, not overwritten "
                       "with the checkpoint's weights", output_dir, found[0])
    return bool(found)


def used_splits(training_args) -> list[str]:
    """The data splits a launch reads: ``train`` with ``do_train``; ``dev`` with ``do_eval``, or when training
    evaluates on the way (``evaluation_strategy`` steps/epoch: Hugging Face and PaddleNLP evaluate then whatever
    ``do_eval`` says). A split not listed is never read, so a broken or empty file there stops nothing."""
    strategy = str(getattr(training_args, "evaluation_strategy", "no")).split(".")[-1].lower()
    evaluates = training_args.do_eval or (training_args.do_train and strategy not in ("no", "none", ""))
    return [s for s, used in (("train", training_args.do_train), ("dev", evaluates)) if used]


def train_summary(result: dict) -> dict:
    """The summary fields of ``Trainer.train``'s result (loss and tokens/s are None when nothing trained), plus
    ``best_model_checkpoint`` / ``best_metric`` / ``best_global_step`` when the run ended on its best checkpoint
    (``load_best_model_at_end``)."""
    out = dict(global_step=result["global_step"], train_loss=result["train_loss"],
               train_tokens_per_sec=result["tokens_per_sec"], train_runtime_s=result["train_runtime"])
    out.update(result.get("best") or {})
    return out


def train_and_evaluate(trainer, training_args, train_ds, resume, do_eval: bool, summary: dict, eval_keys, save,
                       lora: bool = False) -> dict:
    """The train / save / evaluate tail of the preference launchers (DPO, RM), filling ``summary``: train
    (``evaluate_first`` when ``do_eval``: ``dev_before`` is measured after a resumed checkpoint has loaded, before
    the first new step), ``save()`` the final model unless benchmarking or the call trained nothing over an
    existing final model (:func:`keep_final_model`), then ``dev_after``; the dev metrics are those of
    ``eval_keys``, rounded to 5 digits. Returns ``summary``.

    Raises:
        ValueError: ``do_train`` without a training set.
    """
    def pick(metrics: dict) -> dict:
        return {k: round(float(metrics[k]), 5) for k in eval_keys if k in metrics}

    if training_args.do_train:
        if train_ds is None:
            raise ValueError("do_train=true needs train_dataset_path")
        clear_previous_run(training_args)  # overwrite_output_dir: only now that all has loaded
        result = trainer.train(resume_from_checkpoint=resume, evaluate_first=do_eval)
        if result["eval_before"] is not None:
            summary["dev_before"] = pick(result["eval_before"])
        summary.update(train_summary(result))
        if not (training_args.benchmark or training_args.autotuner_benchmark
                or keep_final_model(result, training_args.output_dir, lora)):
            save()
            summary["saved_to"] = os.path.abspath(training_args.output_dir)
    if do_eval:
        summary["dev_after"] = pick(trainer.evaluate())
    return summary


def finish(summary: dict, trainer, start: float) -> dict:
    """Add the wall time, print the ``[summary]`` JSON line (rank 0), tear down the process group."""
    summary["wall_time_s"] = round(time.perf_counter() - start, 1)
    if trainer.dp.is_main:
        print("[summary] " + json.dumps(summary, ensure_ascii=False), flush=True)
    if is_distributed():
        torch.distributed.destroy_process_group()
    return summary
