"""DPO launcher: ``paddlenlp-dpo config.json [--key value ...]``, also ``python llm/run_dpo.py config.json ...``.

PyTorch counterpart of PaddleNLP ``llm/alignment/dpo/run_dpo.py``: same keys (``DPOModelArgument``,
``DPODataArgument``, ``DPOTrainingArguments``, ``DPOConfig``; ``config/llama/flashmask/dpo.json`` parses as is),
same coercions (``finalize_dpo_args``: ``orpo`` -> ``or`` + reference-free + SFT term, ...), same flow:
policy from ``model_name_or_path``; reference = a frozen copy, or the policy with LoRA disabled (``lora``), or
none (``reference_free``), or log-probs precomputed once (``precompute_reference_logps``, ours); train/dev
preference jsonl packed with ZeroPadding into share-question packs; DPO training; final save (full model, or the
PEFT adapter under ``lora``). With ``do_eval`` the dev metrics (rewards/accuracies, rewards/margins, ...) are
measured before and after training and printed in the final ``[summary]`` line.

Differences from PaddleNLP: the tokenizer's chat template is used (``chat_template: "none"`` gives PaddleNLP's
raw encoding); log-probs sum every token of both responses (see ``paddlenlp_ext.trl.dpo_criterion``).
"""

from __future__ import annotations

import copy
import logging
import os
import time

import torch

from paddlenlp_ext.trainer import set_seed
from paddlenlp_ext.trainer.launch import (finish, init_parallel_dims, lora_plus_optimizer, output_dir_lock,
                                         require_model_path, resume_target, run_cli, save_adapter,
                                         train_and_evaluate, used_splits, warn_if_longer_than_model)
from paddlenlp_ext.trainer.logging_utils import setup_logging
from paddlenlp_ext.trainer.resume_config import data_keys
from paddlenlp_ext.trl.arguments import parse_dpo_args

logger = logging.getLogger("paddlenlp_ext.run_dpo")

_EVAL_KEYS = ("eval_loss", "eval_rewards/accuracies", "eval_rewards/margins", "eval_rewards/chosen",
              "eval_rewards/rejected", "eval_logps/chosen", "eval_logps/rejected")


def build_policy(model_args, training_args, dpo_config):
    """fp32 policy (bf16 via autocast on CUDA) with the ``use_fused_*`` keys on its config; LoRA adapters applied
    when ``dpo_config.lora``."""
    from paddlenlp_ext.transformers import AutoModelForCausalLM

    require_model_path(model_args)
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, dtype=torch.float32,
                                                 recompute=training_args.recompute,
                                                 model_implementation=model_args.model_implementation,
                                                 trust_remote_code=model_args.trust_remote_code)
    from paddlenlp_ext.transformers.hf_fused_ops import apply_fused_op_keys

    apply_fused_op_keys(model, training_args, model_args.model_name_or_path)
    from paddlenlp_ext.ops import set_llm_config

    set_llm_config(model, training_args)  # use_fused_* keys -> model config (PaddleNLP run_dpo's LlmMetaConfig)
    if dpo_config.lora:
        from paddlenlp_ext.peft import apply_lora

        model = apply_lora(model, model_args)
        n = sum(p.numel() for p in model.parameters() if p.requires_grad)
        logger.info("LoRA: %d trainable parameters of %d", n, sum(p.numel() for p in model.parameters()))
    return model


def main(argv=None) -> dict:
    """Run the DPO job; returns the summary dict it prints."""
    start = time.perf_counter()
    setup_logging(int(os.environ.get("RANK", "0")))
    model_args, data_args, training_args, dpo_config = parse_dpo_args(argv)
    with output_dir_lock(training_args):  # one training run per output_dir; released on return, error, Ctrl-C
        return _run(start, model_args, data_args, training_args, dpo_config)


def _run(start, model_args, data_args, training_args, dpo_config) -> dict:
    parallel_dims = init_parallel_dims(training_args)
    set_seed(training_args.seed)
    # before any loading: a bad output_dir fails fast
    resume = resume_target(training_args, model_args.model_name_or_path)

    from paddlenlp_ext.datasets import set_chat_template
    from paddlenlp_ext.datasets.preference import build_preference_data
    from paddlenlp_ext.transformers import AutoTokenizer
    from paddlenlp_ext.trl.dpo_trainer import DPOTrainer

    require_model_path(model_args)  # before the tokenizer, which would fail on None with a TypeError traceback
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name_or_path)
    set_chat_template(tokenizer, data_args.chat_template)  # 'none' also clears the saved template
    model = build_policy(model_args, training_args, dpo_config)
    warn_if_longer_than_model(model, data_args, model_args.model_name_or_path)
    from paddlenlp_ext.transformers.vocab_check import check_tokenizer_fits_model

    check_tokenizer_fits_model(tokenizer, model.config, model_args.model_name_or_path, model_args.tokenizer_name_or_path)
    ref_model = None
    if not (dpo_config.reference_free or dpo_config.lora or dpo_config.precompute_reference_logps):
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)  # PaddleNLP: from_config + set_state_dict
    from paddlenlp_ext.distributed import parallelize_model

    model = parallelize_model(model, parallel_dims, training_args)  # TP, compile (to_static), FSDP2: what applies
    if ref_model is not None and parallel_dims is not None:  # runs under no_grad: nothing to compile
        ref_model = parallelize_model(ref_model, parallel_dims, training_args, compile=False)
    # only the splits this run uses: an evaluation-only run needs no train file (the default path may not exist)
    splits = used_splits(training_args)
    train_ds, dev_ds, collator = build_preference_data(data_args, tokenizer, layout="dpo", splits=splits)
    trainer = DPOTrainer(model, training_args, dpo_config=dpo_config, ref_model=ref_model, train_dataset=train_ds,
                         eval_dataset=dev_ds, data_collator=collator,
                         tokenizer=tokenizer, parallel_dims=parallel_dims)
    trainer.optimizer = lora_plus_optimizer(trainer.model, model_args, training_args, dpo_config.lora)
    trainer.data_keys = data_keys(data_args)  # recorded in checkpoints: a resume that reorders the data is warned
    if dpo_config.precompute_reference_logps:
        for ds in (train_ds, dev_ds):
            if ds is not None:
                trainer.precompute_reference_logps(ds)

    summary: dict = {"output_dir": training_args.output_dir, "loss_type": dpo_config.loss_type}
    do_eval = training_args.do_eval and dev_ds is not None

    def save():
        if dpo_config.lora:
            save_adapter(trainer, model_args, training_args.output_dir)
        else:
            trainer.save_model()

    train_and_evaluate(trainer, training_args, train_ds, resume, do_eval, summary, _EVAL_KEYS, save,
                       dpo_config.lora)
    return finish(summary, trainer, start)


def cli() -> None:
    """The ``paddlenlp-dpo`` command (and ``python llm/run_dpo.py``): :func:`main` on ``sys.argv``
    through ``run_cli`` (bad input: one ``error:`` line, exit 2; Ctrl-C 130, SIGTERM 143, each saying how to resume)."""
    run_cli(main, resumable=True)
