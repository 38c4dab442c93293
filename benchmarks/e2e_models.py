"""Model presets, model building and the FLOP count of ``benchmarks/e2e_train.py``.

Presets (``--model``), random initial weights, seeded:

| name | shape | training |
|---|---|---|
| ``llama1b`` | Llama-3.2-1B: hidden 2048, 16 layers, 32/8 heads, head_dim 64, intermediate 8192, vocab 128256, tied | full fine-tune, fp32 weights, bf16 autocast, fp32 AdamW |
| ``llama8b_lora`` | Llama-3.1-8B: hidden 4096, 32 layers, 32/8 heads, head_dim 128, intermediate 14336, vocab 128256, untied | LoRA r=8 (alpha 16) on every decoder linear (``paddlenlp_ext.peft.apply_lora`` defaults), frozen base cast to bf16 (``cast_frozen_base``), fp32 adapters + AdamW |
| ``ernie3b`` | ERNIE-3.5-SE 3B preset ``baidu/ernie-3.5-se-3b`` (hidden 3072, 32 layers, 24 heads, vocab 32000, parallel attention+FFN blocks, biases) | full fine-tune as ``llama1b`` |

For ERNIE the preset's ``use_progressive_seq_len`` (which cuts inputs to 512 tokens for the first 500 steps) and
``enable_random_position_ids`` (a host round trip per forward) are turned off, so every setup trains the same
packs with their logical positions. ``--tiny`` swaps each preset for a toy of the same family (CPU smoke runs).

FLOPs per trained token (PaLM-style, arXiv 2204.02311 appendix B, extended to frozen weights):
``(4 N + 2 N_train) T + 12 n_layers H_q D P``, with N the parameters that take part in matmuls (all parameters
except an untied input embedding, whose lookup is no matmul; a tied embedding counts once, as the LM head),
N_train those of them that get a weight gradient (N for full fine-tuning, giving the usual 6 N T), T real tokens
and P the unmasked causal (query, key) pairs of real tokens. Padding, masked pairs and recompute are not counted.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

LLAMA_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=32, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True,
                rope_theta=500000.0, max_position_embeddings=131072, rms_norm_eps=1e-5,
                rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
LLAMA_8B = dict(LLAMA_1B, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, head_dim=128,
                tie_word_embeddings=False)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, rope_theta=10000.0,
            max_position_embeddings=4096, rms_norm_eps=1e-5, rope_scaling=None)
ERNIE_OVERRIDES = dict(vocab_size=32000, use_progressive_seq_len=False, enable_random_position_ids=False)
ERNIE_TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                  max_position_embeddings=4096, use_progressive_seq_len=False, enable_random_position_ids=False)
MODELS = ("llama1b", "llama8b_lora", "ernie3b")
FUSED_KEYS = ("use_fused_rms_norm", "use_fused_rope", "use_fused_swiglu")


def model_config(name: str, tiny: bool) -> dict:
    """Plain dict describing the preset: ``family`` (llama | ernie), ``lora`` (bool), ``cfg`` (config kwargs),
    and the geometry used by the FLOP count (``n_layers``, ``h_q``, ``head_dim``, ``vocab``)."""
    if name not in MODELS:
        raise ValueError(f"--model: unknown {name!r}; choose from {list(MODELS)}")
    if name == "ernie3b":
        from paddlenlp_ext.transformers.ernie35 import preset_config

        cfg = dict(ERNIE_TINY) if tiny else None
        conf = (preset_config("baidu/ernie-3.5-se-3b", **ERNIE_OVERRIDES) if not tiny else None)
        h, nl, nh, v = ((conf.hidden_size, conf.num_hidden_layers, conf.num_attention_heads, conf.vocab_size)
                        if conf is not None else (cfg["hidden_size"], cfg["num_hidden_layers"],
                                                  cfg["num_attention_heads"], cfg["vocab_size"]))
        return dict(family="ernie", lora=False, cfg=cfg, n_layers=nl, h_q=nh, head_dim=h // nh, vocab=v)
    cfg = dict(TINY) if tiny else dict(LLAMA_1B if name == "llama1b" else LLAMA_8B)
    if tiny and name == "llama8b_lora":
        cfg["tie_word_embeddings"] = False
    return dict(family="llama", lora=name == "llama8b_lora", cfg=cfg, n_layers=cfg["num_hidden_layers"],
                h_q=cfg["num_attention_heads"], head_dim=cfg["head_dim"], vocab=cfg["vocab_size"])


def build_model(info: dict, setup: str, device, recompute: bool, fused_elementwise: bool) -> nn.Module:
    """The training model of ``setup`` on ``device`` (seed the RNG first for equal weights across setups).

    ``hf_padded`` builds ``transformers.LlamaForCausalLM`` (SDPA) of the same shape (ValueError for ERNIE: no
    transformers class). ``fused_elementwise`` sets the ``use_fused_*`` switches of our Llama (no effect on
    transformers' model or ERNIE, whose ops are their own). LoRA presets get adapters and a bf16 frozen base.
    """
    if info["family"] == "ernie":
        if setup == "hf_padded":
            raise ValueError("hf_padded: transformers has no ERNIE-3.5-SE model")
        from paddlenlp_ext.transformers.ernie35 import Ernie35Config, Ernie35ForCausalLM, preset_config

        conf = (Ernie35Config(**info["cfg"]) if info["cfg"] is not None
                else preset_config("baidu/ernie-3.5-se-3b", **ERNIE_OVERRIDES))
        conf.use_recompute = bool(recompute)
        with torch.device(device):
            model = Ernie35ForCausalLM(conf)
    elif setup == "hf_padded":
        import transformers

        hcfg = transformers.LlamaConfig(**info["cfg"], attention_bias=False, mlp_bias=False)
        hcfg._attn_implementation = "sdpa"
        with torch.device(device):
            model = transformers.LlamaForCausalLM(hcfg)
        if recompute:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    else:
        from paddlenlp_ext.transformers.llama import LlamaConfig, LlamaForCausalLM

        with torch.device(device):
            model = LlamaForCausalLM(LlamaConfig(**info["cfg"], recompute=recompute))
        for key in FUSED_KEYS:
            setattr(model.config, key, bool(fused_elementwise))
    if info["lora"]:
        from paddlenlp_ext.peft import apply_lora, cast_frozen_base

        model = apply_lora(model, {"lora_rank": 8})
        if device.type == "cuda":
            cast_frozen_base(model, torch.bfloat16)
    return model.train()


def matmul_params(model: nn.Module) -> tuple[int, int]:
    """``(N, N_train)`` of the FLOP formula: unique parameters minus an untied input embedding; of those, the
    ones with ``requires_grad``."""
    emb = model.get_input_embeddings().weight if hasattr(model, "get_input_embeddings") else \
        model.model.embed_tokens.weight
    head = model.lm_head.weight
    seen, n, n_train = set(), 0, 0
    for p in model.parameters():
        if id(p) in seen or (p is emb and p is not head):
            continue
        seen.add(id(p))
        n += p.numel()
        n_train += p.numel() if p.requires_grad else 0
    return n, n_train


def step_flops(info: dict, n: int, n_train: int, tokens: int, pairs: int) -> float:
    """Model FLOPs of training on ``tokens`` real tokens with ``pairs`` unmasked attention pairs (module doc)."""
    return (4 * n + 2 * n_train) * tokens + 12 * info["n_layers"] * info["h_q"] * info["head_dim"] * pairs


@contextlib.contextmanager
def patched_attention(fn):
    """Route our models' attention through ``fn`` (same signature as ``flashmask_attention``) inside the block:
    the Llama module's imported name and ``flashmask.flashmask_attention`` (which ERNIE calls). None: no patch."""
    import flashmask

    import paddlenlp_ext.transformers.llama.modeling as llama_modeling

    if fn is None:
        yield
        return
    saved = llama_modeling.flashmask_attention, flashmask.flashmask_attention
    llama_modeling.flashmask_attention = flashmask.flashmask_attention = fn
    try:
        yield
    finally:
        llama_modeling.flashmask_attention, flashmask.flashmask_attention = saved
