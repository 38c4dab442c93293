"""``use_fused_rms_norm`` / ``use_fused_rope`` / ``use_fused_swiglu`` on ``transformers`` models: which modules each
family fuses, that the fused model computes the family's forward and gradients, and the refusals."""

from types import SimpleNamespace

import pytest
import torch

from paddlenlp_ext.ops import elementwise
from paddlenlp_ext.transformers.hf_causal_lm import HFCausalLM
from paddlenlp_ext.transformers.hf_fused_ops import apply_fused_op_keys, fuse_modules
from tests._hf_tiny import tiny_model

pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # noqa: E402  (_RemoteCodeAttention's)

EXPECTED = {  # family -> (RMSNorm, MLP, attention classes) computed as the fused ops compute them
    "llama": (["LlamaRMSNorm"], ["LlamaMLP"], ["LlamaAttention"]),
    "qwen2": (["Qwen2RMSNorm"], ["Qwen2MLP"], ["Qwen2Attention"]),
    "qwen3": (["Qwen3RMSNorm"], ["Qwen3MLP"], ["Qwen3Attention"]),  # the q / k norms too
    "mistral": (["MistralRMSNorm"], ["MistralMLP"], ["MistralAttention"]),
    "phi3": (["Phi3RMSNorm"], [], []),  # one gate_up_proj, its own RoPE function (a partial rotary part)
    "gemma3_text": ([], [], ["Gemma3Attention"]),  # (1 + weight) norms, GELU MLPs, Llama's RoPE
}


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_each_family_fuses_the_modules_that_compute_the_op(family):
    model = tiny_model(family)
    got = fuse_modules(model, rms_norm=True, swiglu=True, rope=True)
    assert (got["use_fused_rms_norm"], got["use_fused_swiglu"], got["use_fused_rope"]) == EXPECTED[family]
    fused_classes = set(sum(EXPECTED[family], []))
    assert sum("forward" in vars(m) for m in model.modules()) == sum(
        type(m).__name__ in fused_classes for m in model.modules())


def _logits_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits
    (logits * torch.linspace(-1, 1, logits.shape[-1])).sum().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_fused_qwen3_matches_transformers_forward_and_gradients(compile_on_cpu):
    """Compiled (Inductor on the CPU, as CUDA runs it) RMSNorm incl. Qwen3's q / k norms, RoPE and SwiGLU: logits and
    every parameter gradient equal transformers' eager model to fp32 rounding."""
    ids = torch.randint(0, 96, (2, 11))
    ref_model, fused_model = tiny_model("qwen3").train(), tiny_model("qwen3").train()
    ref = _logits_and_grads(ref_model, ids)
    fuse_modules(fused_model, rms_norm=True, swiglu=True, rope=True)
    got = _logits_and_grads(fused_model, ids)
    assert elementwise._compiled and not elementwise._failed
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-5)
    for name, g in ref[1].items():
        torch.testing.assert_close(got[1][name], g, rtol=1e-4, atol=1e-5, msg=name)


def _args(**keys):
    return SimpleNamespace(**{"use_fused_rms_norm": False, "use_fused_rope": False, "use_fused_swiglu": False,
                              **keys})


def test_a_family_without_the_op_is_refused_by_name():
    model = HFCausalLM(tiny_model("gemma3_text"))
    with pytest.raises(ValueError, match=r"use_fused_rms_norm: true needs an RMSNorm computed as Llama's .*"
                                         r"/models/gemma \(model_type 'gemma3_text'\) has none that matches"):
        apply_fused_op_keys(model, _args(use_fused_rms_norm=True), "/models/gemma")
    with pytest.raises(ValueError, match=r"use_fused_rope: true needs attention that applies RoPE by transformers' "
                                         r"Llama apply_rotary_pos_emb; .*\(model_type 'phi3'\)"):
        apply_fused_op_keys(HFCausalLM(tiny_model("phi3")), _args(use_fused_rope=True), "/models/phi3")


def test_fused_rope_writes_sequence_major_q_k_in_the_autocast_dtype():
    """transformers' apply_rotary_pos_emb on [B, H, L, D] views of sequence-major projections: the fused function
    returns the same values (fp32: bitwise; under bf16 autocast: transformers' fp32 result rounded once to bf16,
    the cast every attention path makes) as views of sequence-major memory, which the FlashMask backend reads
    without a copy."""
    from transformers.models.qwen2 import modeling_qwen2

    from paddlenlp_ext.transformers.hf_fused_ops import hf_apply_rotary_pos_emb

    original = modeling_qwen2.apply_rotary_pos_emb
    fused = hf_apply_rotary_pos_emb(original)
    b, s, h, hk, d = 2, 7, 4, 2, 8
    q = torch.randn(b, s, h, d).transpose(1, 2)  # as q_proj(x).view(b, s, h, d).transpose(1, 2)
    k = torch.randn(b, s, hk, d).transpose(1, 2)
    ang = torch.randn(b, s, d // 2).repeat(1, 1, 2)
    cos, sin = ang.cos(), ang.sin()
    for qq, kk, autocast in ((q, k, False), (q.bfloat16(), k.bfloat16(), True)):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            ref, got = original(qq, kk, cos, sin), fused(qq, kk, cos, sin)
        for r, g in zip(ref, got):
            assert g.dtype == (torch.bfloat16 if autocast else torch.float32)
            assert torch.equal(g, r.to(g.dtype)) and g.transpose(1, 2).is_contiguous()


def test_fused_rope_reads_the_modeling_files_globals_live(monkeypatch):
    """Only apply_rotary_pos_emb is swapped: a module-level name patched after fusing (here the eager attention)
    reaches the fused model, and a patch undone is undone for it too."""
    from transformers.models.qwen2 import modeling_qwen2

    model = tiny_model("qwen2", attn_implementation="eager")
    fuse_modules(model, rms_norm=False, swiglu=False, rope=True)
    ids = torch.randint(0, 96, (1, 9))
    before = model(input_ids=ids).logits
    with monkeypatch.context() as mp:
        mp.setattr(modeling_qwen2, "eager_attention_forward", lambda *a, **k: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            model(input_ids=ids)
    torch.testing.assert_close(model(input_ids=ids).logits, before, rtol=0, atol=0)


def test_fused_rope_leaves_other_models_and_the_modeling_file_alone():
    from transformers.models.qwen2 import modeling_qwen2

    original = modeling_qwen2.apply_rotary_pos_emb
    fused_model, other = tiny_model("qwen2"), tiny_model("qwen2")
    assert fuse_modules(fused_model, rms_norm=False, swiglu=False, rope=True) == {"use_fused_rope": ["Qwen2Attention"]}
    assert modeling_qwen2.apply_rotary_pos_emb is original
    assert not any("forward" in vars(m) for m in other.modules())
    ids = torch.randint(0, 96, (1, 9))
    torch.testing.assert_close(fused_model(input_ids=ids).logits, other(input_ids=ids).logits, rtol=0, atol=0)
    assert fuse_modules(fused_model, rms_norm=False, swiglu=False, rope=True) == {"use_fused_rope": ["Qwen2Attention"]}


def test_native_models_are_left_to_their_config():
    from paddlenlp_ext.transformers.llama import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    assert apply_fused_op_keys(model, _args(use_fused_rms_norm=True, use_fused_rope=True), "tiny") == {}
    assert not any("forward" in vars(m) for m in model.modules())


def test_a_refusal_patches_nothing():
    """Phi-3 has Llama's RMSNorm but a fused gate_up_proj MLP: asking for both keys refuses before any norm is
    patched."""
    model = HFCausalLM(tiny_model("phi3"))
    with pytest.raises(ValueError, match=r"use_fused_swiglu: true needs an MLP"):
        apply_fused_op_keys(model, _args(use_fused_rms_norm=True, use_fused_swiglu=True), "/models/phi3")
    assert not any("forward" in vars(m) for m in model.modules())


def test_a_forward_replaced_by_another_tool_is_left_alone():
    model = tiny_model("llama")
    norm = model.model.norm
    norm.forward = lambda x: x  # e.g. an accelerate hook or another kernel library
    got = fuse_modules(model, rms_norm=True, swiglu=False)
    assert got == {"use_fused_rms_norm": ["LlamaRMSNorm"]} and norm.forward(3) == 3
    assert fuse_modules(model, rms_norm=True, swiglu=False) == got  # our own patch is recognised: idempotent


def test_saved_config_json_has_no_training_keys(tmp_path):
    """set_llm_config puts the use_fused_* keys on the transformers config (the model reads them); the exported
    config.json leaves them out, and the live config keeps them."""
    import json

    from paddlenlp_ext.ops import set_llm_config

    model = HFCausalLM(tiny_model("qwen2"))
    args = _args(use_fused_rms_norm=True, use_fused_swiglu=True, use_fused_linear_cross_entropy=True)
    apply_fused_op_keys(model, args, "/models/qwen2")
    set_llm_config(model, args)
    model.save_pretrained(str(tmp_path / "out"))
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert not [k for k in saved if k.startswith("use_fused_")]
    assert model.hf.config.use_fused_rms_norm is True


def test_fused_rope_compiles_inside_a_decoder_layer_without_graph_breaks():
    """to_static compiles each decoder layer: the attention forward rebuilt around the fused RoPE traces as one
    graph through the FlashMask backend, and packed logits equal the unfused model's."""
    from paddlenlp_ext.transformers.hf_attention import FLASHMASK

    fused_model, ref_model = tiny_model("qwen2", FLASHMASK), tiny_model("qwen2", FLASHMASK)
    fuse_modules(fused_model, rms_norm=False, swiglu=False, rope=True)
    layer = fused_model.model.layers[0]
    layer.forward = torch.compile(layer.forward, fullgraph=True)
    ids = torch.randint(0, 96, (1, 12))
    pos = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6]])  # two packed examples
    torch.testing.assert_close(fused_model(input_ids=ids, position_ids=pos).logits,
                               ref_model(input_ids=ids, position_ids=pos).logits, rtol=1e-6, atol=1e-6)



class _RemoteCodeAttention(torch.nn.Module):
    """Remote code that imports transformers' Llama RoPE function rather than defining rotate_half itself."""

    def forward(self, q, k, cos, sin):
        return apply_rotary_pos_emb(q, k, cos, sin)


def test_fused_rope_takes_an_imported_llama_rope_function():
    module = _RemoteCodeAttention()
    q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 1, 5, 8)
    cos, sin = torch.randn(1, 5, 8), torch.randn(1, 5, 8)
    ref = module(q, k, cos, sin)
    assert fuse_modules(module, rms_norm=False, swiglu=False, rope=True) == {"use_fused_rope": ["_RemoteCodeAttention"]}
    for r, g in zip(ref, module(q, k, cos, sin)):
        assert torch.equal(g, r)
    from transformers.models.llama import modeling_llama

    assert globals()["apply_rotary_pos_emb"] is modeling_llama.apply_rotary_pos_emb  # the name itself is untouched
