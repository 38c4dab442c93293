"""LoRA for any ``nn.Module`` built from ``nn.Linear`` layers, saved in the PEFT format.

Behaviour matched: PaddleNLP ``paddlenlp/peft/lora`` as driven by ``llm/run_finetune.py``
(``create_peft_model``: ``lora_alpha = 2 * lora_rank``, or 4 with ``rslora``; ``lora_dropout = 0``;
``get_lora_target_modules``: every linear layer of attention and MLP; ``LoRAModel`` freezes everything that is not
a LoRA parameter; ``LoRAConfig.merge_weights`` merges on ``eval()`` and unmerges on ``train()``, here
``merge_on_eval``). LoRA itself: Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models"
(arXiv 2106.09685); rsLoRA scaling ``alpha / sqrt(r)``: Kalajdzievski, arXiv 2312.03732.

Differences from PaddleNLP (on purpose):

- ``lora_alpha`` is honoured when given (PaddleNLP's SFT has no such key); ``None`` or a value ``<= 0`` keeps
  PaddleNLP's ``2 * r`` (``4`` with ``rslora``).
- Adapters are written in the PEFT format (``adapter_config.json`` + ``adapter_model.safetensors``, keys
  ``base_model.model.<module>.lora_A.weight``), not ``lora_model_state.pdparams`` + ``lora_config.json``, so
  ``peft.PeftModel.from_pretrained`` loads them onto a Hugging Face model with the same module names.
- Merging folds ``W + scaling * B @ A`` in fp32 and rounds once to the base weight's dtype.

The model never checks a LoRA flag: :func:`apply_lora` swaps matching ``nn.Linear`` modules for
:class:`LoRALinear` in place (the base ``weight``/``bias`` parameters are reused, so base state-dict names do not
change).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
from dataclasses import dataclass, field
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_TARGET_MODULES",
    "LoRAConfig",
    "LoRALinear",
    "apply_lora",
    "lora_state_dict",
    "save_lora",
    "load_lora",
    "merge_lora",
    "disable_lora",
    "mark_only_lora_as_trainable",
    "lora_param_groups",
    "cast_frozen_base",
]

# PaddleNLP ``get_lora_target_modules`` for Llama (all linear layers), plus ERNIE-3.5-SE's fused projection
# (``finetune_generation.py`` targets q, k, v, gate, up, o, down and qkv_gate_up). Regexes, full-matched against
# module names; the LM head and embeddings never match.
DEFAULT_TARGET_MODULES = (
    ".*q_proj.*",
    ".*v_proj.*",
    ".*k_proj.*",
    ".*o_proj.*",
    ".*qkv_proj.*",
    ".*gate_proj.*",
    ".*down_proj.*",
    ".*up_proj.*",
    ".*gate_up_fused_proj.*",
    ".*qkv_gate_up_proj.*",
)

ADAPTER_CONFIG_NAME = "adapter_config.json"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."


@dataclass
class LoRAConfig:
    """LoRA hyper-parameters (PaddleNLP ``LoRAConfig`` names where they exist).

    Attributes:
        r: rank (``lora_rank``), > 0.
        lora_alpha: scaling numerator; ``None`` or ``<= 0`` means PaddleNLP's default ``2 * r`` (``4`` if ``rslora``).
        rslora: scaling ``lora_alpha / sqrt(r)`` instead of ``lora_alpha / r``.
        lora_dropout: dropout on the adapter input (PaddleNLP's SFT leaves it at 0.0).
        target_modules: regexes full-matched against module names or their last part (``q_proj`` or
            ``.*self_attn.q_proj``); only ``nn.Linear`` modules are wrapped.
        merge_on_eval: merge the adapter into the base weight on ``eval()`` and unmerge (exactly) on ``train()``:
            PaddleNLP ``LoRAConfig.merge_weights``. The launcher key ``merge_weights`` means something else here
            (merge once when saving, see :func:`merge_lora`) and is not read by :meth:`from_args`.
        adapter_dtype: dtype of ``lora_A``/``lora_B`` (fp32 by default: the optimizer state then needs no master
            copy while the frozen base stays bf16).
    """

    r: int = 8
    lora_alpha: float | None = None
    rslora: bool = False
    lora_dropout: float = 0.0
    target_modules: tuple[str, ...] | list[str] = field(default_factory=lambda: list(DEFAULT_TARGET_MODULES))
    merge_on_eval: bool = False
    adapter_dtype: torch.dtype = torch.float32

    def __post_init__(self):
        if not isinstance(self.r, int) or self.r <= 0:
            raise ValueError(f"lora_rank must be a positive integer, got {self.r!r}")
        if self.lora_alpha is None or self.lora_alpha <= 0:
            self.lora_alpha = 4.0 if self.rslora else 2.0 * self.r  # PaddleNLP create_peft_model
        if isinstance(self.target_modules, str):
            self.target_modules = [s.strip() for s in self.target_modules.split(",") if s.strip()]
        if not self.target_modules:
            raise ValueError("lora target_modules (lora_target_modules) is empty: give at least one module name or "
                             "regex, e.g. q_proj,v_proj, or leave the key unset (null) for the default: every "
                             "attention and MLP projection")
        for pat in self.target_modules:
            try:
                re.compile(pat)
            except re.error as e:
                raise ValueError(f"lora target_modules: {pat!r} is not a valid regex ({e})") from None

    @property
    def scaling(self) -> float:
        """Multiplier of ``B @ A``: ``alpha / sqrt(r)`` with rslora, else ``alpha / r``."""
        return self.lora_alpha / (math.sqrt(self.r) if self.rslora else self.r)

    @classmethod
    def from_args(cls, args) -> "LoRAConfig":
        """Build from a ``LoRAConfig``, a dict, or a launcher ``ModelArgument``.

        Reads ``lora_rank``, ``lora_alpha``, ``rslora``, ``lora_dropout``, ``lora_target_modules`` (str of
        comma-separated regexes or list; None = default, an empty list or string is an error); missing attributes
        take defaults.

        Raises:
            ValueError: as :class:`LoRAConfig` (empty or invalid ``target_modules``, bad rank).
        """
        if isinstance(args, cls):
            return args
        get = args.get if isinstance(args, dict) else (lambda k, d=None: getattr(args, k, d))
        targets = get("lora_target_modules", None)
        targets = get("target_modules", None) if targets is None else targets
        # None = the default set; an explicit empty list ([] / "") is LoRAConfig's "empty" error, not the default
        targets = list(DEFAULT_TARGET_MODULES) if targets is None else targets
        return cls(
            r=int(get("lora_rank", None) or get("r", None) or 8),
            lora_alpha=get("lora_alpha", None),
            rslora=bool(get("rslora", False)),
            lora_dropout=float(get("lora_dropout", 0.0) or 0.0),
            target_modules=targets,
        )


class LoRALinear(nn.Linear):
    """``nn.Linear`` plus a low-rank update: ``y = x W^T + b + scaling * dropout(x) A^T B^T``.

    Shapes: ``weight [out, in]`` (frozen, any float dtype, bf16 in training), ``lora_A.weight [r, in]``,
    ``lora_B.weight [out, r]`` (trainable, ``adapter_dtype``). Input ``[..., in]`` in the base dtype; output
    ``[..., out]`` in the base dtype; the adapter branch runs in ``adapter_dtype`` and is cast back.

    Init (PaddleNLP/PEFT): ``lora_A`` Kaiming-uniform(a=sqrt(5)), ``lora_B`` zeros, so a fresh adapter is a no-op.
    Source: PaddleNLP ``paddlenlp/peft/lora/lora_layers.py`` ``LoRALinear``.
    """

    def __init__(self, base: nn.Linear, config: LoRAConfig):
        # Build without allocating, then adopt the base parameters (no copy; state-dict names unchanged).
        super().__init__(base.in_features, base.out_features, bias=base.bias is not None, device="meta")
        self.weight = base.weight
        self.bias = base.bias
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        self.r = config.r
        self.lora_alpha = float(config.lora_alpha)
        self.scaling = config.scaling
        self.merge_on_eval = config.merge_on_eval
        self.lora_dropout = nn.Dropout(config.lora_dropout) if config.lora_dropout > 0 else nn.Identity()
        dev = base.weight.device
        self.lora_A = nn.Linear(self.in_features, self.r, bias=False, device=dev, dtype=config.adapter_dtype)
        self.lora_B = nn.Linear(self.r, self.out_features, bias=False, device=dev, dtype=config.adapter_dtype)
        self.reset_lora_parameters()
        self.merged = False
        self.disabled = False
        self.shares_weight = False  # set by apply_lora when the weight is also the (tied) input embedding
        self._unmerged_weight: torch.Tensor | None = None

    def reset_lora_parameters(self) -> None:
        """A: Kaiming-uniform(a=sqrt(5)); B: zeros (PEFT and PaddleNLP default)."""
        if self.lora_A.weight.is_meta:
            return
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)

    def delta_weight(self) -> torch.Tensor:
        """``scaling * B @ A`` in fp32, shape ``[out, in]``."""
        return (self.lora_B.weight.float() @ self.lora_A.weight.float()) * self.scaling

    def merged_weight(self) -> torch.Tensor:
        """``W + scaling * B @ A`` computed in fp32 and rounded once to ``weight.dtype``."""
        return (self.weight.float() + self.delta_weight()).to(self.weight.dtype)

    @torch.no_grad()
    def merge(self) -> None:
        """Fold the adapter into ``weight`` (the unmerged tensor is kept so :meth:`unmerge` is exact). A weight shared
        with the input embedding (tied ``lm_head``) is left unmerged: folding it in place would change the embedding
        too; the forward then adds the adapter path, which gives the same output."""
        if self.merged or self.shares_weight:
            return
        self._unmerged_weight = self.weight.data
        self.weight.data = self.merged_weight()
        self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """Restore the exact pre-merge base weight."""
        if not self.merged:
            return
        self.weight.data = self._unmerged_weight
        self._unmerged_weight = None
        self.merged = False

    def train(self, mode: bool = True):
        """With ``merge_on_eval`` (PaddleNLP ``merge_weights``): merge on ``eval()``, unmerge on ``train()``."""
        super().train(mode)
        if self.merge_on_eval:
            self.unmerge() if mode else self.merge()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight, self.bias)
        if self.merged or self.disabled:
            return out
        a = self.lora_A.weight
        h = self.lora_B(self.lora_A(self.lora_dropout(x.to(a.dtype))))  # [..., r] -> [..., out]
        return out + (h * self.scaling).to(out.dtype)

    def to_linear(self) -> nn.Linear:
        """A plain ``nn.Linear`` holding the merged weight (fp32 fold, one rounding) and the base bias."""
        lin = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        w = self.weight.data if self.merged else self.merged_weight()
        lin.weight = nn.Parameter(w.detach(), requires_grad=False)
        if self.bias is not None:
            lin.bias = nn.Parameter(self.bias.detach(), requires_grad=False)
        return lin

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, r={self.r}, scaling={self.scaling:g}, merged={self.merged}"


def _lora_modules(model: nn.Module) -> Iterator[tuple[str, LoRALinear]]:
    for name, mod in model.named_modules():
        if isinstance(mod, LoRALinear):
            yield name, mod


def _set_submodule(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def mark_only_lora_as_trainable(model: nn.Module) -> None:
    """Freeze every parameter whose name does not contain ``lora_`` (PaddleNLP ``mark_only_lora_as_trainable``)."""
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)


def apply_lora(model: nn.Module, model_args_or_config=None) -> nn.Module:
    """Wrap the model's target ``nn.Linear`` layers with :class:`LoRALinear` and freeze everything else.

    Args:
        model: any module (our Llama/ERNIE or a Hugging Face model). Modified in place and returned.
        model_args_or_config: a launcher ``ModelArgument`` (keys ``lora_rank``, ``lora_alpha``, ``rslora``,
            ``lora_path``, ``lora_target_modules``), a dict with those keys, a
            :class:`LoRAConfig`, or None for the defaults. With ``lora_path`` set, the adapter there (PEFT format)
            is loaded instead, with its own ``r``/``lora_alpha``/targets (PaddleNLP ``LoRAModel.from_pretrained``).

    Returns:
        ``model``, with only LoRA parameters requiring gradients.

    Raises:
        ValueError: no module matches the target patterns (the message lists the linear layers present), or the
            model already holds LoRA layers.
    """
    lora_path = None
    if model_args_or_config is not None and not isinstance(model_args_or_config, LoRAConfig):
        get = (model_args_or_config.get if isinstance(model_args_or_config, dict)
               else lambda k, d=None: getattr(model_args_or_config, k, d))
        lora_path = get("lora_path", None)
    if lora_path:
        model = load_lora(model, lora_path)
        cfg = model.lora_config
        asked = {"lora_rank": get("lora_rank", None), "lora_alpha": get("lora_alpha", None)}
        own = {"lora_rank": cfg.r, "lora_alpha": cfg.lora_alpha}
        differ = [k for k in asked if asked[k] not in (None, -1) and float(asked[k]) != float(own[k])]
        if differ:
            logger.warning("lora_path %s: the adapter's own r=%d, lora_alpha=%g are used; %s ignored", lora_path,
                           cfg.r, cfg.lora_alpha, ", ".join(f"{k}={asked[k]:g}" for k in differ))
        return model
    cfg = LoRAConfig.from_args(model_args_or_config if model_args_or_config is not None else {})
    return _wrap(model, cfg)


def _embedding_weight_ids(model: nn.Module) -> set[int]:
    """``id`` of every ``nn.Embedding`` weight: a linear layer holding one of them is a tied ``lm_head``."""
    return {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}


def _wrap(model: nn.Module, cfg: LoRAConfig) -> nn.Module:
    if any(True for _ in _lora_modules(model)):
        raise ValueError("apply_lora: the model already has LoRA layers; load a second adapter into a fresh model")
    patterns = [re.compile(p) for p in cfg.target_modules]
    linears = [(n, m) for n, m in model.named_modules() if type(m) is nn.Linear]
    # a pattern full-matches the dotted name or its last part, so "q_proj" works as in PEFT's target_modules lists
    targets = [(n, m) for n, m in linears
               if any(p.fullmatch(n) or p.fullmatch(n.rsplit(".", 1)[-1]) for p in patterns)]
    if not targets:
        names = sorted({n.rsplit(".", 1)[-1] for n, _ in linears})
        raise ValueError(f"apply_lora: no nn.Linear module matches target_modules={list(cfg.target_modules)}; "
                         f"linear layer names in this model: {names}")
    embeddings = _embedding_weight_ids(model)
    for name, lin in targets:
        lora = LoRALinear(lin, cfg)
        lora.shares_weight = id(lin.weight) in embeddings  # a tied lm_head: merge() must not fold in place
        _set_submodule(model, name, lora)
    mark_only_lora_as_trainable(model)
    model.lora_config = cfg  # read by save_lora
    return model


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Adapter tensors under our module names: ``{"<module>.lora_A.weight": [r, in], "<module>.lora_B.weight": [out, r]}``."""
    sd = {}
    for name, mod in _lora_modules(model):
        sd[f"{name}.lora_A.weight"] = mod.lora_A.weight.detach()
        sd[f"{name}.lora_B.weight"] = mod.lora_B.weight.detach()
    if not sd:
        raise ValueError("lora_state_dict: the model has no LoRA layers (call apply_lora first)")
    return sd


def _peft_config_dict(model: nn.Module, cfg: LoRAConfig, base_model_name_or_path: str | None) -> dict:
    # PEFT matches a list of target names as module-name suffixes: write the exact leaf names we wrapped.
    leaves = sorted({name.rsplit(".", 1)[-1] for name, _ in _lora_modules(model)})
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": cfg.r,
        "lora_alpha": cfg.lora_alpha,
        "use_rslora": cfg.rslora,
        "lora_dropout": cfg.lora_dropout,
        "target_modules": leaves,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "use_dora": False,
    }


def save_lora(model: nn.Module, output_dir: str, base_model_name_or_path: str | None = None,
              state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """Write the adapter in the PEFT format: ``adapter_config.json`` + ``adapter_model.safetensors``.

    Keys are ``base_model.model.<module>.lora_{A,B}.weight`` (PEFT's names for adapter "default"); tensors keep the
    adapter dtype (fp32 by default). ``base_model_name_or_path`` defaults to ``model.config._name_or_path`` or
    ``model.config.name_or_path`` when present; an existing local directory is stored as its absolute path (hub
    ids and other paths as given), so ``llm/predict.py`` finds the base from any working directory. The
    directory is written atomically (a temporary sibling directory, then rename:
    ``paddlenlp_ext.transformers.model_utils.atomic_save_dir``, as ``save_pretrained``).
    ``state_dict`` (our module names) replaces the model's own adapter tensors, e.g. adapters gathered whole from
    FSDP/TP shards; keys other than ``lora_A``/``lora_B`` are dropped.

    Raises:
        ValueError: the model (or ``state_dict``) has no LoRA tensors.
    """
    from safetensors.torch import save_file

    if state_dict is None:
        sd = lora_state_dict(model)
    else:
        sd = {k: v for k, v in state_dict.items() if ".lora_A." in k or ".lora_B." in k}
        if not sd:
            raise ValueError("save_lora: state_dict holds no lora_A/lora_B tensors (call apply_lora first)")
    cfg = getattr(model, "lora_config", None) or _infer_config(model)
    from paddlenlp_ext.transformers.model_utils import atomic_save_dir

    if base_model_name_or_path is None:
        mcfg = getattr(model, "config", None)
        base_model_name_or_path = getattr(mcfg, "_name_or_path", None) or getattr(mcfg, "name_or_path", None)
    tensors = {_PEFT_PREFIX + k: v.contiguous().cpu() for k, v in sd.items()}
    conf = _peft_config_dict(model, cfg, _absolute_if_local_dir(base_model_name_or_path))
    # Written into a temporary sibling directory, then renamed into place (files 0644): a kill mid-save never
    # leaves a truncated adapter under its final name (same writer as ``save_pretrained``).
    with atomic_save_dir(output_dir) as tmp:
        save_file(tensors, os.path.join(tmp, ADAPTER_WEIGHTS_NAME), metadata={"format": "pt"})
        with open(os.path.join(tmp, ADAPTER_CONFIG_NAME), "w") as f:
            json.dump(conf, f, indent=2, sort_keys=True)


def _absolute_if_local_dir(path: str | None) -> str | None:
    """An existing local directory as its absolute path (so the adapter finds its base from any working
    directory); hub-style ids and paths that do not exist are kept as given."""
    if path and os.path.isdir(path):
        return os.path.abspath(path)
    return path


def _infer_config(model: nn.Module) -> LoRAConfig:
    _, mod = next(_lora_modules(model))
    return LoRAConfig(r=mod.r, lora_alpha=mod.lora_alpha, rslora=not math.isclose(mod.scaling, mod.lora_alpha / mod.r))


def _read_adapter_config(adapter_dir: str) -> dict:
    path = os.path.join(adapter_dir, ADAPTER_CONFIG_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"load_lora: {path} not found; a PEFT adapter directory holds {ADAPTER_CONFIG_NAME} "
                                f"and {ADAPTER_WEIGHTS_NAME}")
    with open(path) as f:
        conf = json.load(f)
    if conf.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{path}: peft_type is {conf.get('peft_type')!r}, only 'LORA' is supported")
    for key in ("use_dora", "rank_pattern", "alpha_pattern", "layers_to_transform", "modules_to_save"):
        if conf.get(key):
            raise ValueError(f"{path}: {key}={conf[key]!r} is not supported; only plain LoRA adapters load")
    if conf.get("bias", "none") != "none" or conf.get("lora_bias"):
        raise ValueError(f"{path}: adapters with trained biases are not supported (bias={conf.get('bias')!r})")
    return conf


def _targets_from_peft(target_modules) -> list[str]:
    """PEFT ``target_modules``: a regex string (full match) or a list of module-name suffixes."""
    if isinstance(target_modules, str):
        return [target_modules]
    return [rf"(.*\.)?{re.escape(t)}" for t in target_modules]


def load_lora(model: nn.Module, adapter_dir: str, merge_on_eval: bool = False) -> nn.Module:
    """Load a PEFT-format LoRA adapter (ours or one saved by ``peft``) into ``model``.

    If the model has no LoRA layers yet, they are created from ``adapter_config.json`` (``r``, ``lora_alpha``,
    ``use_rslora``, ``target_modules``). Accepts keys with or without the ``base_model.model.`` prefix and with
    PEFT's ``.default`` adapter name.

    Raises:
        FileNotFoundError: missing config or weights file.
        ValueError: unsupported adapter options; adapter keys that match no LoRA layer; LoRA layers the adapter
            does not cover; shape mismatches (the message names the key and both shapes).
    """
    from safetensors.torch import load_file

    conf = _read_adapter_config(adapter_dir)
    wpath = os.path.join(adapter_dir, ADAPTER_WEIGHTS_NAME)
    if not os.path.isfile(wpath):
        raise FileNotFoundError(f"load_lora: {wpath} not found")
    if not any(True for _ in _lora_modules(model)):
        cfg = LoRAConfig(r=int(conf["r"]), lora_alpha=float(conf["lora_alpha"]),
                         rslora=bool(conf.get("use_rslora", False)),
                         target_modules=_targets_from_peft(conf["target_modules"]), merge_on_eval=merge_on_eval)
        _wrap(model, cfg)
    raw = load_file(wpath)
    sd = {}
    for k, v in raw.items():
        k = k[len(_PEFT_PREFIX):] if k.startswith(_PEFT_PREFIX) else k
        k = k.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")
        sd[k] = v
    mods = dict(_lora_modules(model))
    expected = {f"{n}.lora_{ab}.weight" for n in mods for ab in "AB"}
    unknown = sorted(set(sd) - expected)
    missing = sorted(expected - set(sd))
    if unknown or missing:
        raise ValueError(f"load_lora({adapter_dir}): adapter keys do not match the model's LoRA layers; "
                         f"unknown {unknown[:5]}{'...' if len(unknown) > 5 else ''}, "
                         f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}")
    with torch.no_grad():
        for name, mod in mods.items():
            for ab, lin in (("A", mod.lora_A), ("B", mod.lora_B)):
                t = sd[f"{name}.lora_{ab}.weight"]
                if t.shape != lin.weight.shape:
                    raise ValueError(f"load_lora: {name}.lora_{ab}.weight has shape {list(t.shape)} in "
                                     f"{wpath}, the model expects {list(lin.weight.shape)}")
                lin.weight.copy_(t)
    return model


def merge_lora(model: nn.Module) -> nn.Module:
    """Replace every :class:`LoRALinear` by a plain ``nn.Linear`` with ``W + scaling * B @ A``.

    The fold is computed in fp32 and rounded once to the base dtype. Afterwards ``model.state_dict()`` has the
    base model's names and shapes (ready for ``save_pretrained``). Parameters are left frozen. In place; returns
    ``model``. An adapted ``lm_head`` tied to the input embedding is untied (``config.tie_word_embeddings`` set
    false), since the merged head no longer equals the embedding.
    """
    # an adapted lm_head whose weight is the (tied) input embedding: after the fold the two differ, so the model
    # must be saved untied, or save_pretrained drops lm_head.weight and a reload ties the unmerged embedding back
    embeddings = _embedding_weight_ids(model)
    untied = [name for name, mod in _lora_modules(model) if id(mod.weight) in embeddings]
    for name, mod in list(_lora_modules(model)):
        _set_submodule(model, name, mod.to_linear())
    if hasattr(model, "lora_config"):
        del model.lora_config
    cfg = getattr(model, "config", None)
    if untied and cfg is not None and getattr(cfg, "tie_word_embeddings", False):
        cfg.tie_word_embeddings = False
        if hasattr(cfg, "weight_share"):  # ERNIE-3.5-SE derives tie_word_embeddings from it
            cfg.weight_share = False
        logger.warning("merge_lora: %s was adapted and shared its weight with the input embedding; the merged model "
                       "is saved with tie_word_embeddings=false (a separate lm_head.weight)", ", ".join(untied))
    return model


@contextlib.contextmanager
def disable_lora(model: nn.Module):
    """Run the base model only (the DPO reference pass). Merged layers are unmerged exactly and re-merged after."""
    mods = [m for _, m in _lora_modules(model)]
    state = [(m, m.disabled, m.merged) for m in mods]
    try:
        for m in mods:
            if m.merged:
                m.unmerge()
            m.disabled = True
        yield model
    finally:
        for m, disabled, merged in state:
            m.disabled = disabled
            if merged:
                m.merge()


def lora_param_groups(model: nn.Module, learning_rate: float, lora_plus_scale: float = 1.0,
                      weight_decay: float = 0.0) -> list[dict]:
    """Optimizer parameter groups for the trainable LoRA parameters: ``lora_A`` at ``learning_rate``, ``lora_B`` at
    ``learning_rate * lora_plus_scale`` (LoRA+, Hayou et al., arXiv 2402.12354; PaddleNLP ``lora_plus_scale``).

    Raises:
        ValueError: the model has no trainable LoRA parameters.
    """
    a = [p for n, p in model.named_parameters() if p.requires_grad and ".lora_A." in n]
    b = [p for n, p in model.named_parameters() if p.requires_grad and ".lora_B." in n]
    if not a and not b:
        raise ValueError("lora_param_groups: no trainable LoRA parameters (call apply_lora first)")
    return [{"params": a, "lr": learning_rate, "weight_decay": weight_decay},
            {"params": b, "lr": learning_rate * lora_plus_scale, "weight_decay": weight_decay}]


@torch.no_grad()
def cast_frozen_base(model: nn.Module, dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """Cast every frozen floating parameter (and floating buffer) to ``dtype``; trainable ones keep theirs.

    Call after :func:`apply_lora` for bf16 LoRA training: the base is held in bf16 (2 bytes per weight, no fp32
    master copy, no gradient, no optimizer state) while the adapters stay fp32. In place; returns ``model``.
    """
    for p in model.parameters():
        if not p.requires_grad and p.is_floating_point():
            p.data = p.data.to(dtype)
    for mod in model.modules():
        for name, b in list(mod.named_buffers(recurse=False)):
            if b is not None and b.is_floating_point():
                setattr(mod, name, b.to(dtype))
    return model
