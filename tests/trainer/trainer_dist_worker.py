"""Worker of test_trainer_distributed.py: the real ``Trainer`` on a tiny Llama, 1 process or under torchrun.

``worker.py SPEC.json OUT.json``; SPEC: ``{"output_dir", "per_device_train_batch_size", "max_steps",
"stop_at", "resume", "sharding", "eval_n", "eval_only"}``. Rank 0 writes ``{"losses", "eval_loss", "log_steps"}``.
Data: 12 synthetic packs (seeded), so every run sees the same global batches.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from paddlenlp_ext.distributed import init_distributed, parallelize_model  # noqa: E402
from paddlenlp_ext.trainer import Trainer  # noqa: E402
from paddlenlp_ext.trainer.arguments import TrainingArguments  # noqa: E402
from paddlenlp_ext.transformers.llama import LlamaConfig, LlamaForCausalLM  # noqa: E402
from trainer_fixtures import make_pack  # noqa: E402


class Packs(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.items = [make_pack(g, (4 + i % 7, 3 + (i * 5) % 9)) for i in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def main(spec_path, out_path):
    spec = json.load(open(spec_path))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    args = TrainingArguments(output_dir=spec["output_dir"], per_device_train_batch_size=spec["per_device_train_batch_size"],
                             per_device_eval_batch_size=1, gradient_accumulation_steps=2, learning_rate=1e-2,
                             max_steps=spec["max_steps"], warmup_steps=1, logging_steps=1, save_steps=2,
                             save_strategy="steps", disable_tqdm=True, seed=3, device="cpu",
                             sharding="stage2" if world > 1 else "")
    dims = init_distributed(args)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = parallelize_model(LlamaForCausalLM(cfg), dims, args)
    trainer = Trainer(model, args, train_dataset=Packs(12, 0), eval_dataset=Packs(spec.get("eval_n", 6), 1), parallel_dims=dims)
    if spec.get("stop_at"):
        trainer.compute_max_steps = lambda: spec["stop_at"]
        trainer.create_optimizer_and_scheduler(spec["max_steps"])
    if not spec.get("eval_only"):
        trainer.train(resume_from_checkpoint=spec.get("resume"))
    eval_loss = trainer.evaluate()["eval_loss"]
    if not dist.is_initialized() or dist.get_rank() == 0:
        hist = trainer.state.log_history
        json.dump({"losses": [h["loss"] for h in hist if "loss" in h], "log_steps": [h["step"] for h in hist],
                   "eval_loss": eval_loss}, open(out_path, "w"))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
