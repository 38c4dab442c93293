"""Argument dataclasses of ``run_dpo.py`` and ``run_reward.py`` with PaddleNLP's key names and defaults.

Sources (PaddleNLP ``develop`` 850c6c2, spec sections 1.4 and 1.5):
- DPO: ``llm/alignment/dpo/dpo_argument.py`` (``DPOTrainingArguments``, ``DPOConfig``, ``DPODataArgument``,
  ``DPOModelArgument``) and the coercions of ``llm/alignment/dpo/run_dpo.py`` (:func:`finalize_dpo_args`).
- RM: ``llm/alignment/rm/reward_argument.py`` (``TrainingArguments`` subclass, ``DataArgument``,
  ``ModelArgument``) and ``llm/alignment/rm/run_reward.py`` (:func:`finalize_rm_args`).

Keys marked ``inert`` parse (so PaddleNLP configs load verbatim) and are listed in one warning when set.
Ours (not in PaddleNLP): ``chat_template``, ``precompute_reference_logps``, ``logprob_chunk_size``,
``lora_target_modules``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import List, Optional

from paddlenlp_ext.trainer.argparser import PdArgumentParser, inert
from paddlenlp_ext.trainer.arguments import (TrainingArguments, apply_benchmark_overrides, model_implementation_field,
                                             trust_remote_code_field)
from paddlenlp_ext.trl.dpo_criterion import LOSS_TYPES, NO_REFERENCE_LOSS_TYPES, REFERENCE_FREE_LOSS_TYPES

logger = logging.getLogger(__name__)


def _help(text: str) -> dict:
    return {"help": text}


_CHAT_TEMPLATE_HELP = ("None = use the tokenizer's chat template if it has one (PaddleNLP's run_dpo always clears "
                       "it); 'none' = PaddleNLP's raw encoding (BOS per user turn, eos after each answer); a file "
                       "path = a Jinja template to use.")


# ----------------------------------------------------------------------------------------------------------- DPO
@dataclass
class DPOTrainingArguments(TrainingArguments):
    """``DPOTrainingArguments`` (``@llmmetaclass``): TrainingArguments with DPO defaults."""

    unified_checkpoint: bool = field(default=True, metadata=inert(
        "checkpoints are always HF-style safetensors of the full model", help="PaddleNLP unified checkpoints."))
    use_intermediate_api: bool = field(default=False, metadata=inert("no intermediate API", help="."))
    num_hidden_layers: int = field(default=2, metadata=inert("intermediate API only", help="."))


@dataclass
class DPOConfig:
    """``DPOConfig``: loss type and its hyper-parameters (spec 3.3)."""

    beta: float = field(default=0.1, metadata=_help("DPO temperature beta (IPO: tau)."))
    simpo_gamma: float = field(default=0.5, metadata=_help("SimPO target margin gamma."))
    label_smoothing: float = field(default=0.0, metadata=_help("Conservative-DPO label smoothing (sigmoid, simpo)."))
    loss_type: str = field(default="sigmoid", metadata=_help(
        "sigmoid | hinge | ipo | simpo | dpop | kto_pair | sppo_hard | nca_pair | or | orpo (= or + "
        "reference_free + sft_loss_ratio 1)."))
    pref_loss_ratio: float = field(default=1.0, metadata=_help("Weight of the preference loss (ORPO's lambda)."))
    sft_loss_ratio: float = field(default=0.0, metadata=_help("Weight of the chosen-response NLL (token mean)."))
    dpop_lambda: float = field(default=50, metadata=_help("DPOP penalty weight lambda."))
    ref_model_update_steps: int = field(default=-1, metadata=_help(
        "Copy the policy into the reference model every N optimizer steps; -1 = never."))
    reference_free: bool = field(default=False, metadata=_help("No reference model (reference log-probs = 0)."))
    lora: bool = field(default=False, metadata=_help(
        "Train LoRA adapters; the reference is the policy with adapters disabled (no second model)."))
    precompute_reference_logps: bool = field(default=False, metadata=_help(
        "Ours: compute reference log-probs once over the train/dev packs with the initial policy before "
        "training and reuse them (no second model in memory). Needs lazy=false."))
    logprob_chunk_size: int = field(default=1024, metadata=_help(
        "Ours: response tokens per LM-head chunk in the fp32 log-softmax (memory ~ chunk * vocab * 8 bytes)."))

    def __post_init__(self):
        errors = []
        if self.loss_type not in LOSS_TYPES + ("orpo",):
            errors.append(f"loss_type must be one of {LOSS_TYPES + ('orpo',)}, got {self.loss_type!r}")
        if self.beta <= 0:
            errors.append(f"beta must be > 0, got {self.beta}")
        if not 0 <= self.label_smoothing < 0.5:
            errors.append(f"label_smoothing must be in [0, 0.5), got {self.label_smoothing}")
        if self.logprob_chunk_size < 1:
            errors.append(f"logprob_chunk_size must be >= 1, got {self.logprob_chunk_size}")
        if self.sft_loss_ratio < 0:
            errors.append(f"sft_loss_ratio must be >= 0 (the weight of the chosen-response NLL), got {self.sft_loss_ratio}")
        if errors:
            raise ValueError("DPOConfig: " + "; ".join(errors))


@dataclass
class DPODataArgument:
    """``DPODataArgument``. DPO always packs (ZeroPadding with capacity ``max_seq_len``)."""

    train_dataset_path: str = field(default="./data/train.jsonl", metadata=_help("Preference jsonl for training."))
    dev_dataset_path: str = field(default="./data/dev.jsonl", metadata=_help("Preference jsonl for evaluation."))
    max_seq_len: int = field(default=4096, metadata=_help("Max tokens of one example (prompt + both answers) "
                                                          "and of a pack."))
    max_prompt_len: int = field(default=2048, metadata=_help("Prompt tokens kept (from the end) when too long."))
    greedy_zero_padding: bool = field(default=False, metadata=_help("Worst-fit packing (train set only)."))
    lazy: bool = field(default=False, metadata=_help("Stream and pack on the fly; needs max_steps."))
    chat_template: Optional[str] = field(default=None, metadata=_help(_CHAT_TEMPLATE_HELP))

    def __post_init__(self):
        if not 0 < self.max_prompt_len <= self.max_seq_len - 2:
            raise ValueError(f"DPODataArgument: need 0 < max_prompt_len ({self.max_prompt_len}) <= max_seq_len - 2 "
                             f"({self.max_seq_len - 2}) so both answers keep a token")


@dataclass
class DPOModelArgument:
    """``DPOModelArgument`` (plus ``use_flash_attention``, a PaddleNLP LlmMeta training key in dpo.json)."""

    model_name_or_path: Optional[str] = field(default=None, metadata=_help(
        "HF-format model directory, or the embedded 'HuggingFaceTB/SmolLM2-135M-Instruct'."))
    tokenizer_name_or_path: Optional[str] = field(default=None, metadata=_help("Tokenizer dir; None = the model's."))
    model_implementation: str = model_implementation_field()
    trust_remote_code: bool = trust_remote_code_field()
    flash_mask: bool = field(default=False, metadata=_help(
        "Kept for compatibility: the share-question mask is always given as attn_mask_startend_row_indices."))
    use_flash_attention: bool = field(default=False, metadata=_help(
        "Kept for compatibility: attention always runs through flashmask_attention."))
    weight_quantize_algo: Optional[str] = field(default=None, metadata=inert("no quantized training", help="."))
    fuse_attention_qkv: Optional[bool] = field(default=None, metadata=inert("q/k/v stay separate", help="."))
    fuse_attention_ffn: Optional[bool] = field(default=None, metadata=inert("gate/up stay separate", help="."))
    lora_rank: int = field(default=8, metadata=_help("LoRA rank r."))
    lora_path: Optional[str] = field(default=None, metadata=_help("Initial LoRA adapter dir (PEFT format)."))
    rslora: bool = field(default=False, metadata=_help("Rank-stabilised scaling alpha/sqrt(r)."))
    lora_plus_scale: float = field(default=1.0, metadata=_help("LoRA+ learning-rate ratio of B over A."))
    lora_alpha: float = field(default=-1, metadata=_help(
        "LoRA alpha; -1 = 2*lora_rank (4 with rslora). Honoured (PaddleNLP computes it and then ignores it)."))
    rslora_plus: bool = field(default=False, metadata=_help("rslora=True, lora_plus_scale=4, lora_alpha=4."))
    use_quick_lora: bool = field(default=True, metadata=inert("no fused quick-LoRA kernel", help="."))
    lora_target_modules: Optional[List[str]] = field(default=None, metadata=_help(
        "Ours: regexes of nn.Linear names to adapt, full-matched against the dotted name or its last part "
        "(q_proj,v_proj or .*self_attn.q_proj); None = all linear layers of attention and MLP."))


def finalize_dpo_args(model_args: DPOModelArgument, data_args: DPODataArgument,
                      training_args: DPOTrainingArguments, dpo_config: DPOConfig) -> List[str]:
    """``run_dpo.py``'s coercions, in place; returns the warnings logged.

    1. ``loss_type == "orpo"``: ``loss_type="or"``, ``reference_free=True``, ``sft_loss_ratio=1.0``.
    2. ``or``/``simpo`` without ``reference_free``: forced on, with a warning.
    3. ``reference_free`` with a loss type that needs a reference: ValueError (PaddleNLP's DPOTrainer raises).
    4. ``rslora_plus``: ``rslora=True``, ``lora_plus_scale=4``, ``lora_alpha=4``; ``lora_alpha=-1`` becomes
       ``4`` (rslora) or ``2*lora_rank``.
    5. ``max_steps > 0``: ``num_train_epochs = 1`` (PaddleNLP rule). ``lazy`` without ``max_steps``: ValueError.
    6. ``precompute_reference_logps`` with ``lazy``, ``reference_free`` or ``ref_model_update_steps > 0``:
       ValueError (the reference would change or cannot be stored).
    7. benchmark / autotuner_benchmark coercions.
    8. ``ref_model_update_steps > 0`` with ``lora`` or ``reference_free`` (no reference model to update): warned.
    9. ``flash_mask`` sets ``use_flash_attention`` (PaddleNLP rule); ``flash_mask`` false is warned (the mask still
       goes through flashmask_attention).
    10. ``lora`` with ``lora_path`` (not reference-free): warned that the reference is the base without that
        adapter.
    """
    msgs: List[str] = []

    def warn(msg: str) -> None:
        logger.warning(msg)
        msgs.append(msg)

    c = dpo_config
    if c.loss_type == "orpo":
        c.loss_type, c.reference_free, c.sft_loss_ratio = "or", True, 1.0
        warn("loss_type 'orpo' -> loss_type='or', reference_free=True, sft_loss_ratio=1.0")
    if c.loss_type in NO_REFERENCE_LOSS_TYPES and not c.reference_free:
        c.reference_free = True
        warn(f"loss_type {c.loss_type!r} uses no reference model: setting reference_free=True")
    if c.reference_free and c.loss_type not in REFERENCE_FREE_LOSS_TYPES:
        raise ValueError(f"reference_free=True is not supported with loss_type {c.loss_type!r}; use one of "
                         f"{sorted(REFERENCE_FREE_LOSS_TYPES)} or set reference_free false")
    m = model_args
    if m.rslora_plus:
        m.rslora, m.lora_plus_scale, m.lora_alpha = True, 4.0, 4.0
    if m.lora_alpha == -1:
        m.lora_alpha = 4.0 if m.rslora else 2.0 * m.lora_rank
    if training_args.max_steps > 0:
        training_args.num_train_epochs = 1
    if data_args.lazy and training_args.max_steps <= 0:
        raise ValueError("lazy=true streams the data (no length), so max_steps must be > 0; set --max_steps N")
    if c.precompute_reference_logps:
        if data_args.lazy:
            raise ValueError("precompute_reference_logps needs lazy=false (the packs must be stored)")
        if c.reference_free or c.ref_model_update_steps > 0:
            raise ValueError("precompute_reference_logps cannot be combined with reference_free or "
                             "ref_model_update_steps > 0")
    if c.ref_model_update_steps > 0 and (c.lora or c.reference_free):
        # no reference model to update: PaddleNLP ignores the key silently in both cases
        warn(f"ref_model_update_steps={c.ref_model_update_steps} has no effect with "
             f"{'lora=true (the reference is the policy with its adapters disabled)' if c.lora else 'reference_free'}"
             "; remove it, or train without that setting to update a reference model")
    if c.lora and m.lora_path and not c.reference_free:
        # the usual pipeline (SFT LoRA, then DPO LoRA from that adapter) gets the base model as reference, silently
        warn(f"lora_path={m.lora_path} with lora=true: the reference model is the policy with its adapters disabled, "
             "the loaded one included, i.e. the base model without that adapter (PaddleNLP does the same), so "
             "training starts away from the reference (rewards not 0 at step 0). For the adapter's model as the "
             "reference, merge it first (llm/merge_lora_params.py) and set model_name_or_path to the merged model")
    if m.flash_mask:
        # PaddleNLP's run_dpo.py: flash_mask without use_flash_attention sets it (FlashMask needs it); nothing to say
        m.use_flash_attention = True
    else:
        warn("flash_mask false: ignored, the share-question mask always goes through flashmask_attention "
             "(PaddleNLP would use a dense mask)")
    if m.tokenizer_name_or_path is None:
        m.tokenizer_name_or_path = m.model_name_or_path
    msgs += apply_benchmark_overrides(training_args)
    return msgs


def parse_dpo_args(argv=None):
    """Parse ``run_dpo.py cfg.json [--k v ...]``; returns ``(model_args, data_args, training_args, dpo_config)``."""
    parser = PdArgumentParser((DPOModelArgument, DPODataArgument, DPOTrainingArguments, DPOConfig))
    model_args, data_args, training_args, dpo_config = parser.parse(argv)
    finalize_dpo_args(model_args, data_args, training_args, dpo_config)
    return model_args, data_args, training_args, dpo_config


# ------------------------------------------------------------------------------------------------------------ RM
@dataclass
class RMTrainingArguments(TrainingArguments):
    """``llm/alignment/rm/reward_argument.py`` ``TrainingArguments`` (no ``@llmmetaclass``)."""

    unified_checkpoint: bool = field(default=True, metadata=inert(
        "checkpoints are always HF-style safetensors of the full model", help="PaddleNLP unified checkpoints."))
    process_reward: bool = field(default=False, metadata=_help("Process reward model (PRM): not implemented."))

    def __post_init__(self):
        super().__post_init__()
        if self.process_reward:
            raise ValueError("process_reward=True (PRM) is not implemented; only the outcome reward model is")


@dataclass
class RMDataArgument:
    """``DataArgument`` of the RM launcher."""

    train_dataset_path: str = field(default="./data/train.jsonl", metadata=_help("Preference jsonl for training."))
    dev_dataset_path: str = field(default="./data/dev.jsonl", metadata=_help("Preference jsonl for evaluation."))
    max_seq_len: int = field(default=4096, metadata=_help("Max tokens of one example and of a pack."))
    max_prompt_len: int = field(default=2048, metadata=_help("Prompt tokens kept (from the end) when too long."))
    autotuner_benchmark: bool = field(default=False, metadata=_help("Autotuner benchmark (see TrainingArguments)."))
    benchmark: bool = field(default=False, metadata=_help("Benchmark mode (see TrainingArguments)."))
    zero_padding: bool = field(default=True, metadata=_help(
        "Pack examples. false is accepted but packs anyway (PaddleNLP's unpacked ORM path is broken, spec 1.5)."))
    greedy_zero_padding: bool = field(default=False, metadata=_help("Worst-fit packing (train set only)."))
    lazy: bool = field(default=False, metadata=_help("Stream and pack on the fly; needs max_steps."))
    chat_template: Optional[str] = field(default=None, metadata=_help(_CHAT_TEMPLATE_HELP))

    def __post_init__(self):
        if not 0 < self.max_prompt_len <= self.max_seq_len - 2:
            raise ValueError(f"RMDataArgument: need 0 < max_prompt_len ({self.max_prompt_len}) <= max_seq_len - 2 "
                             f"({self.max_seq_len - 2})")


@dataclass
class RMModelArgument:
    """``ModelArgument`` of the RM launcher."""

    model_name_or_path: Optional[str] = field(default=None, metadata=_help(
        "HF-format causal-LM (or reward-model) directory, or the embedded SmolLM2."))
    tokenizer_name_or_path: Optional[str] = field(default=None, metadata=_help("Tokenizer dir; None = the model's."))
    model_implementation: str = model_implementation_field()
    trust_remote_code: bool = trust_remote_code_field()
    use_flash_attention: bool = field(default=False, metadata=_help(
        "Kept for compatibility: attention always runs through flashmask_attention."))
    recompute_granularity: str = field(default="full", metadata=inert(
        "recompute always checkpoints whole decoder layers", help="full | core_attn | full_attn."))
    flash_mask: bool = field(default=False, metadata=_help("Kept for compatibility (the mask is always given)."))
    virtual_pp_degree: int = field(default=1, metadata=inert("pipeline parallelism is not implemented", help="."))
    placeholder_token: str = field(default="ки", metadata=inert("PRM is not implemented", help="."))
    reward_tokens: str = field(default="+,-", metadata=inert("PRM is not implemented", help="."))


def finalize_rm_args(model_args: RMModelArgument, data_args: RMDataArgument,
                     training_args: RMTrainingArguments) -> List[str]:
    """``run_reward.py``'s rules in place; returns the warnings logged (PP > 1 is a ValueError there and here)."""
    msgs: List[str] = []
    if training_args.pipeline_parallel_degree > 1:
        raise ValueError("RM does not support pipeline parallelism yet (pipeline_parallel_degree must be <= 1)")
    # PaddleNLP keeps benchmark flags in the RM DataArgument; the parser sets both copies.
    training_args.benchmark = training_args.benchmark or data_args.benchmark
    training_args.autotuner_benchmark = training_args.autotuner_benchmark or data_args.autotuner_benchmark
    if training_args.max_steps > 0:
        training_args.num_train_epochs = 1
    if data_args.lazy and training_args.max_steps <= 0:
        raise ValueError("lazy=true streams the data (no length), so max_steps must be > 0; set --max_steps N")
    if not data_args.zero_padding:
        msg = "zero_padding=false: packing anyway (the share-question layout is only defined on packs)"
        logger.warning(msg)
        msgs.append(msg)
    if model_args.tokenizer_name_or_path is None:
        model_args.tokenizer_name_or_path = model_args.model_name_or_path
    msgs += apply_benchmark_overrides(training_args)
    return msgs


def parse_rm_args(argv=None):
    """Parse ``run_reward.py cfg.json [--k v ...]``; returns ``(model_args, data_args, training_args)``."""
    parser = PdArgumentParser((RMModelArgument, RMDataArgument, RMTrainingArguments))
    model_args, data_args, training_args = parser.parse(argv)
    finalize_rm_args(model_args, data_args, training_args)
    return model_args, data_args, training_args
