"""``to_static`` through the real Trainer: tokens/s and peak memory with eager and compiled decoder layers.

``benchmarks/e2e_train.py`` times its own training loop; this script runs :class:`paddlenlp_ext.trainer.Trainer` (the
loop ``llm/run_finetune.py`` uses: O2 master weights, fused linear cross entropy, its tokens/s windows) on the same
synthetic log-normal packs and the same random-initialised model, once per setting, in one process, and prints a
table. Tokens/s is the median of the Trainer's own logging windows after the first ``--skip-windows`` (compile and
warm-up), counted on non-pad tokens over all steps of a window (the Trainer's definition).

Usage (GPU)::

    PYTHONPATH=$PWD/ops:$PWD python benchmarks/trainer_to_static.py --model llama1b --pack-len 8192 \\
        --steps 24 --window 4 --settings off,on,off,on

CPU smoke run (tiny model, no timing meaning): ``--tiny``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_models  # noqa: E402
import e2e_train  # noqa: E402

from paddlenlp_ext.datasets import collate_packs  # noqa: E402
from paddlenlp_ext.distributed import parallelize_model  # noqa: E402
from paddlenlp_ext.trainer import Trainer, TrainingArguments  # noqa: E402


def run_one(to_static: bool, args, info, packs, device) -> dict:
    """Train ``args.steps`` steps with ``to_static``; returns tokens/s (median window), windows, peak GiB, loss."""
    torch.manual_seed(args.seed)
    model = e2e_models.build_model(info, "ours", device, recompute=args.recompute, fused_elementwise=True)
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(output_dir=out, per_device_train_batch_size=1, max_steps=args.steps,
                                  logging_steps=args.window, learning_rate=1e-5, warmup_steps=0,
                                  bf16=True, fp16_opt_level="O2", save_strategy="no",  # fp32 on a CPU
                                  evaluation_strategy="no", disable_tqdm=True, report_to=[],
                                  to_static=to_static, recompute=args.recompute, dataloader_num_workers=0)
        parallelize_model(model, None, targs)  # one process: applies only the compile step
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        trainer = Trainer(model, targs, train_dataset=packs,
                          data_collator=lambda items: collate_packs(items, args.pack_len, pad_token_id=0))
        t0 = time.perf_counter()
        result = trainer.train()
        wall = time.perf_counter() - t0
        windows = [h["tokens_per_sec"] for h in trainer.state.log_history if "tokens_per_sec" in h]
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    timed = windows[args.skip_windows:]
    del trainer, model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"to_static": to_static, "tokens_per_s": statistics.median(timed) if timed else None,
            "windows": [round(w) for w in windows], "peak_gib": peak, "wall_s": wall,
            "train_loss": result["train_loss"]}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama1b", help="e2e_models preset (llama1b, ernie3b, ...)")
    ap.add_argument("--pack-len", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=24, help="optimizer steps per setting (one pack each)")
    ap.add_argument("--window", type=int, default=4, help="Trainer logging_steps: the tokens/s window")
    ap.add_argument("--skip-windows", type=int, default=1, help="first windows left out (compile, warm-up)")
    ap.add_argument("--settings", default="off,on", help="comma list of to_static settings in run order")
    ap.add_argument("--recompute", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="tiny model and packs (CPU smoke run)")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    settings = [s.strip() for s in args.settings.split(",")]
    bad = [s for s in settings if s not in ("on", "off")]
    if bad:
        ap.error(f"--settings: {bad} are not on/off")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not args.tiny:
        raise SystemExit("trainer_to_static needs a CUDA GPU (--tiny runs a CPU smoke test)")
    info = e2e_models.model_config(args.model, args.tiny)
    scale = args.pack_len / 8192 if args.tiny else 1.0
    packs = e2e_train.build_packs(info["vocab"], args.pack_len, args.steps, args.seed, scale)
    rows = [run_one(s == "on", args, info, packs, device) for s in settings]
    print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name(device)
                      if device.type == "cuda" else "cpu", "argv": sys.argv[1:]}))
    base = next((r["tokens_per_s"] for r in rows if not r["to_static"] and r["tokens_per_s"]), None)
    print("| to_static | tokens/s (median window) | x eager (first eager row) | peak GiB | windows tokens/s | "
          "wall s | train loss |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = f"{r['tokens_per_s'] / base:.3f}" if base and r["tokens_per_s"] else "-"
        tps = f"{r['tokens_per_s']:,.0f}" if r["tokens_per_s"] else "-"
        print(f"| {'on' if r['to_static'] else 'off'} | {tps} | {ratio} | {r['peak_gib']:.1f} | "
              f"{r['windows']} | {r['wall_s']:.1f} | {r['train_loss']:.4f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
