"""Training speed of a ``transformers`` model through the FlashMask backend, against ``transformers``' own paths.

One process, one GPU; every setup trains a randomly initialised model of the same shape (``--model``: ``qwen2.5-1.5b``
default, or ``qwen3-1.7b``) on the same synthetic packs (``e2e_train.build_packs``: log-normal example lengths,
median 661 tokens, ZeroPadding greedy packs of ``--pack_len``), bf16 autocast over fp32 weights, AdamW, the same
loss (fused linear cross entropy over the supervised rows of the final hidden states):

| setup | model | batches | attention |
|---|---|---|---|
| ``ours`` | transformers Qwen2 (``HFCausalLM``) | packs + ``attn_mask_startend_row_indices`` | ``FlashMask`` backend |
| ``ours_fused`` | ``ours`` + ``use_fused_rms_norm`` / ``use_fused_rope`` / ``use_fused_swiglu`` (``hf_fused_ops``) | the same | ``FlashMask`` backend |
| ``hf_sdpa_padded`` | transformers Qwen2 | ``--batch_size`` examples padded to the longest | ``sdpa`` |
| ``hf_flex_packed`` | transformers Qwen2 | the same packs, ``position_ids`` restarting per example | ``flex_attention`` |
| ``hf_sdpa_packed`` | transformers Qwen2 | the same packs via ``position_ids`` | ``sdpa`` (dense packed mask) |
| ``native_llama`` | our ``LlamaForCausalLM`` at the same shape (no qkv bias) | packs | FlashMask (native model) |
| ``hf_llama`` | transformers ``LlamaForCausalLM``, same shape and weights init | packs | ``FlashMask`` backend |

``native_llama`` vs ``hf_llama`` is the price of the generic path. ``--compile`` compiles every decoder layer
(``torch.compile``, as ``to_static``) in every setup. Metrics: tokens/s = real (non-padding) tokens of the timed
steps / seconds between two ``cuda.synchronize``; MFU = model FLOPs / s / 989e12 (``e2e_models.step_flops``: 6 N T
plus the attention of real (query, key) pairs); peak GiB = ``max_memory_allocated``. The table's last columns are
tokens/s over ``hf_sdpa_padded`` and over the faster of ``hf_flex_packed`` / ``hf_sdpa_packed``.

Usage (H200): ``python benchmarks/e2e_hf_models.py --pack_len 8192 --steps 10 --warmup 3 --out hf_models.json``;
``--tiny`` runs toy shapes on the CPU (smoke test, flex skipped there).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import e2e_models  # noqa: E402
from e2e_train import PEAK_BF16_FLOPS, attention_pairs, build_packs, split_pack  # noqa: E402

from paddlenlp_ext.datasets import collate_packs  # noqa: E402
from paddlenlp_ext.ops import fused_linear_cross_entropy  # noqa: E402
from paddlenlp_ext.trainer.loss import IGNORE_INDEX  # noqa: E402

SHAPES = {
    "qwen2.5-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, head_dim=128, tie_word_embeddings=True,
                         rope_theta=1e6, max_position_embeddings=32768),
    "qwen3-1.7b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                       rope_theta=1e6, max_position_embeddings=40960),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, max_position_embeddings=4096),
}
SETUPS = ("ours", "ours_fused", "hf_sdpa_padded", "hf_flex_packed", "hf_sdpa_packed", "native_llama", "hf_llama")
PADDED = ("hf_sdpa_padded",)


def build(setup: str, shape: dict, family: str, device):
    """The model of ``setup`` in fp32 on ``device``, training mode."""
    import transformers

    from paddlenlp_ext.transformers.hf_attention import FLASHMASK
    from paddlenlp_ext.transformers.hf_causal_lm import HFCausalLM

    torch.manual_seed(0)
    if setup == "native_llama":
        from paddlenlp_ext.transformers.llama import LlamaConfig, LlamaForCausalLM

        with torch.device(device):
            return LlamaForCausalLM(LlamaConfig(**shape, rms_norm_eps=1e-6)).train()
    impl = {"ours": FLASHMASK, "ours_fused": FLASHMASK, "hf_llama": FLASHMASK, "hf_sdpa_padded": "sdpa",
            "hf_sdpa_packed": "sdpa", "hf_flex_packed": "flex_attention"}[setup]
    cls = "LlamaConfig" if setup == "hf_llama" else ("Qwen3Config" if family == "qwen3-1.7b" else "Qwen2Config")
    config = getattr(transformers, cls)(**shape, attn_implementation=impl, use_cache=False)
    with torch.device(device):
        hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=impl)
    if setup == "ours_fused":
        from paddlenlp_ext.transformers.hf_fused_ops import fuse_modules

        fuse_modules(hf, rms_norm=True, swiglu=True, rope=True)
    return HFCausalLM(hf).train() if impl == FLASHMASK else hf.train()


def batches(setup: str, packs: list, pack_len: int, batch_size: int, device) -> list:
    """Per pack, a list of device batches: the pack itself, or its examples ``batch_size`` at a time, padded."""
    out = []
    for pack in packs:
        if setup in PADDED:
            recs = split_pack(pack)
            groups = [recs[i: i + batch_size] for i in range(0, len(recs), batch_size)]
        else:
            groups = [[pack]]
        chunk = []
        for members in groups:
            b = collate_packs(members, pack_len, pad_token_id=0, pad_to_multiple_of=64 if setup in PADDED else None)
            lens = [n for m in members for n in m["seq_lens"]]
            b["_tokens"], b["_pairs"] = sum(lens), attention_pairs(lens)
            if setup in PADDED:
                seq = b["input_ids"].shape[1]
                b["attention_mask"] = (torch.arange(seq)[None] < torch.tensor([m["seq_lens"][0] for m in members])[:, None]).long()
            chunk.append({k: v.to(device) if torch.is_tensor(v) else v for k, v in b.items()})
        out.append(chunk)
    return out


def loss_sum(setup: str, model, b: dict) -> torch.Tensor:
    """Summed CE over supervised rows: the trunk's final hidden states through the head, fused and chunked."""
    if setup == "native_llama":
        h = model.model(b["input_ids"], b["position_ids"], b["attn_mask_startend_row_indices"])
    elif setup in ("ours", "ours_fused", "hf_llama"):
        h = model.model(input_ids=b["input_ids"], position_ids=b["position_ids"], use_cache=False,
                        attn_mask_startend_row_indices=b["attn_mask_startend_row_indices"])[0]
    elif setup in PADDED:
        h = model.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], use_cache=False)[0]
    else:  # transformers' padding-free path: restarting position_ids, no attention_mask, no cache
        h = model.model(input_ids=b["input_ids"], position_ids=b["position_ids"], use_cache=False)[0]
    w, bias = model.lm_head.weight, model.lm_head.bias
    return fused_linear_cross_entropy(h.flatten(0, 1), w, b["labels"].flatten(), bias, ignore_index=IGNORE_INDEX,
                                      skip_ignored=True)


def compile_layers(model) -> None:
    for name, m in model.named_modules():
        if name.endswith(tuple(f"layers.{i}" for i in range(1000))):
            m.forward = torch.compile(m.forward)


def run(setup: str, args, shape: dict, packs: list, device) -> dict:
    model = build(setup, shape, args.model, device)
    if args.compile:
        compile_layers(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    data = batches(setup, packs, args.pack_len, args.batch_size, device)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def step(group):
        for b in group:
            with amp:
                loss = loss_sum(setup, model, b) / b["_tokens"]
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for group in data[: args.warmup]:
        step(group)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    timed = data[args.warmup: args.warmup + args.steps]
    for group in timed:
        step(group)
    if device.type == "cuda":
        torch.cuda.synchronize()
    sec = time.perf_counter() - t0
    tokens = sum(b["_tokens"] for g in timed for b in g)
    pairs = sum(b["_pairs"] for g in timed for b in g)
    n, n_train = e2e_models.matmul_params(model)
    info = dict(n_layers=shape["num_hidden_layers"], h_q=shape["num_attention_heads"], head_dim=shape["head_dim"])
    flops = e2e_models.step_flops(info, n, n_train, tokens, pairs)
    out = dict(tokens_per_sec=tokens / sec, mfu=flops / sec / PEAK_BF16_FLOPS, seconds=sec, tokens=tokens,
               peak_gib=torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None)
    del model, opt, data
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def fmt_table(results: dict) -> str:
    ok = {k: v for k, v in results.items() if "tokens_per_sec" in v}
    pad = ok.get("hf_sdpa_padded", {}).get("tokens_per_sec")
    packed = max((ok[k]["tokens_per_sec"] for k in ("hf_flex_packed", "hf_sdpa_packed") if k in ok), default=None)
    lines = ["| setup | tokens/s | MFU % | peak GiB | vs hf_sdpa_padded | vs best hf packed |", "|---|---|---|---|---|---|"]
    for name, r in results.items():
        if "tokens_per_sec" not in r:
            lines.append(f"| {name} | {r.get('error', 'skipped')} | | | | |")
            continue
        tps = r["tokens_per_sec"]
        peak = f"{r['peak_gib']:.1f}" if r["peak_gib"] is not None else "-"
        vs_pad = f"{tps / pad:.2f}x" if pad else "-"
        vs_packed = f"{tps / packed:.2f}x" if packed else "-"
        lines.append(f"| {name} | {tps:,.0f} | {100 * r['mfu']:.1f} | {peak} | {vs_pad} | {vs_packed} |")
    if "native_llama" in ok and "hf_llama" in ok:
        lines.append(f"\ngeneric path (hf_llama) / native Llama: "
                     f"{ok['hf_llama']['tokens_per_sec'] / ok['native_llama']['tokens_per_sec']:.3f}")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setups", default=",".join(SETUPS))
    ap.add_argument("--model", default="qwen2.5-1.5b", choices=[k for k in SHAPES if k != "tiny"])
    ap.add_argument("--pack_len", type=int, default=8192)
    ap.add_argument("--batch_size", type=int, default=4, help="examples per padded batch")
    ap.add_argument("--steps", type=int, default=10, help="timed packs (padded setups: the same examples)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="torch.compile every decoder layer in every setup")
    ap.add_argument("--tiny", action="store_true", help="toy shapes on the CPU (smoke test)")
    ap.add_argument("--out", default=None, help="JSON results path")
    args = ap.parse_args(argv)
    if args.tiny:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        args.pack_len, args.steps, args.warmup = min(args.pack_len, 1024), min(args.steps, 2), min(args.warmup, 1)
        device, shape = torch.device("cpu"), SHAPES["tiny"]
    elif not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU; --tiny runs a CPU smoke test")
    else:
        device, shape = torch.device("cuda"), SHAPES[args.model]
    packs = build_packs(shape["vocab_size"], args.pack_len, args.warmup + args.steps, seed=0,
                        scale=args.pack_len / 8192 if args.tiny else 1.0)
    results = {}
    for setup in args.setups.split(","):
        if setup not in SETUPS:
            raise SystemExit(f"--setups: unknown {setup!r}; choose from {', '.join(SETUPS)}")
        if setup == "hf_flex_packed" and device.type == "cpu":
            results[setup] = {"error": "skipped on the CPU"}
            continue
        try:
            results[setup] = run(setup, args, shape, packs, device)
        except Exception as e:  # one failing setup (e.g. out of memory) does not lose the others
            traceback.print_exc()
            results[setup] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"}
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        print(f"[{setup}] {json.dumps(results[setup])}", flush=True)
    print(f"\n{args.model if not args.tiny else 'tiny'}, {args.pack_len}-token packs, {args.steps} timed steps\n")
    print(fmt_table(results))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)
    return results


if __name__ == "__main__":
    main()
