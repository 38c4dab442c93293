"""End-to-end training speed: tokens/s, MFU, peak memory, a kernel profile and the longest context.

One process, one GPU. Every setup trains the same randomly initialised model (``--model``: ``llama1b`` default,
``llama8b_lora``, ``ernie3b``; see ``e2e_models.py``) on the same synthetic token stream and differs only in how
batches are formed, how attention is computed and which fused ops / loss run:

| setup | batches | attention |
|---|---|---|
| ``ours`` | ZeroPadding packs of ``--pack_len`` | FlashMask Triton kernel (``flashmask_attention``, impl auto) |
| ``padded`` | ``--batch_size`` examples, padded to the longest | FlashMask Triton kernel (padding masked by the LTS) |
| ``sdpa_dense`` | packs | SDPA with a dense bool ``[B, 1, L, L]`` document-causal mask (built once per batch) |
| ``flex`` | packs | ``flashmask.flex.flex_flashmask_attention`` (compiled FlexAttention, BlockMask from the LTS) |
| ``naive_packed`` | packs | SDPA ``is_causal=True`` (FlashAttention-2 backend): no isolation between examples |
| ``hf_padded`` | ``--batch_size`` examples, padded | ``transformers.LlamaForCausalLM``, ``attn_implementation="sdpa"`` |
| ``dpo_shared`` / ``dpo_separate`` | preference packs (``e2e_dpo.py``) | FlashMask; share-question vs separate sequences |

Levers per setup, as ``setup:key=value`` (e.g. ``ours:loss=full:fused=off``; defaults ``--loss``, ``--fused``,
``--amp``; ``kernels=triton`` runs FlashMask's Triton kernels where the Gluon ones would, to compare both kernel
sets in one run):
``loss``: ``fused`` = the trainer's ``sft_loss`` (fused linear cross entropy over supervised rows, the default),
``fused_allrows`` (fused, every row, no host sync), ``full`` (``[T, V]`` fp32 logits, the old path), ``chunked``
(checkpointed 4096-row chunks); ``fused``: ``on`` = ``use_fused_rms_norm/rope/swiglu`` (torch.compile'd on CUDA);
``amp``: ``o1`` = bf16 ``torch.autocast`` over fp32 weights (default), ``o2`` = PaddleNLP's ``fp16_opt_level: O2`` as
the trainer runs it: forward/backward inside ``MasterWeights(model).compute()`` (bf16 compute weights refreshed
after each optimizer step, fp32 master weights, gradients and AdamW states), autocast kept.
Aliases: ``ours_nofuse`` = ``ours:loss=full:fused=off`` (the pre-fusion baseline), ``ours_noew`` =
``ours:fused=off``, ``ours_fullce`` = ``ours:loss=full``.

The attention backends of our models are switched by monkeypatching ``flashmask_attention`` (model code unchanged).
Data: example lengths ~ log-normal with median 661 and mean 1074 tokens (sigma = sqrt(2 ln(1074/661)) = 0.985, p99
~ 6500), clipped to ``[16, pack_len]``; token ids uniform; the first third of each example is prompt (labels
-100). Records are packed with the real ``ZeroPaddingMapDataset(greedy_zero_padding=True)`` and ``collate_packs``;
the padded setups take exactly the records of the same packs, in pack order, ``--batch_size`` at a time.
Every batch is on the device before timing, and FlashMask's index range check (a host sync, cached on the index
tensor) is done then too, so the timed step has no host sync except ``sft_loss``'s one read of the supervised row
count before the forward (``loss=fused``; ``fused_allrows`` has none) and the trl label checks of the DPO rows.

Metrics (time between two ``cuda.synchronize`` calls around the timed steps only):
- effective tokens/s = non-padding tokens of the timed steps / seconds (DPO rows also give preference pairs/s).
- MFU = model FLOPs / seconds / 989e12, FLOPs = ``(4 N + 2 N_train) T + 12 n_layers H_q D P`` (``e2e_models.py``:
  6 N T for full fine-tuning, N without an untied input embedding), P = unmasked causal (query, key) pairs of real
  tokens, counted from the LTS vectors. Recompute and padding work are not counted.
- peak GiB = ``torch.cuda.max_memory_allocated`` from after the model is built (weights, AdamW, activations).

``--profile``: torch.profiler over 2 steps of ``ours`` (after one warm-up step); the top 25 CUDA kernels by total
time (name, calls, ms, %) go to stdout and the JSON (``e2e_profile.py``).

Usage: ``python benchmarks/e2e_train.py --setups ours,ours_nofuse,flex,naive_packed,hf_padded --pack_len 8192
--steps 10 --warmup 3 [--profile] [--longest] --out e2e.json``; ``--tiny`` runs toy models on CPU (smoke test).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import sys
import time
import traceback
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F
import torch.utils.checkpoint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import e2e_dpo  # noqa: E402
import e2e_models  # noqa: E402
from e2e_models import LLAMA_1B, TINY  # noqa: E402,F401  (re-exported for callers of this script)

from paddlenlp_ext.datasets import ZeroPaddingMapDataset, collate_packs  # noqa: E402
from paddlenlp_ext.ops import fused_linear_cross_entropy  # noqa: E402
from paddlenlp_ext.trainer.loss import IGNORE_INDEX, count_real_tokens, sft_loss  # noqa: E402
from paddlenlp_ext.trainer.mixed_precision import MasterWeights  # noqa: E402

PEAK_BF16_FLOPS = 989e12  # H200 / H100 SXM dense bf16 peak
MEDIAN, MEAN = 661.0, 1074.0  # chat-example length distribution (tokens)
SIGMA = math.sqrt(2 * math.log(MEAN / MEDIAN))
ALL_SETUPS = ("ours", "padded", "sdpa_dense", "flex", "naive_packed", "hf_padded", "dpo_shared", "dpo_separate")
PACKED = ("ours", "sdpa_dense", "flex", "naive_packed")
DPO = ("dpo_shared", "dpo_separate")
ALIASES = {"ours_nofuse": "ours:loss=full:fused=off", "ours_noew": "ours:fused=off", "ours_fullce": "ours:loss=full"}
LOSSES = ("fused", "fused_allrows", "full", "chunked")
AMPS = ("o1", "o2")


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
    prime_mask_checks(out)
    return out  # list (per pack) of lists of batches


def prime_mask_checks(groups: list[list[dict]]) -> None:
    """Run FlashMask's index-range check (a device-to-host read, cached on the index tensor) on every batch now,
    outside the timed steps, as a data loader would while the previous step runs."""
    try:
        from flashmask.api import _index_range
    except ImportError:  # pragma: no cover - an api without the cache
        return
    for group in groups:
        for b in group:
            sri = b.get("attn_mask_startend_row_indices")
            if sri is not None and sri.numel():
                _index_range(sri)


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


# ----------------------------------------------------------------------------------------------- setups and loss
def parse_setup(spec: str, loss: str, fused: str, amp: str = "o1") -> dict:
    """``"ours:loss=full:fused=off:amp=o2"`` -> ``{"label", "base", "loss", "fused", "amp"}`` (defaults from the CLI).

    Raises:
        ValueError: unknown setup, key or value (the message lists the valid ones).
    """
    label = spec
    spec = ALIASES.get(spec, spec)
    base, *opts = spec.split(":")
    if base not in ALL_SETUPS:
        raise ValueError(f"--setups: unknown {base!r}; choose from {list(ALL_SETUPS)} or {list(ALIASES)} "
                         f"(options as setup:loss=...:fused=...:amp=...)")
    if amp not in AMPS:
        raise ValueError(f"--amp: unknown {amp!r}; use {'|'.join(AMPS)}")
    out = {"label": label, "base": base, "loss": loss, "fused": fused, "amp": amp, "compile": "off", "kernels": "auto"}
    for o in opts:
        key, _, val = o.partition("=")
        if key == "loss" and val in LOSSES:
            out["loss"] = val
        elif key == "fused" and val in ("on", "off"):
            out["fused"] = val
        elif key == "amp" and val in AMPS:
            out["amp"] = val
        elif key == "compile" and val in ("off", "layers"):
            out["compile"] = val
        elif key == "kernels" and val in ("auto", "triton"):
            out["kernels"] = val
        else:
            raise ValueError(f"--setups {label!r}: bad option {o!r}; use loss={'|'.join(LOSSES)}, fused=on|off, "
                             f"amp={'|'.join(AMPS)}, compile=off|layers or kernels=auto|triton")
    return out


def _ce_chunk(h, w, b, labels):
    z = h @ w.t() if b is None else torch.addmm(b, h, w.t())
    return F.cross_entropy(z.float(), labels, ignore_index=IGNORE_INDEX, reduction="sum")


def chunked_ce(hidden, weight, labels, chunk: int = 4096, bias=None):
    """Summed CE of ``hidden [N, E] @ weight[V, E].T (+ bias)`` against ``labels [N]``, ``chunk`` rows at a time,
    each chunk checkpointed: only ``chunk x V`` logits live at once."""
    total = hidden.new_zeros((), dtype=torch.float32)
    for s in range(0, hidden.shape[0], chunk):
        total = total + torch.utils.checkpoint.checkpoint(_ce_chunk, hidden[s: s + chunk], weight, bias,
                                                          labels[s: s + chunk], use_reentrant=False)
    return total


def loss_sum(setup: str, model, batch: dict, loss: str):
    """Summed token CE (fp32 scalar) of an SFT batch.

    Our models: ``fused`` / ``fused_allrows`` / ``full`` go through the trainer's ``sft_loss`` (``fused=True`` with
    and without skipping unsupervised rows, ``fused=False``); ``chunked`` uses :func:`chunked_ce` on
    ``model.model(...)``. Transformers' model (``hf_padded``) gets the same formulas on its last hidden state.
    """
    if setup != "hf_padded" and loss != "chunked":
        return sft_loss(model, batch, fused=loss != "full", skip_ignored=loss == "fused")[0]
    labels = batch["labels"]
    if setup == "hf_padded":
        h = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    else:
        h = model.model(batch["input_ids"], batch["position_ids"], batch["attn_mask_startend_row_indices"])
    w, b = model.lm_head.weight, model.lm_head.bias
    h, labels = h.flatten(0, 1), labels.flatten()
    if loss == "full":
        return F.cross_entropy(F.linear(h, w, b).float(), labels, ignore_index=IGNORE_INDEX, reduction="sum")
    if loss == "chunked":
        return chunked_ce(h, w, labels, bias=b)
    return fused_linear_cross_entropy(h, w, labels, b, skip_ignored=loss == "fused")


# ----------------------------------------------------------------------------------------------- one setup
def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def prepare(sp: dict, args, info: dict, packs, device, recompute: bool, n_groups: int):
    """Batches (groups per pack), model, optimizer and a ``step(batch) -> detached loss`` closure of setup ``sp``."""
    base = sp["base"]
    if base in DPO:
        scale = args.pack_len / 8192 if args.tiny else 1.0
        batches = e2e_dpo.build_dpo_batches(base, info["vocab"], args.pack_len, n_groups, args.seed, scale, device)
        prime_mask_checks(batches)
    else:
        batches = make_batches(base, packs[:n_groups], args.pack_len, args.batch_size, device)
    torch.manual_seed(args.seed)  # every setup of a model starts from the same weights
    model = e2e_models.build_model(info, base, device, recompute, sp["fused"] == "on")
    if sp.get("compile") == "layers":  # torch.compile each decoder layer (torchtitan's apply_compile); the
        for layer in getattr(getattr(model, "model", model), "layers"):  # attention call is a graph break
            layer.compile()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0, fused=device.type == "cuda")
    amp = torch.autocast(device.type, dtype=torch.bfloat16)
    # O2: the trainer's MasterWeights; its optimizer hook marks the bf16 copies stale after every opt.step()
    master = MasterWeights(model, torch.bfloat16, opt) if sp["amp"] == "o2" else None

    def step(b):
        with (master.compute() if master is not None else contextlib.nullcontext()):
            with amp:
                if base in DPO:
                    ls, n = e2e_dpo.dpo_loss(model, b)
                else:
                    ls, n = loss_sum(base, model, b, sp["loss"]), (b["labels"] != IGNORE_INDEX).sum()
            (ls / n).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return ls.detach() / n

    return batches, model, step


def run_setup(sp, args, info: dict, packs: list[dict], device, recompute: bool, warmup: int, steps: int) -> dict:
    """Train ``warmup + steps`` packs' worth of batches; time the last ``steps`` packs. Returns the metrics.

    ``sp``: a setup name or :func:`parse_setup` dict."""
    if isinstance(sp, str):
        sp = parse_setup(sp, args.loss, args.fused, args.amp)
    _free(device)
    attn = BACKENDS.get(sp["base"])
    # kernels=triton: FlashMask's Triton kernels where the Gluon ones would run (the switches are read per call)
    env = dict.fromkeys(("FLASHMASK_FWD", "FLASHMASK_BWD"), "triton") if sp.get("kernels") == "triton" else {}
    try:
        with e2e_models.patched_attention(attn), mock.patch.dict(os.environ, env):
            batches, model, step = prepare(sp, args, info, packs, device, recompute, warmup + steps)
            n_mm, n_train = e2e_models.matmul_params(model)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            tokens = pairs = n_batches = n_pref = 0
            t_first = time.perf_counter()
            t0 = last = None
            for p_idx, group in enumerate(batches):
                if p_idx == warmup:
                    _sync(device)
                    t0 = time.perf_counter()
                for b in group:
                    last = step(b)
                    if t0 is not None:
                        tokens, pairs, n_batches = tokens + b["_tokens"], pairs + b["_pairs"], n_batches + 1
                        n_pref += b.get("_n_pairs", 0)
            _sync(device)
            t1 = time.perf_counter()
        if t0 is None:  # steps == 0: time everything
            t0 = t_first
        secs = t1 - t0
        flops = e2e_models.step_flops(info, n_mm, n_train, tokens, pairs)
        res = dict(status="ok", tokens_per_s=tokens / secs, mfu=flops / secs / PEAK_BF16_FLOPS, seconds=secs,
                   timed_tokens=tokens, timed_batches=n_batches, params=n_mm, params_trained=n_train,
                   attn_pairs=pairs, model_tflops=flops / secs / 1e12, loss=sp["loss"], fused=sp["fused"],
                   amp=sp["amp"],
                   final_loss=float(last) if last is not None else None, warmup_seconds=t0 - t_first)
        if sp["base"] in DPO:
            res.update(pref_pairs=n_pref, pairs_per_s=n_pref / secs)
        from paddlenlp_ext.ops import elementwise

        if elementwise._failed:  # torch.compile fell back to eager: the fused-op numbers are not fused
            res["compile_failed"] = sorted(f.__name__ for f in elementwise._failed)
        if device.type == "cuda":
            res["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        return res
    finally:
        _dense_cache[0] = _dense_cache[1] = None


def guarded(setup, fn, device) -> dict:
    """Run ``fn()``; an OOM gives ``{"status": "OOM"}``, any other error ``{"status": "error: ..."}``."""
    try:
        res = fn()
    except torch.OutOfMemoryError:
        res = {"status": "OOM"}
    except Exception as e:  # one broken setup must not end the run
        traceback.print_exc()
        res = {"status": f"error: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
    if device.type == "cuda" and res["status"] != "ok":
        res["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    _free(device)
    print(f"[{setup}] {json.dumps(res)}", flush=True)
    return res


def profile_ours(args, info, packs, device) -> dict:
    """``--profile``: one warm-up step then 2 profiled steps of ``ours`` (CLI ``--loss``/``--fused``/``--amp``)."""
    from e2e_profile import format_profile, profile_steps

    sp = parse_setup("ours", args.loss, args.fused, args.amp)
    _free(device)
    batches, model, step = prepare(sp, args, info, packs, device, args.recompute, 3)
    flat = [b for g in batches for b in g]
    step(flat[0])
    _sync(device)
    res = profile_steps(lambda i: step(flat[1 + i]), 2, device)
    del model, batches
    _free(device)
    print(format_profile(res), flush=True)
    return res


# ----------------------------------------------------------------------------------------------- report
def fmt_table(results: dict, ref: str = "hf_padded", ours: str = "ours") -> str:
    """Markdown table: tokens/s, MFU, peak GiB, ratios to ``ref`` and ``ours`` rows, pairs/s of DPO rows."""
    rows = ["| setup | loss | fused ops | amp | tokens/s (effective) | MFU | peak GiB | x hf_padded | x ours | "
            "pairs/s |", "|---|---|---|---|---|---|---|---|---|---|"]
    base = results.get(ref, {}).get("tokens_per_s")
    # "x ours": the plain "ours" row, else the first "ours:..." row (e.g. ours:amp=o1)
    mine = (results.get(ours) or next((r for k, r in results.items() if k.split(":")[0] == ours), {})).get(
        "tokens_per_s")
    for name, r in results.items():
        peak = f"{r['peak_gib']:.1f}" if "peak_gib" in r else "-"
        if r.get("status") != "ok":
            rows.append(f"| {name} | - | - | - | {r['status']} | - | {peak} | - | - | - |")
            continue
        tps = r["tokens_per_s"]
        xb = f"{tps / base:.2f}" if base else "-"
        xo = f"{tps / mine:.2f}" if mine else "-"
        pps = f"{r['pairs_per_s']:,.1f}" if "pairs_per_s" in r else "-"
        loss = "trl logps" if name.split(":")[0] in DPO else r.get("loss", "-")
        rows.append(f"| {name} | {loss} | {r.get('fused', '-')} | {r.get('amp', '-')} | {tps:,.0f} | "
                    f"{100 * r['mfu']:.1f}% | {peak} | {xb} | {xo} | {pps} |")
    return "\n".join(rows)


def longest_context(args, info, device, scale, t_start) -> dict:
    """Largest single packed sequence that trains (recompute on), ours vs sdpa_dense; each setup stops at its
    first failure. Loss: ``--loss`` when it is memory-safe (fused / fused_allrows / chunked), else chunked. One
    timed step per length, no warm-up, so its tokens/s is indicative only. A length is skipped when 4.5x the
    previous length's step time (quadratic attention plus slack) would overrun ``--time_budget``."""
    loss = args.loss if args.loss != "full" else "chunked"
    out = {}
    for setup in ("ours", "sdpa_dense"):
        out[setup] = {}
        prev = 0.0
        for seq in args.longest_lens:
            left = args.time_budget - (time.perf_counter() - t_start)
            if left < 4.5 * prev + 5:
                out[setup][seq] = {"status": f"skipped (time budget: {left:.0f} s left, estimated {4.5 * prev:.0f} s)"}
                break
            packs = build_packs(info["vocab"], seq, 1, args.seed + seq, scale)
            sub = argparse.Namespace(**{**vars(args), "pack_len": seq})
            sp = parse_setup(setup, loss, args.fused, args.amp)
            t = time.perf_counter()
            r = guarded(f"longest {setup} {seq}", lambda: run_setup(sp, sub, info, packs, device, True, 0, 1), device)
            prev = time.perf_counter() - t
            out[setup][seq] = r
            if r["status"] != "ok":
                break
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setups", default="ours,padded,sdpa_dense,flex,naive_packed,hf_padded")
    ap.add_argument("--model", default="llama1b", choices=e2e_models.MODELS)
    ap.add_argument("--pack_len", type=int, default=8192)
    ap.add_argument("--batch_size", type=int, default=4, help="examples per padded batch")
    ap.add_argument("--steps", type=int, default=10, help="timed packs (padded setups: their examples)")
    ap.add_argument("--warmup", type=int, default=4,
                    help="untimed steps first; they must cover Triton and torch.compile (re)compiles for new shapes")
    ap.add_argument("--loss", choices=LOSSES, default="fused", help="default loss of every setup")
    ap.add_argument("--fused", choices=("on", "off"), default="on", help="use_fused_rms_norm/rope/swiglu default")
    ap.add_argument("--amp", choices=AMPS, default="o1",
                    help="default precision of every setup: o1 = bf16 autocast, o2 = MasterWeights (bf16 weights, "
                         "fp32 master weights and grads) + autocast")
    ap.add_argument("--recompute", action="store_true", help="activation checkpointing in the table runs")
    ap.add_argument("--profile", action="store_true", help="profile 2 steps of ours: top 25 CUDA kernels")
    ap.add_argument("--longest", action="store_true", help="also find the longest trainable packed sequence")
    ap.add_argument("--longest_lens", default="32768,65536,131072")
    ap.add_argument("--time_budget", type=float, default=1e9, help="seconds; later setups are skipped after it")
    ap.add_argument("--tiny", action="store_true", help="toy model on CPU (debugging)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="JSON results path")
    args = ap.parse_args(argv)
    specs = [parse_setup(s.strip(), args.loss, args.fused, args.amp) for s in args.setups.split(",") if s.strip()]
    args.longest_lens = [int(x) for x in args.longest_lens.split(",")]
    t_start = time.perf_counter()
    if not args.tiny and not torch.cuda.is_available():
        raise SystemExit("e2e_train needs a CUDA GPU for the real model shapes (the 1B model alone is 5 GB of fp32 "
                         "weights); use --tiny for the CPU smoke test")
    info = e2e_models.model_config(args.model, args.tiny)
    device = torch.device("cpu" if args.tiny else "cuda")
    scale = args.pack_len / 8192 if args.tiny else 1.0  # toy lengths keep the distribution's shape
    packs = build_packs(info["vocab"], args.pack_len, args.warmup + args.steps, args.seed, scale)
    timed = packs[args.warmup: args.warmup + args.steps]
    n_tok = sum(sum(p["seq_lens"]) for p in timed)
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), argv=sys.argv if argv is None else argv,
                python=platform.python_version(), torch=torch.__version__,
                device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu", model=args.model,
                config=info, loss=args.loss, fused=args.fused, amp=args.amp, pack_len=args.pack_len,
                timed_packs=len(timed),
                timed_examples=sum(len(p["seq_lens"]) for p in timed), timed_tokens=n_tok,
                pack_fill=n_tok / (len(timed) * args.pack_len), lognormal=dict(median=MEDIAN, mean=MEAN, sigma=SIGMA))
    for mod in ("triton", "transformers"):
        try:
            meta[mod] = __import__(mod).__version__
        except ImportError:
            pass
    print(json.dumps(meta), flush=True)
    results = {}
    report = {"meta": meta, "table": results}

    def save():  # after every setup, so a run killed at its time limit still leaves its JSON
        if args.out:
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1)

    for sp in specs:
        if time.perf_counter() - t_start > args.time_budget:
            results[sp["label"]] = {"status": "skipped (time budget)"}
            continue
        results[sp["label"]] = guarded(sp["label"], lambda: run_setup(sp, args, info, packs, device, args.recompute,
                                                                      args.warmup, args.steps), device)
        save()
    print(fmt_table(results), flush=True)
    if args.profile:
        report["profile"] = guarded("profile ours", lambda: {"status": "ok", **profile_ours(args, info, packs, device)},
                                    device) if time.perf_counter() - t_start < args.time_budget else \
            {"status": "skipped (time budget)"}
        save()
    if args.longest:
        report["longest"] = longest_context(args, info, device, scale, t_start)
        for setup, per in report["longest"].items():
            print(setup, {k: (v["status"], round(v.get("peak_gib", 0), 1), round(v.get("tokens_per_s", 0)))
                          for k, v in per.items()})
    report["total_seconds"] = time.perf_counter() - t_start
    save()
    return report


if __name__ == "__main__":
    main()
