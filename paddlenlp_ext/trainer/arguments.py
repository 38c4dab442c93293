"""Argument dataclasses with PaddleNLP's key names and defaults, and the SFT cross-field rules.

Sources (PaddleNLP ``develop`` 850c6c2):
- ``TrainingArguments``: ``paddlenlp/trainer/training_args.py`` plus the ``LlmMetaConfig`` fields that
  ``@llmmetaclass`` adds (``paddlenlp/transformers/configuration_utils.py``).
- ``SFTConfig``: ``paddlenlp/trl/sft_config.py``.  ``ModelArgument``: ``paddlenlp/trl/model_config.py``
  (``ModelConfig``).  ``DataArgument``: ``paddlenlp/trl/sftdata_config.py`` (``DataConfig``).
- ``GenerateArgument`` / ``ReftArgument``: ``llm/utils/argument.py`` (accepted, not acted on).
- ``finalize_sft_args``: the checks of ``llm/run_finetune.py`` (steps 1, 5, 15 of its validation).

Every field's ``metadata["help"]`` documents it. ``metadata["inert"]`` (see
:func:`paddlenlp_ext.trainer.argparser.inert`) marks keys that parse but are not acted on yet; the parser
warns once about all of them that a config sets. Remove the marker where a key gets implemented.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from .argparser import PdArgumentParser, inert
from .logging_utils import writer_kinds

logger = logging.getLogger(__name__)

_SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup", "polynomial")  # trainer/optimization.py
_STRATEGIES = ("no", "steps", "epoch")
_RECOMPUTE = ("full", "core_attn", "full_attn")
# parallel degrees: -1 (unset, derived from the world size) or >= 1; data_parallel_degree where a subclass has it
_DEGREES = ("tensor_parallel_degree", "sharding_parallel_degree", "data_parallel_degree", "pipeline_parallel_degree",
            "sep_parallel_degree", "context_parallel_degree")



def _file_ancestor(path: str) -> str | None:
    """The first existing ancestor of ``path`` when it is a file (so ``path`` cannot be created), else None."""
    parent = os.path.dirname(os.path.abspath(path))
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    return parent if parent and os.path.isfile(parent) else None


def _help(text: str) -> Dict[str, str]:
    return {"help": text}


def model_implementation_field():
    """The ``model_implementation`` key of every launcher's model arguments (ours)."""
    return field(default="auto", metadata=_help(
        "Ours: 'auto' (native Llama / ERNIE-3.5-SE models, transformers' implementation for every other model_type, "
        "attention through FlashMask), 'native' or 'transformers' (e.g. Llama through transformers, to compare)."))


def trust_remote_code_field():
    """The ``trust_remote_code`` key of every launcher's model arguments (transformers' name)."""
    return field(default=False, metadata=_help(
        "Run the Python code of a model directory whose model_type transformers does not know (auto_map)."))


class ArgumentsError(ValueError):
    """Every problem one argument dataclass's ``__post_init__`` found: ``owner`` (the class name) and
    ``problems`` (one message each); ``str()`` is ``"<owner>: <problem>; <problem>; ..."``."""

    def __init__(self, owner: str, problems: list[str]):
        super().__init__(f"{owner}: " + "; ".join(problems))
        self.owner, self.problems = owner, list(problems)


class _Errors(list):
    """Collects validation messages; ``raise_if_any`` raises them together as one :class:`ArgumentsError`."""

    def check(self, ok: bool, msg: str) -> None:
        if not ok:
            self.append(msg)

    def raise_if_any(self, owner: str) -> None:
        if self:
            raise ArgumentsError(owner, self)


@dataclass
class TrainingArguments:
    """Core trainer arguments; defaults are PaddleNLP's ``TrainingArguments`` (``output_dir`` is required).

    Raises:
        ValueError: from ``__post_init__``, listing every invalid value (scheduler, strategies, batch sizes,
            fp16 and bf16 together, fp16_opt_level O2 without a half dtype, sharding spelling, ...).
    """

    output_dir: str = field(metadata=_help("Where checkpoints, logs and the final model are written."))
    overwrite_output_dir: bool = field(default=False, metadata=_help(
        "Start over instead of resuming from output_dir's latest checkpoint-<step>: once the model and data have "
        "loaded, the old run's checkpoint-* directories, final weights and config, merged/ and runs/ move to "
        "output_dir/previous_run/, deleted once the new run has saved (tokenizer and other files stay)."))
    do_train: bool = field(default=False, metadata=_help("Run training."))
    do_eval: bool = field(default=False, metadata=_help("Run evaluation on the dev set."))
    do_predict: bool = field(default=False, metadata=inert("prediction is not implemented", help="Run prediction."))
    do_export: bool = field(default=False, metadata=inert("static-graph export has no PyTorch equivalent",
                                                          help="Export a static graph (Paddle only)."))

    # schedule of eval / save / log (counted in optimizer steps)
    evaluation_strategy: str = field(default="no", metadata=_help("When to evaluate: no | steps | epoch."))
    eval_steps: Optional[int] = field(default=None, metadata=_help("Evaluate every N steps; None = logging_steps."))
    save_strategy: str = field(default="steps", metadata=_help("When to save: no | steps | epoch."))
    save_steps: int = field(default=500, metadata=_help("Save a checkpoint every N optimizer steps."))
    save_total_limit: Optional[int] = field(default=None, metadata=_help(
        "Keep at most N >= 1 checkpoints (oldest go); null = keep all. 0 or negative also keeps all (Hugging Face's "
        "and PaddleNLP's rule, kept for their configs) but logs a warning: write null for that, or save_strategy "
        "'no' to save none."))
    logging_steps: int = field(default=500, metadata=_help("Log every N optimizer steps."))
    logging_dir: Optional[str] = field(default=None, metadata=_help("TensorBoard dir; None = <output_dir>/runs."))
    report_to: Optional[List[str]] = field(default=None, metadata=_help(
        "Loggers: a list of 'tensorboard' (extra [tensorboard]), 'visualdl' (extra [visualdl]; without it, TensorBoard "
        "events) or 'none'; [] or 'none' = no logger; "
        "unset (null) = visualdl, as in PaddleNLP. Command line: --report_to tensorboard, "
        "--report_to tensorboard,visualdl, --report_to '[\"tensorboard\"]' or --report_to []."))
    disable_tqdm: Optional[bool] = field(default=None, metadata=_help("Disable the progress bar."))

    # batching (per device, in packs when zero_padding is on)
    per_device_train_batch_size: int = field(default=8, metadata=_help("Train micro-batch size per device."))
    per_device_eval_batch_size: int = field(default=8, metadata=_help("Eval batch size per device."))
    gradient_accumulation_steps: int = field(default=1, metadata=_help("Micro-batches per optimizer step."))
    eval_accumulation_steps: Optional[int] = field(default=None, metadata=inert(
        "eval outputs are reduced on the fly; nothing is accumulated on the host",
        help="Eval steps to accumulate before moving outputs to the host."))

    # optimizer and learning-rate schedule
    learning_rate: float = field(default=5e-5, metadata=_help("Peak learning rate of AdamW."))
    weight_decay: float = field(default=0.0, metadata=_help("AdamW decoupled weight decay."))
    adam_beta1: float = field(default=0.9, metadata=_help("AdamW beta1."))
    adam_beta2: float = field(default=0.999, metadata=_help("AdamW beta2."))
    adam_epsilon: float = field(default=1e-8, metadata=_help("AdamW epsilon."))
    max_grad_norm: float = field(default=1.0, metadata=_help("Global gradient-norm clip; <= 0 disables it."))
    num_train_epochs: float = field(default=1.0, metadata=_help("Epochs, used when max_steps <= 0."))
    max_steps: int = field(default=-1, metadata=_help("Total optimizer steps; > 0 overrides num_train_epochs."))
    lr_scheduler_type: str = field(default="linear", metadata=_help(
        "linear | cosine | constant | constant_with_warmup | polynomial."))
    warmup_ratio: float = field(default=0.0, metadata=_help("Warmup as a fraction of total steps."))
    warmup_steps: int = field(default=0, metadata=_help("Warmup steps; > 0 overrides warmup_ratio."))
    num_cycles: float = field(default=0.5, metadata=_help("Cosine cycles (0.5 = one half-cosine decay)."))
    lr_end: float = field(default=1e-7, metadata=_help("End lr of the polynomial schedule."))
    power: float = field(default=1.0, metadata=_help("Power of the polynomial schedule."))
    min_lr: float = field(default=0.0, metadata=_help("Floor of the decayed learning rate."))
    optim: str = field(default="adamw", metadata=_help("Optimizer; only 'adamw' (torch.optim.AdamW)."))
    decay_steps: int = field(default=0, metadata=inert("the schedules decay over max_steps",
                                                       help="Decay steps of PaddleNLP's polynomial schedule."))

    # precision
    bf16: bool = field(default=False, metadata=_help(
        "Train in bfloat16 on CUDA (fp16_opt_level picks O1 autocast or O2 bf16 weights; CPU runs fp32)."))
    fp16: bool = field(default=False, metadata=_help("Train in float16 (computed in bf16 here: no loss scaling)."))
    fp16_opt_level: str = field(default="O1", metadata=_help(
        "Paddle AMP level with bf16/fp16 on CUDA: O1 = torch.autocast over fp32 parameters; O2 = bf16 compute "
        "weights with fp32 master weights and fp32 gradient accumulation (trainer/mixed_precision.py "
        "MasterWeights, autocast kept; under FSDP, bf16 is always FSDP2's MixedPrecisionPolicy)."))
    amp_master_grad: bool = field(default=False, metadata=inert(
        "gradients are always fp32 master gradients here (O1: fp32 parameters; O2: fp32 accumulation buffers; "
        "FSDP: fp32 reduce)", help="Keep fp32 master gradients (always the case here; no separate effect)."))

    # parallelism (degree -1 = derived from the world size)
    tensor_parallel_degree: int = field(default=-1, metadata=_help(
        "Tensor-parallel degree; -1/1 = off. 0 or < -1 is an error (PaddleNLP clamps it to 1)."))
    tensor_parallel_output: bool = field(default=True, metadata=_help(
        "Keep logits split over tensor-parallel ranks (vocab-parallel cross entropy)."))
    sequence_parallel: bool = field(default=False, metadata=_help("Shard activations along the sequence under TP."))
    sharding: str = field(default="", metadata=_help("'' | stage1 | stage2 | stage3 (optionally ' offload')."))
    sharding_parallel_degree: int = field(default=-1, metadata=_help(
        "Sharding degree; -1 = world / (tp*pp). 0 or < -1 is an error (PaddleNLP clamps it to 1)."))
    pipeline_parallel_degree: int = field(default=-1, metadata=inert("pipeline parallelism is not implemented",
                                                                     help="Pipeline-parallel degree."))
    virtual_pp_degree: int = field(default=1, metadata=inert("pipeline parallelism is not implemented",
                                                             help="Virtual pipeline stages."))
    pp_recompute_interval: int = field(default=1, metadata=inert("pipeline parallelism is not implemented",
                                                                 help="Recompute interval under PP."))
    sep_parallel_degree: int = field(default=-1, metadata=inert("segment parallelism is not implemented",
                                                                help="Segment-parallel degree."))
    context_parallel_degree: int = field(default=-1, metadata=inert("context parallelism is not implemented",
                                                                    help="Context-parallel degree."))
    pipeline_parallel_config: str = field(default="", metadata=inert("pipeline parallelism is not implemented",
                                                                     help="Paddle PP options."))
    sharding_parallel_config: str = field(default="", metadata=inert("Paddle sharding options have no FSDP2 meaning",
                                                                     help="Paddle sharding options."))
    tensor_parallel_config: str = field(default="", metadata=inert("Paddle TP options have no meaning here",
                                                                   help="Paddle TP options."))

    # recompute (activation checkpointing)
    recompute: bool = field(default=False, metadata=_help("Activation checkpointing of decoder layers."))
    recompute_granularity: str = field(default="full", metadata=inert(
        "recompute always checkpoints whole decoder layers", help="full | core_attn | full_attn."))
    recompute_use_reentrant: bool = field(default=False, metadata=inert(
        "non-reentrant checkpointing is always used", help="torch.utils.checkpoint use_reentrant."))
    no_recompute_layers: Optional[List[int]] = field(default=None, metadata=inert(
        "every layer is recomputed when recompute is on", help="Layer indices never recomputed."))
    refined_recompute: str = field(default="", metadata=inert("refined recompute is not implemented",
                                                              help="Paddle refined recompute spec."))
    offload_recompute_inputs: bool = field(default=False, metadata=inert("no CPU offload of recompute inputs",
                                                                         help="Offload recompute inputs."))

    # fused kernels that PaddleNLP switches per flag (LlmMeta). paddlenlp_ext.ops.set_llm_config copies the
    # use_fused_* keys onto the model config (PaddleNLP's LlmMetaConfig.set_llm_config); the model and sft_loss
    # read them there; llm/run_finetune.py calls it right after building the model.
    use_fused_rms_norm: bool = field(default=False, metadata=_help((
        "RMSNorm through one torch.compile'd kernel on CUDA (eager on CPU / DTensors); same HF-order math.")))
    use_fused_rope: bool = field(default=False, metadata=_help((
        "RoPE of q and k in one torch.compile'd region on CUDA (eager on CPU / DTensors).")))
    use_fused_swiglu: bool = field(default=False, metadata=_help((
        "silu(gate)*up as one torch.compile'd kernel on CUDA (ours: PaddleNLP always uses its fused swiglu op).")))
    to_static: bool = field(default=False, metadata=_help((
        "PaddleNLP's dynamic-to-static switch. Here: torch.compile of each decoder layer for training passes "
        "(paddlenlp_ext.distributed.apply_compile; evaluation and generation stay eager). The first steps "
        "compile (tens of seconds). H200, 1B model at 8K packs through the Trainer: 1.03-1.04x tokens/s, same peak "
        "memory (docs/benchmarks.md).")))
    use_fused_linear: bool = field(default=False, metadata=inert("the linears already run as single GEMMs",
                                                                 help="Fused linear."))
    use_fused_dropout_add: bool = field(default=False, metadata=inert("the models have no dropout",
                                                                      help="Fused dropout-add."))
    use_fused_linear_cross_entropy: bool = field(default=True, metadata=_help((
        "LM head + cross entropy chunked over tokens without full [tokens, vocab] logits (SFT loss; not under "
        "tensor parallelism). Default True (PaddleNLP: False): numerically the unfused formula, less memory; a "
        "model config without the key also uses True.")))

    # checkpoints and resume
    unified_checkpoint: bool = field(default=False, metadata=inert(
        "checkpoints are always HF-style safetensors of the full model",
        help="PaddleNLP unified (HF-style, TP-merged) checkpoints."))
    unified_checkpoint_config: str = field(default="", metadata=inert("see unified_checkpoint",
                                                                      help="Unified checkpoint options."))
    resume_from_checkpoint: Optional[Union[str, bool]] = field(default=None, metadata=_help(
        "Checkpoint dir to resume from, or true (JSON true or the string) for the latest checkpoint-<step> in "
        "output_dir, as PaddleNLP's Trainer.train; false = do not resume (start at step 0); null = the default "
        "(a rerun resumes the latest checkpoint)."))
    ignore_data_skip: bool = field(default=False, metadata=_help("On resume, do not skip already-seen data."))
    load_best_model_at_end: bool = field(default=False, metadata=_help(
        "Track the best evaluation (metric_for_best_model) and end with that checkpoint's weights: the final model "
        "or adapter is the best checkpoint's, which save_total_limit never deletes. Needs evaluation_strategy == "
        "save_strategy (and save_steps a multiple of eval_steps), as in Hugging Face and PaddleNLP."))
    metric_for_best_model: Optional[str] = field(default=None, metadata=_help(
        "Evaluation metric that picks the best checkpoint, with or without its eval_ prefix (loss, accuracy, "
        "perplexity, bleu4, rouge_l, exact_match, rewards/accuracies, ...); default loss with "
        "load_best_model_at_end."))
    greater_is_better: Optional[bool] = field(default=None, metadata=_help(
        "Whether a larger metric_for_best_model is better; unset = false for names ending in loss or perplexity "
        "(Hugging Face's rule, plus perplexity), else true."))

    # runtime
    seed: int = field(default=42, metadata=_help("Seed for init, dropout and data shuffling."))
    dataloader_num_workers: int = field(default=0, metadata=_help("DataLoader worker processes."))
    dataloader_shuffle: bool = field(default=True, metadata=_help("Shuffle map-style train packs each epoch."))
    dataloader_drop_last: bool = field(default=False, metadata=_help("Drop the last incomplete batch."))
    device: str = field(default="gpu", metadata=_help("'gpu' (= cuda when available) or 'cpu'."))
    run_name: Optional[str] = field(default=None, metadata=inert("the loggers do not show a run name",
                                                                 help="Name shown in the loggers."))

    # benchmark modes (PaddleNLP: SFTConfig / DPOTrainingArguments; RM puts them in its DataArgument)
    benchmark: bool = field(default=False, metadata=inert(
        "args are coerced (no eval/save) by apply_benchmark_overrides; the trainer does not skip the "
        "final save nor log Effective_Tokens_per_second",
        help="Benchmark mode: train only, no eval/save, report tokens/s."))
    autotuner_benchmark: bool = field(default=False, metadata=inert(
        "args are coerced (max_steps=5, no eval/save) by apply_benchmark_overrides; no random-init model",
        help="Autotuner benchmark: 5 steps on a randomly initialised model."))

    def __post_init__(self):
        e = _Errors()
        e.check(bool(self.output_dir), "output_dir must be a non-empty path")
        e.check(not self.output_dir or not os.path.exists(self.output_dir) or os.path.isdir(self.output_dir),
                f"output_dir={self.output_dir!r} is an existing file, not a directory; choose another path")
        blocker = _file_ancestor(self.output_dir) if self.output_dir else None
        e.check(blocker is None, f"output_dir={self.output_dir!r} cannot be created: {blocker!r} is a file; choose "
                                 "another path")
        e.check(self.lr_scheduler_type in _SCHEDULERS,
                f"lr_scheduler_type must be one of {_SCHEDULERS}, got {self.lr_scheduler_type!r}")
        for key in ("evaluation_strategy", "save_strategy"):
            value = getattr(self, key)
            e.check(value in _STRATEGIES, f"{key} must be one of {_STRATEGIES}, got {value!r}")
        for key in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
                    "logging_steps", "save_steps"):
            e.check(getattr(self, key) >= 1, f"{key} must be >= 1, got {getattr(self, key)}")
        e.check(0.0 <= self.warmup_ratio <= 1.0, f"warmup_ratio must be in [0, 1], got {self.warmup_ratio}")
        e.check(self.warmup_steps >= 0, f"warmup_steps must be >= 0, got {self.warmup_steps}")
        e.check(self.learning_rate >= 0, f"learning_rate must be >= 0, got {self.learning_rate}")
        e.check(self.lr_scheduler_type != "polynomial" or self.lr_end < self.learning_rate,
                f"lr_end ({self.lr_end}) must be smaller than learning_rate ({self.learning_rate}) for "
                "lr_scheduler_type polynomial (PaddleNLP's rule); lower lr_end")
        e.check(self.weight_decay >= 0, f"weight_decay must be >= 0 (AdamW's decoupled decay), got {self.weight_decay}")
        e.check(0 <= self.seed < 2**32, f"seed must be in [0, 2**32 - 1], got {self.seed}")  # numpy's range
        e.check(self.max_steps == -1 or self.max_steps > 0, f"max_steps must be -1 or > 0, got {self.max_steps}")
        e.check(self.max_steps > 0 or self.num_train_epochs > 0,
                f"num_train_epochs must be > 0 when max_steps <= 0, got {self.num_train_epochs}")
        e.check(not (self.bf16 and self.fp16), "bf16 and fp16 are both true; choose one")
        e.check(self.fp16_opt_level in ("O0", "O1", "O2"),
                f"fp16_opt_level must be O0|O1|O2, got {self.fp16_opt_level!r}")
        # run_finetune.py step 1: O2 means half-precision weights, which needs a half dtype
        e.check(not (self.fp16_opt_level == "O2" and not (self.bf16 or self.fp16)),
                "fp16_opt_level 'O2' needs bf16 or fp16 set to true (or use O1)")
        e.check(self.recompute_granularity in _RECOMPUTE,
                f"recompute_granularity must be one of {_RECOMPUTE}, got {self.recompute_granularity!r}")
        e.check(self.optim == "adamw", f"optim must be 'adamw' (the only optimizer), got {self.optim!r}")
        e.check(self.device in ("gpu", "cpu", "cuda"), f"device must be 'gpu' or 'cpu', got {self.device!r}")
        stage = self.sharding.replace("offload", "").split()
        e.check(all(s in ("stage1", "stage2", "stage3") for s in stage) and len(stage) <= 1,
                f"sharding must be '', 'stage1', 'stage2' or 'stage3' (optionally + ' offload'), got {self.sharding!r}")
        # PaddleNLP clamps every degree with max(degree, 1), so 0 or -5 silently means 1; refused here
        for key in _DEGREES:
            value = getattr(self, key, -1)
            e.check(value is None or value == -1 or value >= 1,
                    f"{key} must be -1 (unset, PaddleNLP's default) or >= 1 "
                    f"(1 = off), got {value}; set {key} to -1 or a positive degree")
        e.check(self.virtual_pp_degree >= 1, f"virtual_pp_degree must be >= 1 (1 = off), got {self.virtual_pp_degree}")
        if self.report_to is not None:
            bad = [r for r in self.report_to if r not in ("tensorboard", "none", "visualdl")]
            e.check(not bad, f"report_to supports 'tensorboard', 'visualdl' (VisualDL records, or TensorBoard events "
                             f"without VisualDL) or 'none', got {bad}; e.g. --report_to tensorboard, or --report_to [] "
                             "for no logger")
            if not bad and not (self.benchmark or self.autotuner_benchmark):  # those clear report_to
                try:
                    writer_kinds(self.report_to)
                except ValueError as err:
                    e.check(False, str(err))
        e.raise_if_any(type(self).__name__)
        # JSON true / false (PaddleNLP's Trainer takes the bools) as the strings the launchers already take: "true" =
        # the latest checkpoint, "false" = given but no resume (start from step 0, as PaddleNLP with False)
        if isinstance(self.resume_from_checkpoint, bool):
            self.resume_from_checkpoint = str(self.resume_from_checkpoint).lower()
        if self.save_total_limit is not None and self.save_total_limit <= 0 and self.save_strategy != "no":
            # Hugging Face / PaddleNLP: save_total_limit <= 0 keeps every checkpoint (their _rotate_checkpoints
            # returns early); kept so their configs run, but said aloud: 0 reads like "keep none" (unless
            # nothing is saved at all)
            logger.warning("save_total_limit=%d keeps ALL checkpoints (Hugging Face's rule for values <= 0); write "
                           "save_total_limit null to keep all, a value >= 1 to keep the newest N, or save_strategy "
                           "'no' to save none", self.save_total_limit)
        if self.eval_steps is None:
            self.eval_steps = self.logging_steps  # PaddleNLP: eval_steps falls back to logging_steps
        self._check_best_model_keys()

    def _check_best_model_keys(self) -> None:
        """Hugging Face's / PaddleNLP's ``load_best_model_at_end`` rules (their error texts), plus a warning when
        nothing is evaluated nor saved (PaddleNLP's FlashMask configs set it with both strategies "no": nothing
        to choose from, so the last step's model is the final one, as PaddleNLP does silently)."""
        from .best_model import lower_is_better

        if self.metric_for_best_model is None and self.load_best_model_at_end:
            self.metric_for_best_model = "loss"
        if self.greater_is_better is None and self.metric_for_best_model is not None:
            self.greater_is_better = not lower_is_better(self.metric_for_best_model)
        if not self.load_best_model_at_end:
            return
        if self.evaluation_strategy != self.save_strategy:
            raise ArgumentsError(type(self).__name__, [
                f"load_best_model_at_end requires the save and eval strategy to match, but found evaluation_strategy="
                f"{self.evaluation_strategy!r}, save_strategy={self.save_strategy!r}: set both to 'steps' (or "
                "'epoch'), or load_best_model_at_end false"])
        if self.evaluation_strategy == "steps" and self.save_steps % self.eval_steps != 0:
            raise ArgumentsError(type(self).__name__, [
                f"load_best_model_at_end requires the saving steps to be a round multiple of the evaluation steps, "
                f"but found save_steps={self.save_steps}, which is not a round multiple of eval_steps="
                f"{self.eval_steps}: every saved checkpoint must have been evaluated"])
        if self.evaluation_strategy == "no" and not (self.benchmark or self.autotuner_benchmark):
            logger.warning("load_best_model_at_end=true with evaluation_strategy and save_strategy 'no': nothing is "
                           "evaluated or saved to choose from, so the final model is the last step's; set both to "
                           "'steps' (with do_eval and a dev set) to keep the best checkpoint")

    @property
    def sharding_stage(self) -> int:
        """0 when ``sharding`` is empty, else 1, 2 or 3."""
        parts = self.sharding.replace("offload", "").split()
        return int(parts[0][-1]) if parts else 0

    @property
    def sharding_offload(self) -> bool:
        """True when ``sharding`` contains 'offload'."""
        return "offload" in self.sharding


@dataclass
class SFTConfig(TrainingArguments):
    """Training arguments of ``run_finetune`` (PaddleNLP ``SFTConfig``): SFT defaults over TrainingArguments."""

    learning_rate: float = field(default=2e-5, metadata=_help("Peak learning rate (SFT default 2e-5)."))
    tensor_parallel_output: bool = field(default=False, metadata=_help(
        "Keep logits split over TP ranks (SFTConfig default False)."))
    unified_checkpoint: bool = field(default=False, metadata=inert(
        "checkpoints are always HF-style safetensors of the full model", help="PaddleNLP unified checkpoints."))
    dataset_text_field: str = field(default="text", metadata=inert("TRL-style field, unused by run_finetune",
                                                                   help="Text column of a TRL dataset."))
    max_seq_length: int = field(default=2048, metadata=inert("unused by run_finetune; use max_length",
                                                             help="TRL max sequence length."))
    dataset_num_proc: Optional[int] = field(default=None, metadata=inert("tokenization is single-process",
                                                                         help="Tokenization processes."))
    dataset_batch_size: int = field(default=1000, metadata=inert("unused", help="Tokenization batch size."))
    model_init_kwargs: Optional[Dict[str, Any]] = field(default=None, metadata=inert("unused",
                                                                                    help="Model init kwargs."))
    dataset_kwargs: Optional[Dict[str, Any]] = field(default=None, metadata=inert("unused", help="Dataset kwargs."))
    eval_packing: Optional[bool] = field(default=None, metadata=inert("eval packing follows zero_padding",
                                                                      help="Pack the eval set."))
    use_ssa: bool = field(default=False, metadata=inert("sparse sink attention is not implemented",
                                                        help="Sparse sink attention."))
    ssa_group_size_ratio: float = field(default=0.25, metadata=inert("see use_ssa", help="SSA group ratio."))


@dataclass
class ModelArgument:
    """Model and PEFT arguments (PaddleNLP ``ModelConfig``); ``lora_target_modules``/``merge_weights`` are ours."""

    model_name_or_path: Optional[str] = field(default=None, metadata=_help(
        "HF-format model directory (or a name the model loader knows, e.g. the bundled SmolLM2)."))
    tokenizer_name_or_path: Optional[str] = field(default=None, metadata=_help(
        "Tokenizer dir; None = model_name_or_path (PaddleNLP declares it but never reads it)."))
    model_implementation: str = model_implementation_field()
    trust_remote_code: bool = trust_remote_code_field()
    use_flash_attention: bool = field(default=False, metadata=_help(
        "Route attention through flashmask_attention (PaddleNLP: an LlmMeta training key; RM: a model key). Always "
        "in effect here: false does not fall back to eager attention (which would leak across packed examples)."))
    flash_mask: bool = field(default=False, metadata=_help(
        "Feed attn_mask_startend_row_indices to attention; forces zero_padding and use_flash_attention."))
    continue_training: bool = field(default=True, metadata=_help("Load pretrained weights (False = random init)."))
    use_fast_layer_norm: bool = field(default=False, metadata=inert("the model picks its ops", help="Fast layer norm."))
    fuse_attention_qkv: Optional[bool] = field(default=None, metadata=inert("q/k/v stay separate (HF names)",
                                                                            help="Fused qkv projection."))
    fuse_attention_ffn: Optional[bool] = field(default=None, metadata=inert("gate/up stay separate (HF names)",
                                                                            help="Fused gate+up projection."))
    hidden_dropout_prob: float = field(default=0.1, metadata=inert("Llama has no dropout attribute",
                                                                   help="Hidden dropout (if the model has it)."))
    attention_probs_dropout_prob: float = field(default=0.1, metadata=inert("Llama has no dropout attribute",
                                                                            help="Attention dropout."))
    # LoRA
    lora: bool = field(default=False, metadata=_help("Train LoRA adapters instead of all weights."))
    lora_path: Optional[str] = field(default=None, metadata=_help("Initial LoRA adapter dir (PEFT format)."))
    lora_rank: int = field(default=8, metadata=_help("LoRA rank r."))
    lora_alpha: float = field(default=-1, metadata=_help(
        "LoRA alpha; -1 = PaddleNLP's hard-coded 2*lora_rank (4 with rslora). Unlike PaddleNLP, honoured."))
    rslora: bool = field(default=False, metadata=_help("Rank-stabilised scaling alpha/sqrt(r)."))
    lora_plus_scale: float = field(default=1.0, metadata=_help("LoRA+ learning-rate ratio of B over A."))
    lora_target_modules: Optional[List[str]] = field(default=None, metadata=_help(
        "Regexes of nn.Linear names to adapt, full-matched against the dotted name or its last part "
        "(q_proj,v_proj or .*self_attn.q_proj) (ours); None = all linear layers, as PaddleNLP."))
    merge_weights: bool = field(default=False, metadata=_help(
        "After LoRA training also save the merged model (W + s*B@A folded in fp32, rounded once) as a full HF "
        "directory in output_dir/merged (ours; one process only)."))
    use_quick_lora: bool = field(default=False, metadata=inert("no fused quick-LoRA kernel", help="Quick LoRA."))
    pissa: bool = field(default=False, metadata=inert("PiSSA init is not implemented", help="PiSSA."))
    lora_use_mixer: bool = field(default=False, metadata=inert("MosLoRA is not implemented", help="MosLoRA."))
    use_mora: bool = field(default=False, metadata=inert("MoRA is not implemented", help="MoRA."))
    # other PEFT methods and quantization (PaddleNLP only)
    weight_quantize_algo: Optional[str] = field(default=None, metadata=inert("no quantized training",
                                                                             help="nf4 | fp4 | weight_only_int4/8."))
    qlora_weight_blocksize: int = field(default=64, metadata=inert("no QLoRA", help="QLoRA block size."))
    qlora_weight_double_quant: bool = field(default=False, metadata=inert("no QLoRA", help="QLoRA double quant."))
    qlora_weight_double_quant_block_size: int = field(default=256, metadata=inert("no QLoRA", help="QLoRA block."))
    vera: bool = field(default=False, metadata=inert("VeRA is not implemented", help="VeRA."))
    vera_rank: int = field(default=8, metadata=inert("VeRA is not implemented", help="VeRA rank."))
    lokr: bool = field(default=False, metadata=inert("LoKr is not implemented", help="LoKr."))
    lokr_path: Optional[str] = field(default=None, metadata=inert("LoKr is not implemented", help="LoKr path."))
    lokr_dim: int = field(default=8, metadata=inert("LoKr is not implemented", help="LoKr dim."))
    prefix_tuning: bool = field(default=False, metadata=inert("prefix tuning is not implemented", help="Prefix."))
    prefix_path: Optional[str] = field(default=None, metadata=inert("prefix tuning is not implemented", help="."))
    num_prefix_tokens: int = field(default=128, metadata=inert("prefix tuning is not implemented", help="."))
    reft: bool = field(default=False, metadata=inert("ReFT is not implemented", help="ReFT."))
    neftune: bool = field(default=False, metadata=inert("NEFTune is not implemented", help="NEFTune noise."))
    neftune_noise_alpha: float = field(default=5.0, metadata=inert("NEFTune is not implemented", help="."))
    from_aistudio: bool = field(default=False, metadata=inert("no AI Studio hub", help="Load from AI Studio."))
    save_to_aistudio: bool = field(default=False, metadata=inert("no AI Studio hub", help="Upload to AI Studio."))
    aistudio_repo_id: Optional[str] = field(default=None, metadata=inert("no AI Studio hub", help="."))
    aistudio_repo_private: bool = field(default=True, metadata=inert("no AI Studio hub", help="."))
    aistudio_repo_license: str = field(default="Apache License 2.0", metadata=inert("no AI Studio hub", help="."))
    aistudio_token: Optional[str] = field(default=None, metadata=inert("no AI Studio hub", help="."))
    use_long_sequence_strategies: bool = field(default=False, metadata=inert("not implemented", help="."))
    rope_scaling_factor: float = field(default=1.0, metadata=inert("not implemented", help="RoPE scaling."))
    strategy_type: Optional[str] = field(default=None, metadata=inert("not implemented", help="."))
    strategy_name: Optional[str] = field(default=None, metadata=inert("not implemented", help="."))

    def __post_init__(self):
        e = _Errors()
        e.check(self.lora_rank >= 1, f"lora_rank must be >= 1, got {self.lora_rank}")
        e.check(self.lora_alpha == -1 or self.lora_alpha > 0, f"lora_alpha must be -1 or > 0, got {self.lora_alpha}")
        e.check(self.lora_plus_scale > 0, f"lora_plus_scale must be > 0, got {self.lora_plus_scale}")
        e.raise_if_any(type(self).__name__)

    def effective_lora_alpha(self) -> float:
        """``lora_alpha``, or PaddleNLP's hard-coded value when it is -1: ``4`` with rslora, else ``2*lora_rank``."""
        if self.lora_alpha != -1:
            return float(self.lora_alpha)
        return 4.0 if self.rslora else 2.0 * self.lora_rank


@dataclass
class DataArgument:
    """SFT data arguments (PaddleNLP ``DataConfig``)."""

    dataset_name_or_path: Optional[str] = field(default=None, metadata=_help(
        "Dir with train.json/dev.json (jsonl of {src, tgt} or {instruction, input, output}) or train/*.json, "
        "dev/*.json."))
    dataset_path: Optional[str] = field(default=None, metadata=_help(
        "finetune_generation.py's name for dataset_name_or_path; with task_name squad: the directory holding "
        "train-v1.1.json / dev-v1.1.json."))
    task_name: Optional[str] = field(default=None, metadata=_help(
        "Built-in set: 'squad' (SQuAD v1.1 from a local dataset_path, PaddleNLP's answer/context -> question "
        "template; nothing is downloaded)."))
    data_name: Optional[str] = field(default=None, metadata=_help(
        "finetune_generation.py's dataset name (with task_name): only 'squad' is built in."))
    zero_padding: bool = field(default=False, metadata=_help("Pack several examples into each max_length row."))
    greedy_zero_padding: bool = field(default=False, metadata=_help(
        "Worst-fit packing over a 500-record buffer (train set only); needs zero_padding."))
    pad_to_multiple_of: Optional[int] = field(default=None, metadata=_help(
        "Unpacked batches: pad to a multiple of this instead of max_length."))
    src_length: int = field(default=1024, metadata=_help("Max prompt tokens of the last turn (special tokens count)."))
    max_length: Optional[int] = field(default=None, metadata=_help(
        "Max tokens per example and per pack (the pack capacity); unset: src_length + tgt_length, else 2048."))
    tgt_length: Optional[int] = field(default=None, metadata=_help(
        "finetune_generation.py's answer budget: sets max_length = src_length + tgt_length when max_length is "
        "unset."))
    eval_with_do_generation: bool = field(default=False, metadata=_help(
        "Each evaluation also answers the first eval_generation_max_examples dev prompts greedily (batched, "
        "left-padded, KV cache) and reports exact_match, bleu4 and rouge_l; the answers go to "
        "<output_dir>/eval_predictions/step-<N>.jsonl. Off by default: an evaluation is one loss pass."))
    save_generation_output: bool = field(default=False, metadata=inert(
        "with eval_with_do_generation the answers are always written (eval_predictions/)", help="."))
    eval_generation_max_examples: int = field(default=64, metadata=_help(
        "Ours: dev records answered per evaluation with eval_with_do_generation (the first N in file order)."))
    eval_generation_max_new_tokens: Optional[int] = field(default=None, metadata=_help(
        "Ours: answer length cap with eval_with_do_generation; default max_length - src_length (PaddleNLP's "
        "target length)."))
    lazy: bool = field(default=False, metadata=_help("Stream and pack on the fly (IterableDataset); needs max_steps."))
    chat_template: Optional[str] = field(default=None, metadata=_help(
        "None = the tokenizer's template; 'none' = no template; a dir (<dir>/chat_template.jinja or "
        "chat_template.json) or a file."))
    pad_to_max_length: bool = field(default=False, metadata=_help("Unpacked batches: always pad to max_length."))
    autoregressive: bool = field(default=False, metadata=inert("pretraining-style labels are not implemented",
                                                               help="Label every token."))
    use_pose_convert: bool = field(default=False, metadata=inert("PoSE is not implemented", help="PoSE."))

    def __post_init__(self):
        e = _Errors()
        e.check(self.tgt_length is None or self.tgt_length >= 1, f"tgt_length must be >= 1, got {self.tgt_length}")
        if self.max_length is None:  # finetune_generation.py: source + target budget
            self.max_length = self.src_length + self.tgt_length if self.tgt_length else 2048
        elif self.tgt_length and self.max_length != self.src_length + self.tgt_length:
            logger.warning("max_length=%d is set, so tgt_length=%d does not change it (src_length + tgt_length = "
                           "%d)", self.max_length, self.tgt_length, self.src_length + self.tgt_length)
        if self.dataset_path is not None and not self.task_name:
            e.check(self.dataset_name_or_path in (None, self.dataset_path),
                    f"dataset_path ({self.dataset_path!r}) and dataset_name_or_path ({self.dataset_name_or_path!r}) "
                    f"name the same thing; give one of them")
            self.dataset_name_or_path = self.dataset_path
        e.check(self.max_length >= 2, f"max_length must be >= 2, got {self.max_length}")
        e.check(self.src_length >= 1, f"src_length must be >= 1, got {self.src_length}")
        e.check(self.src_length < self.max_length,
                f"src_length ({self.src_length}) must be smaller than max_length ({self.max_length}) so the "
                f"answer has room")
        e.check(self.pad_to_multiple_of is None or self.pad_to_multiple_of >= 1,
                f"pad_to_multiple_of must be >= 1, got {self.pad_to_multiple_of}")
        e.check(self.eval_generation_max_examples >= 1,
                f"eval_generation_max_examples must be >= 1, got {self.eval_generation_max_examples}")
        e.check(self.eval_generation_max_new_tokens is None or self.eval_generation_max_new_tokens >= 1,
                f"eval_generation_max_new_tokens must be >= 1 (or null), got {self.eval_generation_max_new_tokens}")
        e.raise_if_any(type(self).__name__)


@dataclass
class GenerateArgument:
    """``llm/utils/argument.py`` ``GenerateArgument``: parsed for compatibility, not used."""

    top_k: int = field(default=1, metadata=inert("no generation during eval", help="Top-k sampling."))
    top_p: float = field(default=1.0, metadata=inert("no generation during eval", help="Top-p sampling."))


@dataclass
class ReftArgument:
    """``llm/utils/argument.py`` ``ReftArgument``: parsed for compatibility, ReFT is not implemented."""

    layers: str = field(default="all", metadata=inert("ReFT is not implemented", help="."))
    position: str = field(default="f7+l7", metadata=inert("ReFT is not implemented", help="."))
    intervention_type: str = field(default="LoreftIntervention", metadata=inert("ReFT is not implemented", help="."))
    rank: int = field(default=8, metadata=inert("ReFT is not implemented", help="."))
    act_fn: Optional[str] = field(default="linear", metadata=inert("ReFT is not implemented", help="."))
    add_bias: bool = field(default=False, metadata=inert("ReFT is not implemented", help="."))
    dropout: float = field(default=0.0, metadata=inert("ReFT is not implemented", help="."))


def apply_benchmark_overrides(training_args: TrainingArguments) -> List[str]:
    """PaddleNLP's ``benchmark`` / ``autotuner_benchmark`` coercions; returns the messages it logged.

    benchmark: do_train on; do_eval, do_predict, do_export, load_best_model_at_end off; overwrite_output_dir
    on; report_to = []; save and evaluation strategy "no". autotuner_benchmark: the same plus max_steps=5.
    Source: ``paddlenlp/trl/sft_config.py`` ``SFTConfig.__post_init__``.
    """
    ta = training_args
    if not (ta.benchmark or ta.autotuner_benchmark):
        return []
    ta.do_train, ta.do_eval, ta.do_predict, ta.do_export = True, False, False, False
    ta.overwrite_output_dir, ta.load_best_model_at_end, ta.report_to = True, False, []
    ta.save_strategy, ta.evaluation_strategy = "no", "no"
    which = "benchmark"
    if ta.autotuner_benchmark:
        ta.max_steps, ta.num_train_epochs, which = 5, 1, "autotuner_benchmark"
    msg = (f"{which}=True: forcing do_train=True, do_eval=False, save_strategy='no', evaluation_strategy='no', "
           f"load_best_model_at_end=False, report_to=[]" + (", max_steps=5" if ta.autotuner_benchmark else ""))
    logger.warning(msg)
    return [msg]


def finalize_sft_args(model_args: ModelArgument, data_args: DataArgument,
                      training_args: TrainingArguments) -> List[str]:
    """Apply ``run_finetune.py``'s cross-field rules in place; return the messages it logged.

    Rules:
    1. ``flash_mask`` without ``zero_padding`` or ``use_flash_attention``: both are forced on
       (PaddleNLP step 5, same warning text).
    2. ``greedy_zero_padding`` without ``zero_padding`` has no effect: logged.
    3. ``lazy`` (an IterableDataset without ``__len__``) with ``max_steps <= 0``: ValueError.
    4. ``lora`` with ``lora_alpha == -1``: set to PaddleNLP's value (2*rank, or 4 with rslora).
    5. ``merge_weights`` without ``lora``: logged (nothing to merge).
    6. ``tokenizer_name_or_path`` None: set to ``model_name_or_path``.
    7. benchmark / autotuner_benchmark coercions (:func:`apply_benchmark_overrides`).

    Raises:
        ValueError: rule 3.
    """
    msgs: List[str] = []

    def log(msg: str) -> None:
        logger.warning(msg)
        msgs.append(msg)

    if model_args.flash_mask:
        # Attention always runs through flashmask_attention here, so use_flash_attention is implied (no message);
        # packing is what flash_mask changes, as in PaddleNLP's run_finetune.py.
        model_args.use_flash_attention = True
        if not data_args.zero_padding:
            data_args.zero_padding = True
            log("flash_mask=True packs examples: setting zero_padding=True (PaddleNLP's run_finetune rule)")
    if data_args.greedy_zero_padding and not data_args.zero_padding:
        log("greedy_zero_padding=True has no effect without zero_padding=True")
    if data_args.lazy and training_args.max_steps <= 0:
        raise ValueError("lazy=True streams the data (no dataset length), so max_steps must be > 0; "
                         "set --max_steps N or lazy false")
    if model_args.lora and model_args.lora_alpha == -1:
        model_args.lora_alpha = model_args.effective_lora_alpha()
        log(f"lora_alpha=-1: using PaddleNLP's value {model_args.lora_alpha:g} "
            f"({'4 with rslora' if model_args.rslora else '2*lora_rank'})")
    if getattr(model_args, "merge_weights", False) and not model_args.lora:
        log("merge_weights=True has no effect without lora=True (there is no adapter to merge)")
    if model_args.tokenizer_name_or_path is None:
        model_args.tokenizer_name_or_path = model_args.model_name_or_path
    for m in apply_benchmark_overrides(training_args):
        msgs.append(m)
    return msgs


def parse_sft_args(argv=None):
    """Parse an SFT/LoRA launch (``cfg.json [--k v ...]`` or ``--k v ...``) and apply :func:`finalize_sft_args`.

    Accepts the keys of PaddleNLP's ``run_finetune.py`` parser (GenerateArgument, ModelConfig, ReftArgument,
    DataConfig, SFTConfig). Returns ``(model_args, data_args, training_args)``.

    Raises:
        ValueError: any parse or validation problem (all listed together).
    """
    parser = PdArgumentParser((GenerateArgument, ModelArgument, ReftArgument, DataArgument, SFTConfig))
    _, model_args, _, data_args, training_args = parser.parse(argv)
    finalize_sft_args(model_args, data_args, training_args)
    return model_args, data_args, training_args
