"""Offline tile sweep for the Triton FlashMask kernels (one CUDA GPU): how the tiles of
:mod:`flashmask.launch_config` were chosen.

Times the Triton forward and backward for lists of tile configs (set with ``launch_config.tile_override``) on
masks from :mod:`flashmask.benchmarks.bench_attention` (bf16, H = 32, B*S = 32K). ``--alt name=path`` also runs
another copy of the package (a directory holding a ``flashmask``-shaped package, imported under ``name``: a
changed kernel against this one) at the first config of each list.

Compilation dominates a sweep, so ``--precompile N`` first runs every (variant, config, mask) once in N worker
processes (same shapes, so Triton's on-disk cache is hit later), then times everything sequentially in this
process. Prints one table (ms, median of ``triton.testing.do_bench``) and the best config per kind.
``--timing gpu`` times the kernels alone with ``triton.testing.do_bench_cudagraph`` (device time): at small shapes
(e.g. D = 64, B = 1, 8K) a call is host-bound on the H200 machine and ``do_bench`` measures Python
(docs/kernel_notes.md). ``--alt`` copies run at the first config of each ``--fwd`` / ``--bwd`` list, so put the
default config of the head dim first (the built-in lists start with the D = 128 defaults).

Usage: ``python -m flashmask.benchmarks.tune_blocks --head-dim 128 --masks full,causal,causal_document
[--fwd 128,128,8,3 ...] [--bwd 64,128,8,3,128,64,8,3 ...] [--precompile 8] [--processes 3] [--json out.json]``.
``--processes N`` repeats the whole sweep in N fresh processes and reports medians across them.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import multiprocessing as mp
import os
import sys
import types

import torch

FWD = ["128,128,8,3", "128,128,8,2", "128,64,8,3", "128,64,4,3", "64,64,4,3"]  # first = D=128 default
BWD = ["64,128,8,3,128,64,8,3", "64,128,8,2,128,64,8,2", "32,128,4,3,128,32,4,3", "64,64,4,3,64,64,4,3"]


FWD_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
BWD_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "DQ_BLOCK_M", "DQ_BLOCK_N", "dq_warps", "dq_stages")


def parse_config(cfg: str, keys: tuple[str, ...]) -> dict:
    """``"128,128,8,3"`` -> ``{"BLOCK_M": 128, ...}`` for ``keys``; ValueError naming the config otherwise."""
    vals = cfg.split(",")
    if len(vals) != len(keys) or not all(v.strip().isdigit() for v in vals):
        raise ValueError(f"tile config {cfg!r}: expected {len(keys)} comma-separated integers {','.join(keys)}")
    return dict(zip(keys, map(int, vals)))


def _import_variant(spec: str | None):
    """The kernels of this checkout's ``flashmask`` (``spec`` None) or of the package copy ``name=path``: a
    namespace with ``mask_vectors``, ``forward``, ``backward``, ``attention`` and ``tile_override``."""
    name = "flashmask"
    if spec is not None:
        name, path = spec.split("=", 1)
        if path not in sys.path:
            sys.path.insert(0, path)
    mod = {m: importlib.import_module(f"{name}.{m}") for m in ("mask_cache", "dispatch", "autograd", "launch_config")}
    return types.SimpleNamespace(mask_vectors=mod["mask_cache"].mask_vectors, forward=mod["dispatch"].forward,
                                 backward=mod["dispatch"].backward,
                                 attention=mod["autograd"].flashmask_attention_triton,
                                 tile_override=mod["launch_config"].tile_override)


def _inputs(args, mask: str):
    from flashmask.benchmarks.bench_attention import build_mask

    s, d, h = args.seq, args.head_dim, 32
    b = max(1, 32768 // s) if args.batch is None else args.batch
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, s, h, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    k, v = k[:, :, : h // args.gqa].contiguous(), v[:, :, : h // args.gqa].contiguous()
    sri, causal = build_mask(mask, s, b, args.docs)
    return q, k, v, do, (sri.cuda() if sri is not None else None), causal


def _jobs(args):
    """(variant label, variant spec, kind, cfg) for every point of the sweep."""
    variants = [("new", None)] + [(a.split("=", 1)[0], a) for a in args.alt]
    out = []
    for (label, spec), (kind, cfgs) in itertools.product(variants, (("fwd", args.fwd), ("bwd", args.bwd))):
        for cfg in cfgs:
            if label != "new" and cfg != cfgs[0]:
                continue  # other package copies only at the first (default) config of each kind
            out.append((label, spec, kind, cfg))
    return out


def _device_fn(mod, kind: str, q, k, v, do, sri, causal: bool, scale: float):
    """The kernels of one pass alone (``--timing gpu``): the mask preprocessing is done once here, outside the
    CUDA graph, as the per-index-tensor cache does in training; the call then runs no autograd and no custom-op
    layers. ``kind``: "fwd" or "bwd" (the Triton kernels: ``deterministic=True``)."""
    mv = mod.mask_vectors(sri, causal, q.shape[1], k.shape[1], q.device)
    if kind == "fwd":
        return lambda: mod.forward(q, k, v, mv, causal, scale)
    o, lse = mod.forward(q, k, v, mv, causal, scale)
    return lambda: mod.backward(do, q, k, v, o, lse, None, mv, causal, scale, True)


def _time_one(args, job, mask, inputs, bench: bool):
    from triton.testing import do_bench, do_bench_cudagraph

    label, spec, kind, cfg = job
    # a backward job also runs the forward (for O and LSE): at the first --fwd config, as the forward jobs' default
    fwd_cfg = cfg if kind == "fwd" else (args.fwd[0] if args.fwd else None)
    tiles = dict(fwd=parse_config(fwd_cfg, FWD_KEYS) if fwd_cfg else None,
                 bwd=parse_config(cfg, BWD_KEYS) if kind == "bwd" else None)
    try:
        mod = _import_variant(spec)
        q, k, v, do, sri, causal = inputs
        scale = q.shape[-1] ** -0.5
        with mod.tile_override(**tiles):
            if args.timing == "gpu":
                fn = _device_fn(mod, kind, q, k, v, do, sri, causal, scale)
                fn()  # compiles and builds the visit lists outside the graph
                torch.cuda.synchronize()
                return do_bench_cudagraph(fn, rep=40, return_mode="median") if bench else 0.0
            if kind == "fwd":
                fn = lambda: mod.attention(q, k, v, sri, causal, scale, True)  # noqa: E731
            else:
                leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
                o = mod.attention(*leaves, sri, causal, scale, True)[0]
                fn = lambda: torch.autograd.grad(o, leaves, do, retain_graph=True)  # noqa: E731
            fn()
            torch.cuda.synchronize()
            return do_bench(fn, warmup=10, rep=40, return_mode="median") if bench else 0.0
    except Exception as e:  # out of shared memory / registers for this shape
        print(f"{label} {kind} {cfg} {mask}: {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)
        return float("inf")


def _precompile_worker(args, jobs):
    for mask in args.masks:
        inputs = _inputs(args, mask)
        for job in jobs:
            _time_one(args, job, mask, inputs, bench=False)


def _strip(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """``argv`` without each flag in ``flags`` and its value (``--flag v`` or ``--flag=v``)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in flags:
            skip = True
        elif not any(a.startswith(f + "=") for f in flags):
            out.append(a)
    return out


def aggregate(runs: list[list[dict]], masks: list[str]) -> list[dict]:
    """Rows of several processes' sweeps (same jobs, same order) -> one row per job with the median ms per mask and
    the per-process values (``ms_per_process``)."""
    import statistics

    rows = []
    for i, row in enumerate(runs[0]):
        per = {m: [run[i]["ms"][m] for run in runs] for m in masks}
        rows.append(dict(row, ms={m: statistics.median(v) for m, v in per.items()}, ms_per_process=per))
    return rows


def _across_processes(argv: list[str], args) -> list[dict]:
    """``--processes N``: the same sweep in N fresh processes (timings of small kernels move between processes by up
    to 1.5x on the H200 host), then medians across them."""
    import subprocess
    import tempfile

    # children run one sweep each: an explicit --processes 1 last (argparse takes abbreviations such as --proc 3,
    # which _strip does not see: each child would have spawned N more, without end)
    base = _strip(argv, ("--processes", "--json")) + ["--processes", "1"]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.processes):
            out = os.path.join(tmp, f"run{i}.json")
            subprocess.run([sys.executable, "-m", "flashmask.benchmarks.tune_blocks", *base, "--json", out], check=True)
            with open(out) as f:
                runs.append(json.load(f)["rows"])
    rows = aggregate(runs, args.masks)
    print(f"median over {args.processes} processes, ms [min-max]", flush=True)
    for r in rows:
        cells = " ".join(f"{r['ms'][m]:9.3f} [{min(r['ms_per_process'][m]):.3f}-{max(r['ms_per_process'][m]):.3f}]"
                         for m in args.masks)
        print(f"{r['variant']:8} {r['kind']:6} {r['config']:24} {cells}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(seq=args.seq, head_dim=args.head_dim, gqa=args.gqa, processes=args.processes, rows=rows),
                      f, indent=1)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--batch", type=int, default=None, help="default 32768 // seq")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--gqa", type=int, default=1, help="query heads per kv head")
    p.add_argument("--masks", default="full,causal_document", type=lambda s: s.split(","))
    p.add_argument("--docs", default="lognormal", choices=("lognormal", "aligned64"),
                   help="document lengths of the document masks (bench_attention.doc_lengths)")
    p.add_argument("--fwd", nargs="*", default=FWD, help="BM,BN,warps,stages")
    p.add_argument("--bwd", nargs="*", default=BWD, help="BM,BN,warps,stages,dqBM,dqBN,dqwarps,dqstages")
    p.add_argument("--alt", nargs="*", default=[], help="name=path: another package copy to A/B")
    p.add_argument("--precompile", type=int, default=0, help="worker processes for compilation first")
    p.add_argument("--processes", type=int, default=1, help="repeat the sweep in N fresh processes; report medians")
    p.add_argument("--timing", default="wall", choices=("wall", "gpu"),
                   help="wall: do_bench of the call (host included); gpu: CUDA-graph device time of the kernels "
                        "alone (use it for small shapes, where the call is host-bound)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    for cfgs, keys in ((args.fwd, FWD_KEYS), (args.bwd, BWD_KEYS)):
        for cfg in cfgs:
            try:
                parse_config(cfg, keys)
            except ValueError as e:
                p.error(str(e))
    if not torch.cuda.is_available():
        raise SystemExit("tune_blocks needs a CUDA GPU: it times the Triton kernels' tile configs")
    if args.processes > 1:
        return _across_processes(list(sys.argv[1:] if argv is None else argv), args)
    # the tiles swept here are the Triton kernels': keep the Gluon kernels (sm_90, D = 128) out of the timings
    os.environ.setdefault("FLASHMASK_FWD", "triton")
    os.environ.setdefault("FLASHMASK_BWD", "triton")
    jobs = _jobs(args)
    if args.precompile > 1:
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_precompile_worker, args=(args, jobs[i :: args.precompile]))
                 for i in range(args.precompile)]
        for pr in procs:
            pr.start()
        for pr in procs:
            pr.join()
    rows = []
    print(f"seq {args.seq} head_dim {args.head_dim} gqa {args.gqa}; ms (median, {args.timing} timing)", flush=True)
    print(f"{'variant':8} {'kind':6} {'config':24} " + " ".join(f"{m:>20}" for m in args.masks), flush=True)
    times = {job: [] for job in jobs}
    for mask in args.masks:
        inputs = _inputs(args, mask)
        for job in jobs:
            times[job].append(_time_one(args, job, mask, inputs, bench=True))
        del inputs
        torch.cuda.empty_cache()
    for job in jobs:
        label, _, kind, cfg = job
        print(f"{label:8} {kind:6} {cfg:24} " + " ".join(f"{t:20.3f}" for t in times[job]), flush=True)
        rows.append(dict(variant=label, kind=kind, config=cfg, ms=dict(zip(args.masks, times[job]))))
    for kind in ("fwd", "bwd"):
        cand = [r for r in rows if r["kind"] == kind and r["variant"] == "new"]
        if cand:
            best = min(cand, key=lambda r: sum(r["ms"].values()))
            print(f"best {kind}: {best['config']} (sum {sum(best['ms'].values()):.3f} ms)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(seq=args.seq, head_dim=args.head_dim, gqa=args.gqa, rows=rows), f, indent=1)
    return rows


if __name__ == "__main__":
    main()
