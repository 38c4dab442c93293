"""SFT / LoRA launcher: ``paddlenlp-finetune config.json [--key value ...]``, also ``python llm/run_finetune.py
config.json ...``; under ``torchrun``: ``torchrun ... llm/run_finetune.py ...`` or ``torchrun --no-python ...
paddlenlp-finetune ...``.

PyTorch counterpart of PaddleNLP ``llm/run_finetune.py``: same keys (``PdArgumentParser`` over
GenerateArgument, ModelArgument, ReftArgument, DataArgument, SFTConfig), same rules (``finalize_sft_args``:
``flash_mask`` forces ``zero_padding``), same flow: tokenizer and model from ``model_name_or_path``, train/dev
packs from ``dataset_name_or_path``, train, save the model (or the LoRA adapter) to ``output_dir``.
Like PaddleNLP, an ``output_dir`` holding ``checkpoint-<step>`` directories resumes from the latest one unless
``overwrite_output_dir`` is true.

Ours only (section ``ChatArgument``, documented in the README): ``chat_after_train`` (default true),
``chat_prompt`` and ``chat_max_new_tokens`` print one greedy chat reply of the fine-tuned model at the end.
With ``do_eval`` the dev metrics (loss, token accuracy, perplexity; exact match, BLEU-4 and ROUGE-L of generated
answers with ``eval_with_do_generation``) are measured before and after training ("before": the model as resumed,
once a checkpoint has loaded). A summary (wall time, train tokens/s, dev metrics before/after, the best checkpoint
with ``load_best_model_at_end``, output directory) is printed last.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field

import torch

from paddlenlp_ext.trainer import finalize_sft_args, set_seed
from paddlenlp_ext.trainer.argparser import PdArgumentParser
from paddlenlp_ext.trainer.launch import (clear_previous_run, finish, init_parallel_dims, is_distributed,
                                         keep_final_model, lora_plus_optimizer, output_dir_lock, require_model_path,
                                         resume_target, run_cli, save_adapter, train_summary, used_splits,
                                         warn_if_longer_than_model)
from paddlenlp_ext.trainer.arguments import (DataArgument, GenerateArgument, ModelArgument, ReftArgument,
                                             SFTConfig)
from paddlenlp_ext.trainer.logging_utils import setup_logging
from paddlenlp_ext.trainer.resume_config import data_keys

logger = logging.getLogger("paddlenlp_ext.run_finetune")


@dataclass
class ChatArgument:
    """Ours only (not in PaddleNLP): a sanity-check chat reply from the fine-tuned model after training."""

    chat_after_train: bool = field(default=True, metadata={"help": "Print one greedy chat reply after training "
                                                                     "(single process only)."})
    chat_prompt: str = field(default="What is the capital of France?",
                             metadata={"help": "User message for the chat reply."})
    chat_max_new_tokens: int = field(default=48, metadata={"help": "Max new tokens of the chat reply."})

    def __post_init__(self):
        if self.chat_after_train and self.chat_max_new_tokens < 1:
            raise ValueError(f"chat_max_new_tokens must be >= 1 (or set chat_after_train false), got "
                             f"{self.chat_max_new_tokens}")


def parse_args(argv=None):
    """``(model_args, data_args, training_args, chat_args)`` with PaddleNLP's cross-field rules applied."""
    parser = PdArgumentParser((GenerateArgument, ModelArgument, ReftArgument, DataArgument, SFTConfig, ChatArgument))
    _, model_args, _, data_args, training_args, chat_args = parser.parse(argv)
    finalize_sft_args(model_args, data_args, training_args)
    return model_args, data_args, training_args, chat_args


def build_model(model_args, training_args):
    """Model in fp32 (bf16 comes from autocast / FSDP mixed precision on CUDA), LoRA applied when ``lora``."""
    from paddlenlp_ext.transformers import AutoConfig, AutoModelForCausalLM

    name = require_model_path(model_args)
    impl = dict(model_implementation=model_args.model_implementation, trust_remote_code=model_args.trust_remote_code)
    if model_args.continue_training:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32, recompute=training_args.recompute,
                                                     **impl)
    else:
        logger.warning("continue_training=False: building %s from its config with random weights", name)
        config = AutoConfig.from_pretrained(name, recompute=training_args.recompute, **impl)
        model = AutoModelForCausalLM.from_config(config, recompute=training_args.recompute)
    from paddlenlp_ext.transformers.hf_fused_ops import apply_fused_op_keys

    apply_fused_op_keys(model, training_args, name)
    if model_args.lora:
        try:
            from paddlenlp_ext.peft import apply_lora
        except ImportError as e:
            raise ValueError("lora=true needs paddlenlp_ext.peft.apply_lora, which this checkout lacks") from e
        model = apply_lora(model, model_args)
        n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
        logger.info("LoRA: %d trainable parameters of %d", n_train, sum(p.numel() for p in model.parameters()))
        single_process = int(os.environ.get("WORLD_SIZE", "1")) <= 1
        if model_args.merge_weights and not single_process:
            raise ValueError("merge_weights=true is supported in one process only: under torchrun set "
                             "merge_weights: false, then merge the saved adapter with `python "
                             "llm/merge_lora_params.py --lora_path <output_dir> --output_path <dir>`")
        if training_args.bf16 and torch.cuda.is_available() and single_process:
            from paddlenlp_ext.peft import cast_frozen_base

            # frozen base in bf16 (no fp32 master copy: it gets no gradient), adapters stay fp32
            cast_frozen_base(model, torch.bfloat16)
            logger.info("LoRA: frozen base weights held in bf16, adapters in fp32")
    return model


def sft_metrics(data_args, training_args, tokenizer, has_dev: bool):
    """The Trainer's ``compute_metrics``: perplexity, plus generation scores over the first
    ``eval_generation_max_examples`` dev records with ``eval_with_do_generation`` (``generation_eval``)."""
    from paddlenlp_ext.trainer.generation_eval import SFTMetrics, dev_prompts

    records = None
    if data_args.eval_with_do_generation and has_dev:
        from paddlenlp_ext.datasets.jsonl import sft_data_files

        files = sft_data_files(data_args.dataset_name_or_path).get("dev", [])
        records = dev_prompts(files, tokenizer, data_args.eval_generation_max_examples, data_args.src_length)
    elif data_args.eval_with_do_generation:
        logger.warning("eval_with_do_generation=true but no evaluation reads a dev split: nothing is generated")
    new_tokens = data_args.eval_generation_max_new_tokens or data_args.max_length - data_args.src_length
    return SFTMetrics(records, tokenizer, new_tokens, training_args.per_device_eval_batch_size,
                      training_args.output_dir)


def _dev_metrics(metrics: dict) -> dict:
    """``eval_*`` metrics without the prefix, rounded for the summary line."""
    return {k[len("eval_"):]: round(v, 5) for k, v in metrics.items() if k.startswith("eval_")}


def main(argv=None) -> dict:
    """Run the SFT job; returns the summary dict it prints."""
    start = time.perf_counter()
    setup_logging(int(os.environ.get("RANK", "0")))
    model_args, data_args, training_args, chat_args = parse_args(argv)
    with output_dir_lock(training_args):  # one training run per output_dir; released on return, error, Ctrl-C
        return _run(start, model_args, data_args, training_args, chat_args)


def _run(start, model_args, data_args, training_args, chat_args) -> dict:
    parallel_dims = init_parallel_dims(training_args)
    set_seed(training_args.seed)
    # before any loading: a bad output_dir fails fast
    resume = resume_target(training_args, model_args.model_name_or_path)

    # the Trainer and what it imports (transformers among them) load here, after the argument and output_dir checks:
    # --help and a config mistake answer without them
    from paddlenlp_ext.datasets import create_sft_datasets, make_sft_collator, set_chat_template
    from paddlenlp_ext.datasets.task_data import prepare_task_data
    from paddlenlp_ext.trainer import Trainer
    from paddlenlp_ext.transformers import AutoTokenizer

    # finetune_generation.py's built-in sets (task_name squad): converted from a local copy, before any loading
    task_dir = prepare_task_data(data_args.task_name, data_args.data_name, data_args.dataset_path,
                                 os.path.join(training_args.output_dir, "task_data", str(data_args.task_name)))
    if task_dir is not None:
        logger.info("task_name=%s: SFT records from %s written to %s", data_args.task_name, data_args.dataset_path,
                    task_dir)
        data_args.dataset_name_or_path = task_dir

    require_model_path(model_args)  # before the tokenizer, which would fail on None with a TypeError traceback
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name_or_path or model_args.model_name_or_path)
    set_chat_template(tokenizer, data_args.chat_template)  # the template trained on is the one chatted with, saved
    model = build_model(model_args, training_args)
    warn_if_longer_than_model(model, data_args, model_args.model_name_or_path)
    from paddlenlp_ext.transformers.vocab_check import check_tokenizer_fits_model

    check_tokenizer_fits_model(tokenizer, model.config, model_args.model_name_or_path, model_args.tokenizer_name_or_path)
    from paddlenlp_ext.ops import set_llm_config

    set_llm_config(model, training_args)  # use_fused_* keys -> model config (PaddleNLP's LlmMetaConfig)
    from paddlenlp_ext.distributed import parallelize_model

    model = parallelize_model(model, parallel_dims, training_args)  # TP, compile (to_static), FSDP2: what applies
    # only the splits this run uses: without do_eval or an evaluation_strategy the dev file is not read, so an empty
    # or broken dev.json does not stop a training run, and no time goes into tokenising it
    splits = used_splits(training_args)
    datasets = create_sft_datasets(data_args, tokenizer, splits=splits)
    train_ds, dev_ds = datasets.get("train"), datasets.get("dev")
    if training_args.do_train and train_ds is None:
        raise ValueError(f"do_train=true but {data_args.dataset_name_or_path} has no train split "
                         "(train.json or train/*.json)")
    for split, ds in datasets.items():
        if hasattr(ds, "__len__"):
            logger.info("%s: %d packs of up to %d tokens", split, len(ds), data_args.max_length)
            used = training_args.do_train if split == "train" else training_args.do_eval and split == "dev"
            if used and len(ds) == 0:
                raise ValueError(f"the {split} split of {data_args.dataset_name_or_path} has no example left after "
                                 f"tokenisation: none fits max_length={data_args.max_length} "
                                 f"(src_length={data_args.src_length}; see the 'dropped' warning above). Raise "
                                 f"max_length (and, with chat_template none, src_length) or shorten the examples")
    sp = parallel_dims is not None and parallel_dims.sequence_parallel  # None: one process
    if sp and not (data_args.zero_padding or data_args.pad_to_max_length):
        # unpacked rows are padded to the batch's longest: sequence parallelism shards that length over the TP
        # ranks, so round it to a multiple of tp (PaddleNLP pads to max_length there); the first odd-length batch
        # stopped the run before
        step, tp = data_args.pad_to_multiple_of or 1, parallel_dims.tp
        data_args.pad_to_multiple_of = step * tp // math.gcd(step, tp)
        if data_args.pad_to_multiple_of != step:
            logger.info("sequence_parallel with unpacked batches: pad_to_multiple_of %d -> %d (a multiple of "
                        "tensor_parallel_degree)", step, data_args.pad_to_multiple_of)
    trainer = Trainer(model, training_args, train_dataset=train_ds, eval_dataset=dev_ds,
                      data_collator=make_sft_collator(data_args, tokenizer), tokenizer=tokenizer,
                      parallel_dims=parallel_dims, compute_metrics=sft_metrics(data_args, training_args, tokenizer,
                                                                               dev_ds is not None))
    trainer.optimizer = lora_plus_optimizer(trainer.model, model_args, training_args, model_args.lora)
    trainer.data_keys = data_keys(data_args)  # recorded in checkpoints: a resume that reorders the data is warned

    summary: dict = {"output_dir": training_args.output_dir}
    do_eval = training_args.do_eval and dev_ds is not None
    if training_args.do_eval and dev_ds is None:
        logger.warning("do_eval=true but %s has no dev split (dev.json or dev/*.json): no evaluation",
                       data_args.dataset_name_or_path)
    if training_args.do_train:
        clear_previous_run(training_args)  # overwrite_output_dir: only now that all has loaded
        # evaluate_first: the dev loss "before" is measured inside train(), after a resumed checkpoint has loaded
        # (the model being trained on, not the base weights loaded above); none when nothing is left to train
        result = trainer.train(resume_from_checkpoint=resume, evaluate_first=do_eval)
        if result["eval_before"] is not None:
            summary["dev_loss_before"] = result["eval_before"]["eval_loss"]
            summary["dev_before"] = _dev_metrics(result["eval_before"])
        summary.update(train_summary(result))
        if keep_final_model(result, training_args.output_dir, model_args.lora):
            # resumed at max_steps and a final model is there: keep it (it may be newer than the checkpoint)
            if model_args.lora and model_args.merge_weights:
                logger.warning("nothing trained, so nothing merged: merge the kept adapter with python "
                               "llm/merge_lora_params.py --lora_path %s --output_path %s/merged",
                               training_args.output_dir, training_args.output_dir)
        elif model_args.lora:
            save_adapter(trainer, model_args, training_args.output_dir)
            if model_args.merge_weights:
                from paddlenlp_ext.peft import merge_lora

                # fp32 fold, rounded once. The full model goes to its own directory: beside the adapter files,
                # transformers (with peft installed) would load the merged weights AND apply the adapter again.
                merge_lora(trainer.model)
                summary["merged_to"] = os.path.abspath(trainer.save_model(os.path.join(training_args.output_dir,
                                                                                       "merged")))
        else:
            trainer.save_model()
        summary["saved_to"] = os.path.abspath(training_args.output_dir)
    if do_eval:
        after = trainer.evaluate_final(training_args.do_train)
        summary["dev_loss_after"], summary["dev_after"] = after["eval_loss"], _dev_metrics(after)
    if chat_args.chat_after_train and not is_distributed():
        from paddlenlp_ext.transformers.generation import chat

        with torch.no_grad(), trainer._autocast():
            reply = chat(trainer.model, tokenizer, chat_args.chat_prompt, max_new_tokens=chat_args.chat_max_new_tokens)
        summary["chat"] = {"prompt": chat_args.chat_prompt, "reply": reply}
        if trainer.dp.is_main:
            print(f"\n[chat] user: {chat_args.chat_prompt}\n[chat] assistant: {reply}\n", flush=True)
    return finish(summary, trainer, start)


def cli() -> None:
    """The ``paddlenlp-finetune`` command (and ``python llm/run_finetune.py``): :func:`main` on ``sys.argv``
    through ``run_cli`` (bad input: one ``error:`` line, exit 2; Ctrl-C 130, SIGTERM 143, each saying how to resume)."""
    run_cli(main, resumable=True)
