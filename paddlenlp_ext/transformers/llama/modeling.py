"""Llama in plain PyTorch, attention through FlashMask; Hugging Face parameter names.

Matches ``transformers.models.llama.modeling_llama`` numerically (RMSNorm in fp32, rotate_half RoPE with optional
Llama-3 scaling, GQA, SwiGLU, no biases by default) and PaddleNLP's ``paddlenlp/transformers/llama/modeling.py``
routing: with ``attn_mask_startend_row_indices`` every layer calls ``flashmask_attention`` and RoPE positions come
from ``position_ids`` (they restart per packed example). No parallelism and no LoRA switches live here.

Fused ops (PaddleNLP keys, read from the config at forward time, default off; set them with
``paddlenlp_ext.ops.set_llm_config``): ``use_fused_rms_norm``, ``use_fused_rope``, ``use_fused_swiglu`` route
RMSNorm / RoPE / SwiGLU through ``paddlenlp_ext.ops`` (``torch.compile``d on CUDA, the same eager math elsewhere).

Shape legend: B batch, L sequence, E hidden_size, H / H_k query / key-value heads, D head_dim, V vocab.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from flashmask import flashmask_attention
from torch import nn

from paddlenlp_ext.ops import fused_flag, fused_rms_norm, fused_rope, fused_swiglu

from ..cache import KVCache
from ..model_utils import PretrainedMixin
from .configuration import LlamaConfig


class LlamaRMSNorm(nn.Module):
    """RMSNorm: ``w * x / sqrt(mean(x^2) + eps)``, statistics in fp32, output in the input dtype (HF order)."""

    def __init__(self, hidden_size: int, eps: float, config: LlamaConfig | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps
        self.config = config  # only read for use_fused_rms_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., E] -> [..., E]
        if fused_flag(self.config, "use_fused_rms_norm"):
            return fused_rms_norm(x, self.weight, self.variance_epsilon)
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dtype)


def rope_inv_freq(config: LlamaConfig, device=None) -> torch.Tensor:
    """RoPE inverse frequencies, fp32 ``[D/2]``; Llama-3 wavelength-band scaling when ``rope_scaling`` says so.

    Source: RoFormer (Su et al., arXiv 2104.09864); Llama-3.1 scaling as in transformers'
    ``_compute_llama3_parameters`` and PaddleNLP's ``Llama3RotaryEmbedding``.
    """
    d = config.head_dim
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d))
    rs = config.rope_scaling
    if rs is None:
        return inv
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old_len = rs["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old_len / lo, inv / factor, inv)  # long wavelengths: slowed down by factor
    smooth = (old_len / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / hi) & ~(wavelen > old_len / lo)
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin(config: LlamaConfig, position_ids: torch.Tensor, dtype: torch.dtype):
    """cos, sin ``[B, L, D]`` in ``dtype`` for int64 ``position_ids [B, L]`` (computed in fp32, like HF)."""
    inv = rope_inv_freq(config, position_ids.device)  # [D/2]
    freqs = position_ids.float()[..., None] * inv  # [B, L, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [B, L, D]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` on the last dim (HF / PaddleNLP half-split RoPE layout)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, L, H, D]`` by ``cos, sin [B, L, D]`` (fp32); the result keeps ``x``'s dtype.

    cos/sin are cast to ``x.dtype`` first, as transformers does, so under bf16 autocast q and k stay bf16 like v.
    """
    cos, sin = cos.to(x.dtype)[:, :, None], sin.to(x.dtype)[:, :, None]
    return x * cos + rotate_half(x) * sin


class LlamaAttention(nn.Module):
    """GQA self-attention; the softmax runs in :func:`flashmask.flashmask_attention` (layout ``[B, L, H, D]``)."""

    def __init__(self, config: LlamaConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.config = config
        self.num_heads, self.num_kv_heads, self.head_dim = (config.num_attention_heads, config.num_key_value_heads,
                                                           config.head_dim)
        e, b = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(e, self.num_heads * self.head_dim, bias=b)
        self.k_proj = nn.Linear(e, self.num_kv_heads * self.head_dim, bias=b)
        self.v_proj = nn.Linear(e, self.num_kv_heads * self.head_dim, bias=b)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, e, bias=b)

    def forward(self, x, cos, sin, startend_row_indices=None, kv_cache: KVCache | None = None):
        """``x [B, L, E]`` -> ``[B, L, E]``; ``startend_row_indices`` int32 ``[B, 1|H_k, L, C]`` or None."""
        bsz, seq, _ = x.shape
        # Local head counts come from the weight shapes, so a tensor-parallel split of q/k/v works unchanged.
        q = self.q_proj(x).view(bsz, seq, -1, self.head_dim)  # [B, L, H, D]
        k = self.k_proj(x).view(bsz, seq, -1, self.head_dim)  # [B, L, H_k, D]
        v = self.v_proj(x).view(bsz, seq, -1, self.head_dim)
        if fused_flag(self.config, "use_fused_rope"):
            q, k = fused_rope(q, k, cos, sin)
        else:
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        causal = True
        if kv_cache is not None:
            decoding = kv_cache.seen > 0
            k, v = kv_cache.update(self.layer_idx, k, v)
            causal = not decoding  # one new query sees every cached key
        out = flashmask_attention(q, k, v, startend_row_indices, causal=causal)  # [B, L, H, D]
        return self.o_proj(out.reshape(bsz, seq, -1))


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))`` (Shazeer, arXiv 2002.05202)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        e, f, b = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.config = config
        self.gate_proj = nn.Linear(e, f, bias=b)
        self.up_proj = nn.Linear(e, f, bias=b)
        self.down_proj = nn.Linear(f, e, bias=b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, L, E] -> [B, L, E]
        if fused_flag(self.config, "use_fused_swiglu"):
            return self.down_proj(fused_swiglu(self.gate_proj(x), self.up_proj(x)))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))`` then ``h + mlp(norm(h))``."""

    def __init__(self, config: LlamaConfig, layer_idx: int):
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_idx)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps, config)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps, config)

    def forward(self, x, cos, sin, startend_row_indices=None, kv_cache=None):  # [B, L, E] -> [B, L, E]
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, startend_row_indices, kv_cache)
        return h + self.mlp(self.post_attention_layernorm(h))


def _check_inputs(input_ids, position_ids, sri, cached: int = 0):
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.is_floating_point():
        raise ValueError(f"input_ids must be an integer tensor [batch, seq], got "
                         f"{getattr(input_ids, 'dtype', type(input_ids))} {list(getattr(input_ids, 'shape', []))}")
    if position_ids is not None and tuple(position_ids.shape) != tuple(input_ids.shape):
        raise ValueError(f"position_ids must have the shape of input_ids {list(input_ids.shape)}, "
                         f"got {list(position_ids.shape)}")
    keys = cached + input_ids.shape[1]  # the key axis: the cached tokens, then these
    if sri is not None and (sri.dim() != 4 or sri.shape[0] != input_ids.shape[0] or sri.shape[2] != keys):
        raise ValueError(f"attn_mask_startend_row_indices must be int32 [batch, 1, keys, C] with keys = cached + "
                         f"seq = {keys} for input_ids {list(input_ids.shape)}, got {list(sri.shape)}")


class LlamaModel(nn.Module):
    """Embedding, ``layers`` (an ``nn.ModuleList`` of :class:`LlamaDecoderLayer`) and the final norm."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps, config)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                attn_mask_startend_row_indices: torch.Tensor | None = None,
                kv_cache: KVCache | None = None) -> torch.Tensor:
        """Final hidden states ``[B, L, E]`` (after ``norm``), in the parameter dtype.

        Args:
            input_ids: int64 ``[B, L]``.
            position_ids: int64 ``[B, L]``; default ``0..L-1`` per row (or continuing after ``kv_cache.seen``).
                For packed batches pass the per-example positions (they restart at 0).
            attn_mask_startend_row_indices: int32 ``[B, 1, L, 1]`` FlashMask LTS (docs/design.md section 2) or
                None for plain causal attention. With a ``kv_cache`` its key axis spans the cached tokens too
                (``[B, 1, seen + L, C]``: a decode step passes the non-causal ``[LTS, UTE]`` of its one query, e.g.
                to hide left padding, ``batch_generation.generate_batch``).
            kv_cache: inference cache (see :class:`KVCache`); None in training.

        Raises:
            ValueError: malformed shapes (message gives expected and actual).
        """
        _check_inputs(input_ids, position_ids, attn_mask_startend_row_indices, kv_cache.seen if kv_cache else 0)
        bsz, seq = input_ids.shape
        if position_ids is None:
            start = kv_cache.seen if kv_cache is not None else 0
            position_ids = torch.arange(start, start + seq, device=input_ids.device).expand(bsz, seq)
        h = self.embed_tokens(input_ids)  # [B, L, E]
        cos, sin = rope_cos_sin(self.config, position_ids, h.dtype)  # [B, L, D] each
        checkpoint = self.config.recompute and torch.is_grad_enabled() and kv_cache is None
        for layer in self.layers:
            if checkpoint:
                h = torch.utils.checkpoint.checkpoint(layer, h, cos, sin, attn_mask_startend_row_indices,
                                                      use_reentrant=False)
            else:
                h = layer(h, cos, sin, attn_mask_startend_row_indices, kv_cache)
        if kv_cache is not None:
            kv_cache.advance(seq)
        return self.norm(h)


class LlamaForCausalLM(PretrainedMixin, nn.Module):
    """Llama decoder + LM head. ``forward(input_ids, position_ids, attn_mask_startend_row_indices) -> logits``.

    Built on the meta device (``with torch.device("meta"):``) it allocates nothing; then call
    ``to_empty(device=...)``, ``init_weights()`` (which re-ties embeddings). ``from_pretrained`` /
    ``save_pretrained`` come from :class:`~paddlenlp_ext.transformers.model_utils.PretrainedMixin`.
    """

    kv_cache_key_mask = True  # with a KV cache, forward takes FlashMask vectors over the cached key columns

    config_class = LlamaConfig

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
        if not self.lm_head.weight.is_meta:
            self.init_weights()

    def tie_weights(self) -> None:
        """Share ``lm_head.weight`` with ``model.embed_tokens.weight`` when ``config.tie_word_embeddings``."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.no_grad()
    def init_weights(self, std: float | None = None) -> None:
        """HF init: Linear/Embedding weights ~ N(0, ``initializer_range``), biases 0, RMSNorm weights 1."""
        std = self.config.initializer_range if std is None else std
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                m.weight.normal_(0.0, std)
                if getattr(m, "bias", None) is not None:
                    m.bias.zero_()
            elif isinstance(m, LlamaRMSNorm):
                m.weight.fill_(1.0)
        self.tie_weights()

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                attn_mask_startend_row_indices: torch.Tensor | None = None,
                kv_cache: KVCache | None = None) -> torch.Tensor:
        """Logits ``[B, L, V]`` in the parameter dtype; arguments as in :meth:`LlamaModel.forward`."""
        return self.lm_head(self.model(input_ids, position_ids, attn_mask_startend_row_indices, kv_cache))

    def make_kv_cache(self, batch_size: int, max_len: int) -> KVCache:
        """An empty :class:`KVCache` for this model's geometry, dtype and device."""
        p = self.lm_head.weight
        return KVCache(self.config.num_hidden_layers, batch_size, max_len, self.config.num_key_value_heads,
                       self.config.head_dim, p.dtype, p.device)
