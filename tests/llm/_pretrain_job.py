"""A tiny pretraining job for the launcher tests: a random 2-layer Llama with the SmolLM2 tokenizer and a corpus of
random documents ending in the tokenizer's eos (id 2)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import torch

EOS = 2


def make_pretrain_job(root, n_docs: int = 200, seed: int = 0):
    from paddlenlp_ext.datasets.pretraining import write_corpus
    from paddlenlp_ext.transformers import LlamaConfig, LlamaForCausalLM, resolve_model_name_or_path

    src = resolve_model_name_or_path("HuggingFaceTB/SmolLM2-135M-Instruct")  # tokenizer files only
    cfg = LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                      max_position_embeddings=256)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(str(root / "model"))
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), root / "model")
    rng = np.random.RandomState(seed)
    docs = [[list(rng.randint(3, 300, size=rng.randint(5, 40))) + [EOS]] for _ in range(n_docs)]
    write_corpus(str(root / "data" / "corpus"), docs, meta={"vocab_size": 49152, "eos_token_id": EOS,
                                                             "tokenizer": "SmolLM2"})
    return root


def pretrain_config(job, out: str, **over) -> dict:
    cfg = {"model_name_or_path": str(job / "model"), "input_dir": str(job / "data"), "output_dir": str(job / out),
           "split": "90,8,2", "max_seq_length": 32, "per_device_train_batch_size": 2, "per_device_eval_batch_size": 2,
           "max_steps": 6, "learning_rate": 3e-3, "min_learning_rate": 3e-4, "warmup_steps": 1,
           "lr_scheduler_type": "cosine", "logging_steps": 1, "eval_steps": 3, "eval_iters": 2, "test_iters": 2,
           "save_steps": 3, "do_train": True, "do_eval": True, "continue_training": True, "flash_mask": True,
           "disable_tqdm": True, "report_to": [], "seed": 3}
    cfg.update(over)
    return cfg


def losses(output_dir, step: int) -> list[float]:
    state = json.loads((output_dir / f"checkpoint-{step}" / "trainer_state.json").read_text())
    return [h["loss"] for h in state["log_history"] if "loss" in h]
