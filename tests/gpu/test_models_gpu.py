"""Models on a CUDA GPU through the Triton FlashMask kernel: packed == unpacked in bf16, training, ERNIE, DPO.

What is checked (all on CUDA, attention forced to ``impl="triton"`` through :func:`attention_impl`):

1. Llama (hidden 512, 4 layers, 8 / 2 heads, head_dim 64, vocab 4096), bf16 weights: four examples of odd lengths
   packed into one row (and in reverse order into a second row) give the logits of each example run alone.
2. Changing a neighbour example leaves the other examples' logits bit-identical (the kernel adds exact zeros for
   masked keys and skips fully masked tiles by the mask alone, so no value of a masked key reaches a row).
3. 30 AdamW steps on fixed packs (bf16 autocast, fp32 parameters, ``trainer.loss.sft_loss``): loss falls, gradients
   finite; one step's gradients through Triton match ``impl="reference"``.
4. ERNIE-3.5-SE tiny preset (random position ids off): packed == unpacked in bf16.
5. DPO: pair log-probs of a preference pack (chunked head, ``trl.dpo_trainer.policy_pair_logps``) equal each pair
   run alone; one DPO step from policy == reference gives loss ln 2, finite gradients, and a lower loss after.

Tolerance rule (derived, as tests/ops/tolerance.py): ``gold`` = fp32 weights (the bf16 weights cast up) with the
fp32 reference attention; ``same`` = the bf16 model with the PyTorch reference attention (same dtype, no Triton).
Then ``max|alone_triton - gold| <= 2 * max|same - gold| + floor`` and
``max|packed_triton - gold| <= 2 * max|alone_triton - gold| + floor`` with ``floor = 1e-3 * max|gold|``.

``test_llama_bf16_autocast`` pins that under ``torch.autocast`` the Llama's RoPE keeps q/k in the dtype of v
(fp32 cos/sin would promote q/k to fp32 while v stays bf16). Set ``GPU_RESULTS_JSON=path`` to append the measured
numbers.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import math

import pytest
import torch

from _records import record  # tests/gpu/_records.py

import flashmask
from flashmask.api import flashmask_attention as _real_attention
from paddlenlp_ext.transformers.llama import LlamaConfig, LlamaForCausalLM
from paddlenlp_ext.transformers.llama import modeling as llama_modeling

pytestmark = pytest.mark.gpu

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# On a CPU dry run (tests called directly, no GPU) the "Triton" runs fall back to the reference path: bf16 is not
# usable under TRITON_INTERPRET. On CUDA the kernel is always forced.
TRITON = "triton" if DEVICE == "cuda" else "reference"
LENGTHS = (37, 61, 93, 29)  # odd lengths, 220 tokens: one 256 pack with 36 padding tokens
PACK_LEN = 256
LLAMA_CFG = dict(vocab_size=4096, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                 num_attention_heads=8, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-5,
                 rope_theta=10000.0, max_position_embeddings=1024)

if torch.cuda.is_available():
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 gold must be real fp32
    torch.backends.cudnn.allow_tf32 = False


@contextlib.contextmanager
def attention_impl(impl: str, align_dtypes: bool = False):
    """Force ``flashmask_attention(..., impl=impl)`` inside the Llama and ERNIE models; yields a call counter.

    ``align_dtypes``: cast q and k to v's dtype first (a no-op since the Llama RoPE keeps q/k in the projection
    dtype; kept to count mismatches). The counter counts calls per (impl, q dtype).
    """
    calls: collections.Counter = collections.Counter()

    def wrapped(q, k, v, startend_row_indices=None, *, causal=True, **kw):
        if align_dtypes and q.dtype != v.dtype:
            q, k = q.to(v.dtype), k.to(v.dtype)
            calls["aligned"] += 1
        kw["impl"] = impl
        calls[(impl, str(q.dtype))] += 1
        return _real_attention(q, k, v, startend_row_indices, causal=causal, **kw)

    saved = flashmask.flashmask_attention, llama_modeling.flashmask_attention
    flashmask.flashmask_attention = llama_modeling.flashmask_attention = wrapped
    try:
        yield calls
    finally:
        flashmask.flashmask_attention, llama_modeling.flashmask_attention = saved


def pack_rows(rows, length: int, device=DEVICE) -> dict:
    """Design-doc packed batch (docs/design.md section 2) from ``rows``: a list (batch) of lists of int64 ``[n]``.

    Returns ``input_ids``/``labels``/``position_ids`` int64 ``[B, L]`` and ``attn_mask_startend_row_indices``
    int32 ``[B, 1, L, 1]`` (LTS = example end, padding columns 0); labels are next tokens inside each example.
    """
    b = len(rows)
    ids = torch.zeros(b, length, dtype=torch.long)
    labels = torch.full((b, length), -100, dtype=torch.long)
    pos = torch.zeros(b, length, dtype=torch.long)
    sri = torch.zeros(b, 1, length, 1, dtype=torch.int32)
    for r, exs in enumerate(rows):
        start = 0
        for ex in exs:
            end = start + len(ex)
            assert end <= length, f"pack_rows: row {r} needs {end} > {length} tokens"
            ids[r, start:end] = ex
            labels[r, start:end - 1] = ex[1:]
            pos[r, start:end] = torch.arange(len(ex))
            sri[r, 0, start:end, 0] = end
            start = end
    batch = dict(input_ids=ids, labels=labels, position_ids=pos, attn_mask_startend_row_indices=sri)
    return {k: v.to(device) for k, v in batch.items()}


def _examples(lengths, vocab: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (n,), generator=g) for n in lengths]


def _spans(exs):
    out, start = [], 0
    for ex in exs:
        out.append((start, start + len(ex)))
        start += len(ex)
    return out


def _bf16_and_gold(model: torch.nn.Module):
    """(bf16 copy, fp32 copy holding exactly the bf16 weights), both eval, on DEVICE."""
    m16 = copy.deepcopy(model).to(DEVICE, torch.bfloat16).eval()
    return m16, copy.deepcopy(m16).float().eval()


def _maxabs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def _packed_vs_alone(m16, m32, exs, name: str, **fwd_kw) -> dict:
    """The derived-tolerance check of the module docstring for a logits model; returns the measured errors."""
    rows = [exs, exs[::-1]]
    batch = pack_rows(rows, PACK_LEN)
    with torch.no_grad():
        with attention_impl("reference"):
            gold = [m32(ex[None].to(DEVICE), **fwd_kw)[0].double() for ex in exs]
            same = [m16(ex[None].to(DEVICE), **fwd_kw)[0] for ex in exs]
        with attention_impl(TRITON) as calls:
            alone = [m16(ex[None].to(DEVICE), **fwd_kw)[0] for ex in exs]
            packed = m16(batch["input_ids"], position_ids=batch["position_ids"],
                         attn_mask_startend_row_indices=batch["attn_mask_startend_row_indices"], **fwd_kw)
    assert calls[(TRITON, "torch.bfloat16")] > 0 and set(calls) == {(TRITON, "torch.bfloat16")}, calls
    assert torch.isfinite(packed).all(), f"{name}: non-finite packed logits (padding rows included)"
    e_same = max(_maxabs(s, g) for s, g in zip(same, gold))
    e_alone = max(_maxabs(a, g) for a, g in zip(alone, gold))
    e_packed = 0.0
    for r, row in enumerate(rows):
        idx = list(range(len(exs))) if r == 0 else list(range(len(exs)))[::-1]
        for (s, e), i in zip(_spans(row), idx):
            e_packed = max(e_packed, _maxabs(packed[r, s:e], gold[i]))
    scale = max(float(g.abs().max()) for g in gold)
    floor = 1e-3 * scale
    res = dict(max_abs_gold=scale, err_same_bf16_reference=e_same, err_alone_bf16_triton=e_alone,
               err_packed_bf16_triton=e_packed, budget_alone=2 * e_same + floor, budget_packed=2 * e_alone + floor,
               attention_calls=sum(calls.values()))
    record(name, **res)
    assert e_alone <= 2 * e_same + floor, f"{name}: alone Triton bf16 error {e_alone:.4g} > budget {res}"
    assert e_packed <= 2 * e_alone + floor, f"{name}: packed Triton bf16 error {e_packed:.4g} > budget {res}"
    return res


@pytest.fixture(scope="module")
def llama():
    """Random Llama (std 0.04, norm weights U(0.5, 1.5)): (bf16 model, fp32 model with the same weights)."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**LLAMA_CFG))
    model.init_weights(std=0.04)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("layernorm.weight") or n == "model.norm.weight":
                p.uniform_(0.5, 1.5)
    return _bf16_and_gold(model)


def test_llama_packed_equals_unpacked_bf16(llama):
    m16, m32 = llama
    _packed_vs_alone(m16, m32, _examples(LENGTHS, LLAMA_CFG["vocab_size"], seed=1), "llama_packed_vs_alone_bf16")


def test_llama_neighbour_change_is_bitwise_invisible(llama):
    m16, _ = llama
    a, b, c, d = _examples(LENGTHS, LLAMA_CFG["vocab_size"], seed=2)
    b2 = _examples([len(b)], LLAMA_CFG["vocab_size"], seed=3)[0]
    (sa, sb, sc, sd) = _spans([a, b, c, d])
    with torch.no_grad(), attention_impl(TRITON):
        outs = []
        for mid in (b, b2):
            batch = pack_rows([[a, mid, c, d]], PACK_LEN)
            outs.append(m16(batch["input_ids"], position_ids=batch["position_ids"],
                            attn_mask_startend_row_indices=batch["attn_mask_startend_row_indices"])[0])
            leak = m16(batch["input_ids"], position_ids=batch["position_ids"])[0]  # no indices: c sees b
            outs.append(leak)
    o1, leak1, o2, leak2 = outs
    diffs = {n: _maxabs(o1[s:e], o2[s:e]) for n, (s, e) in dict(a=sa, b=sb, c=sc, d=sd).items()}
    record("llama_neighbour_change_bf16", max_abs_diff=diffs, leak_without_indices=_maxabs(leak1[sc[0]:sc[1]],
                                                                                             leak2[sc[0]:sc[1]]))
    assert diffs["b"] > 0, "the changed example's logits did not change"
    assert _maxabs(leak1[sc[0]:sc[1]], leak2[sc[0]:sc[1]]) > 0, "without indices c should see b (test not vacuous)"
    for n in "acd":
        s, e = dict(a=sa, c=sc, d=sd)[n]
        assert torch.equal(o1[s:e], o2[s:e]), f"example {n} changed (max diff {diffs[n]:.3g}) when b changed"


def _train_batch():
    """Two fixed packs of random-token examples (4 + 2 examples, 256 tokens each row)."""
    v = LLAMA_CFG["vocab_size"]
    return pack_rows([_examples((70, 50, 90, 30), v, seed=10), _examples((120, 100), v, seed=11)], PACK_LEN)


def _sft_step_loss(model, batch):
    from paddlenlp_ext.trainer.loss import sft_loss

    loss_sum, count, _ = sft_loss(model, batch)  # the trainer's loss contract: summed CE and token count
    return loss_sum / count


def test_llama_trains_through_triton():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**LLAMA_CFG)).to(DEVICE).train()  # fp32 master weights, std 0.02
    batch = _train_batch()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    losses, norms = [], []
    with attention_impl(TRITON, align_dtypes=True) as calls:
        for step in range(30):
            with torch.autocast(DEVICE, dtype=torch.bfloat16):
                loss = _sft_step_loss(model, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            for n, p in model.named_parameters():
                assert p.grad is not None and torch.isfinite(p.grad).all(), f"step {step}: bad gradient of {n}"
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
            opt.step()
            losses.append(float(loss.detach()))
    record("llama_train_30_steps_bf16_autocast", loss_first=losses[0], loss_last=losses[-1], losses=losses,
            grad_norm_first=norms[0], grad_norm_last=norms[-1], calls={str(k): v for k, v in calls.items()})
    assert calls[(TRITON, "torch.bfloat16")] == 30 * LLAMA_CFG["num_hidden_layers"], calls
    assert all(math.isfinite(x) for x in losses), losses
    assert abs(losses[0] - math.log(LLAMA_CFG["vocab_size"])) < 0.5, f"initial loss {losses[0]} far from ln V"
    assert losses[-1] < 0.5 * losses[0], f"loss did not fall by half in 30 steps: {losses[0]:.3f} -> {losses[-1]:.3f}"


def _rel(ga: dict, gb: dict, names) -> float:
    num = sum(float((ga[n] - gb[n]).pow(2).sum()) for n in names)
    den = sum(float(gb[n].pow(2).sum()) for n in names)
    return math.sqrt(num / den)


def test_llama_triton_grads_match_reference(llama):
    _, m32 = llama
    batch = _train_batch()

    def grads(impl, autocast):
        model = copy.deepcopy(m32).train()
        ctx = torch.autocast(DEVICE, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
        with attention_impl(impl, align_dtypes=True), ctx:
            loss = _sft_step_loss(model, batch)
        loss.backward()
        return float(loss.detach()), {n: p.grad.double() for n, p in model.named_parameters()}

    loss_t, g_t = grads(TRITON, True)
    loss_r, g_r = grads("reference", True)
    loss_32, g_32 = grads("reference", False)
    names = list(g_32)
    per_t = {n: _rel(g_t, g_32, [n]) for n in names}
    per_r = {n: _rel(g_r, g_32, [n]) for n in names}
    res = dict(loss_triton_bf16=loss_t, loss_reference_bf16=loss_r, loss_fp32=loss_32,
               rel_err_triton_vs_fp32=_rel(g_t, g_32, names), rel_err_reference_bf16_vs_fp32=_rel(g_r, g_32, names),
               rel_err_triton_vs_reference_bf16=_rel(g_t, g_r, names),
               worst_param_triton=max(per_t.values()), worst_param_reference=max(per_r.values()),
               worst_param_name=max(per_t, key=per_t.get))
    record("llama_one_step_grads_triton_vs_reference", **res)
    for n in names:
        assert torch.isfinite(g_t[n]).all(), n
    assert res["rel_err_triton_vs_fp32"] <= 2 * res["rel_err_reference_bf16_vs_fp32"] + 1e-3, res
    assert res["worst_param_triton"] <= 2 * res["worst_param_reference"] + 1e-3, res


def test_llama_bf16_autocast():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**LLAMA_CFG)).to(DEVICE).train()
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        loss = _sft_step_loss(model, _train_batch())
    loss.backward()
    assert torch.isfinite(loss)


def test_ernie_tiny_packed_equals_unpacked_bf16():
    from paddlenlp_ext.transformers.ernie35 import from_preset_or_pretrained

    torch.manual_seed(0)
    model = from_preset_or_pretrained("ernie/tiny-random-ernie", vocab_size=32000, enable_random_position_ids=False)
    m16, m32 = _bf16_and_gold(model.eval())
    _packed_vs_alone(m16, m32, _examples(LENGTHS, 32000, seed=4), "ernie_tiny_packed_vs_alone_bf16")


# ---- DPO --------------------------------------------------------------------------------------------------------

PAIRS = ((13, 21, 9), (7, 5, 30), (25, 17, 17))  # (prompt, chosen, rejected) lengths, each response ends in EOS


def _dpo_pack(vocab: int):
    """A preference pack built by the data pipeline (dpo layout, ZeroPaddingMapDataset, PreferenceCollator)."""
    from paddlenlp_ext.datasets.preference import PreferenceCollator, _layout
    from paddlenlp_ext.datasets.zero_padding import ZeroPaddingMapDataset

    g = torch.Generator().manual_seed(5)
    pieces = [[torch.randint(1, vocab, (n,), generator=g).tolist() for n in lens] for lens in PAIRS]
    recs = [_layout(p, a, b, 1, 1) for p, a, b in pieces]
    ds = ZeroPaddingMapDataset(recs, max_length=PACK_LEN)
    assert len(ds) == 1, "all pairs should share one pack"
    batch = PreferenceCollator(PACK_LEN)([ds[0]])
    return pieces, {k: v.to(DEVICE) for k, v in batch.items()}


def _alone_logps(model, prompt, resp) -> torch.Tensor:
    """Sum of log p(resp | prompt) from one plain causal sequence ``prompt + resp[:-1]`` (chunked head)."""
    from paddlenlp_ext.trl.logprobs import token_logps

    x = torch.tensor([prompt + resp[:-1]], device=DEVICE)
    hidden = model.model(x)[0, len(prompt) - 1:]  # rows predicting resp
    return token_logps(hidden, model.lm_head.weight, torch.tensor(resp, device=DEVICE)).sum()


def test_dpo_pack_logps_equal_alone_and_step(llama):
    from paddlenlp_ext.trl.dpo_criterion import DPOCriterion
    from paddlenlp_ext.trl.dpo_trainer import policy_pair_logps

    m16, m32 = llama
    pieces, batch = _dpo_pack(LLAMA_CFG["vocab_size"])

    def alone(model):
        return torch.stack([torch.stack([_alone_logps(model, p, a), _alone_logps(model, p, b)])
                            for p, a, b in pieces]).double()  # [N, 2]

    with torch.no_grad():
        with attention_impl("reference"):
            gold, same = alone(m32), alone(m16)
        with attention_impl(TRITON):
            tri_alone = alone(m16)
            lp = policy_pair_logps(m16, batch)
    packed = torch.stack([lp.chosen, lp.rejected], 1).double()
    e_same, e_alone, e_packed = _maxabs(same, gold), _maxabs(tri_alone, gold), _maxabs(packed, gold)
    floor = 1e-4 * float(gold.abs().max())
    assert lp.chosen_tokens.tolist() == [a for _, a, _ in PAIRS] and lp.rejected_tokens.tolist() == [
        b for _, _, b in PAIRS]
    assert e_alone <= 2 * e_same + floor and e_packed <= 2 * e_alone + floor, (e_same, e_alone, e_packed, floor)

    # One DPO step (sigmoid, beta 0.1) from policy == reference: loss must be exactly ln 2, then fall.
    policy, crit = copy.deepcopy(m32).train(), DPOCriterion(loss_type="sigmoid", beta=0.1)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-4, weight_decay=0.0)
    n = len(PAIRS)
    losses = []
    with attention_impl(TRITON, align_dtypes=True):
        with torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16):
            ref = policy_pair_logps(m32, batch)
        for _ in range(2):
            with torch.autocast(DEVICE, dtype=torch.bfloat16):
                loss_sum, metrics = crit(policy_pair_logps(policy, batch), ref)
            loss = loss_sum / n
            losses.append(float(loss.detach()))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            for name, p in policy.named_parameters():
                assert torch.isfinite(p.grad).all(), name
            opt.step()
    record("dpo_pack_bf16", gold_logps=gold.tolist(), err_same_bf16_reference=e_same,
            err_alone_bf16_triton=e_alone, err_packed_bf16_triton=e_packed, floor=floor,
            dpo_loss_step0=losses[0], dpo_loss_step1=losses[1], margins_step1=float(metrics["rewards/margins"]) / n)
    assert abs(losses[0] - math.log(2)) < 1e-6, losses
    assert losses[1] < losses[0], losses
