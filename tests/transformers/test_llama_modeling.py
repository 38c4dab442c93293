"""Our Llama against transformers' LlamaForCausalLM, packing (FlashMask startend indices), recompute, meta init."""

from __future__ import annotations

import pytest
import torch
from _llama_testing import LLAMA3_ROPE, assert_matches_hf, hf_twin, tiny_config, tiny_model

from paddlenlp_ext.transformers import LlamaConfig, LlamaForCausalLM


@pytest.mark.parametrize(
    "kw",
    [
        dict(),  # GQA 4/2, untied
        dict(tie_word_embeddings=True),
        dict(num_key_value_heads=4),  # MHA
        dict(num_key_value_heads=1, tie_word_embeddings=True),  # MQA
        dict(rope_scaling=LLAMA3_ROPE, rope_theta=500000.0),  # Llama-3.1 scaling on positions past 16
        dict(head_dim=24),  # head_dim * heads != hidden
    ],
    ids=["gqa", "tied", "mha", "mqa-tied", "llama3-rope", "head_dim"],
)
def test_logits_match_transformers(kw):
    model = tiny_model(**kw)
    ids = torch.randint(0, model.config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(48).expand(2, 48) + torch.tensor([[0], [70]])  # second row: positions 70..117
    with torch.no_grad():
        ours = model(ids, position_ids=pos)
        hf64 = hf_twin(model, torch.float64)(ids, position_ids=pos).logits
        hf32 = hf_twin(model, torch.float32)(ids, position_ids=pos).logits
    assert ours.shape == (2, 48, model.config.vocab_size) and ours.dtype == torch.float32
    assert_matches_hf(ours, hf64, hf32, str(kw))
    hidden = model.model(ids, position_ids=pos)
    assert hidden.shape == (2, 48, model.config.hidden_size)


def test_tied_embedding_is_shared():
    model = tiny_model(tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert "lm_head.weight" in dict(model.named_parameters(remove_duplicate=False))


def _pack(examples, total_len):
    """Pack examples as docs/design.md section 2: positions restart, LTS = example end, padding columns 0."""
    ids = torch.zeros(1, total_len, dtype=torch.long)
    pos = torch.zeros(1, total_len, dtype=torch.long)
    sri = torch.zeros(1, 1, total_len, 1, dtype=torch.int32)
    start = 0
    for ex in examples:
        end = start + len(ex)
        ids[0, start:end] = ex
        pos[0, start:end] = torch.arange(len(ex))
        sri[0, 0, start:end, 0] = end
        start = end
    return ids, pos, sri


@pytest.mark.parametrize("tied", [False, True])
def test_packed_equals_unpacked(tied):
    model = tiny_model(tie_word_embeddings=tied, rope_scaling=LLAMA3_ROPE)
    g = torch.Generator().manual_seed(2)
    exs = [torch.randint(1, 97, (n,), generator=g) for n in (11, 7, 20)]
    ids, pos, sri = _pack(exs, 42)  # 38 tokens + 4 padding
    with torch.no_grad():
        packed = model(ids, position_ids=pos, attn_mask_startend_row_indices=sri)[0]
        start = 0
        for ex in exs:
            alone = model(ex[None])[0]
            hf64 = hf_twin(model, torch.float64)(ex[None]).logits[0]
            hf32 = hf_twin(model, torch.float32)(ex[None]).logits[0]
            # Same rounding budget as our unpacked run against transformers.
            assert_matches_hf(alone, hf64, hf32, "alone")
            assert_matches_hf(packed[start:start + len(ex)], hf64, hf32, f"packed example at {start}")
            start += len(ex)
    assert torch.isfinite(packed).all()


def test_neighbour_change_does_not_leak():
    model = tiny_model()
    g = torch.Generator().manual_seed(3)
    a, b, c = (torch.randint(1, 97, (n,), generator=g) for n in (9, 13, 6))
    b2 = torch.randint(1, 97, (13,), generator=g)
    with torch.no_grad():
        ids1, pos, sri = _pack([a, b, c], 30)
        ids2, pos2, sri2 = _pack([a, b2, c], 30)
        assert torch.equal(pos, pos2) and torch.equal(sri, sri2)
        out1 = model(ids1, position_ids=pos, attn_mask_startend_row_indices=sri)
        out2 = model(ids2, position_ids=pos, attn_mask_startend_row_indices=sri)
    # Example b changed: a (before it) and c (after it) must be bit-identical, b must differ.
    assert torch.equal(out1[0, :9], out2[0, :9])
    assert torch.equal(out1[0, 22:28], out2[0, 22:28])
    assert not torch.allclose(out1[0, 9:22], out2[0, 9:22])
    # Without the startend indices, c does see b: the test above is not vacuous.
    with torch.no_grad():
        leak1 = model(ids1, position_ids=pos)
        leak2 = model(ids2, position_ids=pos)
    assert not torch.allclose(leak1[0, 22:28], leak2[0, 22:28])


def test_recompute_gives_same_loss_and_grads():
    base = tiny_model(seed=4)
    ids = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(5))
    ids_p, pos, sri = _pack([ids[0, :10], ids[0, 10:]], 24)
    grads = []
    for recompute in (False, True):
        model = tiny_model(seed=4, recompute=recompute).train()
        model.load_state_dict(base.state_dict())
        logits = model(ids_p, position_ids=pos, attn_mask_startend_row_indices=sri)
        loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids_p[0, 1:])
        loss.backward()
        grads.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (l0, g0), (l1, g1) = grads
    assert torch.equal(l0, l1)
    assert g0.keys() == g1.keys() and len(g0) == 3 + 9 * 2  # embed, norm, lm_head + 9 per layer
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=0, atol=0, msg=lambda m: f"{n}: {m}")
        assert g0[n].abs().sum() > 0, f"{n} got no gradient"


def test_recompute_actually_checkpoints(monkeypatch):
    calls = []
    real = torch.utils.checkpoint.checkpoint

    def spy(*a, **k):
        calls.append(k.get("use_reentrant"))
        return real(*a, **k)

    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", spy)
    model = tiny_model(recompute=True).train()
    model(torch.randint(0, 97, (1, 8))).sum().backward()
    assert calls == [False, False]  # one per decoder layer, non-reentrant


def test_meta_device_construction_and_init():
    cfg = tiny_config(tie_word_embeddings=True)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    assert all(p.is_meta for p in model.parameters())
    model.to_empty(device="cpu")
    model.init_weights()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    w = model.model.layers[0].self_attn.q_proj.weight
    assert abs(w.std().item() - 0.02) < 0.003 and abs(w.mean().item()) < 0.003
    assert torch.equal(model.model.norm.weight, torch.ones(64))
    assert isinstance(model.model.layers, torch.nn.ModuleList) and len(model.model.layers) == 2


def test_parameter_names_are_hf():
    names = set(dict(tiny_model().named_parameters()))
    expected = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(2):
        expected |= {f"model.layers.{i}.self_attn.{p}_proj.weight" for p in "qkvo"}
        expected |= {f"model.layers.{i}.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
        expected |= {f"model.layers.{i}.{p}_layernorm.weight" for p in ("input", "post_attention")}
    assert names == expected


def test_bad_inputs_raise_clear_errors():
    model = tiny_model()
    with pytest.raises(ValueError, match="input_ids must be an integer tensor"):
        model(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="position_ids must have the shape"):
        model(torch.zeros(2, 4, dtype=torch.long), position_ids=torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="attn_mask_startend_row_indices"):
        model(torch.zeros(2, 4, dtype=torch.long), attn_mask_startend_row_indices=torch.zeros(2, 1, 5, 1,
                                                                                             dtype=torch.int32))


def test_config_validation_and_hf_dict_roundtrip():
    with pytest.raises(ValueError, match="num_attention_heads=4 must be a multiple of num_key_value_heads=3"):
        tiny_config(num_key_value_heads=3)
    with pytest.raises(ValueError, match="rope_type 'yarn' is not supported"):
        tiny_config(rope_scaling={"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="missing keys"):
        tiny_config(rope_scaling={"rope_type": "llama3", "factor": 2.0})
    cfg = tiny_config(rope_scaling=LLAMA3_ROPE, recompute=True)
    d = cfg.to_dict()
    assert d["architectures"] == ["LlamaForCausalLM"] and "recompute" not in d
    # transformers v5 layout (rope_parameters) and unknown keys are understood / kept.
    v5 = dict(d, rope_parameters=dict(LLAMA3_ROPE, rope_theta=123.0), use_cache=True, my_key=[1])
    del v5["rope_scaling"], v5["rope_theta"]
    back = LlamaConfig.from_dict(v5)
    assert back.rope_theta == 123.0 and back.rope_scaling == LLAMA3_ROPE
    assert back.extra == {"use_cache": True, "my_key": [1]} and back.to_dict()["my_key"] == [1]


def test_bf16_autocast_keeps_qkv_dtype():
    """Under bf16 autocast q/k leave RoPE in bf16 like v (fp32 cos/sin would promote them; the API rejects mixes)."""
    from paddlenlp_ext.transformers.llama import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(cfg)
    ids = torch.randint(0, 64, (1, 9))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(ids)
    logits.float().sum().backward()
    assert torch.isfinite(logits.float()).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
