"""Same-process A/B of the FlashMask kernels: a git revision of ``ops/flashmask`` against the working tree.

Between two runs of ``bench_attention`` single rows move by 2 % and more (another machine of the same kind, clocks,
the L2 flush between calls), so a change worth 1 % cannot be read off two runs. This imports ``ops/flashmask`` of
``--base`` (through ``git archive``) as a second package beside the working tree's, gives both the same inputs and
times them paired: every repetition times each version once, in a shuffled order, with CUDA events around a few
back-to-back calls, and the speed of ours over the base is the median over repetitions of the per-repetition ratio
base time / our time. Exactness is printed beside it: the largest difference of O and of dQ, dK, dV between the
versions, and between two runs of the base (the Gluon backward sums dQ in the order its tiles finish).

Usage: ``python -m flashmask.benchmarks.ab_revision --base HEAD|DIR [--seqs 8192,16384] [--masks causal_vec,...]
[--reps 30] [--head-dim 128] [--heads 32] [--kv-heads N (default: --heads)]`` from a git checkout, on one CUDA
GPU.
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import importlib
import io
import math
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]  # ops/flashmask/benchmarks/ab_revision.py -> the repository root
_LOADED: dict[str, object] = {}


def load_revision(rev: str, repo: Path = REPO):
    """The ``flashmask`` package of git revision ``rev`` of ``repo``, imported as ``flashmask_ab_<sha[:10]>``
    (cached per commit; its benchmarks are left out). ``rev`` may also be a directory (relative to the current
    one) holding a copy of ``ops/flashmask``, recognised by its ``autograd.py`` (for a machine that has the working
    tree but not its ``.git``); it imports as ``flashmask_ab_dir_<name>_<hash of its path>``. The package imports
    its own modules relatively and names its custom ops after itself, so each version runs its own code; they
    share the environment knobs (``FLASHMASK_FWD`` / ``FLASHMASK_BWD``) and the preprocessed mask cached on an
    index tensor, so give each version its own copy of the index tensor.

    Raises:
        ValueError: ``rev`` is neither such a directory nor a commit of the checkout ``repo`` (or ``repo`` is no
            checkout), or the commit has no ``ops/flashmask/autograd.py`` to compare with.
    """
    if (Path(rev) / "autograd.py").is_file():
        return _load_directory(Path(rev))

    def git(*args) -> bytes:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=True).stdout

    try:
        sha = git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").decode().strip()
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        raise ValueError(f"ab_revision: {rev!r} is not a commit of the git checkout {repo} (git rev-parse failed) "
                         f"nor a directory holding a copy of ops/flashmask (no autograd.py in it); pass a revision "
                         f"such as HEAD, HEAD~1 or a commit hash, or such a directory") from e
    name = f"flashmask_ab_{sha[:10]}"
    if sha in _LOADED:
        return _LOADED[sha]
    try:
        archive = git("archive", "--format=tar", sha, "ops/flashmask")
    except subprocess.CalledProcessError as e:
        raise ValueError(f"ab_revision: commit {sha[:10]} ({rev}) has no ops/flashmask to compare with") from e
    root = Path(tempfile.mkdtemp(prefix="flashmask_ab_"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if not (member.isfile() and member.name.startswith("ops/flashmask/")):
                continue
            rel = Path(member.name).relative_to("ops/flashmask")
            if rel.parts[0] != "benchmarks":
                member.name = str(Path(name) / rel)
                tar.extract(member, root, filter="data")
    if not (root / name / "autograd.py").is_file():
        raise ValueError(f"ab_revision: commit {sha[:10]} ({rev}) has no ops/flashmask/autograd.py to compare with")
    _LOADED[sha] = _import(root, name)
    return _LOADED[sha]


def _load_directory(src: Path):
    """``load_revision`` of a directory copy of ``ops/flashmask`` (one holding ``autograd.py``)."""
    src = src.resolve()
    key = str(src)
    if key in _LOADED:
        return _LOADED[key]
    tag = hashlib.sha1(key.encode()).hexdigest()[:8]  # two copies with one folder name stay two packages
    name = "flashmask_ab_dir_" + "".join(c if c.isalnum() else "_" for c in src.name) + "_" + tag
    root = Path(tempfile.mkdtemp(prefix="flashmask_ab_"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("benchmarks", "__pycache__"))
    _LOADED[key] = _import(root, name)
    return _LOADED[key]


def _import(root: Path, name: str):
    sys.path.insert(0, str(root))
    try:
        pkg = importlib.import_module(name)
        importlib.import_module(f"{name}.autograd")
    finally:
        sys.path.remove(str(root))
    return pkg


def paired_speed(base_ms: list[float], ours_ms: list[float]) -> float:
    """Median over repetitions of ``base / ours`` (> 1: ours is faster); the lists are paired by repetition."""
    if len(base_ms) != len(ours_ms) or not base_ms:
        raise ValueError(f"paired_speed: needs two equally long, non-empty lists; got {len(base_ms)} and "
                         f"{len(ours_ms)} times")
    return statistics.median(b / o for b, o in zip(base_ms, ours_ms))


def geomean(xs) -> float:
    """Geometric mean of positive numbers (speed ratios)."""
    xs = list(xs)
    return math.exp(sum(map(math.log, xs)) / len(xs))


def time_paired(fns: dict, reps: int, calls: int, seed: int = 0) -> dict[str, list[float]]:
    """ms per call of each of ``fns`` (name -> callable), ``reps`` repetitions, each timing every callable once
    in a shuffled order over ``calls`` back-to-back calls (CUDA events), after one untimed call."""
    rnd = random.Random(seed)
    times = {k: [] for k in fns}
    for _ in range(reps):
        order = list(fns)
        rnd.shuffle(order)
        for k in order:
            fns[k]()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fns[k]()
            end.record()
            torch.cuda.synchronize()
            times[k].append(start.elapsed_time(end) / calls)
    return times


def _run(attn, q, k, v, do, sri, causal):
    """(O, dQ, dK, dV) in fp32 of one forward + backward of ``attn`` (``flashmask_attention_triton``)."""
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o = attn(*leaves, sri, causal, q.shape[-1] ** -0.5, False)[0]
    o.backward(do)
    return [o.detach().float()] + [t.grad.float() for t in leaves]


def _maxdiff(a, b) -> list[float]:
    return [float((x - y).abs().max()) for x, y in zip(a, b)]


def main(argv=None) -> None:
    from flashmask.autograd import flashmask_attention_triton
    from flashmask.benchmarks.bench_attention import V3_MASKS, V3_OVER_FLEX, build_v3_mask

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="HEAD", help="git revision (or a directory copy of ops/flashmask) to compare "
                   "the working tree with (default HEAD)")
    p.add_argument("--seqs", default="8192,16384")
    p.add_argument("--masks", default=",".join(V3_MASKS), help=f"from {V3_MASKS}")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("ab_revision needs a CUDA GPU")
    base = load_revision(args.base).autograd.flashmask_attention_triton
    versions = {"base": base, "ours": flashmask_attention_triton}
    h, d, hk = args.heads, args.head_dim, args.kv_heads or args.heads
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}; base {args.base} against the working tree; "
          f"B=1 H={h} H_kv={hk} D={d} bf16; {args.reps} paired repetitions")
    speeds = {}
    for s in map(int, args.seqs.split(",")):
        g = torch.Generator(device="cuda").manual_seed(s)
        q, do = (torch.randn(1, s, h, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(1, s, hk, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        calls = max(2, round(6 * (8192 / s) ** 2))
        for name in args.masks.split(","):
            sri, causal = build_v3_mask(name, s)
            # each version caches its preprocessed mask on the index tensor under the same attribute: one copy each
            sris = {key: None if sri is None else sri.clone() for key in versions}
            res = {key: _run(fn, q, k, v, do, sris[key], causal) for key, fn in versions.items()}
            noise = _maxdiff(_run(base, q, k, v, do, sris["base"], causal), res["base"])
            diff = _maxdiff(res["ours"], res["base"])
            leaves = {key: [t.clone().requires_grad_(True) for t in (q, k, v)] for key in versions}

            def fwd(key):
                return lambda: versions[key](q, k, v, sris[key], causal, d ** -0.5, False)

            def fwd_bwd(key):
                def call():
                    versions[key](*leaves[key], sris[key], causal, d ** -0.5, False)[0].backward(do)
                    for t in leaves[key]:
                        t.grad = None
                return call

            tf = time_paired({key: fwd(key) for key in versions}, args.reps, calls)
            tb = time_paired({key: fwd_bwd(key) for key in versions}, args.reps, calls)
            speeds[(name, s)] = (paired_speed(tf["base"], tf["ours"]), paired_speed(tb["base"], tb["ours"]))
            print(f"{name:24s} {s:6d} fwd ms base {statistics.median(tf['base']):.3f} ours "
                  f"{statistics.median(tf['ours']):.3f} speed {speeds[(name, s)][0]:.3f}x | fwd+bwd ms base "
                  f"{statistics.median(tb['base']):.3f} ours {statistics.median(tb['ours']):.3f} speed "
                  f"{speeds[(name, s)][1]:.3f}x | max|diff| O/dQ/dK/dV " + " ".join(f"{x:.1e}" for x in diff)
                  + " (base/base " + " ".join(f"{x:.1e}" for x in noise) + ")", flush=True)
    v3 = [key for key in speeds if key in V3_OVER_FLEX]
    for j, what in ((0, "fwd"), (1, "fwd+bwd")):
        line = f"geometric mean speed ours/base, {what}: all rows {geomean(x[j] for x in speeds.values()):.4f}"
        if v3:
            line += f", the {len(v3)} rows with a V3 figure {geomean(speeds[key][j] for key in v3):.4f}"
        print(line)


if __name__ == "__main__":
    main()
