"""Reward-model launcher: ``paddlenlp-reward config.json [--key value ...]``, also ``python llm/run_reward.py
config.json ...``.

PyTorch counterpart of PaddleNLP ``llm/alignment/rm/run_reward.py`` (outcome RM): same keys (``RMModelArgument``,
``RMDataArgument``, ``RMTrainingArguments``; ``config/llama/flashmask/rm.json`` parses as is), same flow: a
Llama (or ERNIE) trunk from ``model_name_or_path`` plus a scalar ``score`` head, preference pairs packed
prompt | chosen | rejected (share-question mask), Bradley-Terry loss ``-log sigmoid(s_c - s_r)`` with scores read
at each response's last token, ``accuracy`` metric on the dev set (before and after training with ``do_eval``).
The model is saved as a Hugging Face ``LlamaForSequenceClassification`` directory (``num_labels = 1``), so
``transformers.AutoModelForSequenceClassification.from_pretrained(output_dir)`` scores text the same.

Differences from PaddleNLP: no BOS before each response, multi-turn history kept in order, the tokenizer's chat
template used (``chat_template: "none"`` for raw encoding); ``benchmark: true`` (set in rm.json) still skips the
final save, as in PaddleNLP.
"""

from __future__ import annotations

import logging
import os
import time

import torch

from paddlenlp_ext.trainer import set_seed
from paddlenlp_ext.trainer.launch import (finish, init_parallel_dims, output_dir_lock, require_model_path,
                                         resume_target, run_cli, train_and_evaluate, used_splits,
                                         warn_if_longer_than_model)
from paddlenlp_ext.trainer.logging_utils import setup_logging
from paddlenlp_ext.trainer.resume_config import data_keys
from paddlenlp_ext.trl.arguments import parse_rm_args

logger = logging.getLogger("paddlenlp_ext.run_reward")

_EVAL_KEYS = ("eval_loss", "eval_accuracy", "eval_margin", "eval_chosen_score", "eval_rejected_score")


def main(argv=None) -> dict:
    """Run the RM job; returns the summary dict it prints."""
    start = time.perf_counter()
    setup_logging(int(os.environ.get("RANK", "0")))
    model_args, data_args, training_args = parse_rm_args(argv)
    with output_dir_lock(training_args):  # one training run per output_dir; released on return, error, Ctrl-C
        return _run(start, model_args, data_args, training_args)


def _run(start, model_args, data_args, training_args) -> dict:
    parallel_dims = init_parallel_dims(training_args)
    set_seed(training_args.seed)
    # before any loading: a bad output_dir fails fast
    resume = resume_target(training_args, model_args.model_name_or_path)

    from paddlenlp_ext.datasets import set_chat_template
    from paddlenlp_ext.datasets.preference import build_preference_data
    from paddlenlp_ext.transformers import AutoTokenizer, resolve_model_name_or_path
    from paddlenlp_ext.trl.reward_model import LlamaForScore
    from paddlenlp_ext.trl.rm_trainer import RewardTrainer

    require_model_path(model_args)
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name_or_path)
    set_chat_template(tokenizer, data_args.chat_template)  # 'none' also clears the saved template
    from paddlenlp_ext.transformers.ernie35 import is_preset

    name = model_args.model_name_or_path  # an ERNIE preset name builds a random trunk (as run_finetune/run_dpo)
    path = name if is_preset(name) else resolve_model_name_or_path(name)
    from paddlenlp_ext.trl.hf_reward_model import HFForScore, reward_model_class

    cls = reward_model_class(path, model_args.model_implementation, model_args.trust_remote_code)
    if cls is HFForScore:  # any transformers family: its *ForSequenceClassification
        from paddlenlp_ext.transformers.hf_fused_ops import apply_fused_op_keys

        model = HFForScore.from_pretrained(path, dtype=torch.float32, recompute=training_args.recompute,
                                           trust_remote_code=model_args.trust_remote_code)
        apply_fused_op_keys(model, training_args, name)
    else:
        model = LlamaForScore.from_pretrained(path, dtype=torch.float32, recompute=training_args.recompute)
    warn_if_longer_than_model(model, data_args, name)
    from paddlenlp_ext.transformers.vocab_check import check_tokenizer_fits_model

    check_tokenizer_fits_model(tokenizer, model.config, name, model_args.tokenizer_name_or_path)
    from paddlenlp_ext.ops import set_llm_config

    # use_fused_* keys -> model config (ours: PaddleNLP's RM does not call LlmMetaConfig.set_llm_config, and
    # its RM TrainingArguments has no such keys)
    set_llm_config(model, training_args)
    from paddlenlp_ext.distributed import parallelize_model

    model = parallelize_model(model, parallel_dims, training_args)  # TP, compile (to_static), FSDP2: what applies
    # only the splits this run uses: an evaluation-only run needs no train file (the default path may not exist)
    splits = used_splits(training_args)
    train_ds, dev_ds, collator = build_preference_data(data_args, tokenizer, layout="rm", splits=splits)
    trainer = RewardTrainer(model, training_args, train_dataset=train_ds, eval_dataset=dev_ds,
                            data_collator=collator, tokenizer=tokenizer,
                            parallel_dims=parallel_dims)
    trainer.data_keys = data_keys(data_args)  # recorded in checkpoints: a resume that reorders the data is warned

    summary: dict = {"output_dir": training_args.output_dir}
    do_eval = training_args.do_eval and dev_ds is not None
    train_and_evaluate(trainer, training_args, train_ds, resume, do_eval, summary, _EVAL_KEYS, trainer.save_model)
    return finish(summary, trainer, start)


def cli() -> None:
    """The ``paddlenlp-reward`` command (and ``python llm/run_reward.py``): :func:`main` on ``sys.argv``
    through ``run_cli`` (bad input: one ``error:`` line, exit 2; Ctrl-C 130, SIGTERM 143, each saying how to resume)."""
    run_cli(main, resumable=True)
