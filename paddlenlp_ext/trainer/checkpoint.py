"""Training checkpoints: ``output_dir/checkpoint-<step>/``, written atomically, resumable bit-for-bit.

Layout of one checkpoint (all ranks write into ``checkpoint-<step>.tmp``; rank 0 renames it with
``os.replace`` once every rank is done, and only then rotates old checkpoints):

- ``distcp/``: model and optimizer states through ``torch.distributed.checkpoint`` (DCP) with
  ``get_state_dict`` / ``set_state_dict``, so the same code saves a single-process model, FSDP2 shards or TP
  DTensors (each rank writes its own ``__<rank>_0.distcp``).
- ``scheduler.pt``: the LR scheduler's ``state_dict``.
- ``rng_state_<rank>.pth``: python, numpy, torch CPU and CUDA generator states of that rank.
- ``data_state_<rank>.pt``: data position (epoch and micro-batches consumed in that epoch).

These three pickles are read with ``torch.load(weights_only=True)`` (:func:`load_plain_pickle`): containers,
numbers, strings, tensors and numpy's uint32 RNG key array, nothing else, so a checkpoint directory from
elsewhere cannot run code on resume; one asking for any other global is refused naming the file.
- ``trainer_state.json``: global step, epoch, log history (losses), max_steps.

PaddleNLP writes ``model_state.pdparams``/``optimizer.pdopt``/``rng_state_*.pth``/``trainer_state.json``
(``paddlenlp/trainer/trainer.py::_save_checkpoint``) or its unified-checkpoint safetensors; we keep its names for
the RNG and trainer-state files and use DCP for tensors. The final model is saved separately by
``Trainer.save_model`` as a Hugging Face directory.

A write that fails with an OS error (disk full, quota, permissions), in a checkpoint or, through
:func:`explain_write_errors`, in the final model, raises :class:`SaveError`: one message naming the directory,
the errno, what is still intact and the fix, chained to the writer's own error (DCP's ``CheckpointException``,
safetensors' ``SafetensorError`` or torch's ``RuntimeError`` otherwise).
"""

from __future__ import annotations

import contextlib
import errno as errno_mod
import json
import logging
import os
import random
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

logger = logging.getLogger(__name__)

PREFIX = "checkpoint"
_CKPT_RE = re.compile(rf"^{PREFIX}-(\d+)$")
TRAINER_STATE = "trainer_state.json"


def _dist_on() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _dist_on() else 0


def _barrier() -> None:
    if _dist_on():
        dist.barrier()


class SaveError(OSError):
    """A checkpoint or final-model write failed with an OS error (``ENOSPC`` disk full, ``EDQUOT``, ``EACCES``, ...).

    ``errno`` is the original error's number (None when the writer did not report one, e.g. torch.save's stream
    errors); the message names the directory, what is still intact and the fix. Always raised ``from`` the
    writer's own exception. Launchers print it as one ``error:`` line (``launch.run_cli``).
    """

    def __str__(self) -> str:  # the message alone: it names the errno itself ("[Errno None]" would be noise)
        return self.strerror or super().__str__()


# safetensors' Rust writer reports "I/O error: No space left on device (os error 28)" in a SafetensorError
_OS_ERROR_RE = re.compile(r"\(os error (\d+)\)")
# torch.save's C++ stream writer loses the errno: "PytorchStreamWriter failed writing file ...: file write
# failed", or (a full disk, torch 2.13) "unexpected pos 576 vs 534" raised from "basic_ios::clear: iostream error"
_TORCH_WRITE_RE = re.compile(r"PytorchStreamWriter failed writing|file write failed|iostream error|unexpected pos \d+")


def _chain(exc: BaseException):
    """``exc`` and every exception it wraps: ``__cause__`` / ``__context__`` and DCP's ``failures``."""
    todo, seen = [exc], set()
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
        todo += [e.__cause__, e.__context__]


def reraise_interrupt(exc: BaseException) -> None:
    """Raise a ``KeyboardInterrupt`` (chained to ``exc``, of the same class as the one found: a SIGTERM is
    ``launch._Terminated``) when a Ctrl-C or SIGTERM is anywhere in ``exc``'s chain.

    A Ctrl-C inside ``torch.save`` surfaces as the stream writer's ``RuntimeError`` ("unexpected pos ...") with the
    KeyboardInterrupt as its context, or wrapped in DCP's ``CheckpointException``: it is an interrupt, not a full
    disk, and the launchers print it as one line (``run_cli``)."""
    if isinstance(exc, KeyboardInterrupt):
        raise exc
    found = next((e for e in _chain(exc) if isinstance(e, KeyboardInterrupt)), None)
    if found is not None:
        raise type(found)() from exc


def write_failure(exc: BaseException) -> tuple[int | None, str] | None:
    """``(errno or None, description)`` when ``exc`` is (or wraps) an OS-level write failure, else None.

    Looks through ``__cause__`` / ``__context__`` chains and DCP's ``CheckpointException.failures``
    (``{rank: (exception, traceback)}``), and reads the ``(os error N)`` of safetensors' errors and torch.save's
    stream-writer errors (which carry no errno). Anything else (a bug, KeyboardInterrupt) gives None.
    """
    for e in _chain(exc):
        if isinstance(e, OSError):
            return e.errno, e.strerror or str(e)
        if isinstance(e, Exception):
            text = str(e)
            m = _OS_ERROR_RE.search(text)
            if m:
                return int(m.group(1)), os.strerror(int(m.group(1)))
            if isinstance(e, RuntimeError) and _TORCH_WRITE_RE.search(text):
                return None, f"torch.save could not write ({text.strip().splitlines()[0][:120]})"
    return None


def _dir_mib(path: Path) -> float:
    total = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return total / 2**20


def save_error_message(what: str, target: str | os.PathLike, err_no: int | None, detail: str, intact: str,
                       size_hint: str = "", after: str = "run again") -> str:
    """The :class:`SaveError` text: what failed where, the errno (by name), free space now, what is intact, the fix
    (``after`` says what to do once there is room)."""
    target = Path(target)
    name = f"errno {errno_mod.errorcode.get(err_no, err_no)}: " if err_no is not None else ""
    probe = next((p for p in (target, *target.parents) if p.exists()), None)
    free = ""
    if probe is not None:
        with contextlib.suppress(OSError):
            left = shutil.disk_usage(probe).free
            free = f"; {left / 2**20:.1f} MiB" if left >= 2**20 else f"; {left // 1024} KiB"
            free += " free there now"
    full = err_no in (errno_mod.ENOSPC, getattr(errno_mod, "EDQUOT", -1)) or err_no is None
    fix = ("free disk space (or raise the quota), or point output_dir at a disk with room" if full else
           "make the directory writable, or point output_dir somewhere writable")
    if after != "run again":  # the fix happens in this directory (e.g. the tokenizer of a kept final model)
        fix = fix.split(", or point output_dir")[0]
    return f"could not write {what} to {target} ({name}{detail}{free}). {intact} Fix: {fix}{size_hint}, then {after}."


FINAL_MODEL_INTACT = ("Nothing is half-written: the new files go to a temporary directory beside it, removed now, "
                      "and are moved in only when complete, so the files already there are untouched.")


@contextlib.contextmanager
def explain_write_errors(target: str | os.PathLike, what: str, intact: str = FINAL_MODEL_INTACT,
                         after: str = "run again"):
    """Turn an OS-level write failure inside the block into :class:`SaveError` (see :func:`write_failure`).

    Args:
        target: the directory being written (named in the message).
        what: e.g. ``"the final model"``.
        intact: a sentence saying what the failure left untouched (true for the caller's write path; the
            default is that of ``model_utils.atomic_save_dir``, used by every final-model and adapter save).
        after: what to do once there is room.

    Other exceptions pass through unchanged.
    """
    try:
        yield
    except BaseException as e:  # DCP's CheckpointException derives from BaseException
        reraise_interrupt(e)
        failure = write_failure(e)
        if failure is None or isinstance(e, SaveError):
            raise
        raise SaveError(failure[0], save_error_message(what, target, failure[0], failure[1], intact,
                                                       after=after)) from e


def explain_tokenizer_write_errors(tokenizer, output_dir: str | os.PathLike,
                                   written: str = "The model weights and config.json"):
    """:func:`explain_write_errors` for ``tokenizer.save_pretrained(output_dir)`` after the final model (whose
    files ``written`` names): the tokenizer files are written in place (not atomically), and a rerun keeps an
    existing final model without saving again, so the message gives the command that writes them."""
    src = getattr(tokenizer, "name_or_path", "") or "<tokenizer_name_or_path>"
    return explain_write_errors(
        output_dir, "the tokenizer files",
        intact=f"{written} there are complete (written before, atomically); the tokenizer files may be incomplete.",
        after=(f'write them with: python -c "from paddlenlp_ext.transformers import AutoTokenizer; '
               f"AutoTokenizer.from_pretrained('{src}').save_pretrained('{output_dir}')\""))

def checkpoint_step(path: str | os.PathLike) -> int | None:
    """The step of a ``checkpoint-<step>`` directory path, or None when its name is not of that form."""
    m = _CKPT_RE.match(Path(path).name)
    return int(m.group(1)) if m else None


def export_command(path: str | os.PathLike) -> str:
    """The command that turns the training checkpoint ``path`` into a final model (or LoRA adapter) directory:
    resuming it with ``max_steps`` at its step trains nothing and writes the final model to the new
    ``output_dir``. Used by the tools that refuse a checkpoint where a model is needed (predict, merge)."""
    step = checkpoint_step(path)
    return (f"python llm/run_finetune.py <config> --resume_from_checkpoint {path} --max_steps "
            f"{step if step is not None else '<step>'} --output_dir <new dir>")


PREVIOUS_RUN_DIR = "previous_run"  # output_dir/previous_run: a replaced run, kept until the new run's first save


def drop_previous_run(output_dir: str | os.PathLike) -> None:
    """Delete ``output_dir/previous_run/`` (``launch.clear_previous_run``: what ``overwrite_output_dir`` moved
    aside) if it exists; the Trainer calls it on rank 0 right after a checkpoint or the final model is complete."""
    keep = Path(output_dir) / PREVIOUS_RUN_DIR
    if keep.is_dir():
        shutil.rmtree(keep)
        logger.info("removed %s (the run that overwrite_output_dir replaced): this run has saved", keep)


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """Completed checkpoints ``output_dir/checkpoint-<step>`` sorted by step (``*.tmp`` dirs are ignored)."""
    out = Path(output_dir)
    if not out.is_dir():
        return []
    found = [(step, p) for p in out.iterdir() if p.is_dir() and (step := checkpoint_step(p)) is not None]
    return [p for _, p in sorted(found)]


def resolve_resume_path(resume_from_checkpoint: Any, output_dir: str | os.PathLike) -> Path | None:
    """Turn ``resume_from_checkpoint`` (None/False, True/"true", or a path) into a checkpoint directory.

    True means the latest ``checkpoint-<step>`` in ``output_dir``; none found is an error (as PaddleNLP:
    "No valid checkpoint found in output directory"). Raises ValueError for a path that is not a checkpoint.
    """
    if resume_from_checkpoint in (None, False, "", "false", "False", "none", "None"):
        return None
    if resume_from_checkpoint is True or str(resume_from_checkpoint).lower() == "true":
        ckpts = list_checkpoints(output_dir)
        if not ckpts:
            raise ValueError(f"resume_from_checkpoint=true but no checkpoint-<step> directory in {output_dir}; "
                             "train without it or pass a checkpoint path")
        return ckpts[-1]
    path = Path(resume_from_checkpoint)
    if not (path / TRAINER_STATE).is_file():
        raise ValueError(f"resume_from_checkpoint={resume_from_checkpoint!r}: {path / TRAINER_STATE} does not "
                         "exist; pass a checkpoint-<step> directory written by this trainer, or true")
    return path


def _numpy_array_globals() -> list:
    """What unpickling the numpy RNG state's key array (``ndarray`` of uint32) needs, under both of numpy's module
    names (``numpy.core`` before 2.0, ``numpy._core`` since), so a checkpoint pickled under either loads."""
    core = getattr(np, "_core", None) or np.core
    reconstruct = core.multiarray._reconstruct
    return [reconstruct, (reconstruct, "numpy.core.multiarray._reconstruct"),
            (reconstruct, "numpy._core.multiarray._reconstruct"), np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def load_plain_pickle(path: str | os.PathLike) -> Any:
    """``torch.load(path, weights_only=True)`` with numpy's uint32 array allowed: the plain types a checkpoint's
    ``scheduler.pt``, ``rng_state_<rank>.pth`` and ``data_state_<rank>.pt`` hold (dicts, lists, tuples, numbers,
    strings, None, tensors, the numpy RNG key array).

    Raises ValueError naming the file and the globals its pickle asks for when it asks for anything else (a
    pickle can call any function on load: ``os.system`` in a checkpoint from elsewhere would run on resume).
    PaddleNLP and Hugging Face load these files with ``weights_only=False``.
    """
    import pickle

    from torch import serialization

    try:
        with serialization.safe_globals(_numpy_array_globals()):
            return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        try:
            asked = ", ".join(serialization.get_unsafe_globals_in_checkpoint(path)) or "an unsupported object"
        except Exception:  # not a torch zip file at all
            asked = "an unsupported object"
        raise ValueError(f"refusing to load {path}: its pickle asks for {asked}, which no checkpoint of this trainer "
                         "holds (only numbers, strings, containers and tensors), and unpickling it could run code. "
                         "Resume only checkpoints you wrote: delete this checkpoint directory, or start over with "
                         "overwrite_output_dir true") from e


# globals DCP's ``distcp/.metadata`` pickle names besides its own dataclasses and enums (torch 2.11-2.13)
_DCP_METADATA_GLOBALS = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
                         ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"), ("pathlib", "PureWindowsPath"),
                         ("collections", "OrderedDict")}


def check_dcp_metadata(distcp_dir: str | os.PathLike) -> None:
    """Refuse a ``distcp/.metadata`` whose pickle names anything but DCP's metadata types.

    ``torch.distributed.checkpoint`` reads that file with a plain ``pickle.load`` (torch 2.13); here it is first
    unpickled by a restricted unpickler that resolves only DCP's dataclasses and enums, torch dtypes, ``torch.Size``,
    torch's layout lookup and ``pathlib`` paths, so a crafted checkpoint is refused before DCP unpickles it.
    Raises ValueError naming the file and the global it asked for.
    """
    import dataclasses
    import enum
    import importlib
    import pickle

    meta = Path(distcp_dir) / ".metadata"
    if not meta.is_file():
        return  # DCP reports a missing file itself

    class Restricted(pickle.Unpickler):
        def find_class(self, module, name):
            obj = None
            if (module, name) in _DCP_METADATA_GLOBALS:
                obj = getattr(importlib.import_module(module), name)
            elif module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
                obj = getattr(torch, name)
            elif module.startswith("torch.distributed.checkpoint.") and "." not in name:
                found = getattr(importlib.import_module(module), name, None)
                if isinstance(found, type) and (dataclasses.is_dataclass(found) or issubclass(found, enum.Enum)):
                    obj = found
            if obj is None:
                raise ValueError(f"refusing to load {meta}: its pickle asks for {module}.{name}, which no "
                                 "torch.distributed.checkpoint metadata holds, and unpickling it could run code. "
                                 "Resume only checkpoints you wrote: delete this checkpoint directory, or start "
                                 "over with overwrite_output_dir true")
            return obj

    with open(meta, "rb") as f:
        try:
            Restricted(f).load()
        except ValueError:
            raise
        except Exception as e:
            raise ValueError(f"{meta} is not a readable torch.distributed.checkpoint metadata file ({e}); delete "
                             "this checkpoint directory, or start over with overwrite_output_dir true") from e


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["cpu"])
    if torch.cuda.is_available() and "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(output_dir: str | os.PathLike, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, scheduler, trainer_state: dict[str, Any],
                    data_state: dict[str, Any], save_total_limit: int | None = None,
                    keep: str | os.PathLike | None = None) -> Path:
    """Write ``output_dir/checkpoint-<step>`` atomically; collective when torch.distributed is initialised.

    Args:
        trainer_state: JSON-serialisable dict (global_step, epoch, log_history, ...).
        data_state: this rank's data position (any ``torch.save``-able dict).
        save_total_limit: keep at most this many checkpoints of steps <= ``step`` (oldest removed), only after the
            new one is in place; checkpoints of later steps (an abandoned run resumed from an earlier checkpoint)
            are left alone.
        keep: a checkpoint rotation never removes (the best one, ``load_best_model_at_end``); it counts toward
            ``save_total_limit`` unless the limit is 1, where it is kept beside the newest (Hugging Face's rule).

    Returns the final checkpoint path. On any error the temporary directory is removed (best effort) and the
    exception re-raised, so no half-written ``checkpoint-<step>`` ever exists and older checkpoints are untouched.

    Raises:
        SaveError: an OS-level write failure (disk full: ``errno.ENOSPC``), with the directory, what is intact
            and the fix; chained to the writer's error. Other errors propagate unchanged.
    """
    out = Path(output_dir)
    try:
        return _save_checkpoint(out, step, model, optimizer, scheduler, trainer_state, data_state, save_total_limit,
                                keep)
    except BaseException as e:  # DCP's CheckpointException derives from BaseException
        reraise_interrupt(e)
        failure = write_failure(e)
        if failure is None:
            raise
        name = f"{PREFIX}-{step}"
        previous = [p for p in list_checkpoints(out) if p.name != name]  # the failed save left no checkpoint
        if previous:
            intact = (f"The temporary {name}.tmp was removed and the previous checkpoint {previous[-1]} is intact "
                      "(a checkpoint is renamed into place only when complete; older ones are rotated out only "
                      "after), so a rerun resumes from it.")
            size_hint = f" (the last checkpoint takes {_dir_mib(previous[-1]):.1f} MiB)"
        else:
            intact = (f"The temporary {name}.tmp was removed; there is no earlier checkpoint in {out}, so a rerun "
                      "starts from step 0.")
            size_hint = ""
        msg = save_error_message(f"checkpoint {name}", out, failure[0], failure[1], intact, size_hint)
        raise SaveError(failure[0], msg) from e


def _save_checkpoint(out: Path, step: int, model, optimizer, scheduler, trainer_state, data_state,
                     save_total_limit, keep=None) -> Path:
    final = out / f"{PREFIX}-{step}"
    tmp = out / f"{PREFIX}-{step}.tmp"
    rank = _rank()
    try:
        if rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)  # a write interrupted by a crash
            tmp.mkdir()
        _barrier()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*assuming the intent is to save in a single process.*")
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / "distcp"))
        torch.save(_rng_state(), tmp / f"rng_state_{rank}.pth")
        torch.save(data_state, tmp / f"data_state_{rank}.pt")
        if rank == 0:
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
            (tmp / TRAINER_STATE).write_text(json.dumps(trainer_state, indent=2))
        _barrier()
        if rank == 0:
            if final.exists():  # re-saving the same step: swap out the old copy
                old = out / f"{PREFIX}-{step}.old"
                os.replace(final, old)
                os.replace(tmp, final)
                shutil.rmtree(old)
            else:
                os.replace(tmp, final)
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # a full disk gets its space back
        raise
    _barrier()
    if rank == 0 and save_total_limit is not None and save_total_limit > 0:
        # rotate among this run's steps only: after a resume from an earlier checkpoint, a later-step one left by
        # the abandoned run sorted last, so the checkpoint just written was the one removed (and a rerun resumed
        # the abandoned run); later-step checkpoints stay until this run overwrites them
        mine = [c for c in list_checkpoints(out) if checkpoint_step(c) <= step]
        kept = Path(keep).name if keep else None
        others = [c for c in mine if c.name != kept]
        newest = max(save_total_limit - (1 if kept and len(others) < len(mine) else 0), 1)
        for old_ckpt in others[:-newest]:
            shutil.rmtree(old_ckpt, ignore_errors=True)
    _barrier()
    return final


def load_model_weights(path: str | os.PathLike, model: torch.nn.Module) -> None:
    """Load only the model weights of checkpoint ``path`` (``distcp/``) into ``model``; collective when
    torch.distributed is initialised (FSDP shards and TP DTensors reshard through DCP). The optimizer is left as
    it is. Used to end a run on its best checkpoint (``load_best_model_at_end``)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    path = Path(path)
    check_dcp_metadata(path / "distcp")
    state = {"model": get_model_state_dict(model)}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")
        dcp.load(state, checkpoint_id=str(path / "distcp"))
    set_model_state_dict(model, state["model"])


def load_checkpoint(path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Restore model, optimizer, scheduler and RNG from ``path``; return ``(trainer_state, data_state)``.

    ``data_state`` is this rank's saved data position, or None when the checkpoint has no file for this rank
    (written with a smaller world size): a warning is issued, RNG is not restored and the caller falls back to
    the epoch / micro-batch count of ``trainer_state.json``. Model and optimizer states reshard through DCP.
    Raises ValueError when ``path`` is not a checkpoint directory, or holds the state of another model or
    parameter set (e.g. a full fine-tune's checkpoint resumed by a LoRA run), or when one of its pickles asks for
    more than plain types (:func:`load_plain_pickle`; checked before anything is loaded).
    """
    path = Path(path)
    if not (path / TRAINER_STATE).is_file() or not (path / "distcp").is_dir():
        raise ValueError(f"{path} is not a complete checkpoint (needs {TRAINER_STATE} and distcp/)")
    rank = _rank()
    # the pickles first: a refused one (load_plain_pickle) stops the resume before any weight is touched
    scheduler_state = load_plain_pickle(path / "scheduler.pt")
    rng_file, data_file = path / f"rng_state_{rank}.pth", path / f"data_state_{rank}.pt"
    rng_state = data_state = None
    if rng_file.is_file() and data_file.is_file():
        rng_state, data_state = load_plain_pickle(rng_file), load_plain_pickle(data_file)
    check_dcp_metadata(path / "distcp")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")
        try:
            dcp.load(state, checkpoint_id=str(path / "distcp"))
        except (RuntimeError, CheckpointException) as e:  # DCP's missing / unexpected keys, shape mismatches
            first = next((ln.strip() for ln in str(e).splitlines() if "Missing key" in ln or "mismatch" in ln),
                         str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
            raise ValueError(
                f"checkpoint {path} does not match this model and optimizer ({first[:300]}): it was written by "
                "another run (e.g. full fine-tuning vs LoRA, another model). Use another output_dir, set "
                "overwrite_output_dir true to start over, or name the right resume_from_checkpoint") from e
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    scheduler.load_state_dict(scheduler_state)
    trainer_state = json.loads((path / TRAINER_STATE).read_text())
    if rng_state is not None:
        _set_rng_state(rng_state)
    else:
        warnings.warn(f"{path} has no RNG/data state for rank {rank} (saved with another world size?); "
                      "the data position comes from trainer_state.json (rank 0's count) and RNG is not restored")
    return trainer_state, data_state
