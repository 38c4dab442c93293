"""ERNIE-3.5-SE generation speed with and without the KV cache (random weights; greedy; prints a table).

    python benchmarks/ernie_generation.py                                   # tiny preset, CPU, fp32
    python benchmarks/ernie_generation.py --preset 3b --device cuda --dtype bfloat16   # the 3B shape on a GPU

Each row generates ``--new_tokens`` tokens after ``--batch_size`` prompts of ``--prompt_len`` random tokens with
``paddlenlp_ext.transformers.batch_generation.generate_batch`` (``use_cache`` on / off), after one warm-up call;
tokens/s counts generated tokens of all rows. Without the cache every token recomputes the whole prefix.
"""

from __future__ import annotations

import argparse
import time

import torch

PRESETS = {"tiny": "ernie/tiny-random-ernie", "3b": "baidu/ernie-3.5-se-3b"}


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--batch_size", type=int, default=1)
    p.add_argument("--prompt_len", type=int, default=128)
    p.add_argument("--new_tokens", type=int, default=64)
    p.add_argument("--num_threads", type=int, default=0, help="CPU threads (0: torch's default)")
    args = p.parse_args(argv)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    from paddlenlp_ext.transformers.batch_generation import generate_batch
    from paddlenlp_ext.transformers.ernie35 import preset_config
    from paddlenlp_ext.transformers.ernie35.modeling import Ernie35ForCausalLM

    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    with torch.device(args.device):
        model = Ernie35ForCausalLM(preset_config(PRESETS[args.preset])).to(dtype).eval()
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, 4096, (args.batch_size, args.prompt_len), generator=g).tolist()
    rows = []
    for use_cache in (True, False):
        generate_batch(model, prompts, 2, pad_token_id=0, use_cache=use_cache)  # warm-up
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = generate_batch(model, prompts, args.new_tokens, pad_token_id=0, eos_token_id=None, use_cache=use_cache)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        n = sum(len(o) for o in out)
        rows.append({"kv_cache": use_cache, "tokens": n, "seconds": elapsed, "tokens_per_s": n / elapsed})
    print(f"ERNIE-3.5-SE {args.preset} ({PRESETS[args.preset]}), {args.device} {args.dtype}, batch "
          f"{args.batch_size}, prompt {args.prompt_len}, {args.new_tokens} new tokens")
    print("| KV cache | tokens | seconds | tokens/s |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {'on' if r['kv_cache'] else 'off'} | {r['tokens']} | {r['seconds']:.2f} | {r['tokens_per_s']:.1f} |")
    print(f"speed-up with the cache: {rows[0]['tokens_per_s'] / rows[1]['tokens_per_s']:.2f}x")
    return rows


if __name__ == "__main__":
    main()
