"""ERNIE-3.5-SE in PyTorch: parallel attention/FFN blocks, "head MHA, tail FFN" layers, FlashMask packing.

Source: PaddleNLP ``llm/experimental/ernie-3.5-se/modeling.py`` (``Ernie35Attention``, ``Ernie35MLP``,
``Ernie35MLPAttention``, ``Ernie35DecoderLayer``, ``Ernie35Model``, ``Ernie35LMHead``, ``Ernie35ForCausalLM``).

Parameter names follow the Llama contract (``model.embed_tokens``, ``model.layers.N...``, ``model.norm``,
``lm_head``) with ERNIE's module names inside a layer:

- layer 0 (``parallel_attn_hatf``): ``self_attn.{q,k,v,o}_proj`` + ``input_layernorm``;
- middle layers: ``self_attn_mlp.qkv_gate_up_proj`` (``H -> 3H + 2I``) + ``self_attn_mlp.o_proj``
  (``I + H -> H``) + ``input_layernorm``;
- last layer (``parallel_attn_hatf``): ``mlp.{gate,up,down}_proj`` + ``post_attention_layernorm``.

Linear weights are PyTorch ``[out, in]`` (Paddle stores ``[in, out]``; :mod:`.paddle_import` transposes).
Difference from PaddleNLP: attention goes through ``flashmask.flashmask_attention`` with the pack's
``attn_mask_startend_row_indices``, so packed SFT/LoRA/DPO/RM batches work (PaddleNLP's flash path ignores masks).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

import flashmask

from ..model_utils import PretrainedMixin, to_torch_dtype
from .configuration import ERNIE_PRETRAINED_INIT_CONFIGURATION, Ernie35Config
from .positions import apply_rotary_pos_emb, position_seed, resolve_position_ids, rope_cos_sin, training_seq_len

__all__ = ["Ernie35Attention", "Ernie35MLP", "Ernie35MLPAttention", "Ernie35DecoderLayer", "Ernie35Model",
           "Ernie35ForCausalLM", "from_preset_or_pretrained", "count_parameters_formula", "is_preset",
           "preset_config"]


def _attention(q, k, v, cos, sin, startend, kv_cache=None, layer_idx=0):
    """RoPE then FlashMask causal attention. q, k, v ``[B, L, H, D]`` -> ``[B, L, H*D]``. With ``kv_cache`` the
    keys/values are appended to the cache first; a decoding step (one query after the prefill) sees every cached
    key, so it runs non-causally (``startend`` then masks key columns: C = 2, LTS/UTE)."""
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    causal = True
    if kv_cache is not None:
        causal = kv_cache.seen == 0
        k, v = kv_cache.update(layer_idx, k, v)
    out = flashmask.flashmask_attention(q, k, v, startend, causal=causal)  # [B, L, H, D]
    return out.flatten(2)


class Ernie35Attention(nn.Module):
    """Attention-only sub-block (layer 0 under ``parallel_attn_hatf``): MHA (no GQA), biases iff ``use_bias``.

    ``forward(x [B, L, H], cos, sin [B, L, 1, D] fp32, startend int32 [B, 1, L, C] | None) -> [B, L, H]``.
    """

    def __init__(self, config: Ernie35Config):
        super().__init__()
        h, b = config.hidden_size, config.use_bias
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.q_proj = nn.Linear(h, h, bias=b)
        self.k_proj = nn.Linear(h, h, bias=b)
        self.v_proj = nn.Linear(h, h, bias=b)
        self.o_proj = nn.Linear(h, h, bias=b)

    def forward(self, x, cos, sin, startend=None, kv_cache=None, layer_idx=0):
        bsz, seq, _ = x.shape
        # -1 heads: the projections may hold only some of the heads (their weights split from outside)
        shape = (bsz, seq, -1, self.head_dim)
        q, k, v = self.q_proj(x).view(shape), self.k_proj(x).view(shape), self.v_proj(x).view(shape)
        return self.o_proj(_attention(q, k, v, cos, sin, startend, kv_cache, layer_idx))


class Ernie35MLP(nn.Module):
    """SwiGLU FFN-only sub-block (last layer under ``parallel_attn_hatf``): ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: Ernie35Config):
        super().__init__()
        h, i, b = config.hidden_size, config.intermediate_size, config.use_bias
        self.gate_proj = nn.Linear(h, i, bias=b)
        self.up_proj = nn.Linear(h, i, bias=b)
        self.down_proj = nn.Linear(i, h, bias=b)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Ernie35MLPAttention(nn.Module):
    """Parallel attention + FFN with one fused input and one fused output projection.

    ``qkv_gate_up_proj``: ``H -> 3H + 2I``, output columns ``[QKV (3H) | G (I) | U (I)]`` where the QKV block is
    head-interleaved (``[q_h | k_h | v_h]`` per head, each ``head_dim`` wide). FFN output is ``silu(G) * U``
    (PaddleNLP names G ``up_states`` and U ``gate_states``; the maths is the same). ``o_proj``: ``I + H -> H`` over
    ``concat([ffn_out, attn_out], -1)``, FFN first.

    ``forward(x [B, L, H], cos, sin, startend) -> [B, L, H]``. The head count and FFN width are read from the
    projection's output, so the weights may be split from outside (TP: ``paddlenlp_ext.distributed``).
    """

    def __init__(self, config: Ernie35Config):
        super().__init__()
        h, i, b = config.hidden_size, config.intermediate_size, config.use_bias
        self.num_heads, self.head_dim, self.intermediate_size = config.num_attention_heads, config.head_dim, i
        self.qkv_gate_up_proj = nn.Linear(h, 3 * h + 2 * i, bias=b)
        self.o_proj = nn.Linear(i + h, h, bias=b)

    def forward(self, x, cos, sin, startend=None, kv_cache=None, layer_idx=0):
        bsz, seq, hidden = x.shape
        fused = self.qkv_gate_up_proj(x)  # [B, L, 3h + 2i]
        # Widths read from the output: the projection may hold a 1/k share of every block (heads and FFN columns
        # split from outside, rows ordered [QKV share | G share | U share]); h : i stays hidden : intermediate.
        share = (3 * hidden + 2 * self.intermediate_size) // fused.shape[-1]
        h, i = hidden // share, self.intermediate_size // share
        if 3 * h + 2 * i != fused.shape[-1]:
            raise ValueError(f"qkv_gate_up_proj output width {fused.shape[-1]} is not a 1/{share} share of "
                             f"[3 x {hidden} | {self.intermediate_size} | {self.intermediate_size}]")
        mix, g, u = fused.split([3 * h, i, i], -1)
        q, k, v = mix.reshape(bsz, seq, -1, 3 * self.head_dim).chunk(3, dim=-1)  # each [B, L, h / D, D]
        attn = _attention(q, k, v, cos, sin, startend, kv_cache, layer_idx)  # [B, L, h]
        ffn = F.silu(g) * u  # [B, L, i]
        return self.o_proj(torch.cat([ffn, attn], dim=-1))


class Ernie35DecoderLayer(nn.Module):
    """Pre-norm block (PaddleNLP ``Ernie35DecoderLayer(config, has_ffn, has_mha, parallel_attn_ffn)``).

    - parallel: ``x + self_attn_mlp(LN(x))`` (one shared LayerNorm ``input_layernorm``);
    - otherwise: ``x + self_attn(input_layernorm(x))`` if ``has_mha``, then ``x + mlp(post_attention_layernorm(x))``
      if ``has_ffn``. Absent sub-modules are None.
    """

    def __init__(self, config: Ernie35Config, has_ffn=True, has_mha=True, parallel_attn_ffn=False):
        super().__init__()
        norm = lambda: nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)  # noqa: E731  weight + bias
        self.self_attn_mlp = self.self_attn = self.mlp = None
        self.input_layernorm = self.post_attention_layernorm = None
        if parallel_attn_ffn:
            self.self_attn_mlp = Ernie35MLPAttention(config)
            self.input_layernorm = norm()
        else:
            if has_mha:
                self.self_attn = Ernie35Attention(config)
                self.input_layernorm = norm()
            if has_ffn:
                self.mlp = Ernie35MLP(config)
                self.post_attention_layernorm = norm()

    def forward(self, hidden_states, cos, sin, startend=None, kv_cache=None, layer_idx=0):
        if self.self_attn_mlp is not None:
            return hidden_states + self.self_attn_mlp(self.input_layernorm(hidden_states), cos, sin, startend,
                                                      kv_cache, layer_idx)
        if self.self_attn is not None:
            hidden_states = hidden_states + self.self_attn(self.input_layernorm(hidden_states), cos, sin, startend,
                                                           kv_cache, layer_idx)
        if self.mlp is not None:
            hidden_states = hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states


class Ernie35Model(nn.Module):
    """Embeddings, decoder layers, final LayerNorm. ``forward(...) -> hidden states [B, L, H]``.

    Attributes ``global_step`` (None = read ``TRAINER_GLOBAL_STEP``) and ``replica_rank`` (data-parallel replica
    index) seed the random position ids; set them from the trainer for reproducible draws.
    """

    def __init__(self, config: Ernie35Config):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        n = config.num_hidden_layers
        layers = []
        for i in range(n):
            if not config.parallel_attn_hatf:
                layers.append(Ernie35DecoderLayer(config, has_ffn=False, has_mha=False, parallel_attn_ffn=True))
            elif i == 0:  # head: attention only
                layers.append(Ernie35DecoderLayer(config, has_ffn=False, has_mha=True, parallel_attn_ffn=False))
            elif i == n - 1:  # tail: FFN only
                layers.append(Ernie35DecoderLayer(config, has_ffn=True, has_mha=False, parallel_attn_ffn=False))
            else:
                layers.append(Ernie35DecoderLayer(config, has_ffn=False, has_mha=False, parallel_attn_ffn=True))
        self.layers = nn.ModuleList(layers)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.global_step: int | None = None
        self.replica_rank: int = 0
        # inference with random position ids: a fixed spacing of positions (PaddleNLP predictor's
        # pos_decoding_interval), or None for the evaluation table (8, or max_pos // length past 4096 tokens)
        self.pos_decoding_interval: int | None = None
        # the attention layers' indices in a KV cache (the FFN-only tail layer has none)
        self.cache_index = {}
        for i, layer in enumerate(layers):
            if layer.self_attn is not None or layer.self_attn_mlp is not None:
                self.cache_index[i] = len(self.cache_index)

    def forward(self, input_ids, position_ids=None, attn_mask_startend_row_indices=None, kv_cache=None):
        """Args: input_ids int64 ``[B, L]``; position_ids int64 ``[B, L]`` (logical, restarting at 0 per example)
        or None (``0..L-1``, continuing after ``kv_cache.seen``); attn_mask_startend_row_indices int32
        ``[B, 1, L, C]`` (FlashMask; with a cache, over the cached + new key columns) or None (plain causal);
        kv_cache: :class:`~paddlenlp_ext.transformers.cache.KVCache` from ``Ernie35ForCausalLM.make_kv_cache``
        (inference). Returns ``[B, L, H]`` in the parameter dtype."""
        bsz, seq = input_ids.shape
        cfg = self.config
        if position_ids is None and kv_cache is not None and kv_cache.seen:
            position_ids = torch.arange(kv_cache.seen, kv_cache.seen + seq, device=input_ids.device).expand(bsz, seq)
        pos = resolve_position_ids(position_ids, bsz, seq, max_pos=cfg.max_position_embeddings,
                                   random_ids=cfg.enable_random_position_ids, training=self.training,
                                   seed=position_seed(self.global_step, self.replica_rank), device=input_ids.device,
                                   interval=None if self.training else self.pos_decoding_interval)
        cos, sin = rope_cos_sin(pos, cfg.head_dim)  # computed once, shared by all layers (as in PaddleNLP)
        h = self.embed_tokens(input_ids)
        # recompute: our launcher's key; use_recompute: PaddleNLP's config key (full-layer recompute either way)
        checkpoint = (bool(getattr(cfg, "recompute", False) or cfg.use_recompute) and torch.is_grad_enabled()
                      and kv_cache is None)
        for i, layer in enumerate(self.layers):
            if checkpoint:
                h = torch.utils.checkpoint.checkpoint(layer, h, cos, sin, attn_mask_startend_row_indices,
                                                      use_reentrant=False)
            else:
                h = layer(h, cos, sin, attn_mask_startend_row_indices, kv_cache, self.cache_index.get(i, 0))
        if kv_cache is not None:
            kv_cache.advance(seq)
        return self.norm(h)


class Ernie35ForCausalLM(PretrainedMixin, nn.Module):
    """ERNIE-3.5-SE causal LM: ``forward(input_ids, position_ids=None, attn_mask_startend_row_indices=None) -> logits``.

    ``lm_head`` is ``nn.Linear(H, V)`` with a bias iff ``use_bias and weight_share_add_bias``; its weight is the
    embedding matrix iff ``weight_share``. Init (PaddleNLP): ``initializer_range`` is overwritten with
    ``sqrt(0.3333 / hidden_size)``; Linear/Embedding/LM-head weights ~ N(0, range); biases 0; LayerNorm 1/0; then
    every ``o_proj`` and ``mlp.down_proj`` is scaled by ``1 / sqrt(2 * num_hidden_layers)``.

    With ``use_progressive_seq_len`` in training mode the inputs are cut to 512/1024/2048 tokens before steps
    500/1000/1500 (step from ``self.model.global_step`` or ``TRAINER_GLOBAL_STEP``), as PaddleNLP does in here.
    The trainer cuts the whole batch first (``paddlenlp_ext.trainer.progressive``), so that cut is then a no-op;
    a direct caller gets logits shorter than its labels (``sft_loss`` cuts the labels to match).
    """

    config_class = Ernie35Config
    kv_cache_key_mask = True  # with a KV cache, forward takes FlashMask vectors over the cached key columns

    def __init__(self, config: Ernie35Config):
        super().__init__()
        config.initializer_range = math.sqrt(0.3333 / config.hidden_size)  # BLOOM-176B std-init trick
        self.config = config
        self.model = Ernie35Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size,
                                 bias=bool(config.use_bias and config.weight_share_add_bias))
        self.tie_weights()
        if not self.lm_head.weight.is_meta:
            self.init_weights()

    def tie_weights(self) -> None:
        """Share ``lm_head.weight`` with the embedding iff ``weight_share`` (= ``tie_word_embeddings``)."""
        if self.config.weight_share:
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.no_grad()
    def init_weights(self) -> None:
        """PaddleNLP ``_init_weights`` + ``_post_init`` (see class docstring). Uses the torch default RNG."""
        std = self.config.initializer_range
        for mod in self.modules():
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                mod.weight.normal_(0.0, std)
                if getattr(mod, "bias", None) is not None:
                    mod.bias.zero_()
            elif isinstance(mod, nn.LayerNorm):
                mod.weight.fill_(1.0)
                mod.bias.zero_()
        factor = 1.0 / math.sqrt(2 * self.config.num_hidden_layers)
        for layer in self.model.layers:
            for sub in (layer.self_attn_mlp, layer.self_attn):
                if sub is not None:
                    sub.o_proj.weight.mul_(factor)
            if layer.mlp is not None:
                layer.mlp.down_proj.weight.mul_(factor)

    def training_seq_len(self, seq_len: int) -> int:
        """Tokens the next forward keeps of a ``seq_len``-long batch (the progressive warm-up cut, in training
        only): the trainer counts the loss denominator with it before the forward."""
        return training_seq_len(self.config, self.training, self.model.global_step, seq_len)

    def make_kv_cache(self, batch_size: int, max_len: int):
        """An empty :class:`~paddlenlp_ext.transformers.cache.KVCache` for this model's attention layers (all but
        an FFN-only tail layer), in its dtype and device."""
        from ..cache import KVCache

        p = self.lm_head.weight
        return KVCache(len(self.model.cache_index), batch_size, max_len, self.config.num_attention_heads,
                       self.config.head_dim, p.dtype, p.device)

    def forward(self, input_ids, position_ids=None, attn_mask_startend_row_indices=None, kv_cache=None):
        """Logits ``[B, L, V]`` (``L`` possibly cut by the progressive warm-up, see class docstring); ``kv_cache``
        as in :meth:`Ernie35Model.forward` (inference)."""
        if self.config.use_progressive_seq_len and self.training:
            cut = self.training_seq_len(input_ids.shape[1])
            if cut < input_ids.shape[1]:
                input_ids = input_ids[:, :cut]
                position_ids = None if position_ids is None else position_ids[:, :cut]
                if attn_mask_startend_row_indices is not None:
                    attn_mask_startend_row_indices = attn_mask_startend_row_indices[:, :, :cut].clamp(max=cut)
        return self.lm_head(self.model(input_ids, position_ids, attn_mask_startend_row_indices, kv_cache))

    # ---- checkpoints (save_pretrained comes from PretrainedMixin: config.json + sharded safetensors) ---------

    @classmethod
    def from_config(cls, config: Ernie35Config, dtype: str | torch.dtype | None = None, device=None):
        """Randomly initialised model (PaddleNLP init), optionally cast to ``dtype`` / moved to ``device``."""
        dtype = to_torch_dtype(dtype)
        model = cls(config)
        return model.to(device=device, dtype=dtype) if (dtype or device) else model

    @classmethod
    def from_pretrained(cls, name_or_dir: str, dtype: str | torch.dtype | None = None, device=None,
                        **config_overrides):
        """Load a directory: ours (``model.safetensors`` [+ index]) or PaddleNLP's (``model_state.pdparams`` or
        Paddle-layout safetensors, converted by :mod:`.paddle_import`). A preset name gives a random model
        (:func:`from_preset_or_pretrained`). Returned in eval mode, like the Llama.

        Raises:
            FileNotFoundError: no config.json or no weights file in the directory.
            ValueError: missing/unexpected parameter names or shape mismatches (named in the message).
        """
        if name_or_dir in ERNIE_PRETRAINED_INIT_CONFIGURATION:
            return from_preset_or_pretrained(name_or_dir, dtype=dtype, device=device, **config_overrides)
        from .paddle_import import load_checkpoint_state_dict

        dtype = to_torch_dtype(dtype)
        config = Ernie35Config.from_pretrained(name_or_dir, **config_overrides)
        sd = load_checkpoint_state_dict(name_or_dir, config)
        with torch.device("meta"):
            model = cls(config)
        model.load_our_state_dict(sd, source=name_or_dir)
        model = model.to(device=device, dtype=dtype) if (dtype or device) else model
        return model.eval()

    def load_our_state_dict(self, sd: dict[str, torch.Tensor], source: str = "state dict") -> None:
        """Assign tensors (our names, ``[out, in]``) to the parameters, checking names and shapes; re-ties weights."""
        if self.config.weight_share:
            sd = {k: v for k, v in sd.items() if k != "lm_head.weight"}
        own = self.state_dict()
        expected = {k for k in own if not (self.config.weight_share and k == "lm_head.weight")}
        missing, unexpected = sorted(expected - set(sd)), sorted(set(sd) - expected)
        if missing or unexpected:
            raise ValueError(f"{source}: parameter names do not match Ernie35ForCausalLM ({self.config.num_hidden_layers}"
                             f" layers, parallel_attn_hatf={self.config.parallel_attn_hatf}): missing {missing[:6]}, "
                             f"unexpected {unexpected[:6]}")
        for k, v in sd.items():
            if tuple(v.shape) != tuple(own[k].shape):
                raise ValueError(f"{source}: {k} has shape {list(v.shape)}, the model expects {list(own[k].shape)}")
        self.load_state_dict(sd, strict=False, assign=True)
        self.tie_weights()


def is_preset(name) -> bool:
    """True for the PaddleNLP preset names ``ernie/tiny-random-ernie`` and ``baidu/ernie-3.5-se-3b``."""
    return isinstance(name, str) and name in ERNIE_PRETRAINED_INIT_CONFIGURATION


def preset_config(name: str, **config_overrides) -> Ernie35Config:
    """The preset's config (PaddleNLP's, ``vocab_size`` 32000: the bundled 4,096-piece tokenizer's ids fit in it)."""
    return Ernie35Config.from_pretrained(name, **config_overrides)


def from_preset_or_pretrained(name: str, dtype: str | torch.dtype | None = None, device=None, **config_overrides):
    """``Ernie35ForCausalLM`` from a preset name (random init: no ERNIE-3.5-SE weights exist in any reachable
    registry) or from a checkpoint directory.

    Presets: ``ernie/tiny-random-ernie`` (768 hidden, 3 layers), ``baidu/ernie-3.5-se-3b`` (3072 hidden, 32 layers).
    ``config_overrides`` replace config fields (presets keep PaddleNLP's ``vocab_size`` 32000 otherwise).
    Random weights come from the torch default RNG (seed it for reproducibility). Presets return in train mode.

    Raises:
        FileNotFoundError: not a preset and not a directory with ``config.json``.
    """
    if name in ERNIE_PRETRAINED_INIT_CONFIGURATION:
        return Ernie35ForCausalLM.from_config(preset_config(name, **config_overrides), dtype=dtype, device=device)
    return Ernie35ForCausalLM.from_pretrained(name, dtype=dtype, device=device, **config_overrides)


def count_parameters_formula(config: Ernie35Config) -> int:
    """Closed-form parameter count of :class:`Ernie35ForCausalLM` (tied LM head counted once)."""
    h, i, v, n = config.hidden_size, config.intermediate_size, config.vocab_size, config.num_hidden_layers
    b = 1 if config.use_bias else 0
    ln = 2 * h
    attn = 4 * (h * h + b * h) + ln
    ffn = 2 * (h * i + b * i) + (i * h + b * h) + ln
    par = h * (3 * h + 2 * i) + b * (3 * h + 2 * i) + (i + h) * h + b * h + ln
    layers = attn + ffn + (n - 2) * par if config.parallel_attn_hatf else n * par
    head = (0 if config.weight_share else v * h) + (v if (config.use_bias and config.weight_share_add_bias) else 0)
    return v * h + layers + ln + head
