"""Training scenarios for the distributed tests: run under torchrun (N ranks) or in-process (1 rank).

``python -m torch.distributed.run --nproc_per_node N tests/distributed/worker.py SPEC.json OUT.json`` runs
every scenario of SPEC in order inside one process group and rank 0 writes ``{name: {"losses", "grad_norms"}}``.
A scenario is a dict:

- ``name``; ``layout``: ``{dp, sharding, tp, sharding_stage, tensor_parallel_output, sequence_parallel,
  tp_fp32_reduce, tp_impl}``;
- ``start``/``end``: first step / step after the last; ``micro``: micro-batches per step (default 1);
- ``model``: ``"llama"`` (default), ``"ernie"`` or ``"reward"`` (see ``run_reward_scenario``); ``vocab`` (128);
  ``tied``; ``lora``; ``from_pretrained``;
- ``load``/``save_at``/``save``: DCP checkpoint dirs and the step after which to save;
- ``export`` (+ ``export_max_shard_bytes``): gathered HF dir; ``adapters``: gathered PEFT dir;
- ``clip`` (+ ``clip_impl``: ``"torch"``): clip threshold; ``hidden_path``: loss via ``hidden_states_and_head``;
- ``eval_after``: no-grad loss on batch ``end``; ``seq``: sequence length; ``expect_error``: record a ValueError;
- ``record_local_shapes``: also return rank 0's local shape of every projection parameter.

Steps are deterministic: global batch ``k`` is built from seed ``k``; each rank trains on its dp slice.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn.functional as F

from paddlenlp_ext.distributed import (ParallelDims, all_reduce_sum_dp, dp_slice, init_distributed,
                                       loss_parallel_context, parallelize_model, to_local_loss)

GLOBAL_BATCH, SEQ = 4, 16


def make_batch(step: int, vocab: int = 128, seq: int = SEQ) -> dict[str, torch.Tensor]:
    """Global packed batch for ``step``: each row packs two examples then padding (docs/design.md section 2)."""
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(1, vocab, (GLOBAL_BATCH, seq), generator=g)
    labels = torch.full_like(ids, -100)
    pos = torch.zeros_like(ids)
    sri = torch.zeros(GLOBAL_BATCH, 1, seq, 1, dtype=torch.int32)
    for b in range(GLOBAL_BATCH):
        a = int(torch.randint(3, 9, (1,), generator=g))
        e = int(torch.randint(a + 3, seq + 1, (1,), generator=g))
        for s, t in ((0, a), (a, e)):
            pos[b, s:t] = torch.arange(t - s)
            sri[b, 0, s:t, 0] = t
            labels[b, s + 1:t - 1] = ids[b, s + 2:t]  # first token is prompt; targets shifted inside the example
        ids[b, e:] = 0
    return {"input_ids": ids, "labels": labels, "position_ids": pos, "attn_mask_startend_row_indices": sri}


def build_model(tied: bool, kind: str = "llama", vocab: int = 128):
    """Tiny fp32 Llama (hidden 64, 2 layers, 4 heads, 2 KV heads, vocab 128), identical on every rank."""
    torch.manual_seed(0)
    if kind == "ernie":  # head attention layer, one fused parallel layer, tail FFN layer
        from paddlenlp_ext.transformers.ernie35 import Ernie35Config, Ernie35ForCausalLM

        return Ernie35ForCausalLM(Ernie35Config(vocab_size=128, hidden_size=64, intermediate_size=128,
                                                num_hidden_layers=3, num_attention_heads=4,
                                                max_position_embeddings=64))
    from paddlenlp_ext.transformers.llama import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied,
                         initializer_range=0.05, max_position_embeddings=64)
    return LlamaForCausalLM(config)


def save_train_state(path, model, opt, sched, trainer_state) -> None:
    """DCP save of model + optimizer + scheduler + step (what trainer/checkpoint.py does, minus files)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd, "scheduler": sched.state_dict(), "trainer": trainer_state},
             checkpoint_id=path)


def load_train_state(path, model, opt, sched) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd, "scheduler": sched.state_dict(), "trainer": {"global_step": -1}}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    sched.load_state_dict(state["scheduler"])
    return state["trainer"]


def grad_norm(model) -> float:
    from torch.distributed.tensor import DTensor

    total = 0.0
    for p in model.parameters():
        if p.grad is not None:
            g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            total += float(g.double().pow(2).sum())
    return total ** 0.5


def run_scenario(sc: dict, world_size: int) -> dict:
    lay = dict(sc.get("layout", {}))
    # CPU + gloo here; on a GPU machine (tests/distributed/test_gpu_distributed.py) CUDA + NCCL in fp32.
    dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    dims = ParallelDims(dp=lay.get("dp", -1), sharding=lay.get("sharding", -1), tp=lay.get("tp", -1),
                        world_size=world_size, sharding_stage=lay.get("sharding_stage"),
                        sequence_parallel=lay.get("sequence_parallel", False),
                        tensor_parallel_output=lay.get("tensor_parallel_output", False), device_type=dev.type,
                        tp_fp32_reduce=lay.get("tp_fp32_reduce"), tp_impl=lay.get("tp_impl", "auto"))
    if world_size > 1:
        dims.build_mesh()
    if sc.get("from_pretrained"):
        if sc.get("model") == "ernie":
            from paddlenlp_ext.transformers.ernie35 import Ernie35ForCausalLM as cls
        else:
            from paddlenlp_ext.transformers.llama import LlamaForCausalLM as cls

        model = cls.from_pretrained(sc["from_pretrained"])
    else:
        model = build_model(sc.get("tied", False), sc.get("model", "llama"), sc.get("vocab", 128))
    if sc.get("lora"):
        from paddlenlp_ext.peft.lora import LoRAConfig, apply_lora

        apply_lora(model, LoRAConfig(r=4, lora_alpha=8))
    model = parallelize_model(model.to(dev), dims, SimpleNamespace(bf16=False))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
    start = sc.get("start", 0)
    if sc.get("load"):
        state = load_train_state(sc["load"], model, opt, sched)
        assert state["global_step"] == start, (state, start)
    if sc.get("eval_before"):  # a no-grad forward before training (the launchers' "dev loss before")
        with torch.no_grad():
            b = {k: v[dp_slice(GLOBAL_BATCH, dims)].to(dev) for k, v in make_batch(99).items()}
            model(b["input_ids"], position_ids=b["position_ids"],
                  attn_mask_startend_row_indices=b["attn_mask_startend_row_indices"])
    losses, norms = [], []
    for step in range(start, sc["end"]):
        global_batch = make_batch(step, vocab=sc.get("vocab", 128), seq=sc.get("seq", SEQ))
        batch = {k: v[dp_slice(GLOBAL_BATCH, dims)].to(dev) for k, v in global_batch.items()}
        # Token count of the whole step (all micro-batches, all data-parallel ranks; never TP ranks).
        count = all_reduce_sum_dp((batch["labels"] != -100).sum(), dims)
        n_micro = sc.get("micro", 1)
        step_sum = torch.zeros((), device=dev)
        for m in range(n_micro):
            mb = {k: v.chunk(n_micro)[m] for k, v in batch.items()}
            with loss_parallel_context(dims):
                if sc.get("hidden_path"):  # DPO-style: hidden states + head weight applied by the loss
                    from paddlenlp_ext.distributed import hidden_states_and_head

                    hidden, weight = hidden_states_and_head(
                        model, mb["input_ids"], position_ids=mb["position_ids"],
                        attn_mask_startend_row_indices=mb["attn_mask_startend_row_indices"])
                    logits = hidden @ weight.T  # [b, L, V]
                else:
                    logits = model(mb["input_ids"], position_ids=mb["position_ids"],
                                   attn_mask_startend_row_indices=mb["attn_mask_startend_row_indices"])
                loss_sum = F.cross_entropy(logits.float().flatten(0, 1), mb["labels"].flatten(),
                                           ignore_index=-100, reduction="sum")
                loss_sum = to_local_loss(loss_sum)
                (loss_sum / count).backward()
            step_sum += loss_sum.detach()
        losses.append(float(all_reduce_sum_dp(step_sum, dims) / count))
        norms.append(grad_norm(model))
        if sc.get("clip"):  # the clip's norm replaces the test's own full-tensor norm; clipping is active
            from paddlenlp_ext.distributed import clip_grad_norm_

            if sc.get("clip_impl") == "torch":  # stock torch: works because every param is a DTensor on one mesh
                got = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None],
                                                     sc["clip"])
                norms[-1] = float(got.full_tensor() if hasattr(got, "full_tensor") else got)
            else:
                norms[-1] = float(clip_grad_norm_(model.parameters(), sc["clip"]))
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if sc.get("save_at") == step + 1:
            save_train_state(sc["save"], model, opt, sched, {"global_step": step + 1})
    if sc.get("eval_after"):  # loss on the next global batch, without a step (checks exported weights)
        global_batch = make_batch(sc["end"], vocab=sc.get("vocab", 128))
        batch = {k: v[dp_slice(GLOBAL_BATCH, dims)].to(dev) for k, v in global_batch.items()}
        with torch.no_grad(), loss_parallel_context(dims):
            logits = model(batch["input_ids"], position_ids=batch["position_ids"],
                           attn_mask_startend_row_indices=batch["attn_mask_startend_row_indices"])
            loss_sum = to_local_loss(F.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten(),
                                                     ignore_index=-100, reduction="sum"))
        count = all_reduce_sum_dp((batch["labels"] != -100).sum(), dims)
        eval_loss = float(all_reduce_sum_dp(loss_sum, dims) / count)
        from torch.distributed.tensor import DTensor

        # Under FSDP a gathered (unsharded) parameter is a plain tensor (pure FSDP) or a tp-only DTensor; the
        # decoder layers must be sharded again after a no-grad forward (the root group stays gathered).
        sharded_after_eval = all(isinstance(p, DTensor) and p.device_mesh.mesh_dim_names[0] in ("sharding", "dp")
                                 for n, p in model.named_parameters() if ".layers." in n)
    if sc.get("export"):
        from paddlenlp_ext.distributed.checkpoint import save_full_model

        save_full_model(model, sc["export"], max_shard_bytes=sc.get("export_max_shard_bytes"))
    if sc.get("adapters"):
        from paddlenlp_ext.distributed.checkpoint import save_full_adapters

        save_full_adapters(model, sc["adapters"])
    out = {"losses": losses, "grad_norms": norms}
    if sc.get("record_local_shapes"):  # what this rank holds of the fused / split projections
        from torch.distributed.tensor import DTensor

        out["local_shapes"] = {n: list(p.to_local().shape if isinstance(p, DTensor) else p.shape)
                               for n, p in model.named_parameters() if "proj" in n}
    if sc.get("eval_after"):
        out["eval_loss"] = eval_loss
        out["sharded_after_eval"] = sharded_after_eval
    return out


def run_reward_scenario(sc: dict, world_size: int) -> dict:
    """A reward model (``paddlenlp_ext.trl.reward_model.LlamaForScore``: trunk + ``score`` head applied after the
    forward): optional no-grad forwards first (``eval_before``: how many), then AdamW steps on ``sum(score^2)`` at
    fixed positions, then the same scores without autograd."""
    from paddlenlp_ext.transformers.llama import LlamaConfig
    from paddlenlp_ext.trl.reward_model import LlamaForScore

    lay = dict(sc.get("layout", {}))
    dims = ParallelDims(dp=lay.get("dp", -1), sharding=lay.get("sharding", -1), tp=lay.get("tp", -1),
                        world_size=world_size, sharding_stage=lay.get("sharding_stage"))
    if world_size > 1:
        dims.build_mesh()
    torch.manual_seed(0)
    model = LlamaForScore(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, initializer_range=0.05))
    model = parallelize_model(model, dims, SimpleNamespace(bf16=False))

    def scores(step):
        b = {k: v[dp_slice(GLOBAL_BATCH, dims)] for k, v in make_batch(step).items()}
        rows = torch.arange(b["input_ids"].shape[0])
        hidden = model(b["input_ids"], b["position_ids"], b["attn_mask_startend_row_indices"])
        return model.score_at(hidden, rows, torch.full_like(rows, 5))  # [b]

    if sc.get("eval_before"):
        model.eval()
        with torch.no_grad():
            for k in range(int(sc["eval_before"])):
                scores(99 + k)
        model.train()
    # Built after the evaluation, as the launchers do: it must hold the sharded parameters.
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(sc["end"]):
        loss = scores(step).pow(2).sum()
        (loss / GLOBAL_BATCH).backward()
        losses.append(float(all_reduce_sum_dp(loss.detach(), dims)) / GLOBAL_BATCH)
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        eval_loss = float(all_reduce_sum_dp(scores(sc["end"]).pow(2).sum(), dims)) / GLOBAL_BATCH
    return {"losses": losses, "eval_loss": eval_loss}


def main(spec_path: str, out_path: str) -> None:
    spec = json.load(open(spec_path))
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 comparisons on GPU
    torch.backends.cudnn.allow_tf32 = False
    init_distributed(SimpleNamespace(tensor_parallel_degree=1, sharding_parallel_degree=-1, sharding="stage1"))
    world = dist.get_world_size() if dist.is_initialized() else 1
    results = {}
    for sc in spec:
        try:
            run = run_reward_scenario if sc.get("model") == "reward" else run_scenario
            results[sc["name"]] = run(sc, world)
        except ValueError as e:  # a scenario that must be rejected records the message
            if not sc.get("expect_error"):
                raise
            results[sc["name"]] = {"error": str(e)}
    if not dist.is_initialized() or dist.get_rank() == 0:
        json.dump(results, open(out_path, "w"))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
