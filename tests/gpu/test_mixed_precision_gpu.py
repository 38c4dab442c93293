"""AMP O2 on a CUDA GPU: the Trainer with ``fp16_opt_level`` O1 vs O2 on a tiny Llama (FlashMask Triton kernel).

What is checked (5 optimizer steps, each over the same 4 packs as 2 micro-batches of 2, same seed for every run):

1. ``bf16 + O2`` picks ``precision == "o2"`` (``MasterWeights``) and fused AdamW; ``bf16 + O1`` picks autocast.
2. Losses: O2's distance to the fp32 run is within ``2 * max(d_o1, d_pure)``, with ``d_o1`` the O1-vs-fp32 and
   ``d_pure`` the pure-bf16-model-vs-fp32 distance measured here (a bf16 model with O2 set falls back to O1 with
   bf16 weights and AdamW states: the same-dtype run, whose first forward is O2's first forward).
3. Parameters, gradients and AdamW states are fp32 after O2 training; O2 with recompute gives the same losses.
4. Checkpoint save at step 3 and resume to step 5 under O2 reproduce the uninterrupted losses (to the same
   tolerance: the Triton backward is not bit-deterministic) and the bf16 copies are refreshed after the load.
5. ``MasterWeights`` with a fused CUDA AdamW (which does not bump ``_version``) refreshes its copies every step.

``GPU_RESULTS_JSON=path`` appends the measured numbers.
Run: ``python -m pytest -q tests/gpu/test_mixed_precision_gpu.py -s``.
"""

from __future__ import annotations


import pytest
import torch

from _records import record  # tests/gpu/_records.py

from paddlenlp_ext.trainer.arguments import TrainingArguments
from paddlenlp_ext.trainer.mixed_precision import MasterWeights
from paddlenlp_ext.trainer.trainer import Trainer
from paddlenlp_ext.transformers.llama import LlamaConfig, LlamaForCausalLM

pytestmark = pytest.mark.gpu

CFG = dict(vocab_size=2048, hidden_size=256, intermediate_size=704, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=512)
PACK_LEN = 256
STEPS = 5

if torch.cuda.is_available():
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 run must be real fp32
    torch.backends.cudnn.allow_tf32 = False


def _pack(g: torch.Generator, lengths) -> dict:
    """One packed SFT item (docs/design.md section 2, no batch dim): examples of ``lengths``, then padding."""
    ids = torch.zeros(PACK_LEN, dtype=torch.long)
    labels = torch.full((PACK_LEN,), -100, dtype=torch.long)
    pos = torch.zeros(PACK_LEN, dtype=torch.long)
    sri = torch.zeros(1, PACK_LEN, 1, dtype=torch.int32)
    start = 0
    for n in lengths:
        ex = torch.randint(1, CFG["vocab_size"], (n,), generator=g)
        end = start + n
        ids[start:end] = ex
        labels[start + n // 3: end - 1] = ex[n // 3 + 1:]  # first third is prompt
        pos[start:end] = torch.arange(n)
        sri[0, start:end, 0] = end
        start = end
    return {"input_ids": ids, "labels": labels, "position_ids": pos, "attn_mask_startend_row_indices": sri}


class Packs(torch.utils.data.Dataset):
    def __init__(self, n: int = 4, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.items = [_pack(g, (37 + 7 * (i % 5), 61, 90 - 9 * (i % 3), 29)) for i in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def _model(dtype=torch.float32, recompute=False):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**CFG, recompute=recompute)).to(dtype)


def _train(out, *, bf16=True, level="O2", dtype=torch.float32, recompute=False, max_steps=STEPS, save_steps=0,
           resume=None):
    args = TrainingArguments(output_dir=str(out), bf16=bf16, fp16_opt_level=level if bf16 else "O1",
                             per_device_train_batch_size=2, gradient_accumulation_steps=2, learning_rate=1e-3,
                             max_steps=STEPS, warmup_steps=0, logging_steps=1, seed=0, dataloader_shuffle=False,
                             save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500,
                             evaluation_strategy="no", disable_tqdm=True, report_to=["none"])
    t = Trainer(_model(dtype, recompute), args, train_dataset=Packs(4))  # every step sees the same 4 packs
    t.compute_max_steps = lambda: max_steps
    if max_steps != STEPS:
        t.create_optimizer_and_scheduler(STEPS)  # same schedule as the full run
    t.train(resume_from_checkpoint=resume)
    return t


def _losses(t):
    return [h["loss"] for h in t.state.log_history if "loss" in h]


def _dist(a, b):
    return max(abs(x - y) for x, y in zip(a, b))


def test_trainer_o1_vs_o2_losses_checkpoint(tmp_path):
    fp32 = _train(tmp_path / "fp32", bf16=False)
    o1 = _train(tmp_path / "o1", level="O1")
    o2 = _train(tmp_path / "o2")
    pure = _train(tmp_path / "pure", dtype=torch.bfloat16)
    assert (fp32.precision, o1.precision, o2.precision, pure.precision) == ("fp32", "o1", "o2", "o1")
    assert isinstance(o2.master_weights, MasterWeights) and o1.master_weights is None
    assert o2.optimizer.defaults["fused"] is True  # every trainable parameter is a CUDA plain tensor
    d_o1, d_pure, d_o2 = (_dist(_losses(t), _losses(fp32)) for t in (o1, pure, o2))
    tol = 2 * max(d_o1, d_pure)
    record("o2_vs_o1_losses", fp32=_losses(fp32), o1=_losses(o1), o2=_losses(o2), pure_bf16=_losses(pure),
            d_o1=d_o1, d_o2=d_o2, d_pure=d_pure, tol=tol)
    assert d_o2 <= tol, (d_o2, tol)
    assert _losses(o2)[-1] < _losses(o2)[0]  # it trains
    for n, p in o2.model.named_parameters():
        assert p.dtype == torch.float32, n
    states = [s for st in o2.optimizer.state.values() for s in st.values() if s.ndim > 0]
    assert states and all(s.dtype == torch.float32 for s in states)

    rec = _train(tmp_path / "o2_recompute", recompute=True)
    d_rec = _dist(_losses(rec), _losses(o2))
    record("o2_recompute", losses=_losses(rec), d_vs_o2=d_rec)
    assert d_rec <= tol, (d_rec, tol)

    full = _train(tmp_path / "ckpt_full", save_steps=3)
    _train(tmp_path / "ckpt_split", save_steps=3, max_steps=3)
    resumed = _train(tmp_path / "ckpt_split", save_steps=3, resume=str(tmp_path / "ckpt_split" / "checkpoint-3"))
    assert resumed.state.global_step == STEPS and resumed.precision == "o2"
    d_res = _dist(_losses(resumed)[3:], _losses(full)[3:])
    record("o2_resume", full=_losses(full), resumed=_losses(resumed), d=d_res)
    assert d_res <= tol, (d_res, tol)
    for p, master in zip(resumed.master_weights.params, resumed.master_weights.masters):
        assert p.data_ptr() == master.data_ptr()  # fp32 masters are back in the parameters


def test_master_weights_fused_adamw_refresh():
    model = _model().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    mw = MasterWeights(model, optimizer=opt)
    item = Packs(1)[0]
    batch = {k: v[None].cuda() for k, v in item.items()}
    for _ in range(3):
        with mw.compute():
            for p, master in zip(mw.params, mw.masters):
                assert p.dtype == torch.bfloat16 and torch.equal(p.detach(), master.to(torch.bfloat16))
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(batch["input_ids"], batch["position_ids"], batch["attn_mask_startend_row_indices"])
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(),
                                                         ignore_index=-100)
            loss.backward()
        assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in mw.params)
        opt.step()
        opt.zero_grad(set_to_none=True)
