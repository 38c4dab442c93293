"""Helpers of the trainer tests: a tiny model with the model interface, synthetic packs, arguments.

The tiny model keeps the trainer tests independent of the Llama/FlashMask stack (which has its own tests) and
fast on 2 CPU cores; it honours ``forward(input_ids, position_ids, attn_mask_startend_row_indices) -> logits``.
"""

import pytest
import torch
from torch import nn

from paddlenlp_ext.trainer.arguments import TrainingArguments

VOCAB, HIDDEN, L = 32, 16, 24


class TinyLM(nn.Module):
    """Embedding -> (MLP with bias, LayerNorm named ``norm``) -> lm_head; logits ``[B, L, V]`` fp32."""

    def __init__(self, vocab: int = VOCAB, hidden: int = HIDDEN):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(64, hidden)
        self.mlp = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids, position_ids=None, attn_mask_startend_row_indices=None):
        h = self.embed_tokens(input_ids)  # [B, L, H]
        if position_ids is not None:
            h = h + self.pos(position_ids)
        h = self.norm(h + torch.tanh(self.mlp(h)))
        return self.lm_head(h)  # [B, L, V]


def make_pack(g: torch.Generator, lengths=(10, 8), total: int = L) -> dict:
    """One packed SFT example (docs/design.md section 2 layout, without the batch dim)."""
    ids, labels, pos, sri = [], [], [], []
    start = 0
    for n in lengths:
        x = torch.randint(1, VOCAB, (n,), generator=g)
        ids.append(x)
        lab = torch.cat([x[1:], torch.tensor([0])]).clone()
        lab[: n // 2] = -100  # prompt part unsupervised
        labels.append(lab)
        pos.append(torch.arange(n))
        sri.append(torch.full((n,), start + n))
        start += n
    pad = total - start
    ids.append(torch.zeros(pad, dtype=torch.long))
    labels.append(torch.full((pad,), -100))
    pos.append(torch.zeros(pad, dtype=torch.long))
    sri.append(torch.zeros(pad, dtype=torch.long))
    return {"input_ids": torch.cat(ids), "labels": torch.cat(labels), "position_ids": torch.cat(pos),
            "attn_mask_startend_row_indices": torch.cat(sri).to(torch.int32).view(1, total, 1)}


class PackDataset(torch.utils.data.Dataset):
    """``n`` synthetic packs with varying example lengths (so label counts differ between packs)."""

    def __init__(self, n: int = 16, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for i in range(n):
            a = 4 + i % 7
            b = 3 + (i * 5) % 9
            self.items.append(make_pack(g, (a, b)))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def load_run_finetune():
    """``llm/run_finetune.py`` imported as the module ``run_finetune`` (it is a script, not a package)."""
    from tests._scripts import load_script  # here: trainer_dist_worker.py imports this file without the repo root

    return load_script("llm/run_finetune.py")


def write_sft_config(root, out, settings: dict, **over) -> list:
    """``[path]``: the argv of ``run_finetune.main`` for a tiny job made by ``make_tiny_sft_job`` at ``root``: a
    JSON config ``<out>.json`` beside ``out`` holding the job's model and data paths, ``output_dir=out``, then
    ``settings`` and ``over`` (later keys win)."""
    import json

    cfg = {"model_name_or_path": str(root / "model"), "dataset_name_or_path": str(root / "data"),
           "output_dir": str(out), **settings, **over}
    path = out.parent / f"{out.name}.json"
    path.write_text(json.dumps(cfg))
    return [str(path)]
