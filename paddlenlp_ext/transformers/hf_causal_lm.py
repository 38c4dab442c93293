"""Any ``transformers`` causal LM behind this package's model interface, attention through FlashMask.

:class:`HFCausalLM` holds the children of a ``transformers`` ``*ForCausalLM`` (``model``: the decoder trunk with
``layers``; ``lm_head``) under the same names, so its state dict, checkpoints, LoRA adapters and exported
directories use the family's own parameter names, and it offers what the trainers and launchers call on our
native models:

- ``forward(input_ids, position_ids=None, attn_mask_startend_row_indices=None, kv_cache=None) -> logits [B, L, V]``
  (the index tensor reaches every attention layer as a forward kwarg, see :mod:`.hf_attention`);
- ``model`` + a plain ``lm_head`` (the fused linear cross entropy and DPO's chunked log-probs run the head on the
  trunk's final-norm output themselves);
- ``save_pretrained`` (atomic; the directory loads in ``transformers.AutoModelForCausalLM``), ``make_kv_cache``
  (generation: decode steps run SDPA), ``recompute`` as ``transformers``' activation checkpointing.

What a family needs beyond the attention function is checked at load (:func:`check_hf_config`): a model_type
``transformers`` knows (or remote code with ``trust_remote_code``), an attention the kernel computes exactly, and
logits that are ``lm_head(final hidden states)`` (no final softcapping / scaling).
"""

from __future__ import annotations

import inspect
import os

import torch
from torch import nn

from ..ops import without_fused_keys
from .hf_attention import FLASHMASK, STARTEND_KEY, register_flashmask_attention
from .model_utils import atomic_save_dir, to_torch_dtype

# model_type -> (config key, what it is): attention the FlashMask kernel cannot compute exactly
_REFUSED_ATTENTION = {
    "attn_logit_softcapping": "attention logit softcapping",
    "attention_chunk_size": "chunked attention",
    "alibi": "ALiBi position biases",
    "use_bidirectional_attention": "bidirectional attention",
}
_REFUSED_MODEL_TYPES = {"gpt_oss": "learned attention sinks (the `sinks` parameter of every attention layer)"}
# logits that are not lm_head(hidden): the fused head + loss would skip the transform
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
_HYBRID_LAYER_TYPES = ("linear_attention", "mamba", "conv")


def check_hf_config(config, where: str) -> None:
    """Refuse, with one ``ValueError`` naming ``where`` (the ``config.json``), the config key and the alternative,
    a ``transformers`` config this path cannot train exactly on packed FlashMask batches."""
    mt = getattr(config, "model_type", None)
    alt = ("train it with transformers' own Trainer and attn_implementation='sdpa' on padded batches, or choose "
           "another model")
    if mt in _REFUSED_MODEL_TYPES:
        raise ValueError(f"{where}: model_type {mt!r} uses {_REFUSED_MODEL_TYPES[mt]}, which the FlashMask kernel "
                         f"cannot compute exactly; {alt}")
    for key, what in _REFUSED_ATTENTION.items():
        value = getattr(config, key, None)
        if value not in (None, False, 0):
            raise ValueError(f"{where}: {key}={value!r} ({what} of model_type {mt!r}) cannot be computed exactly by "
                             f"the FlashMask kernel; {alt}")
    for key in _LOGIT_TRANSFORMS:
        value = getattr(config, key, None)
        if value not in (None, 1, 1.0):
            raise ValueError(f"{where}: {key}={value!r}: model_type {mt!r} transforms its logits after the LM head, "
                             f"which the packed trainers' head + loss do not apply; {alt}")
    hybrid = sorted({t for t in (getattr(config, "layer_types", None) or []) if t in _HYBRID_LAYER_TYPES})
    if hybrid:
        raise ValueError(f"{where}: layer_types holds {hybrid} layers (model_type {mt!r}): their recurrent state "
                         f"would flow across packed documents; {alt}")
    dropout = getattr(config, "attention_dropout", 0.0) or 0.0
    if dropout:
        raise ValueError(f"{where}: attention_dropout={dropout}: FlashMask has no attention dropout; set "
                         f"\"attention_dropout\": 0.0 in config.json (the usual value for fine-tuning)")


def mirror_setattr(wrapper: nn.Module, name: str, value) -> None:
    """``nn.Module.__setattr__`` of a wrapper that shares the children of ``wrapper.hf``: a child replaced on the
    wrapper (LoRA wrapping or merging ``lm_head``, a head swapped for ``nn.Identity``) is replaced in the
    ``transformers`` model too, so its ``save_pretrained`` and ``generate`` see the same modules."""
    nn.Module.__setattr__(wrapper, name, value)
    hf = wrapper.__dict__.get("hf")
    if hf is not None and isinstance(value, nn.Module) and name in hf._modules:
        setattr(hf, name, value)


class _HFCache:
    """The ``kv_cache`` object of :func:`paddlenlp_ext.transformers.generation.generate` for an :class:`HFCausalLM`:
    a ``transformers`` ``DynamicCache`` (it knows how many tokens it holds, so positions continue by themselves)."""

    def __init__(self, config):
        from transformers import DynamicCache

        self.cache = DynamicCache(config=config)


def enable_activation_checkpointing(hf: nn.Module) -> None:
    """Recompute each decoder layer's activations in the backward (non-reentrant ``torch.utils.checkpoint``), by
    ``activation_checkpointing_enable`` where ``transformers`` has it, else by its older name
    ``gradient_checkpointing_enable`` (deprecated, to be removed in transformers 6)."""
    enable = getattr(hf, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


class HFCausalLM(nn.Module):
    """A ``transformers`` ``*ForCausalLM`` with this package's model interface (module docstring).

    Build it with :meth:`from_pretrained` / :meth:`from_config`, or wrap a loaded model: ``HFCausalLM(hf_model)``
    (its children are shared, not copied; the model should use ``attn_implementation="FlashMask"`` for packed
    batches).
    """

    is_hf_model = True

    def __init__(self, hf_model: nn.Module):
        super().__init__()
        for name, child in hf_model.named_children():
            self.add_module(name, child)
        object.__setattr__(self, "hf", hf_model)  # not a child: parameter names stay the family's own
        self.config = hf_model.config
        params = inspect.signature(self.model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

    def __setattr__(self, name, value):
        mirror_setattr(self, name, value)

    # ---- construction ------------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str, dtype: str | torch.dtype = torch.float32, *, trust_remote_code: bool = False,
                        recompute: bool = False, attn_implementation: str = FLASHMASK) -> "HFCausalLM":
        """Load a local ``transformers`` causal LM directory (never the hub) in ``dtype`` on the CPU.

        Raises:
            ValueError: what :func:`check_hf_config` refuses; a directory that is not a causal LM.
        """
        import transformers

        register_flashmask_attention()
        where = os.path.join(path, "config.json")
        config = transformers.AutoConfig.from_pretrained(path, local_files_only=True,
                                                         trust_remote_code=trust_remote_code)
        check_hf_config(config, where)
        try:
            hf = transformers.AutoModelForCausalLM.from_pretrained(
                path, dtype=to_torch_dtype(dtype), attn_implementation=attn_implementation, local_files_only=True,
                trust_remote_code=trust_remote_code)
        except ValueError as e:
            if "Unrecognized configuration class" in str(e):
                raise ValueError(f"{where}: model_type {config.model_type!r} has no causal-LM class in transformers "
                                 f"{transformers.__version__} (AutoModelForCausalLM); a causal LM checkpoint is "
                                 "needed") from None
            raise
        return cls._finish(hf, recompute)

    @classmethod
    def from_config(cls, config, *, recompute: bool = False, trust_remote_code: bool = False,
                    attn_implementation: str = FLASHMASK) -> "HFCausalLM":
        """Random ``transformers`` initialisation of ``config`` (a ``transformers`` config object)."""
        import transformers

        register_flashmask_attention()
        check_hf_config(config, f"config of model_type {config.model_type!r}")
        hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation,
                                                           trust_remote_code=trust_remote_code)
        return cls._finish(hf, recompute)

    @classmethod
    def _finish(cls, hf, recompute: bool) -> "HFCausalLM":
        if recompute:
            enable_activation_checkpointing(hf)
        model = cls(hf)
        if not isinstance(getattr(model, "model", None), nn.Module) or not isinstance(getattr(model, "lm_head", None),
                                                                                      nn.Linear):
            raise ValueError(f"{type(hf).__name__} has no `model` trunk and `lm_head` linear head; only decoder "
                             "causal LMs laid out that way are supported")
        return model.eval()

    # ---- forward -----------------------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                attn_mask_startend_row_indices: torch.Tensor | None = None, kv_cache: _HFCache | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[B, L, V]`` (``lm_head`` of the trunk's final hidden states).

        Args:
            input_ids: int64 ``[B, L]``; position_ids: int64 ``[B, L]`` (restarting per packed example).
            attn_mask_startend_row_indices: int32 ``[B, 1, L, C]`` FlashMask vectors (docs/design.md section 2).
            kv_cache: from :meth:`make_kv_cache` (generation), else None.
            attention_mask: 2-D padding mask (1 = token), for unpacked padded batches.
        """
        kwargs = {}
        if attn_mask_startend_row_indices is not None:
            kwargs[STARTEND_KEY] = attn_mask_startend_row_indices
        if kv_cache is not None:
            kwargs[self._cache_kwarg] = kv_cache.cache
        out = self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                         use_cache=kv_cache is not None, **kwargs)
        return self.lm_head(out[0])

    def make_kv_cache(self, batch_size: int, max_len: int) -> _HFCache:
        """An empty cache for :func:`paddlenlp_ext.transformers.generation.generate` (sizes are not needed)."""
        return _HFCache(self.config)

    def tie_weights(self) -> None:
        """Re-tie ``lm_head`` to the input embedding when the config says so (``transformers``' rule)."""
        if getattr(self.config, "tie_word_embeddings", False):
            self.lm_head.weight = self.model.get_input_embeddings().weight

    # ---- saving ------------------------------------------------------------------------------------------------
    def save_pretrained(self, save_dir: str, dtype: str | torch.dtype | None = None, **kwargs) -> None:
        """``transformers``' ``save_pretrained`` into a temporary directory, renamed into place when complete
        (``model_utils.atomic_save_dir``); ``dtype`` casts floating weights on save."""
        dtype = to_torch_dtype(dtype)
        state_dict = None
        if dtype is not None:
            state_dict = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in self.hf.state_dict().items()}
        with atomic_save_dir(save_dir) as tmp, without_fused_keys(self.hf.config):
            self.hf.save_pretrained(tmp, state_dict=state_dict, **kwargs)


def is_hf_model(model: nn.Module) -> bool:
    """Whether ``model`` (possibly FSDP / LoRA wrapped in place) is an :class:`HFCausalLM`."""
    return bool(getattr(model, "is_hf_model", False))

