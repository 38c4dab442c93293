"""``use_fused_rms_norm`` / ``use_fused_rope`` / ``use_fused_swiglu`` on a ``transformers`` Qwen2 on CUDA (the
compiled kernels), under bf16 autocast over fp32 weights as training runs it, through the FlashMask backend on a
pack of three examples.

Tolerance rule (as tests/gpu/test_models_gpu.py): ``gold`` = the unfused model in fp32 (no autocast, TF32 off);
``same`` = the unfused model under bf16 autocast. The fused model under autocast must satisfy
``max|fused - gold| <= 2 * max|same - gold| + 1e-3 * max|gold|`` for the logits and for every parameter gradient.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

transformers = pytest.importorskip("transformers")


def _model(fused: bool):
    from paddlenlp_ext.transformers.hf_attention import FLASHMASK
    from paddlenlp_ext.transformers.hf_fused_ops import fuse_modules

    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=704, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                   max_position_embeddings=512, attn_implementation=FLASHMASK, use_cache=False)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=FLASHMASK).train()
    if fused:
        got = fuse_modules(model, rms_norm=True, swiglu=True, rope=True)
        assert got == {"use_fused_rms_norm": ["Qwen2RMSNorm"], "use_fused_rope": ["Qwen2Attention"],
                       "use_fused_swiglu": ["Qwen2MLP"]}
    return model


def _run(model, autocast: bool):
    lens = (70, 123, 63)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 512, (1, sum(lens)), generator=g).cuda()
    pos = torch.cat([torch.arange(n) for n in lens])[None].cuda()
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=ids, position_ids=pos).logits.float()
    (logits * torch.linspace(-1, 1, logits.shape[-1], device="cuda")).sum().backward()
    return logits.detach(), {n: p.grad.float() for n, p in model.named_parameters()}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_ops_on_a_transformers_model_match_its_forward_and_gradients_in_bf16():
    torch.backends.cuda.matmul.allow_tf32 = False
    gold = _run(_model(False), autocast=False)
    same = _run(_model(False), autocast=True)
    fused = _run(_model(True), autocast=True)
    from paddlenlp_ext.ops import elementwise

    assert elementwise._compiled and not elementwise._failed  # the compiled kernels ran

    def err(a, b):
        return float((a - b).abs().max())

    pairs = [("logits", fused[0], same[0], gold[0])] + [(n, fused[1][n], same[1][n], gold[1][n]) for n in gold[1]]
    for name, f, s, g in pairs:
        bound = 2 * err(s, g) + 1e-3 * float(g.abs().max())
        assert err(f, g) <= bound, f"{name}: |fused - fp32| {err(f, g):.3g} > {bound:.3g}"
