"""Pretraining launcher: ``paddlenlp-pretrain config.json [--key value ...]``, also ``python llm/run_pretrain.py
config.json ...``; under ``torchrun``: ``torchrun ... llm/run_pretrain.py ...`` or ``torchrun --no-python ...
paddlenlp-pretrain ...``.

PyTorch counterpart of PaddleNLP ``llm/run_pretrain.py``: the same keys (``ModelArguments``, ``DataArguments``,
``PreTrainingArguments``: ``input_dir``, ``split``, ``max_seq_length``, ``min_learning_rate``, ``decay_steps``,
``continue_training``, ``share_folder``, ``data_cache``, ``eval_iters``, ``scale_loss``, ...) and flow: token files
from ``input_dir`` (``.bin``/``.idx`` or ``_ids.npy``/``_idx.npz``) cut into shuffled windows of
``max_seq_length + 1`` tokens exactly as PaddleNLP's index does; ``continue_training 0`` builds the model from its
config with the family's initialisation (vocabulary padded to a multiple of 128, ``max_position_embeddings >=
max_seq_length``), ``1`` loads its weights; PaddleNLP's warmup-decay schedules with ``min_learning_rate``; validation
loss and perplexity every ``eval_steps``, the test split at the end (``do_predict``). An ``output_dir`` holding
checkpoints resumes at the exact next sample, also under another data-parallel size.

Ours: ``flash_mask: true`` splits each window at end-of-document tokens into documents that do not attend to each
other, with positions restarting per document (``reset_attention_mask`` / ``reset_position_ids``,
``eod_mask_loss``: Megatron-LM's names); PaddleNLP's windows let every token attend to the previous documents.
A summary (wall time, tokens/s, validation loss and perplexity before and after, test perplexity) is printed last.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time

import torch

from paddlenlp_ext.trainer import set_seed
from paddlenlp_ext.trainer.argparser import PdArgumentParser
from paddlenlp_ext.trainer.launch import (clear_previous_run, finish, init_parallel_dims, keep_final_model,
                                         output_dir_lock, resume_target, run_cli, train_summary)
from paddlenlp_ext.trainer.logging_utils import setup_logging
from paddlenlp_ext.trainer.pretraining_arguments import (PretrainDataArguments, PretrainModelArguments,
                                                         PreTrainingArguments, finalize_pretrain_args,
                                                         padded_vocab_size, pretraining_sample_counts, pretraining_scheduler)

logger = logging.getLogger("paddlenlp_ext.run_pretrain")

DATA_KEYS = ("input_dir", "split", "max_seq_length", "reset_attention_mask", "reset_position_ids", "eod_mask_loss")


def parse_args(argv=None):
    """``(model_args, data_args, training_args)`` with ``run_pretrain``'s rules applied."""
    parser = PdArgumentParser((PretrainModelArguments, PretrainDataArguments, PreTrainingArguments))
    model_args, data_args, training_args = parser.parse(argv)
    finalize_pretrain_args(model_args, data_args, training_args)
    return model_args, data_args, training_args


def build_model(model_args, data_args, training_args, tokenizer):
    """The model: from its config with the family's init (``continue_training`` 0: vocab padded to a multiple of
    128 and at least the tokenizer's, ``max_position_embeddings >= max_seq_length``), or loaded (1). fp32."""
    from paddlenlp_ext.transformers import AutoConfig, AutoModelForCausalLM

    name = model_args.model_name_or_path
    overrides = {"recompute": training_args.recompute}
    if model_args.num_hidden_layers is not None:
        overrides["num_hidden_layers"] = model_args.num_hidden_layers
    if model_args.continue_training:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32, **overrides)
        limit = model.config.max_position_embeddings
        if data_args.max_seq_length > limit:
            logger.warning("max_seq_length=%d is larger than max_position_embeddings=%d of %s: positions past %d were "
                           "never trained", data_args.max_seq_length, limit, name, limit)
        return model
    config = AutoConfig.from_pretrained(name, **overrides)
    vocab = len(tokenizer)
    padded = padded_vocab_size(config.vocab_size, vocab)  # PaddleNLP: "for better amp performance"
    if padded != config.vocab_size:
        logger.info("vocab_size %d -> %d (the tokenizer's %d rounded up to a multiple of 128)", config.vocab_size,
                    padded, vocab)
    config.vocab_size = padded
    config.max_position_embeddings = max(int(config.max_position_embeddings), data_args.max_seq_length)
    logger.warning("continue_training=0: building %s from its config with random weights (%s init)", name,
                   config.model_type)
    return AutoModelForCausalLM.from_config(config)


def checkpoint_train_samples(resume, output_dir: str) -> int | None:
    """The train sample count recorded by the checkpoint this run resumes (None when fresh or not recorded)."""
    from paddlenlp_ext.trainer.checkpoint import TRAINER_STATE, resolve_resume_path

    path = resolve_resume_path(resume, output_dir)
    if path is None:
        return None
    with open(os.path.join(path, TRAINER_STATE), encoding="utf-8") as f:
        return (json.load(f).get("data_order") or {}).get("train_samples")


def eod_token_id(data_args, tokenizer, input_dir_prefixes) -> int | None:
    """``eod_token_id`` if set, else the id recorded by the preprocessing tool, else the tokenizer's eos."""
    if data_args.eod_token_id is not None:
        return data_args.eod_token_id
    from paddlenlp_ext.datasets.pretraining import read_meta

    recorded = {(read_meta(p) or {}).get("eos_token_id") for p in input_dir_prefixes} - {None}
    if len(recorded) == 1:
        return int(recorded.pop())
    return tokenizer.eos_token_id


def main(argv=None) -> dict:
    """Run the pretraining job; returns the summary dict it prints."""
    start = time.perf_counter()
    setup_logging(int(os.environ.get("RANK", "0")))
    model_args, data_args, training_args = parse_args(argv)
    with output_dir_lock(training_args):
        return _run(start, model_args, data_args, training_args)


def _run(start, model_args, data_args, training_args) -> dict:
    from paddlenlp_ext.datasets.pretraining import (PretrainingCollator, build_train_valid_test_datasets,
                                                    data_prefixes)
    from paddlenlp_ext.trainer.pretraining_trainer import PretrainingTrainer, eval_subset, perplexity
    from paddlenlp_ext.transformers import AutoTokenizer

    parallel_dims = init_parallel_dims(training_args)
    set_seed(training_args.seed)
    resume = resume_target(training_args, model_args.model_name_or_path)
    prefixes, _ = data_prefixes(data_args.input_dir)  # a bad input_dir fails before the model loads
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name_or_path)
    model = build_model(model_args, data_args, training_args, tokenizer)
    from paddlenlp_ext.ops import set_llm_config
    from paddlenlp_ext.distributed import parallelize_model

    vocab_size = int(model.config.vocab_size)
    set_llm_config(model, training_args)
    model = parallelize_model(model, parallel_dims, training_args)
    data_ranks = 1 if parallel_dims is None else int(parallel_dims.batch_world_size)

    counts = list(pretraining_sample_counts(training_args, data_ranks))
    recorded = checkpoint_train_samples(resume, training_args.output_dir) if training_args.do_train else None
    if recorded is not None and counts[0] and recorded != counts[0]:
        if recorded >= counts[0]:
            # the same index as the checkpoint's run (another data-parallel size or batch shape needs fewer
            # samples): the consumed samples stay a prefix of it, so training continues at the next one
            logger.info("resuming: keeping the checkpoint's %d train samples (this run needs %d)", recorded, counts[0])
            counts[0] = recorded
        else:
            logger.warning("resuming with more train samples (%d) than the checkpoint's run (%d: a larger max_steps or "
                           "global batch): the sample order is rebuilt, so the samples skipped are not exactly those "
                           "already trained on", counts[0], recorded)
    train_ds, valid_ds, test_ds = build_train_valid_test_datasets(
        data_args.input_dir, data_args.split, data_args.max_seq_length, counts, training_args.seed,
        data_cache=data_args.data_cache, share_folder=data_args.share_folder, vocab_size=vocab_size,
        tokenizer_vocab_size=len(tokenizer))
    for name, ds, n in zip(("train", "validation", "test"), (train_ds, valid_ds, test_ds), counts):
        if ds is not None:
            logger.info("%s: %d samples of %d tokens (%d needed)", name, len(ds), data_args.max_seq_length, n)
    eod = eod_token_id(data_args, tokenizer, prefixes)
    collator = PretrainingCollator(eod, data_args.reset_attention_mask, data_args.reset_position_ids,
                                   data_args.eod_mask_loss)
    logger.info("windows: %s", "document masks (reset_attention_mask), eod id %s" % eod
                if data_args.reset_attention_mask else "plain causal attention across documents (PaddleNLP)")
    eval_ds = eval_subset(valid_ds, training_args.per_device_eval_batch_size, data_ranks, training_args.eval_iters)
    trainer = PretrainingTrainer(model, training_args, train_dataset=train_ds, eval_dataset=eval_ds,
                                 data_collator=collator, tokenizer=tokenizer, parallel_dims=parallel_dims)
    from paddlenlp_ext.trainer.optimization import build_optimizer

    trainer.optimizer = build_optimizer(trainer.model, training_args)
    trainer.lr_scheduler = pretraining_scheduler(trainer.optimizer, training_args)  # None: the trainer's default
    trainer.data_keys = {**{k: getattr(data_args, k) for k in DATA_KEYS}, "train_samples": counts[0]}

    summary: dict = {"output_dir": training_args.output_dir}
    do_eval = training_args.do_eval and eval_ds is not None
    if training_args.do_train:
        clear_previous_run(training_args)
        result = trainer.train(resume_from_checkpoint=resume, evaluate_first=do_eval)
        if result["eval_before"] is not None:
            summary["eval_loss_before"] = result["eval_before"]["eval_loss"]
            summary["eval_ppl_before"] = result["eval_before"]["eval_ppl"]
        summary.update(train_summary(result))
        if not keep_final_model(result, training_args.output_dir):
            trainer.save_model()
        summary["saved_to"] = os.path.abspath(training_args.output_dir)
    if do_eval:
        after = trainer.evaluate_final(training_args.do_train)
        summary["eval_loss_after"], summary["eval_ppl_after"] = after["eval_loss"], after["eval_ppl"]
    if training_args.do_predict and test_ds is not None:
        test = trainer.evaluate(eval_subset(test_ds, training_args.per_device_eval_batch_size, data_ranks,
                                            training_args.test_iters), log=False)
        summary["test_loss"], summary["test_ppl"] = test["eval_loss"], perplexity(test["eval_loss"])
    return finish(summary, trainer, start)


def cli() -> None:
    """The ``paddlenlp-pretrain`` command (and ``python llm/run_pretrain.py``): :func:`main` on ``sys.argv``
    through ``run_cli`` (bad input: one ``error:`` line, exit 2; Ctrl-C 130, SIGTERM 143, each saying how to resume)."""
    run_cli(main, resumable=True)
