"""Pretraining speed: document masks vs plain causal vs FlexAttention's document mask vs SDPA causal, side by side.

One process, one GPU. Every setup trains the same randomly initialised model (``--model llama1b``: the 1.24B
Llama-3.2-1B shape; ``ernie3b``: the ERNIE-3.5-SE 3B preset; see ``e2e_models.py``) on the same pretraining windows
and differs only in the attention:

| setup | attention | mask |
|---|---|---|
| ``docmask`` | FlashMask Triton kernel | causal-document (``reset_attention_mask``: fully masked tiles skipped), positions restart per document |
| ``causal`` | FlashMask Triton kernel, causal path (no index tensor) | plain causal over the window (PaddleNLP's ``run_pretrain``) |
| ``flex_docmask`` | ``flashmask.flex.flex_flashmask_attention`` (compiled FlexAttention, BlockMask from the LTS) | the same causal-document mask |
| ``sdpa_causal`` | ``F.scaled_dot_product_attention(is_causal=True)`` (FlashAttention-2 backend) | plain causal |

Data: a corpus of documents whose lengths are log-normal (median 661, mean 1074 tokens; ``e2e_train.py``'s fit),
each ending in an end-of-document token, written as ``.bin``/``.idx`` and read through the real pipeline
(``GPTDataset`` windows of ``--seq + 1`` tokens in PaddleNLP's shuffled order, ``PretrainingCollator``). Loss:
the trainer's ``sft_loss`` (fused linear cross entropy); ``--amp o1``: bf16 autocast over fp32 weights, fp32 AdamW;
``o2`` (``fp16_opt_level: "O2"``, as ``config/ernie35se/pretrain_3b.json``): also the trainer's ``MasterWeights``
(bf16 compute weights, fp32 master weights and AdamW states).

Metrics (time between two ``cuda.synchronize`` around the timed steps): tokens/s = window tokens / seconds; MFU =
model FLOPs / seconds / 989e12 with FLOPs = ``6 N T + 12 n_layers H_q D P`` (``e2e_models.step_flops``), ``P`` = the
(query, key) pairs the mask leaves (document-masked setups: only within documents, so they do fewer FLOPs for the
same tokens; their MFU counts only useful work); peak GiB = ``torch.cuda.max_memory_allocated``.

Usage: ``python benchmarks/e2e_pretrain.py --seq 8192 32768 [--model ernie3b] [--amp o2] [--compile] [--steps 8
--warmup 3] [--out f.json]`` (``--compile``: every setup's decoder layers compiled, as ``to_static``);
``--tiny``: toy model on CPU (smoke test). Targets: docmask >= causal tokens/s, >= 1.2x flex_docmask at
32K, MFU >= 45 % at 8K.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import sys
import tempfile
import time
import traceback

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import e2e_models  # noqa: E402
from e2e_train import BACKENDS, MEDIAN, PEAK_BF16_FLOPS, SIGMA  # noqa: E402

from paddlenlp_ext.datasets.pretraining import (PretrainingCollator, build_train_valid_test_datasets,  # noqa: E402
                                                write_corpus)
from paddlenlp_ext.trainer.loss import sft_loss  # noqa: E402
from paddlenlp_ext.trainer.mixed_precision import MasterWeights  # noqa: E402

EOD = 2
SETUPS = {"docmask": (None, True), "causal": (None, False), "flex_docmask": ("flex", True),
          "sdpa_causal": ("naive_packed", False)}


def make_windows(vocab: int, seq: int, n: int, seed: int, workdir: str, tiny: bool) -> list[np.ndarray]:
    """``n`` windows of ``seq + 1`` tokens from a synthetic corpus of log-normal documents, via the real index."""
    rng = np.random.RandomState(seed)
    scale = seq / 8192 if tiny else 1.0
    need, docs, total = n * seq + seq + 1, [], 0
    while total < need:
        length = int(np.clip(rng.lognormal(math.log(MEDIAN * scale), SIGMA), 8, 4 * seq))
        docs.append([list(rng.randint(3, vocab, size=length - 1)) + [EOD]])
        total += length
    prefix = os.path.join(workdir, f"corpus_{seq}")
    write_corpus(prefix, docs, np.int32)
    train, _, _ = build_train_valid_test_datasets(prefix, "1", seq, (n, 0, 0), seed, data_cache=workdir)
    return [train[i] for i in range(n)]


def attention_pairs(batch: dict) -> int:
    """Unmasked causal (query, key) pairs of the batch: within documents (LTS given), else the whole window."""
    sri = batch.get("attn_mask_startend_row_indices")
    bsz, seq = batch["input_ids"].shape
    if sri is None:
        return bsz * seq * (seq + 1) // 2
    lts = sri[:, 0, :, 0].long()
    cols = torch.arange(seq, device=lts.device)
    return int((lts - cols).sum().item())  # column j is seen by rows j .. lts[j]-1


def run(setup: str, info: dict, windows, args, device) -> dict:
    backend, docmask = SETUPS[setup]
    collate = PretrainingCollator(EOD, reset_attention_mask=docmask, reset_position_ids=docmask)
    bs = args.batch_size
    batches = [collate(windows[i: i + bs]) for i in range(0, len(windows) - bs + 1, bs)]
    batches = [{k: v.to(device) for k, v in b.items()} for b in batches]
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    with e2e_models.patched_attention(BACKENDS.get(backend) if backend else None):
        torch.manual_seed(args.seed)
        model = e2e_models.build_model(info, "ours", device, args.recompute, fused_elementwise=True)
        if args.compile:  # each decoder layer compiled, as the trainer's to_static
            for layer in getattr(getattr(model, "model", model), "layers"):
                layer.compile()
        n_mm, n_train = e2e_models.matmul_params(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
        amp = torch.autocast(device.type, dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
        master = MasterWeights(model, torch.bfloat16, opt) if args.amp == "o2" else None
        tokens = pairs = 0
        t0 = None
        for i, b in enumerate(batches[: args.warmup + args.steps]):
            if i == args.warmup:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                t0 = time.perf_counter()
            with master.compute() if master is not None else contextlib.nullcontext():
                with amp:
                    ls, n, _ = sft_loss(model, b)
                (ls / n).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if t0 is not None:
                tokens += b["input_ids"].numel()
                pairs += attention_pairs(b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        secs = time.perf_counter() - t0
    flops = e2e_models.step_flops(info, n_mm, n_train, tokens, pairs)
    res = dict(status="ok", tokens_per_s=tokens / secs, mfu=flops / secs / PEAK_BF16_FLOPS, seconds=secs,
               timed_tokens=tokens, attn_pairs=pairs, final_loss=float((ls / n).detach()))
    if device.type == "cuda":
        res["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    del model, opt, master
    return res


def fmt_table(results: dict) -> str:
    rows = ["| window | setup | tokens/s | MFU | peak GiB | x causal | x flex_docmask |", "|---|---|---|---|---|---|---|"]
    for seq, per in results.items():
        ref = {k: per.get(k, {}).get("tokens_per_s") for k in ("causal", "flex_docmask")}
        for name, r in per.items():
            if r.get("status") != "ok":
                rows.append(f"| {seq} | {name} | {r.get('status')} | - | - | - | - |")
                continue
            ratio = [f"{r['tokens_per_s'] / v:.2f}x" if v else "-" for v in ref.values()]
            peak = f"{r['peak_gib']:.1f}" if "peak_gib" in r else "-"
            rows.append(f"| {seq} | {name} | {r['tokens_per_s']:,.0f} | {100 * r['mfu']:.1f}% | {peak} | "
                        f"{ratio[0]} | {ratio[1]} |")
    return "\n".join(rows)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama1b", choices=("llama1b", "ernie3b"))
    ap.add_argument("--seq", type=int, nargs="+", default=[8192, 32768], help="window lengths (max_seq_length)")
    ap.add_argument("--setups", default=",".join(SETUPS))
    ap.add_argument("--batch_size", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps (Triton / torch.compile compiles)")
    ap.add_argument("--recompute", action="store_true", help="activation checkpointing (32K windows of 3B need it)")
    ap.add_argument("--tiny", action="store_true", help="toy model and short windows on CPU (smoke test)")
    ap.add_argument("--amp", choices=("o1", "o2"), default="o1",
                    help="o1: bf16 autocast over fp32 weights; o2: MasterWeights as fp16_opt_level O2")
    ap.add_argument("--compile", action="store_true", help="torch.compile each decoder layer (to_static), every setup")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    if args.tiny:
        args.seq = [s for s in args.seq if s <= 256] or [128, 256]
        args.steps, args.warmup = min(args.steps, 2), min(args.warmup, 1)
    info = e2e_models.model_config(args.model, args.tiny)
    results: dict = {}
    with tempfile.TemporaryDirectory() as work:
        for seq in args.seq:
            windows = make_windows(info["vocab"], seq, (args.warmup + args.steps) * args.batch_size, args.seed, work,
                                   args.tiny)
            results[seq] = {}
            for setup in args.setups.split(","):
                try:
                    results[seq][setup] = run(setup, info, windows, args, device)
                except torch.cuda.OutOfMemoryError:
                    results[seq][setup] = {"status": "OOM"}
                except Exception as e:  # noqa: BLE001 - one failing backend must not hide the others' rows
                    traceback.print_exc()
                    results[seq][setup] = {"status": f"error: {type(e).__name__}"}
                print(seq, setup, {k: v for k, v in results[seq][setup].items() if k in ("status", "tokens_per_s",
                                                                                     "mfu")}, flush=True)
    table = fmt_table(results)
    print(f"\nmodel {args.model}, batch {args.batch_size} x window, {args.steps} timed steps, device "
          f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}\n\n{table}")
    out = {"args": vars(args), "results": {str(k): v for k, v in results.items()}, "table": table}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
