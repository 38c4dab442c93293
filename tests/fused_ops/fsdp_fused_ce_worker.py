"""Worker of test_fused_ce_fsdp.py: ``sft_loss`` fused vs unfused on a tiny Llama under FSDP2 (2 ranks, gloo).

``python -m torch.distributed.run --nproc_per_node 2 fsdp_fused_ce_worker.py OUT.json``. For tied and untied
embeddings, each rank computes the loss of its own pack both ways on a freshly sharded model (same seed), runs
backward, gathers every parameter gradient (``full_tensor``) and a no-grad evaluation loss (the root is then
resharded and the head weight is gathered by ``hidden_states_and_head``). Rank 0 writes the largest differences.
"""

from __future__ import annotations

import json
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from paddlenlp_ext.distributed import init_distributed, parallelize_model
from paddlenlp_ext.trainer.arguments import TrainingArguments
from paddlenlp_ext.trainer.loss import sft_loss
from paddlenlp_ext.transformers.llama import LlamaConfig, LlamaForCausalLM


def make_batch(seed: int, vocab: int = 96, seq: int = 24) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (2, seq), generator=g)
    labels = torch.where(torch.rand(2, seq, generator=g) < 0.6, torch.randint(0, vocab, (2, seq), generator=g), -100)
    pos = torch.arange(seq).expand(2, seq).clone()
    sri = torch.full((2, 1, seq, 1), seq, dtype=torch.int32)
    return {"input_ids": ids, "labels": labels, "position_ids": pos, "attn_mask_startend_row_indices": sri}


def run(tied: bool, fused: bool, rank: int, dims, args) -> dict:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied,
                      max_position_embeddings=64)
    model = parallelize_model(LlamaForCausalLM(cfg), dims, args)
    loss, _, _ = sft_loss(model, make_batch(rank), fused=fused)
    loss.backward()
    grads = {}
    for n, p in model.named_parameters():
        g = p.grad
        grads[n] = (g.full_tensor() if isinstance(g, DTensor) else g).clone()
    with torch.no_grad():
        ev = sft_loss(model, make_batch(10 + rank), fused=fused)[0]
    sums = torch.stack([loss.detach(), ev])
    dist.all_reduce(sums)
    return {"loss": float(sums[0]), "eval": float(sums[1]), "grads": grads}


def main(out_path: str) -> None:
    tmp = tempfile.mkdtemp()
    args = TrainingArguments(output_dir=tmp, device="cpu", sharding="stage2", report_to=["none"])
    dims = init_distributed(args)
    rank = dist.get_rank()
    out = {}
    for tied in (True, False):
        a, b = run(tied, False, rank, dims, args), run(tied, True, rank, dims, args)
        rel = max(float((b["grads"][k] - a["grads"][k]).abs().max() / a["grads"][k].abs().max())
                  for k in a["grads"])
        out["tied" if tied else "untied"] = {
            "loss_unfused": a["loss"], "loss_fused": b["loss"], "eval_unfused": a["eval"], "eval_fused": b["eval"],
            "grad_max_rel": rel, "n_grads": len(a["grads"]), "same_names": sorted(a["grads"]) == sorted(b["grads"])}
    if rank == 0:
        json.dump(out, open(out_path, "w"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
