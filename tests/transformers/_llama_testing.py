"""Helpers for the Llama tests: tiny configs, a transformers twin, and the derived-tolerance assertion.

Tolerance rule (as in tests/ops/tolerance.py): with ``ref`` = transformers' Llama in fp64 on the same weights and
``same`` = transformers' Llama in fp32, our fp32 output passes iff
``max|ours - ref| <= 2 * max|same - ref| + 1e-6`` (the floor absorbs a lucky, exact same-dtype run).
"""

from __future__ import annotations

import copy

import torch
import transformers

from paddlenlp_ext.transformers import LlamaConfig, LlamaForCausalLM

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}


def tiny_config(**kw) -> LlamaConfig:
    """2 layers, hidden 64, 4 query / 2 KV heads (GQA), vocab 97; ``kw`` overrides any field."""
    base = dict(vocab_size=97, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=128)
    base.update(kw)
    return LlamaConfig(**base)


def tiny_model(seed: int = 0, **kw) -> LlamaForCausalLM:
    """A randomly initialised (HF init, std 0.02 -> scaled up to 0.2 so logits are not all ~0) tiny model."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_config(**kw))
    model.init_weights(std=0.2)
    with torch.no_grad():  # non-trivial norm weights so a wrong RMSNorm would show
        for n, p in model.named_parameters():
            if n.endswith("layernorm.weight") or n == "model.norm.weight":
                p.uniform_(0.5, 1.5)
    return model.eval()


def hf_twin(model: LlamaForCausalLM, dtype=torch.float32) -> transformers.LlamaForCausalLM:
    """transformers' LlamaForCausalLM (eager attention) with the same config and weights, in ``dtype``."""
    hf_cfg = transformers.LlamaConfig(**model.config.to_dict())
    hf_cfg._attn_implementation = "eager"
    hf = transformers.LlamaForCausalLM(hf_cfg)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    result = hf.load_state_dict(sd, strict=False)
    assert not result.unexpected_keys, result.unexpected_keys
    assert set(result.missing_keys) <= {"lm_head.weight"}, result.missing_keys
    return copy.deepcopy(hf).to(dtype).eval()


def assert_matches_hf(ours: torch.Tensor, hf64: torch.Tensor, hf32: torch.Tensor, what: str) -> float:
    """Assert the derived-tolerance rule above; returns our max error."""
    err = (ours.double() - hf64).abs().max().item()
    same = (hf32.double() - hf64).abs().max().item()
    budget = 2 * same + 1e-6
    assert err <= budget, f"{what}: max|ours - hf64| = {err:.3g} > budget {budget:.3g} (hf fp32 err {same:.3g})"
    return err
