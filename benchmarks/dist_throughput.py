"""Distributed SFT training speed: effective tokens/s on 1 GPU vs 2 GPUs (FSDP, TP) at one global batch.

Every layout trains the same randomly initialised Llama-3.2-1B-shaped model (``e2e_train.LLAMA_1B``: hidden 2048,
16 layers, 32/8 heads, head_dim 64, intermediate 8192, vocab 128256, tied embeddings) on the same synthetic packed
batches (``e2e_train.build_packs``: log-normal example lengths, the real ZeroPadding greedy packer, FlashMask causal
document indices ``attn_mask_startend_row_indices [1, 1, L, 1]``), one ``--pack_len`` pack per micro-batch and
``--global_packs`` packs per optimizer step:

| layout | launch | per rank per step |
|---|---|---|
| ``single`` | ``torchrun --nproc_per_node 1`` | all ``G`` packs as ``G`` micro-batches |
| ``fsdp`` | ``torchrun --nproc_per_node 2`` | FSDP2 ``sharding_parallel_degree 2``, ``stage2``: ``G / 2`` micro-batches |
| ``tp`` | ``torchrun --nproc_per_node 2`` | ``tensor_parallel_degree 2`` + ``tensor_parallel_output`` (vocab-parallel CE) + ``sequence_parallel``: all ``G`` packs (TP ranks read the same data) |

The step is the trainer's: parameters fp32, forward under ``torch.autocast(bfloat16)`` on CUDA, and
``parallelize_model(..., bf16=True)`` (FSDP2 mixed precision: bf16 all-gathers, fp32 reduce-scatter; TP unaffected),
loss = summed fp32 token cross entropy (``paddlenlp_ext.trainer.loss`` formula, under ``loss_parallel_context``)
divided by the global label-token count (``all_reduce_sum_dp``), AdamW (torch default foreach), attention through
``flashmask_attention`` (Triton on CUDA, reference on CPU).

Metric: effective tokens/s = non-padding tokens of the global batches of the timed steps / wall seconds between
two ``barrier + cuda.synchronize`` points (rank 0's clock). Peak GiB = max over ranks of
``torch.cuda.max_memory_allocated``.

More layouts: ``tp_nosp`` (TP 2 + loss parallel, no SP) and ``fsdp_tp`` (4 ranks: FSDP 2 x TP 2 + SP). ``--model
ernie``: ERNIE-3.5-SE at the same scale (``ERNIE_1B``, fused ``qkv_gate_up_proj`` layers, 1.03 B parameters).
``--tp_fp32_reduce on|off|auto`` and ``--tp_impl auto|local|dtensor`` set the ``ParallelDims`` fields (``--tag``
suffixes the result files, to keep several settings side by side). ``--profile``: after the timed steps one more
step (the last batch again) runs under ``torch.profiler``; rank 0 prints the top kernels by self device time, the
NCCL kernel time and every collective with its calls per layer per micro-batch (also in the JSON).

Usage (each launch runs the listed layouts one after the other, freeing memory between them)::

    torchrun --nproc_per_node 1 benchmarks/dist_throughput.py --layouts single --out OUT [--model ernie]
    torchrun --nproc_per_node 2 benchmarks/dist_throughput.py --layouts fsdp,tp,tp_nosp --profile --out OUT
    python benchmarks/dist_throughput.py --table OUT   # Markdown table: x 1 GPU and loss difference per model

``--tiny``: toy model, 256-token packs, CPU + gloo (debugging only). Results: ``OUT/<model>_<layout>.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
import traceback
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_train import LLAMA_1B, TINY, build_packs  # noqa: E402  (the end-to-end benchmark's model shape and data)

from paddlenlp_ext.datasets import collate_packs  # noqa: E402
from paddlenlp_ext.distributed import (ParallelDims, all_reduce_sum_dp, dp_slice,  # noqa: E402
                                       loss_parallel_context, parallelize_model, to_local_loss)
from paddlenlp_ext.trainer.loss import IGNORE_INDEX, count_real_tokens  # noqa: E402
from paddlenlp_ext.transformers.llama import LlamaConfig, LlamaForCausalLM  # noqa: E402

LAYOUTS = {  # name -> (world size, ParallelDims keywords)
    "single": (1, {}),
    "fsdp": (2, dict(sharding=2, tp=1, sharding_stage="stage2")),
    "tp": (2, dict(sharding=1, tp=2, tensor_parallel_output=True, sequence_parallel=True)),
    "tp_nosp": (2, dict(sharding=1, tp=2, tensor_parallel_output=True)),
    "fsdp_tp": (4, dict(sharding=2, tp=2, sharding_stage="stage2", tensor_parallel_output=True,
                        sequence_parallel=True)),
}

# ERNIE-3.5-SE at the Llama-1B scale (same vocabulary and data): hidden 2048, 16 layers (head attention layer,
# 14 fused parallel layers, tail FFN layer), 16 heads of 128, intermediate 5504, tied embeddings: 1.03 B parameters.
ERNIE_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=5504, num_hidden_layers=16,
                num_attention_heads=16, max_position_embeddings=16384, weight_share=True)
ERNIE_TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                  max_position_embeddings=4096, weight_share=True)


def _sync(device) -> None:
    if dist.is_initialized():
        dist.barrier()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_COLLECTIVE_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::")


def _profiler(device):
    """``torch.profiler`` over one optimizer step: CPU ops with input shapes, plus CUDA kernels on a GPU."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    return profile(activities=acts, record_shapes=True)


def summarize_profile(prof, device, micro_batches: int, layers: int, top: int = 15) -> dict:
    """Top kernels and the collectives of one profiled optimizer step.

    Returns ``{"top": [[name, calls, ms], ...], "comm_ms", "compute_ms", "collectives": {op: {"calls",
    "per_layer_per_micro_batch", "shapes": {shape: calls}}}}``. On CUDA, ``top`` ranks device kernels by self device
    time and ``comm_ms`` sums NCCL kernels (they overlap compute only where FSDP prefetches); on CPU, ops by self CPU
    time. Collectives are the c10d / functional-collective ops issued on the host (``wait_tensor`` excluded).
    """
    cuda = device.type == "cuda"

    def self_ms(e):
        return (getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)) / 1e3 if cuda \
            else e.self_cpu_time_total / 1e3

    avgs = [e for e in prof.key_averages() if self_ms(e) > 0]
    if cuda:  # device kernels only: names of host ops carry no device self time except through their kernels
        avgs = [e for e in avgs if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type)] or avgs
    avgs.sort(key=self_ms, reverse=True)
    comm = sum(self_ms(e) for e in avgs if "nccl" in e.key.lower() or (not cuda and "gloo" in e.key.lower()))
    total = sum(self_ms(e) for e in avgs)
    colls: dict = {}
    for e in prof.events():
        if e.name.startswith(_COLLECTIVE_PREFIXES) and "wait" not in e.name:
            c = colls.setdefault(e.name, {"calls": 0, "shapes": {}})
            c["calls"] += 1
            shape = str([list(x) for x in e.input_shapes if x][:1])
            c["shapes"][shape] = c["shapes"].get(shape, 0) + 1
    for c in colls.values():
        c["per_layer_per_micro_batch"] = round(c["calls"] / max(layers * micro_batches, 1), 2)
    return {"top": [[e.key[:100], e.count, round(self_ms(e), 3)] for e in avgs[:top]],
            "comm_ms": round(comm, 3), "compute_ms": round(total - comm, 3), "collectives": colls,
            "micro_batches": micro_batches, "layers": layers}


def print_profile(name: str, p: dict) -> None:
    print(f"[{name}] profiled step: {p['micro_batches']} micro-batches x {p['layers']} layers; "
          f"communication {p['comm_ms']:.1f} ms, other {p['compute_ms']:.1f} ms (self time)")
    for k, calls, ms in p["top"]:
        print(f"    {ms:10.2f} ms  {calls:6d}x  {k}")
    for op, c in sorted(p["collectives"].items()):
        shapes = ", ".join(f"{sh} x{n}" for sh, n in sorted(c["shapes"].items(), key=lambda t: -t[1])[:3])
        print(f"    {op}: {c['calls']} calls ({c['per_layer_per_micro_batch']} / layer / micro-batch); {shapes}")


def run_layout(name: str, args, cfg: dict, packs: list[dict], device) -> dict:
    """Train ``warmup + steps`` optimizer steps of ``global_packs`` packs under layout ``name``; time the last ``steps``.

    Raises:
        ValueError: the launch's world size is not the layout's, or ``global_packs`` does not divide by the
            data-parallel size.
    """
    world = dist.get_world_size() if dist.is_initialized() else 1
    need, kw = LAYOUTS[name]
    if world != need:
        raise ValueError(f"layout {name!r} needs torchrun --nproc_per_node {need}, launched with {world}")
    fp32_reduce = {"auto": None, "on": True, "off": False}[args.tp_fp32_reduce]
    dims = ParallelDims(dp=1, world_size=world, device_type=device.type, tp_fp32_reduce=fp32_reduce,
                        tp_impl=args.tp_impl, **kw) if world > 1 else None
    if dims is not None:
        dims.build_mesh()
    torch.manual_seed(args.seed)  # same initial weights on every rank and layout
    with torch.device(device):
        if args.model == "ernie":
            from paddlenlp_ext.transformers.ernie35 import Ernie35Config, Ernie35ForCausalLM

            model = Ernie35ForCausalLM(Ernie35Config(**cfg, use_recompute=args.recompute)).train()
        else:
            model = LlamaForCausalLM(LlamaConfig(**cfg, recompute=args.recompute)).train()
    n_params = sum(p.numel() for p in model.parameters())
    if dims is not None:
        model = parallelize_model(model, dims, SimpleNamespace(bf16=True))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    rows = dp_slice(args.global_packs, dims)  # this rank's packs of each global batch
    losses, tokens, t0, secs, prof = [], 0, None, None, None
    n_prof = 1 if args.profile else 0
    for step in range(args.warmup + args.steps + n_prof):
        if step == args.warmup:
            _sync(device)
            t0 = time.perf_counter()
        if step == args.warmup + args.steps:  # one extra, untimed step under the profiler
            _sync(device)
            secs = time.perf_counter() - t0
            prof = _profiler(device)
            prof.__enter__()
        k = min(step, args.warmup + args.steps - 1)  # the profiled step repeats the last batch (same data as without)
        glob = packs[k * args.global_packs:(k + 1) * args.global_packs]
        mine = [collate_packs([p], args.pack_len, pad_token_id=0) for p in glob[rows]]
        mine = [{k: v.to(device, non_blocking=True) for k, v in b.items() if torch.is_tensor(v)} for b in mine]
        local_lab = sum((b["labels"] != IGNORE_INDEX).sum() for b in mine)
        count = all_reduce_sum_dp(local_lab, dims)  # label tokens of the whole global batch
        step_sum = torch.zeros((), device=device)
        for b in mine:
            with loss_parallel_context(dims):
                with amp:
                    logits = model(b["input_ids"], position_ids=b["position_ids"],
                                   attn_mask_startend_row_indices=b["attn_mask_startend_row_indices"])
                loss_sum = to_local_loss(F.cross_entropy(logits.float().flatten(0, 1), b["labels"].flatten(),
                                                         ignore_index=IGNORE_INDEX, reduction="sum"))
                del logits
                (loss_sum / count).backward()
            step_sum += loss_sum.detach()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(all_reduce_sum_dp(step_sum, dims) / count))
        if t0 is not None and prof is None:  # global non-padding tokens, equal on every rank (all ranks built all packs)
            tokens += sum(int(count_real_tokens(collate_packs([p], args.pack_len, pad_token_id=0))) for p in glob)
    _sync(device)
    if secs is None:
        secs = time.perf_counter() - t0
    profile = None
    if prof is not None:
        prof.__exit__(None, None, None)
        profile = summarize_profile(prof, device, len(mine), cfg["num_hidden_layers"])
    res = dict(status="ok", model=args.model, layout=name, world_size=world, tokens_per_s=tokens / secs,
               tokens_per_s_per_gpu=tokens / secs / world, seconds=secs, timed_steps=args.steps,
               timed_tokens=tokens, global_packs=args.global_packs, pack_len=args.pack_len,
               micro_batches_per_rank=len(range(args.global_packs)[rows]), params=n_params,
               losses=losses[:args.warmup + args.steps], tp_fp32_reduce=args.tp_fp32_reduce, tp_impl=args.tp_impl)
    if profile is not None:
        res["profile"] = profile
    if device.type == "cuda":
        peak = torch.tensor(torch.cuda.max_memory_allocated(device) / 2**30, device=device)
        if dist.is_initialized():
            dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        res["peak_gib_max_rank"] = float(peak)
    del model, opt
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return res


def fmt_table(results: dict) -> str:
    """Markdown table of ``{file stem: result}``: tokens/s over the same model's ``single`` run, and the largest
    relative difference of the per-step losses from ``single`` (same data and initial weights; bf16 on CUDA)."""
    base = {r.get("model", "llama"): r for r in results.values() if r.get("layout") == "single" and r.get("status") == "ok"}
    lines = ["| model | layout | GPUs | micro-batches / rank / step | tokens/s | tokens/s/GPU | x 1 GPU | peak GiB | "
             "final loss | max rel loss diff vs 1 GPU |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        model = r.get("model", "llama")
        if r.get("status") != "ok":
            lines.append(f"| {model} | {r.get('layout', name)} | | | {r.get('status')} | | | | | |")
            continue
        b = base.get(model)
        ratio = f"{r['tokens_per_s'] / b['tokens_per_s']:.2f}" if b else "-"
        diff = max((abs(x - y) / abs(y) for x, y in zip(r["losses"], b["losses"])), default=float("nan")) if b else None
        layout = r["layout"] + (f" ({r['tp_impl']})" if r.get("tp_impl", "auto") != "auto" else "")
        lines.append(f"| {model} | {layout} | {r['world_size']} | {r['micro_batches_per_rank']} | "
                     f"{r['tokens_per_s']:,.0f} | {r['tokens_per_s_per_gpu']:,.0f} | {ratio} | "
                     f"{r.get('peak_gib_max_rank', float('nan')):.1f} | {r['losses'][-1]:.4f} | "
                     f"{'-' if diff is None else f'{diff:.1e}'} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layouts", default="single", help="comma list of " + ", ".join(LAYOUTS))
    ap.add_argument("--global_packs", type=int, default=4, help="packs (micro-batches of 1 pack) per step")
    ap.add_argument("--pack_len", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=4, help="timed optimizer steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed optimizer steps first (Triton compile)")
    ap.add_argument("--recompute", action="store_true", help="activation checkpointing of each decoder layer")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="toy model and 256-token packs on CPU (debugging)")
    ap.add_argument("--model", choices=("llama", "ernie"), default="llama",
                    help="Llama-3.2-1B shape, or ERNIE-3.5-SE at the same scale (ERNIE_1B)")
    ap.add_argument("--profile", action="store_true",
                    help="after the timed steps, profile one more step: top kernels, NCCL time, collectives")
    ap.add_argument("--tp_fp32_reduce", choices=("auto", "on", "off"), default="auto",
                    help="row-parallel reductions in fp32 (ParallelDims.tp_fp32_reduce; auto = the default, fp32 when tp > 1)")
    ap.add_argument("--tp_impl", choices=("auto", "local", "dtensor"), default="auto",
                    help="ParallelDims.tp_impl: local compute (default without LoRA) or torch's DTensor styles")
    ap.add_argument("--tag", default="", help="suffix of the result file names (compare settings side by side)")
    ap.add_argument("--out", default="dist_throughput_out", help="directory for <layout>.json")
    ap.add_argument("--table", default=None, help="only print the table of the JSON files in this directory")
    args = ap.parse_args(argv)
    if args.table:
        res = {f[:-5]: json.load(open(os.path.join(args.table, f)))
               for f in sorted(os.listdir(args.table)) if f.endswith(".json")}
        print(fmt_table(res))
        return
    names = [n for n in args.layouts.split(",") if n]
    for n in names:
        if n not in LAYOUTS:
            raise ValueError(f"--layouts: unknown layout {n!r}; expected one of {list(LAYOUTS)}")
    if not args.tiny and not torch.cuda.is_available():
        raise SystemExit("dist_throughput needs CUDA GPUs for the 1B shapes (5 GB of fp32 weights per model); "
                         "use --tiny for the CPU smoke test")
    cfg = dict(ERNIE_1B if args.model == "ernie" else LLAMA_1B)
    if args.tiny:
        cfg, args.pack_len = dict(ERNIE_TINY if args.model == "ernie" else TINY), min(args.pack_len, 256)
    use_cuda = torch.cuda.is_available() and not args.tiny
    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
        if use_cuda:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl" if use_cuda else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    rank = dist.get_rank() if dist.is_initialized() else 0
    packs = build_packs(cfg["vocab_size"], args.pack_len, args.global_packs * (args.warmup + args.steps), args.seed,
                        1.0 if not args.tiny else 0.05)
    os.makedirs(args.out, exist_ok=True)
    results = {}
    for n in names:
        try:
            results[n] = run_layout(n, args, cfg, packs, device)
        except torch.OutOfMemoryError:
            results[n] = {"status": "OOM", "layout": n}
        except Exception as e:  # one broken layout must not lose the others' numbers
            traceback.print_exc()
            results[n] = {"status": f"error: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}",
                          "layout": n}
        results[n]["env"] = dict(torch=torch.__version__, python=platform.python_version(),
                                 gpu=torch.cuda.get_device_name(device) if use_cuda else "cpu",
                                 nccl=".".join(map(str, torch.cuda.nccl.version())) if use_cuda else None)
        if rank == 0:
            print(f"[{n}] {json.dumps({k: v for k, v in results[n].items() if k not in ('env', 'profile')})}",
                  flush=True)
            if "profile" in results[n]:
                print_profile(n, results[n]["profile"])
            json.dump(results[n], open(os.path.join(args.out, f"{args.model}_{n}{args.tag}.json"), "w"), indent=1)
    if rank == 0:
        print(fmt_table(results))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
