"""A tiny pretraining job for the launcher tests: a random 2-layer Llama with the SmolLM2 tokenizer and a corpus of
random documents ending in the tokenizer's eos (id 2)."""

from __future__ import annotations

import json

import numpy as np

EOS = 2


def make_pretrain_job(root, n_docs: int = 200, seed: int = 0):
    from paddlenlp_ext.datasets.pretraining import write_corpus
    from tests._hf_tiny import save_tiny_llama_dir

    save_tiny_llama_dir(root / "model")
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
