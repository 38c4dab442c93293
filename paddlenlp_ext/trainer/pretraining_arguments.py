"""Arguments of ``llm/run_pretrain.py`` with PaddleNLP's pretraining keys, and their cross-field rules.

Sources: PaddleNLP ``llm/run_pretrain.py`` (``DataArguments``, ``ModelArguments``, ``PreTrainingArguments``) and
``llm/experimental/ernie-3.5-se/run_pretrain.py`` (its older model keys, accepted). Ours (Megatron-LM's names):
``reset_attention_mask``, ``reset_position_ids``, ``eod_mask_loss``, plus ``flash_mask``, ``eod_token_id`` and
``test_iters``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import List, Optional

from .argparser import inert
from .arguments import TrainingArguments, _Errors, _help

logger = logging.getLogger(__name__)

SCALE_LOSS_DEFAULT = 2.0**15


@dataclass
class PretrainDataArguments:
    """PaddleNLP ``run_pretrain.DataArguments`` plus the document-mask switches."""

    input_dir: Optional[str] = field(default=None, metadata=_help(
        "A directory of token files (every <prefix>.idx / <prefix>_idx.npz in it, weight 1 each), one corpus prefix, "
        "or a weighted list \"w1 prefix1 w2 prefix2 ...\" (PaddleNLP's blending)."))
    split: str = field(default="949,50,1", metadata=_help(
        "Train/validation/test weights over the stored sequences of each prefix, e.g. \"949,50,1\" (PaddleNLP's "
        "rounding)."))
    max_seq_length: int = field(default=1024, metadata=_help("Tokens per training window (each sample reads L+1)."))
    share_folder: bool = field(default=False, metadata=_help(
        "The data directory is shared by all nodes: only global rank 0 builds the index cache (else local rank 0 of "
        "each node)."))
    data_impl: str = field(default="mmap", metadata=_help(
        "'mmap' (the only reader; the _ids.npy/_idx.npz pair is detected by its file names)."))
    skip_warmup: bool = field(default=True, metadata=inert("files are memory-mapped and read on demand",
                                                           help="Pre-read the token files."))
    data_cache: Optional[str] = field(default=None, metadata=_help(
        "Directory for the index cache when <data dir>/index-cache does not hold it (built there when given)."))
    reset_attention_mask: Optional[bool] = field(default=None, metadata=_help(
        "Ours (Megatron-LM's name): end-of-document tokens split a window into documents that do not attend to each "
        "other (the FlashMask causal-document mask). Default: flash_mask."))
    reset_position_ids: Optional[bool] = field(default=None, metadata=_help(
        "Ours (Megatron-LM's name): position_ids restart at 0 after each end-of-document token. Default: flash_mask."))
    eod_mask_loss: bool = field(default=False, metadata=_help(
        "Ours (Megatron-LM's name): do not train the prediction made at an end-of-document token (the next "
        "document's first token). PaddleNLP trains it (false)."))
    eod_token_id: Optional[int] = field(default=None, metadata=_help(
        "End-of-document id that splits windows; default: the corpus' recorded id, else the tokenizer's eos."))

    def __post_init__(self):
        e = _Errors()
        e.check(self.max_seq_length >= 1, f"max_seq_length must be >= 1, got {self.max_seq_length}")
        e.check(self.data_impl in ("mmap", "lazy"), f"data_impl must be 'mmap', got {self.data_impl!r}")
        e.check(self.data_impl != "lazy", "data_impl 'lazy' (PaddleNLP's TNTIDX files) is not read; write the corpus "
                                          "with --data_impl mmap")
        from paddlenlp_ext.datasets.pretraining import parse_split

        try:
            parse_split(self.split)
        except ValueError as err:
            e.append(str(err))
        e.raise_if_any(type(self).__name__)


@dataclass
class PretrainModelArguments:
    """PaddleNLP ``run_pretrain.ModelArguments`` (and the ERNIE-3.5-SE script's extra keys, not acted on)."""

    model_name_or_path: Optional[str] = field(default=None, metadata=_help(
        "Model directory, the embedded SmolLM2 name, or an ERNIE-3.5-SE preset (ernie/tiny-random-ernie, "
        "baidu/ernie-3.5-se-3b). With continue_training 0 only its config is read."))
    tokenizer_name_or_path: Optional[str] = field(default=None, metadata=_help("Tokenizer; None = model_name_or_path."))
    continue_training: bool = field(default=False, metadata=_help(
        "1: load the model's weights; 0 (PaddleNLP's default): build it from its config with the family's "
        "initialisation, vocab padded to a multiple of 128, max_position_embeddings >= max_seq_length."))
    num_hidden_layers: Optional[int] = field(default=None, metadata=_help("Override the config's layer count."))
    flash_mask: bool = field(default=False, metadata=_help(
        "Document masks: end-of-document tokens split each window (reset_attention_mask and reset_position_ids "
        "default to this). false = PaddleNLP's plain causal windows through the kernel's causal path."))
    use_flash_attention: bool = field(default=True, metadata=_help(
        "Attention always runs through flashmask_attention here (the key is accepted)."))
    use_fast_layer_norm: bool = field(default=False, metadata=inert("the model picks its ops", help="."))
    use_fused_ln: bool = field(default=False, metadata=inert("the model picks its ops", help="ERNIE fused LayerNorm."))
    hidden_dropout_prob: float = field(default=0.1, metadata=inert("the models have no dropout", help="."))
    attention_probs_dropout_prob: float = field(default=0.1, metadata=inert("the models have no dropout", help="."))
    fuse_attention_qkv: Optional[bool] = field(default=None, metadata=inert("q/k/v stay separate", help="."))
    fuse_attention_ffn: Optional[bool] = field(default=None, metadata=inert("gate/up stay separate", help="."))
    model_type: Optional[str] = field(default=None, metadata=inert("config.json's model_type decides", help="."))
    recompute_granularity_model: Optional[str] = field(default=None, metadata=inert("see recompute", help="."))

    def __post_init__(self):
        e = _Errors()
        e.check(self.num_hidden_layers is None or self.num_hidden_layers >= 1,
                f"num_hidden_layers must be >= 1, got {self.num_hidden_layers}")
        e.raise_if_any(type(self).__name__)


@dataclass
class PreTrainingArguments(TrainingArguments):
    """PaddleNLP ``PreTrainingArguments``: the trainer's keys plus the pretraining schedule and evaluation sizes."""

    min_learning_rate: float = field(default=1e-5, metadata=_help(
        "Floor of the cosine / linear warmup-decay schedules (PaddleNLP's CosineAnnealingWithWarmupDecay)."))
    decay_steps: Optional[int] = field(default=None, metadata=_help(
        "Step at which the schedule reaches min_learning_rate; None = max_steps."))
    scale_loss: float = field(default=SCALE_LOSS_DEFAULT, metadata=_help(
        "Initial fp16 loss scale. fp16 runs as bf16 here, which needs no loss scaling: a value other than the "
        "default is warned as having no effect."))
    eval_iters: int = field(default=10, metadata=_help(
        "Validation batches per evaluation (per data rank); PaddleNLP hard-codes 10."))
    test_iters: int = field(default=100, metadata=_help("Test batches at the end (do_predict); PaddleNLP: 100."))
    dataloader_shuffle: bool = field(default=False, metadata=_help(
        "Keep false: the sample order is the dataset's own shuffle (PaddleNLP's non-shuffling batch sampler)."))
    enable_linear_fused_grad_add: bool = field(default=False, metadata=inert("no fused grad-add kernel", help="."))
    do_predict: bool = field(default=False, metadata=_help("Evaluate the test split at the end."))

    def __post_init__(self):
        super().__post_init__()
        e = _Errors()
        e.check(self.max_steps > 0, f"max_steps must be > 0 for pretraining (the sample count is derived from it), "
                                    f"got {self.max_steps}")
        e.check(self.decay_steps is None or self.decay_steps > 0, f"decay_steps must be > 0, got {self.decay_steps}")
        e.check(self.min_learning_rate >= 0, f"min_learning_rate must be >= 0, got {self.min_learning_rate}")
        e.check(self.eval_iters >= 1 and self.test_iters >= 1, "eval_iters and test_iters must be >= 1")
        e.check(self.scale_loss > 0, f"scale_loss must be > 0, got {self.scale_loss}")
        e.raise_if_any(type(self).__name__)


def finalize_pretrain_args(model_args: PretrainModelArguments, data_args: PretrainDataArguments,
                           training_args: PreTrainingArguments) -> List[str]:
    """``run_pretrain``'s rules, in place; returns the messages logged.

    1. ``input_dir`` is required; ``tokenizer_name_or_path`` defaults to ``model_name_or_path``.
    2. ``reset_attention_mask`` / ``reset_position_ids`` default to ``flash_mask``; ``reset_attention_mask`` without
       ``flash_mask`` is an error (the document mask is the FlashMask index tensor).
    3. ``decay_steps`` defaults to ``max_steps``.
    4. ``do_eval`` with ``evaluation_strategy`` "no" evaluates every ``eval_steps`` (the validation sample count
       assumes it, as PaddleNLP's scripts pass ``--eval_steps``).
    5. ``scale_loss`` other than the default: warned (no loss scaling with bf16; fp16 runs as bf16 here).
    6. ``dataloader_shuffle`` true: warned (the samples are already shuffled; a second shuffle breaks PaddleNLP's
       order and the exact resume).
    """
    msgs: List[str] = []

    def log(msg):
        logger.warning(msg)
        msgs.append(msg)

    problems = []
    if not data_args.input_dir:
        problems.append("input_dir is required: a directory of token files, a corpus prefix or \"w1 p1 w2 p2\" "
                        "(write token files with llm/tools/preprocess/create_pretraining_data.py)")
    if not model_args.model_name_or_path:
        problems.append("model_name_or_path is required (a model directory, the embedded "
                        "HuggingFaceTB/SmolLM2-135M-Instruct or an ERNIE preset such as ernie/tiny-random-ernie)")
    if data_args.reset_attention_mask and not model_args.flash_mask:
        problems.append("reset_attention_mask=true needs flash_mask=true (the document mask is FlashMask's "
                        "attn_mask_startend_row_indices)")
    if problems:
        raise ValueError(problems[0] if len(problems) == 1 else f"{len(problems)} problem(s):\n  - "
                         + "\n  - ".join(problems))
    if model_args.tokenizer_name_or_path is None:
        model_args.tokenizer_name_or_path = model_args.model_name_or_path
    if data_args.reset_attention_mask is None:
        data_args.reset_attention_mask = model_args.flash_mask
    if data_args.reset_position_ids is None:
        data_args.reset_position_ids = model_args.flash_mask
    if training_args.decay_steps is None:
        training_args.decay_steps = training_args.max_steps
    if training_args.do_eval and str(training_args.evaluation_strategy) == "no":
        training_args.evaluation_strategy = "steps"
        log(f"do_eval=true: evaluating every eval_steps={training_args.eval_steps} steps on eval_iters="
            f"{training_args.eval_iters} validation batches")
    if training_args.scale_loss != SCALE_LOSS_DEFAULT:
        log(f"scale_loss={training_args.scale_loss:g} has no effect: "
            + ("bf16 needs no loss scaling" if training_args.bf16 else
               "fp16 is computed in bf16 here, which needs no loss scaling" if training_args.fp16 else
               "fp32 training has no loss scaling"))
    if training_args.dataloader_shuffle:
        log("dataloader_shuffle=true reshuffles the already shuffled samples: the order is no longer PaddleNLP's")
    return msgs


def pretraining_lr_lambda(kind: str, max_lr: float, min_lr: float, warmup: float, decay_steps: int):
    """``LambdaLR`` multiplier ``f(step + 1) / max_lr`` of PaddleNLP's ``CosineAnnealingWithWarmupDecay`` /
    ``LinearAnnealingWithWarmupDecay`` (``paddlenlp/transformers/optimization.py``): for update ``t`` (1-based),
    ``max_lr * t / warmup`` while ``t <= warmup``; ``min_lr`` past ``decay_steps``; else with
    ``r = (t - warmup) / (decay - warmup)`` cosine ``min + 0.5 (1 + cos(pi r)) (max - min)`` or linear
    ``min + (1 - r) (max - min)``. Paddle's scheduler starts at ``last_epoch = 0`` and steps once in its
    constructor, so the first update uses ``t = 1``; ``LambdaLR``'s step 0 is mapped to it."""
    if kind not in ("cosine", "linear"):
        raise ValueError(f"pretraining schedules are cosine | linear, got {kind!r}")

    def lr_at(t: int) -> float:
        if warmup > 0 and t <= warmup:
            return max_lr * t / warmup
        if t > decay_steps:
            return min_lr
        r = (t - warmup) / max(decay_steps - warmup, 1e-12)
        coeff = 0.5 * (1.0 + math.cos(math.pi * r)) if kind == "cosine" else 1.0 - r
        return min_lr + coeff * (max_lr - min_lr)

    def fn(step: int) -> float:
        return lr_at(step + 1) / max_lr if max_lr > 0 else 0.0

    fn.lr_at = lr_at
    return fn


def pretraining_scheduler(optimizer, training_args):
    """PaddleNLP's pretraining scheduler for ``lr_scheduler_type`` cosine / linear (``warmup_steps`` if > 0, else
    ``warmup_ratio * max_steps``, not rounded); None for any other type (the trainer's default schedules apply)."""
    import torch

    kind = str(training_args.lr_scheduler_type)
    if kind not in ("cosine", "linear"):
        return None
    ta = training_args
    warmup = ta.warmup_steps if ta.warmup_steps > 0 else ta.warmup_ratio * ta.max_steps
    fn = pretraining_lr_lambda(kind, ta.learning_rate, ta.min_learning_rate, warmup, ta.decay_steps or ta.max_steps)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)


def padded_vocab_size(config_vocab_size: int, tokenizer_vocab_size: int) -> int:
    """PaddleNLP's ``continue_training`` 0 rule: ``max(config vocab, tokenizer vocab rounded up to a multiple of
    128)`` (``((v - 1) // 128 + 1) * 128``). The tokenizer's size counts added tokens (``len(tokenizer)``)."""
    return max(int(config_vocab_size), ((int(tokenizer_vocab_size) - 1) // 128 + 1) * 128)


def pretraining_sample_counts(training_args: PreTrainingArguments, data_ranks: int) -> tuple[int, int, int]:
    """``(train, valid, test)`` sample counts (PaddleNLP ``create_pretrained_dataset``): train = batch x data ranks
    x max_steps x accumulation; valid = eval batch x data ranks x eval_iters x (max_steps // eval_steps + 1) with
    ``do_eval``; test = eval batch x data ranks x test_iters with ``do_predict``; 0 for a split not used."""
    ta = training_args
    train = ta.per_device_train_batch_size * data_ranks * ta.max_steps * ta.gradient_accumulation_steps
    evals = ta.max_steps // max(int(ta.eval_steps or ta.max_steps), 1) + 1
    valid = ta.per_device_eval_batch_size * data_ranks * ta.eval_iters * evals if ta.do_eval else 0
    test = ta.per_device_eval_batch_size * data_ranks * ta.test_iters if ta.do_predict else 0
    return train if ta.do_train else 0, valid, test
