"""``python -m paddlenlp_ext.distributed.launch [flags] llm/run_finetune.py config.json [--key value ...]``.

The flags and behaviour of ``paddle.distributed.launch`` (PaddleNLP's launch form) on ``torch.distributed.run``'s
elastic agent (``torch.distributed.launcher.api.elastic_launch``); the agent starts, watches, restarts and stops
the workers, this module only turns Paddle's flags into its ``LaunchConfig`` and reports the outcome:

- ``--gpus 0,1`` / ``--devices 0,1``: ``CUDA_VISIBLE_DEVICES`` and one process per listed device; a device the
  machine lacks is one ``error:`` line. Without it: ``--nproc_per_node`` processes (default: every CUDA device,
  else 1), gloo on a CPU machine.
- ``--nnodes N --master HOST:PORT [--rank R]``: multi-node rendezvous at ``--master`` (the same on every node):
  torch's ``static`` rendezvous with ``--rank`` as the node rank, or ``c10d`` (node ranks assigned on arrival)
  without ``--rank`` or with ``--max_restarts`` (a static group cannot be re-formed after a failure). One node:
  ``c10d`` on a free local port (``torchrun --standalone``).
- ``--log_dir DIR`` (default ``log``, as Paddle): ``DIR/workerlog.<global rank>`` per process (stdout and stderr
  together), through a ``LogsSpecs`` of the agent's; local rank 0 is also streamed to the terminal (the agent's
  tee). A restarted worker's earlier log is kept as ``workerlog.<rank>.<attempt>``.
- ``--max_restarts N``: the agent restarts the whole group after a worker dies; the launchers resume from the
  newest complete checkpoint (``TORCHELASTIC_RESTART_COUNT`` > 0 also overrides ``overwrite_output_dir``). Each
  restarted group gets a fresh c10d store (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``), not the dead group's keys.
- A failure ends with the failing rank's exit status (128 + signal for a killed one) and one ``launch:`` line
  naming it and its log, after the tail of that log unless the terminal already showed it (local rank 0). A config
  or data error is therefore the worker's one ``error:`` line, not once per rank plus the agent's traceback.

Not named ``paddle...``: a ``paddle`` package of ours would shadow a real PaddlePaddle install. A Paddle command
becomes ours by one word: ``python -m paddle.distributed.launch`` -> ``python -m paddlenlp_ext.distributed.launch``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import uuid

WORKER_LOG = "workerlog"
TAIL_LINES = 20


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m paddlenlp_ext.distributed.launch",
        description="paddle.distributed.launch's flags on torch.distributed.run's elastic agent. Example: python -m "
                    "paddlenlp_ext.distributed.launch --gpus 0,1 llm/run_finetune.py config/smollm2/sft.json")
    p.add_argument("--gpus", "--devices", dest="gpus", default=None,
                   help="CUDA devices to use, e.g. 0,1,2,3 (one process each; sets CUDA_VISIBLE_DEVICES)")
    p.add_argument("--nproc_per_node", type=int, default=None,
                   help="processes on this node (default: the --gpus count, else every CUDA device, else 1)")
    p.add_argument("--nnodes", type=int, default=1, help="number of nodes (needs --master when > 1)")
    p.add_argument("--master", default=None, help="HOST:PORT of the rendezvous, the same on every node")
    p.add_argument("--rank", type=int, default=None, help="this node's rank in [0, nnodes) (static rendezvous)")
    p.add_argument("--log_dir", default="log", help="directory of the workerlog.<rank> files (default: log)")
    p.add_argument("--max_restarts", type=int, default=0,
                   help="restarts of the worker group after a failure; training resumes from the last checkpoint")
    p.add_argument("--job_id", default=None, help="rendezvous id, the same on every node (default: from --master)")
    p.add_argument("script", help="the training script, e.g. llm/run_finetune.py")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments (config.json, --key value ...)")
    return p


class LaunchError(ValueError):
    """A launch flag that cannot work; printed as one ``error:`` line."""


def _devices(gpus: str) -> list[str]:
    """The ``--gpus`` list, checked against ``torch.cuda.device_count()`` (LaunchError naming the missing ones)."""
    import torch

    ids = [g.strip() for g in str(gpus).split(",") if g.strip()]
    if not ids or not all(g.isdigit() for g in ids):
        raise LaunchError(f"--gpus {gpus!r}: give device numbers separated by commas, e.g. --gpus 0,1")
    if len(set(ids)) != len(ids):
        raise LaunchError(f"--gpus {gpus!r} names a device twice")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    missing = [g for g in ids if int(g) >= count]
    if missing:
        have = f"devices 0-{count - 1}" if count else "no CUDA device"
        raise LaunchError(f"--gpus {gpus}: device {', '.join(missing)} does not exist (this machine has {have}); "
                          + ("list existing devices" if count else "on a CPU machine use --nproc_per_node N (gloo)"))
    return ids


def launch_config(args):
    """``(LaunchConfig, env)``: the elastic agent's configuration for the parsed flags, and the environment the
    agent and workers need (``CUDA_VISIBLE_DEVICES``; with restarts, a fresh store per rendezvous round). Raises
    LaunchError for flags that cannot work."""
    from torch.distributed.launcher.api import LaunchConfig

    env = {}
    nproc = args.nproc_per_node
    if args.gpus is not None:
        ids = _devices(args.gpus)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
        if nproc is not None and nproc != len(ids):
            raise LaunchError(f"--nproc_per_node {nproc} and --gpus {args.gpus} ({len(ids)} devices) disagree; "
                              "give one of them")
        nproc = len(ids)
    if nproc is None:
        import torch

        nproc = max(torch.cuda.device_count(), 1) if torch.cuda.is_available() else 1
    if nproc < 1:
        raise LaunchError(f"--nproc_per_node must be >= 1, got {nproc}")
    if args.nnodes < 1:
        raise LaunchError(f"--nnodes must be >= 1, got {args.nnodes}")
    if args.nnodes > 1 and not args.master:
        raise LaunchError(f"--nnodes {args.nnodes} needs --master HOST:PORT, the rendezvous address given to every "
                          "node (e.g. the first node's IP and a free port)")
    if args.rank is not None and not 0 <= args.rank < args.nnodes:
        raise LaunchError(f"--rank {args.rank} is not in [0, --nnodes {args.nnodes})")
    if args.master and (":" not in args.master or not args.master.rsplit(":", 1)[1].isdigit()):
        raise LaunchError(f"--master {args.master!r}: give HOST:PORT, e.g. 10.0.0.1:8090")
    if args.max_restarts < 0:
        raise LaunchError(f"--max_restarts must be >= 0, got {args.max_restarts}")
    if not os.path.isfile(args.script):
        raise LaunchError(f"{args.script}: no such script (paths are read from the current directory {os.getcwd()})")
    # torch's static rendezvous keeps one store prefix across restarts (the restarted group would read the dead
    # group's gloo addresses), so restarts, and nodes without --rank, use c10d, as torchrun --standalone does
    static = args.rank is not None and args.max_restarts == 0 and args.nnodes > 1
    if not static and args.max_restarts > 0 and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in os.environ:
        # c10d's agent hands the workers one TCPStore for every rendezvous round, and init_process_group adds no
        # per-attempt prefix: a restarted group reads the dead group's keys (gloo's rank_<r> addresses, NCCL ids)
        # and connects to closed ports or waits forever (pytorch#135712). Opting out of the shared store gives
        # each round a fresh store on a new port, hosted by worker rank 0, as torchrun did before torch 2.5.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    endpoint = args.master or "localhost:0"
    run_id = args.job_id or (f"paddlenlp_ext-{endpoint.replace(':', '-')}" if args.master else uuid.uuid4().hex[:8])
    config = LaunchConfig(
        min_nodes=args.nnodes, max_nodes=args.nnodes, nproc_per_node=nproc, run_id=run_id, role="",
        rdzv_endpoint=endpoint, rdzv_backend="static" if static else "c10d",
        rdzv_configs={"rank": args.rank or 0} if static else {}, max_restarts=args.max_restarts,
        monitor_interval=0.5, logs_specs=worker_logs(args.log_dir),
        log_line_prefix_template="${role_name}")  # role "": rank 0's lines reach the terminal as printed
    return config, env


def worker_logs(log_dir: str):
    """The agent's ``LogsSpecs``: Paddle's ``workerlog.<global rank>`` layout (see the module docstring)."""
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, LogsDest

    class WorkerLogs(DefaultLogsSpecs):
        def reify(self, envs):
            dest = super().reify(envs)  # error files (error.json per rank) under log_dir/.elastic: failure reports
            os.makedirs(log_dir, exist_ok=True)
            stdouts, tee = {}, {}
            for local_rank, env in envs.items():
                path = os.path.join(log_dir, f"{WORKER_LOG}.{env['RANK']}")
                attempt = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
                if attempt and os.path.exists(path):
                    os.replace(path, f"{path}.{attempt - 1}")
                stdouts[local_rank] = path
                if local_rank == 0:
                    tee[local_rank] = path
            # stderr goes to the console stream here; the worker entry (_worker.py) points its fd 2 at stdout
            return LogsDest(stdouts=stdouts, stderrs=dict.fromkeys(envs, ""), tee_stdouts=tee, tee_stderrs={},
                            error_files=dest.error_files)

    return WorkerLogs(log_dir=os.path.join(log_dir, ".elastic"))


def _tail(path: str, n: int = TAIL_LINES) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()[-n:]
    except OSError:
        return []


def main(argv=None) -> int:
    """Parse, launch, wait; returns the exit status (0, or the failing rank's)."""
    args = build_parser().parse_args(argv)
    try:
        config, env = launch_config(args)
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.environ.update(env)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default: N processes would over-subscribe the cores
    os.environ.setdefault("PYTHONUNBUFFERED", "1")  # lines reach workerlog.N (and the terminal) as printed
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    import logging

    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)  # its per-event lines: the outcome is reported below
    cmd = ["-u", "-m", "paddlenlp_ext.distributed._worker", args.script, *args.script_args]
    try:
        elastic_launch(config, entrypoint=sys.executable)(*cmd)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        code = failure.exitcode
        status = 128 - code if code < 0 else code  # killed by a signal: the shell's 128 + N
        how = (f"was killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals()
               else f"exited with status {code}")
        path = os.path.join(args.log_dir, f"{WORKER_LOG}.{rank}")
        if failure.local_rank != 0:  # local rank 0 is on the terminal already
            lines = _tail(path)
            # a config error reaches every rank: its error: line is on the terminal already (rank 0's), once
            shown = set(_tail(os.path.join(args.log_dir, f"{WORKER_LOG}.{rank - failure.local_rank}"), 200))
            errors = [ln for ln in lines if ln.startswith("error:")]
            if lines and not (errors and all(ln in shown for ln in errors)):
                print(f"--- last {len(lines)} lines of {path} ---", file=sys.stderr)
                print("\n".join(lines), file=sys.stderr)
        restarts = f" after {args.max_restarts} restart(s)" if args.max_restarts else ""
        print(f"launch: rank {rank} {how}{restarts}; its log: {path}", file=sys.stderr)
        return status or 1
    except SignalException as e:  # SIGTERM (Slurm's time limit, timeout): the agent has stopped the workers
        print(f"launch: stopped by {signal.Signals(e.sigval).name}; rerun the same command to resume from the latest "
              "checkpoint", file=sys.stderr)
        return 128 + int(e.sigval)
    except KeyboardInterrupt:
        print("launch: interrupted; rerun the same command to resume from the latest checkpoint", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
