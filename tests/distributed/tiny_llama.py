"""A small stand-in Llama with HF module names, used until/unless the real one is importable.

Same names and the same head reshape as ``paddlenlp_ext.transformers.llama`` (``view(B, L, -1, D)``), so the
TP plan and FSDP wrapping apply unchanged. Attention goes through ``flashmask.flashmask_attention``.
Shapes: B batch, L sequence, H hidden, N heads, D head dim, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from flashmask import flashmask_attention


@dataclass
class TinyConfig:
    vocab_size: int = 128
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False


class RMSNorm(nn.Module):
    def __init__(self, h, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))
        self.eps = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def _rope(x, pos, theta):  # x [B, L, N, D], pos [B, L]
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = pos[..., None].float() * inv  # [B, L, D/2]
    cos, sin = torch.cat([ang, ang], -1).cos()[:, :, None], torch.cat([ang, ang], -1).sin()[:, :, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.head_dim, self.theta = c.hidden_size // c.num_attention_heads, c.rope_theta
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * self.head_dim, c.hidden_size, bias=False)

    def forward(self, x, position_ids, sri):
        b, l, _ = x.shape
        # -1 heads: under TP each rank holds N/tp query heads and N_kv/tp KV heads.
        q = _rope(self.q_proj(x).view(b, l, -1, self.head_dim), position_ids, self.theta)
        k = _rope(self.k_proj(x).view(b, l, -1, self.head_dim), position_ids, self.theta)
        v = self.v_proj(x).view(b, l, -1, self.head_dim)
        out = flashmask_attention(q, k, v, sri, causal=True, impl="reference")  # [B, L, N_local, D]
        return self.o_proj(out.reshape(b, l, -1))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn, self.mlp = Attention(c), MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, position_ids, sri):
        x = x + self.self_attn(self.input_layernorm(x), position_ids, sri)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, input_ids, position_ids, sri):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, position_ids, sri)
        return self.norm(x)


class TinyLlamaForCausalLM(nn.Module):
    def __init__(self, c: TinyConfig):
        super().__init__()
        self.config = c
        self.model = Backbone(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids, position_ids=None, attn_mask_startend_row_indices=None):
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1])[None].expand_as(input_ids)
        return self.lm_head(self.model(input_ids, position_ids, attn_mask_startend_row_indices))
