"""``attn_implementation="FlashMask"`` on tiny random ``transformers`` models: packed == alone == transformers'
own eager / sdpa / padding-free forward, sliding windows folded exactly, refusals, KV-cache generation, compile."""

import pytest
import torch
from flashmask.masks import causal_document_mask

from paddlenlp_ext.transformers.hf_attention import (FLASHMASK, FlashMaskUnsupportedError,
                                                     flashmask_attention_forward, startend_from_starts)
from tests._hf_tiny import FAMILIES, tiny_model

LENS = [6, 9, 5]  # every document longer than every family's test window
ATOL = 2e-5


def _packed(seed=0, lens=LENS, vocab=96):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (1, sum(lens)), generator=g)
    pos = torch.cat([torch.arange(n) for n in lens])[None]
    return ids, pos


def _alone(model, ids, lens, impl):
    model.set_attn_implementation(impl)
    try:
        out, start = [], 0
        for n in lens:
            out.append(model(input_ids=ids[:, start:start + n]).logits)
            start += n
        return torch.cat(out, dim=1)
    finally:
        model.set_attn_implementation(FLASHMASK)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_packed_logits_equal_each_example_alone_and_eager_sdpa(family):
    model = tiny_model(family, FLASHMASK)
    ids, pos = _packed()
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=pos).logits
        for impl in ("sdpa", "eager"):
            torch.testing.assert_close(packed, _alone(model, ids, LENS, impl), atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_startend_row_indices_batch_with_padding_equals_alone(family):
    """Our packed-batch contract: ``attn_mask_startend_row_indices`` ``[B, 1, S, 1]`` with padding (LTS 0)."""
    model = tiny_model(family, FLASHMASK)
    rows = [[6, 9, 5], [11, 4]]  # second row: 5 padding tokens
    s = 20
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 96, (2, s), generator=g)
    pos = torch.stack([torch.cat([torch.arange(n) for n in r] + [torch.zeros(s - sum(r), dtype=torch.long)])
                       for r in rows])
    sri = causal_document_mask(rows, seq_len=s).startend_row_indices
    sri[1, 0, 15:, 0] = 0  # padding columns, as ZeroPadding packs them
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=pos, attn_mask_startend_row_indices=sri).logits
        for b, r in enumerate(rows):
            alone = _alone(model, ids[b:b + 1, :sum(r)], r, "sdpa")
            torch.testing.assert_close(packed[b:b + 1, :sum(r)], alone, atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", ["qwen2", "mistral", "gemma3_text"])
def test_equals_transformers_padding_free_path(family):
    """DataCollatorWithFlattening's batch: FlashMask (from position_ids, no index tensor) == transformers' own
    packed sdpa path (``find_packed_sequence_indices``), logits, loss and gradients. transformers skips its packed
    detection when a KV cache exists (``use_cache`` defaults to True), so its side runs with ``use_cache=False``."""
    from transformers import DataCollatorWithFlattening

    g = torch.Generator().manual_seed(2)
    feats = [{"input_ids": torch.randint(3, 96, (n,), generator=g).tolist()} for n in LENS]
    for f in feats:
        f["labels"] = list(f["input_ids"])
    batch = DataCollatorWithFlattening(return_tensors="pt")(feats)
    assert "attention_mask" not in batch
    results = {}
    for impl in ("sdpa", FLASHMASK):
        model = tiny_model(family, impl)
        out = model(**batch, use_cache=False)
        out.loss.backward()
        results[impl] = (out.logits.detach(), out.loss.detach(), model.model.layers[0].self_attn.q_proj.weight.grad)
    for a, b in zip(results["sdpa"], results[FLASHMASK]):
        torch.testing.assert_close(b, a, atol=ATOL, rtol=1e-5)


def test_cu_seq_lens_mark_the_documents():
    """``cu_seq_lens_q`` (FlashAttention varlen kwargs) take precedence over position_ids."""
    from transformers import DataCollatorWithFlattening

    model = tiny_model("llama", FLASHMASK)
    feats = [{"input_ids": list(range(3, 3 + n))} for n in LENS]
    batch = DataCollatorWithFlattening(return_tensors="pt", return_flash_attn_kwargs=True)(feats)
    ids = batch["input_ids"]
    with torch.no_grad():
        ref = model(input_ids=ids, position_ids=batch["position_ids"]).logits
        out = model(input_ids=ids, position_ids=batch["position_ids"], cu_seq_lens_q=batch["cu_seq_lens_q"],
                    cu_seq_lens_k=batch["cu_seq_lens_k"]).logits
        torch.testing.assert_close(out, ref, atol=ATOL, rtol=0)


def test_startend_from_starts_is_the_document_mask():
    starts = torch.tensor([[True, False, False, True, False, True, False, False]])
    ref = causal_document_mask([[3, 2, 3]], seq_len=8).startend_row_indices
    assert torch.equal(startend_from_starts(starts), ref)
    bi = startend_from_starts(starts, causal=False)
    assert bi[0, 0, :, 1].tolist() == [0, 0, 0, 3, 3, 5, 5, 5]


@pytest.mark.parametrize("side", ["right", "left"])
def test_two_d_padding_mask_is_honoured(side):
    model = tiny_model("mistral", FLASHMASK)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 96, (2, 10), generator=g)
    mask = torch.ones(2, 10, dtype=torch.long)
    if side == "right":
        mask[1, 7:] = 0
    else:
        mask[1, :3] = 0
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask).logits
        model.set_attn_implementation("sdpa")
        ref = model(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()
    torch.testing.assert_close(out[keep], ref[keep], atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma3_text"])
def test_generation_with_kv_cache_matches_sdpa(family):
    model = tiny_model(family, FLASHMASK)
    ids, _ = _packed(seed=4, lens=[7])
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    out = model.generate(ids, **kw)
    model.set_attn_implementation("sdpa")
    assert torch.equal(out, model.generate(ids, **kw))


def test_gradients_packed_equal_alone():
    model = tiny_model("gemma3_text", FLASHMASK)
    ids, pos = _packed(seed=5)
    model(input_ids=ids, position_ids=pos).logits.pow(2).sum().backward()
    packed = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    _alone(model, ids, LENS, "sdpa").pow(2).sum().backward()
    for a, b in zip(packed, (p.grad for p in model.parameters())):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_scaling_is_honoured():
    """Gemma's query_pre_attn_scalar (12 here, head_dim 8): a wrong default scale would change the logits."""
    model = tiny_model("gemma3_text", FLASHMASK)
    assert model.model.layers[0].self_attn.scaling != 8 ** -0.5
    ids, pos = _packed(seed=6, lens=[9])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, _alone(model, ids, [9], "eager"), atol=ATOL, rtol=0)


def test_attention_compiles_without_graph_break():
    """The attention function, the index derivation from position_ids and the window fold trace as one graph."""
    model = tiny_model("qwen2", FLASHMASK)
    attn = model.model.layers[2].self_attn  # a sliding layer
    g = torch.Generator().manual_seed(7)
    q, k, v = torch.randn(1, 4, 20, 8, generator=g), torch.randn(1, 2, 20, 8, generator=g), torch.randn(1, 2, 20, 8,
                                                                                                         generator=g)
    pos = _packed()[1]
    fn = torch.compile(flashmask_attention_forward, fullgraph=True, backend="eager")
    out, _ = fn(attn, q, k, v, None, scaling=attn.scaling, sliding_window=attn.sliding_window, position_ids=pos)
    ref, _ = flashmask_attention_forward(attn, q, k, v, None, scaling=attn.scaling,
                                         sliding_window=attn.sliding_window, position_ids=pos)
    torch.testing.assert_close(out, ref)


def test_gemma2_softcapping_is_refused():
    from transformers import AutoModelForCausalLM, Gemma2Config

    cfg = Gemma2Config(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, attn_logit_softcapping=50.0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=FLASHMASK)
    with pytest.raises(FlashMaskUnsupportedError, match=r"attn_logit_softcapping.*attn_implementation='sdpa'"):
        model(input_ids=torch.tensor([[3, 4, 5]]))


def test_attention_sinks_are_refused():
    from transformers import AutoModelForCausalLM, GptOssConfig

    cfg = GptOssConfig(vocab_size=96, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, num_local_experts=2, num_experts_per_tok=1,
                       layer_types=["sliding_attention", "full_attention"])
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=FLASHMASK)
    with pytest.raises(FlashMaskUnsupportedError, match=r"gpt_oss.*sinks"):
        model(input_ids=torch.tensor([[3, 4, 5]]))


def test_attention_dropout_in_training_is_refused():
    model = tiny_model("qwen3", FLASHMASK, attention_dropout=0.1).train()
    with pytest.raises(FlashMaskUnsupportedError, match="attention_dropout"):
        model(input_ids=torch.tensor([[3, 4, 5]]))


def test_four_d_mask_is_refused():
    model = tiny_model("llama", FLASHMASK)
    attn = model.model.layers[0].self_attn
    q = torch.randn(1, 4, 3, 8)
    k = torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="2-D padding mask"):
        flashmask_attention_forward(attn, q, k, k, torch.ones(1, 1, 3, 3, dtype=torch.bool))


def test_autocast_runs_mixed_fp32_qk_and_bf16_v_in_the_autocast_dtype():
    """Under autocast the rotary embedding leaves q, k fp32 beside a bf16 v; the backend runs all three in bf16, as
    SDPA does under autocast."""
    model = tiny_model("llama", FLASHMASK)
    attn = model.model.layers[0].self_attn
    torch.manual_seed(0)
    q, k = torch.randn(1, 4, 6, 8), torch.randn(1, 2, 6, 8)
    v = torch.randn(1, 2, 6, 8).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = flashmask_attention_forward(attn, q, k, v, None, scaling=8 ** -0.5)
        ref, _ = flashmask_attention_forward(attn, q.bfloat16(), k.bfloat16(), v, None, scaling=8 ** -0.5)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref)
