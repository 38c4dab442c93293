"""End-to-end SFT training speed (issue 8): tokens/s, MFU, peak memory and the longest trainable context.

One process, one GPU. Every setup trains the same randomly initialised Llama-3.2-1B-shaped model (hidden 2048,
16 layers, 32/8 heads, head_dim 64, intermediate 8192, vocab 128256, tied embeddings; fp32 weights, bf16
autocast, fused fp32 AdamW) on the same synthetic token stream, and differs only in how batches are formed and
how attention is computed:

| setup | batches | attention |
|---|---|---|
| ``ours`` | ZeroPadding packs of ``--pack_len`` | FlashMask Triton kernel (``flashmask_attention``, impl auto) |
| ``padded`` | ``--batch_size`` examples, padded to the longest | FlashMask Triton kernel (padding masked by the LTS) |
| ``sdpa_dense`` | packs | SDPA with a dense bool ``[B, 1, L, L]`` document-causal mask (built once per batch) |
| ``flex`` | packs | ``flashmask.flex.flex_flashmask_attention`` (compiled FlexAttention, BlockMask from the LTS) |
| ``naive_packed`` | packs | SDPA ``is_causal=True`` (FlashAttention-2 backend): no isolation between examples |
| ``hf_padded`` | ``--batch_size`` examples, padded | ``transformers.LlamaForCausalLM``, ``attn_implementation="sdpa"`` |

The backends of our model are switched by monkeypatching ``paddlenlp_ext.transformers.llama.modeling.
flashmask_attention`` (the model code is unchanged). Data: example lengths are drawn from a log-normal with
median 661 and mean 1074 tokens (sigma = sqrt(2 ln(1074/661)) = 0.985, p99 ~ 6500), clipped to
``[16, pack_len]``; token ids are uniform; the first third of each example is prompt (labels -100), the rest
response. The records are packed with the real ``ZeroPaddingMapDataset(greedy_zero_padding=True)`` and padded with
``collate_packs``; the padded setups take exactly the records of the same packs, in pack order, ``--batch_size``
at a time (``one_per_pack`` packs, dynamic padding to a multiple of 64).

Metrics (time measured between two ``cuda.synchronize`` calls around the timed steps only):
- effective tokens/s = non-padding tokens of the timed steps / seconds.
- MFU = (6 * N * tokens + 12 * n_layers * H_q * head_dim * sum_docs n_doc (n_doc + 1) / 2) / seconds / 989e12,
  N = unique parameters (tied embedding counted once; it is the LM head matmul); attention FLOPs count only
  unmasked (query, key) pairs of real tokens (forward 4*D*H per pair, backward twice that). Recompute and padding
  work are not counted, so this is model-FLOPs utilisation of useful work.
- peak GiB = ``torch.cuda.max_memory_allocated`` over the setup (weights, AdamW state, activations).

Usage: ``python benchmarks/e2e_train.py --setups ours,padded,sdpa_dense,flex,hf_padded --pack_len 8192
--steps 10 --warmup 3 [--longest] --out e2e.json``; ``--tiny`` runs a toy model on CPU (debugging only).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import platform
import sys
import time
import traceback
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn.functional as F
import torch.utils.checkpoint

import paddlenlp_ext.transformers.llama.modeling as llama_modeling
from paddlenlp_ext.datasets import ZeroPaddingMapDataset, collate_packs
from paddlenlp_ext.trainer.loss import IGNORE_INDEX, count_real_tokens, sft_loss
from paddlenlp_ext.transformers.llama import LlamaConfig, LlamaForCausalLM

PEAK_BF16_FLOPS = 989e12  # H200 / H100 SXM dense bf16 peak
MEDIAN, MEAN = 661.0, 1074.0  # chat-example length distribution (tokens)
SIGMA = math.sqrt(2 * math.log(MEAN / MEDIAN))
ALL_SETUPS = ("ours", "padded", "sdpa_dense", "flex", "naive_packed", "hf_padded")
PACKED = ("ours", "sdpa_dense", "flex", "naive_packed")

LLAMA_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=32, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True,
                rope_theta=500000.0, max_position_embeddings=131072, rms_norm_eps=1e-5,
                rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, rope_theta=10000.0,
            max_position_embeddings=4096, rms_norm_eps=1e-5, rope_scaling=None)


# ----------------------------------------------------------------------------------------------- data
def make_records(n: int, vocab: int, max_len: int, seed: int, scale: float = 1.0) -> list[dict]:
    """``n`` synthetic tokenized SFT records (design.md keys, labels already shifted), lengths log-normal.

    Lengths ~ LogNormal(ln 661, 0.985) * ``scale``, rounded, clipped to ``[16, max_len]``.
    """
    rng = np.random.default_rng(seed)
    lens = np.clip(np.rint(rng.lognormal(math.log(MEDIAN), SIGMA, n) * scale), 16, max_len).astype(int)
    recs = []
    for n_tok in lens.tolist():
        ids = rng.integers(1, vocab, n_tok + 1).tolist()  # one extra: the target of the last token (EOS stand-in)
        prompt = n_tok // 3
        labels = [IGNORE_INDEX] * prompt + ids[prompt + 1: n_tok + 1]
        recs.append({"input_ids": ids[:n_tok], "labels": labels, "position_ids": list(range(n_tok))})
    return recs


def build_packs(vocab: int, pack_len: int, n_packs: int, seed: int, scale: float) -> list[dict]:
    """At least ``n_packs`` packs (the real ZeroPadding greedy path), each a dict with ``seq_lens``."""
    n_rec = max(64, int(n_packs * pack_len / (MEAN * scale) * 1.3) + 8)
    while True:
        ds = ZeroPaddingMapDataset(make_records(n_rec, vocab, pack_len, seed, scale), max_length=pack_len,
                                   greedy_zero_padding=True)
        # the last packs of a greedy buffer are underfull; keep only the first n_packs
        if len(ds) >= n_packs + 2:
            return [ds[i] for i in range(n_packs)]
        n_rec *= 2


def split_pack(pack: dict) -> list[dict]:
    """The records of a pack, back as one-record packs (positions restart at 0, so slicing is exact)."""
    out, off = [], 0
    for n in pack["seq_lens"]:
        rec = {k: pack[k][off: off + n] for k in ("input_ids", "labels", "position_ids")}
        rec["attn_mask_startend_row_indices"] = [n] * n
        rec["seq_lens"] = [n]
        out.append(rec)
        off += n
    return out


def attention_pairs(seq_lens) -> int:
    """Unmasked causal (query, key) pairs of examples of these lengths: sum n (n + 1) / 2."""
    return sum(n * (n + 1) // 2 for n in seq_lens)


def make_batches(setup: str, packs: list[dict], pack_len: int, batch_size: int, device) -> list[dict]:
    """Device batches for ``setup``: one pack per batch, or ``batch_size`` examples padded to the longest.

    Each batch dict also holds the python ints ``_tokens`` (non-padding tokens) and ``_pairs``, and for the
    padded setups one batch boundary falls on every pack boundary so warm-up / timed splits match.
    """
    out = []
    for pack in packs:
        if setup in PACKED:
            groups = [([pack], pack_len, None)]
        else:
            recs = split_pack(pack)
            groups = [(recs[i: i + batch_size], pack_len, 64) for i in range(0, len(recs), batch_size)]
        chunk = []
        for members, max_len, mult in groups:
            b = collate_packs(members, max_len, pad_token_id=0, pad_to_multiple_of=mult)
            lens = [n for m in members for n in m["seq_lens"]]
            b["_tokens"], b["_pairs"] = sum(lens), attention_pairs(lens)
            if setup == "hf_padded":
                seq = b["input_ids"].shape[1]
                b["attention_mask"] = (torch.arange(seq)[None] < torch.tensor([m["seq_lens"][0] for m in members])[:, None]).long()
            assert int(count_real_tokens(b)) == b["_tokens"]
            chunk.append({k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in b.items()})
        out.append(chunk)
    return out  # list (per pack) of lists of batches


# ----------------------------------------------------------------------------------------------- attention backends
_dense_cache: list = [None, None]  # (sri tensor, dense mask): one mask per batch, shared by all layers


def _dense_mask(sri: torch.Tensor) -> torch.Tensor:
    """bool ``[B, 1, L, L]`` (True = attend) of a causal C=1 FlashMask, diagonal always on (padding rows would be
    all-False and give NaN in SDPA; their labels are -100 so they never reach the loss)."""
    if _dense_cache[0] is sri:
        return _dense_cache[1]
    lts = sri[:, 0, :, 0]  # [B, L]
    seq = lts.shape[-1]
    i = torch.arange(seq, device=sri.device)
    mask = (i[None, :, None] < lts[:, None, :]) & (i[None, None, :] <= i[None, :, None])  # [B, L(q), L(k)]
    mask.diagonal(dim1=-2, dim2=-1).fill_(True)  # in place: an eye() would be another L*L bytes
    _dense_cache[0], _dense_cache[1] = sri, mask[:, None]
    return _dense_cache[1]


def sdpa_dense_attention(q, k, v, startend_row_indices=None, causal=True, **_):
    """``[B, L, H, D]`` attention through SDPA with a materialised document-causal mask (k/v repeated for GQA,
    as transformers does, so the memory-efficient kernel that takes a mask can run)."""
    rep = q.shape[2] // k.shape[2]
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, L, D]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    mask = _dense_mask(startend_row_indices)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)


def naive_causal_attention(q, k, v, startend_row_indices=None, causal=True, **_):
    """Plain causal SDPA over the whole pack (examples see earlier examples: 'packing without isolation')."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2)


def flex_attention_backend(q, k, v, startend_row_indices=None, causal=True, **_):
    from flashmask.flex import flex_flashmask_attention
    import torch._dynamo
    # each batch brings a new BlockMask / mask_mod closure; do not fall back to eager on the default limit (8)
    for knob in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, max(getattr(torch._dynamo.config, knob), 64))
    return flex_flashmask_attention(q, k, v, startend_row_indices, causal)


BACKENDS = {"sdpa_dense": sdpa_dense_attention, "naive_packed": naive_causal_attention,
            "flex": flex_attention_backend}


# ----------------------------------------------------------------------------------------------- models and loss
def build_model(setup: str, cfg: dict, device, recompute: bool):
    """fp32 model on ``device``: ours (LlamaForCausalLM of paddlenlp_ext) or transformers' (setup hf_padded)."""
    if setup == "hf_padded":
        import transformers
        hcfg = transformers.LlamaConfig(**{k: v for k, v in cfg.items()}, attention_bias=False, mlp_bias=False)
        hcfg._attn_implementation = "sdpa"
        with torch.device(device):
            model = transformers.LlamaForCausalLM(hcfg)
        if recompute:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        return model.train()
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig(**cfg, recompute=recompute))
    return model.train()


def _ce_chunk(h, w, labels):
    return F.cross_entropy((h @ w.t()).float(), labels, ignore_index=IGNORE_INDEX, reduction="sum")


def chunked_ce(hidden, weight, labels, chunk: int = 4096):
    """Summed CE of ``hidden [N, E] @ weight[V, E].T`` against ``labels [N]``, ``chunk`` rows at a time, each
    chunk checkpointed: only ``chunk x V`` logits live at once (fp32 logits of 128K tokens would be 64 GiB)."""
    total = hidden.new_zeros((), dtype=torch.float32)
    for s in range(0, hidden.shape[0], chunk):
        total = total + torch.utils.checkpoint.checkpoint(_ce_chunk, hidden[s: s + chunk], weight,
                                                          labels[s: s + chunk], use_reentrant=False)
    return total


def loss_sum(setup: str, model, batch: dict, loss: str):
    """Summed token CE (fp32 scalar). ``loss='full'``: ours through the trainer's ``sft_loss`` (full fp32
    logits), transformers' model through the same formula; ``'chunked'``: :func:`chunked_ce` for both."""
    labels = batch["labels"]
    if setup == "hf_padded":
        h = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    elif loss == "full":
        return sft_loss(model, batch)[0]
    else:
        h = model.model(batch["input_ids"], batch["position_ids"], batch["attn_mask_startend_row_indices"])
    w = model.lm_head.weight
    if loss == "full":
        return F.cross_entropy(F.linear(h, w).float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                               reduction="sum")
    return chunked_ce(h.flatten(0, 1), w, labels.flatten())


# ----------------------------------------------------------------------------------------------- one setup
def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def run_setup(setup: str, args, cfg: dict, packs: list[dict], device, recompute: bool, loss: str,
              warmup: int, steps: int) -> dict:
    """Train ``warmup + steps`` packs' worth of batches; time the last ``steps`` packs. Returns the metrics."""
    _free(device)
    orig = llama_modeling.flashmask_attention
    if setup in BACKENDS:
        llama_modeling.flashmask_attention = BACKENDS[setup]
    try:
        batches = make_batches(setup, packs[: warmup + steps], args.pack_len, args.batch_size, device)
        torch.manual_seed(args.seed)  # every setup of our model starts from the same weights
        model = build_model(setup, cfg, device, recompute)
        n_params = sum(p.numel() for p in model.parameters())  # tied weights counted once
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0, fused=device.type == "cuda")
        amp = torch.autocast(device.type, dtype=torch.bfloat16)
        tokens = pairs = n_batches = 0
        t_first = time.perf_counter()
        t0 = None
        last = None
        for p_idx, group in enumerate(batches):
            if p_idx == warmup:
                _sync(device)
                t0 = time.perf_counter()
            for b in group:
                with amp:
                    ls = loss_sum(setup, model, b, loss)
                n_lab = (b["labels"] != IGNORE_INDEX).sum()
                (ls / n_lab).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                last = ls.detach() / n_lab
                if t0 is not None:
                    tokens, pairs, n_batches = tokens + b["_tokens"], pairs + b["_pairs"], n_batches + 1
        _sync(device)
        t1 = time.perf_counter()
        if t0 is None:  # steps == 0: time everything
            t0 = t_first
        secs = t1 - t0
        n_layers, h_q, d = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["head_dim"]
        flops = 6 * n_params * tokens + 12 * n_layers * h_q * d * pairs
        res = dict(status="ok", tokens_per_s=tokens / secs, mfu=flops / secs / PEAK_BF16_FLOPS, seconds=secs,
                   timed_tokens=tokens, timed_batches=n_batches, params=n_params, attn_pairs=pairs,
                   model_tflops=flops / secs / 1e12, final_loss=float(last) if last is not None else None,
                   warmup_seconds=t0 - t_first)
        if device.type == "cuda":
            res["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        return res
    finally:
        llama_modeling.flashmask_attention = orig
        _dense_cache[0] = _dense_cache[1] = None


def guarded(setup, fn, device) -> dict:
    """Run ``fn()``; an OOM gives ``{"status": "OOM"}``, any other error ``{"status": "error: ..."}``."""
    try:
        res = fn()
    except torch.OutOfMemoryError as e:  # noqa: F841
        res = {"status": "OOM"}
    except Exception as e:  # one broken setup must not end the run
        traceback.print_exc()
        res = {"status": f"error: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
    if device.type == "cuda" and res["status"] != "ok":
        res["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    _free(device)
    print(f"[{setup}] {json.dumps(res)}", flush=True)
    return res


# ----------------------------------------------------------------------------------------------- report
def fmt_table(results: dict, ref: str = "hf_padded", ours: str = "ours") -> str:
    rows = ["| setup | tokens/s (effective) | MFU | peak GiB | x hf_padded | x ours |", "|---|---|---|---|---|---|"]
    base = results.get(ref, {}).get("tokens_per_s")
    mine = results.get(ours, {}).get("tokens_per_s")
    for name, r in results.items():
        if r.get("status") != "ok":
            peak = f"{r['peak_gib']:.1f}" if "peak_gib" in r else "-"
            rows.append(f"| {name} | {r['status']} | - | {peak} | - | - |")
            continue
        tps = r["tokens_per_s"]
        peak = f"{r['peak_gib']:.1f}" if "peak_gib" in r else "-"
        rows.append(f"| {name} | {tps:,.0f} | {100 * r['mfu']:.1f}% | {peak} | "
                    f"{tps / base:.2f} | {tps / mine:.2f} |" if base and mine else
                    f"| {name} | {tps:,.0f} | {100 * r['mfu']:.1f}% | {peak} | - | - |")
    return "\n".join(rows)


def longest_context(args, cfg, device, scale, t_start) -> dict:
    """Largest single packed sequence that trains (recompute on, chunked CE), ours vs sdpa_dense; each setup
    stops at its first failure. One timed step per length, no warm-up (the kernels were compiled by the table
    runs), so its tokens/s is indicative only. A length is skipped when 4.5x the previous length's step time
    (quadratic attention plus slack) would overrun ``--time_budget``."""
    out = {}
    for setup in ("ours", "sdpa_dense"):
        out[setup] = {}
        prev = 0.0
        for seq in args.longest_lens:
            left = args.time_budget - (time.perf_counter() - t_start)
            if left < 4.5 * prev + 5:
                out[setup][seq] = {"status": f"skipped (time budget: {left:.0f} s left, estimated {4.5 * prev:.0f} s)"}
                break
            packs = build_packs(cfg["vocab_size"], seq, 1, args.seed + seq, scale)
            sub = argparse.Namespace(**{**vars(args), "pack_len": seq})
            t = time.perf_counter()
            r = guarded(f"longest {setup} {seq}", lambda: run_setup(setup, sub, cfg, packs, device, True, "chunked",
                                                                    0, 1), device)
            prev = time.perf_counter() - t
            out[setup][seq] = r
            if r["status"] != "ok":
                break
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setups", default="ours,padded,sdpa_dense,flex,naive_packed,hf_padded")
    ap.add_argument("--pack_len", type=int, default=8192)
    ap.add_argument("--batch_size", type=int, default=4, help="examples per padded batch")
    ap.add_argument("--steps", type=int, default=10, help="timed packs (padded setups: their examples)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--loss", choices=("full", "chunked"), default="full")
    ap.add_argument("--recompute", action="store_true", help="activation checkpointing in the table runs")
    ap.add_argument("--longest", action="store_true", help="also find the longest trainable packed sequence")
    ap.add_argument("--longest_lens", default="32768,65536,131072")
    ap.add_argument("--time_budget", type=float, default=1e9, help="seconds; later setups are skipped after it")
    ap.add_argument("--tiny", action="store_true", help="toy model on CPU (debugging)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="JSON results path")
    args = ap.parse_args(argv)
    setups = [s.strip() for s in args.setups.split(",") if s.strip()]
    bad = [s for s in setups if s not in ALL_SETUPS]
    if bad:
        raise ValueError(f"--setups: unknown {bad}; choose from {list(ALL_SETUPS)}")
    args.longest_lens = [int(x) for x in args.longest_lens.split(",")]
    t_start = time.perf_counter()
    cfg = dict(TINY if args.tiny else LLAMA_1B)
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    scale = args.pack_len / 8192 if args.tiny else 1.0  # toy lengths keep the distribution's shape
    packs = build_packs(cfg["vocab_size"], args.pack_len, args.warmup + args.steps, args.seed, scale)
    timed = packs[args.warmup: args.warmup + args.steps]
    n_tok = sum(sum(p["seq_lens"]) for p in timed)
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), argv=sys.argv, python=platform.python_version(),
                torch=torch.__version__, device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                config=cfg, timed_packs=len(timed), timed_examples=sum(len(p["seq_lens"]) for p in timed),
                timed_tokens=n_tok, pack_fill=n_tok / (len(timed) * args.pack_len),
                lognormal=dict(median=MEDIAN, mean=MEAN, sigma=SIGMA))
    try:
        import triton
        meta["triton"] = triton.__version__
    except ImportError:
        pass
    try:
        import transformers
        meta["transformers"] = transformers.__version__
    except ImportError:
        pass
    print(json.dumps(meta), flush=True)
    results = {}
    report = {"meta": meta, "table": results}

    def save():  # after every setup, so a run killed at its time limit still leaves its JSON
        if args.out:
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1)

    for s in setups:
        if time.perf_counter() - t_start > args.time_budget:
            results[s] = {"status": "skipped (time budget)"}
            continue
        results[s] = guarded(s, lambda: run_setup(s, args, cfg, packs, device, args.recompute, args.loss,
                                                  args.warmup, args.steps), device)
        save()
    print(fmt_table(results))
    if args.longest:
        report["longest"] = longest_context(args, cfg, device, scale, t_start)
        for setup, per in report["longest"].items():
            print(setup, {k: (v["status"], round(v.get("peak_gib", 0), 1), round(v.get("tokens_per_s", 0)))
                          for k, v in per.items()})
    report["total_seconds"] = time.perf_counter() - t_start
    save()
    return report


if __name__ == "__main__":
    main()
