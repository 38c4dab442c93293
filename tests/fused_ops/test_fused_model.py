"""Fused paths inside the Llama model and the SFT loss / trainer (CPU).

- ``sft_loss`` fused (hidden states + chunked CE) vs unfused (full logits): same loss and parameter gradients.
- A few Trainer steps with ``use_fused_linear_cross_entropy`` on and off (``set_llm_config``): same losses.
- ``use_fused_rms_norm/rope/swiglu``: eager fallback on CPU is bitwise the unfused model; the compiled functions
  (Inductor on CPU, ``COMPILE_ON_CPU``) match the eager math, and packs of 3 lengths compile at most twice.

Tolerances: fp32 runs of the same model differ only by summation order; measured: losses ~1e-7 relative,
gradients max |diff| <= 1.1e-7 of the tensor's max |grad|; the bounds below are ~10x those.
"""

import pytest
import torch

from paddlenlp_ext.ops import FUSED_DEFAULTS, elementwise, set_llm_config
from paddlenlp_ext.trainer.loss import sft_loss, use_fused_loss
from paddlenlp_ext.transformers.llama import LlamaConfig, LlamaForCausalLM

VOCAB, L = 96, 40


def tiny_llama(seed=0, tie=True):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=tie)
    return LlamaForCausalLM(cfg).train()


def make_pack(g, lengths=(14, 19), total=L):
    """One packed SFT row (design.md section 2): labels -100 on the first third of each example and padding."""
    ids, labels, pos, sri, start = [], [], [], [], 0
    for n in lengths:
        x = torch.randint(1, VOCAB, (n,), generator=g)
        lab = torch.cat([x[1:], torch.tensor([2])])
        lab[: n // 3] = -100
        ids.append(x), labels.append(lab), pos.append(torch.arange(n)), sri.append(torch.full((n,), start + n))
        start += n
    pad = total - start
    ids.append(torch.zeros(pad, dtype=torch.long)), labels.append(torch.full((pad,), -100))
    pos.append(torch.zeros(pad, dtype=torch.long)), sri.append(torch.zeros(pad, dtype=torch.long))
    return {"input_ids": torch.cat(ids), "labels": torch.cat(labels), "position_ids": torch.cat(pos),
            "attn_mask_startend_row_indices": torch.cat(sri).to(torch.int32).view(1, total, 1)}


def batch_of(seed=0, rows=2):
    g = torch.Generator().manual_seed(seed)
    packs = [make_pack(g, (5 + 3 * i, 11 + 2 * i)) for i in range(rows)]
    return {k: torch.stack([p[k] for p in packs]) for k in packs[0]}


def _loss_and_grads(model, batch, **kw):
    model.zero_grad(set_to_none=True)
    loss, count, _ = sft_loss(model, batch, **kw)
    loss.backward()
    return loss.detach(), count, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("skip", [True, False])
def test_sft_loss_fused_equals_unfused(tie, skip):
    model, batch = tiny_llama(tie=tie), batch_of()
    assert use_fused_loss(model)  # default on for a plain lm_head
    ref, n_ref, g_ref = _loss_and_grads(model, batch, fused=False)
    got, n_got, g_got = _loss_and_grads(model, batch, fused=True, skip_ignored=skip)
    assert int(n_got) == int(n_ref) == int((batch["labels"] != -100).sum())
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=0)
    assert g_got.keys() == g_ref.keys()
    for k in g_ref:  # measured: max |diff| / max |grad| <= 1.1e-7 (fp32 summation order)
        assert (g_got[k] - g_ref[k]).abs().max() <= 1e-6 * g_ref[k].abs().max(), k


def test_fused_key_off_and_unsupported_heads():
    model = tiny_llama()
    set_llm_config(model, type("A", (), {"use_fused_linear_cross_entropy": False})())
    assert not use_fused_loss(model)

    class NoTrunk(torch.nn.Module):
        def forward(self, input_ids, **_):
            return torch.zeros(*input_ids.shape, VOCAB, requires_grad=True)

    assert not use_fused_loss(NoTrunk())
    with pytest.raises(ValueError, match="plain nn.Linear"):
        sft_loss(NoTrunk(), batch_of(), fused=True)


def test_set_llm_config_reaches_every_module_config():
    model = tiny_llama()
    args = type("A", (), {k: True for k in FUSED_DEFAULTS})()
    configs = set_llm_config(model, args)
    assert len(configs) == 1 and configs[0] is model.config
    assert model.model.layers[0].input_layernorm.config.use_fused_rms_norm
    assert "use_fused_rope" not in model.config.to_dict()  # a training switch, not written to config.json


def test_trainer_losses_same_with_fused_ce_on_and_off(tmp_path):
    from paddlenlp_ext.trainer import Trainer
    from paddlenlp_ext.trainer.arguments import TrainingArguments

    g = torch.Generator().manual_seed(1)
    data = [make_pack(g, (6 + i % 5, 9 + (3 * i) % 7)) for i in range(8)]
    losses = {}
    for on in (True, False):
        args = TrainingArguments(output_dir=str(tmp_path / str(on)), per_device_train_batch_size=2, max_steps=4,
                                 learning_rate=1e-2, logging_steps=1, save_strategy="no", disable_tqdm=True,
                                 seed=3, device="cpu", report_to=["none"], dataloader_shuffle=False,
                                 use_fused_linear_cross_entropy=on)
        model = tiny_llama(seed=5)
        set_llm_config(model, args)
        assert use_fused_loss(model) is on
        trainer = Trainer(model, args, train_dataset=data)
        trainer.train()
        losses[on] = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses[True]) == 4
    assert losses[True] == pytest.approx(losses[False], rel=1e-6)
    assert losses[True][-1] < losses[True][0]  # it trains


def test_fused_elementwise_flags_eager_fallback_is_bitwise_on_cpu():
    batch = batch_of(1)
    ref_model = tiny_llama(seed=2)
    ref, _, g_ref = _loss_and_grads(ref_model, batch, fused=False)
    model = tiny_llama(seed=2)
    for k in ("use_fused_rms_norm", "use_fused_rope", "use_fused_swiglu"):
        setattr(model.config, k, True)
    got, _, g_got = _loss_and_grads(model, batch, fused=False)
    assert torch.equal(got, ref)
    assert all(torch.equal(g_got[k], g_ref[k]) for k in g_ref)


def _run(fn, *xs):
    xs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in xs]
    out = fn(*xs)
    out = out if isinstance(out, tuple) else (out,)
    sum((o.float() * torch.linspace(-1, 1, o.numel()).view(o.shape)).sum() for o in out).backward()
    return [o.detach() for o in out] + [x.grad for x in xs if x.grad is not None]


def test_compiled_ops_match_eager_and_do_not_recompile_per_length(compile_on_cpu):
    from torch._dynamo.utils import counters

    g = torch.Generator().manual_seed(0)
    counters.clear()
    for seq in (24, 40, 56):  # three pack lengths: static graph, then one dynamic graph
        x = torch.randn(2, seq, 32, generator=g)
        w = torch.rand(32, generator=g) + 0.5
        q, k = torch.randn(2, seq, 4, 8, generator=g), torch.randn(2, seq, 2, 8, generator=g)
        pos = torch.arange(seq).expand(2, seq)
        freqs = pos[..., None].float() * torch.rand(4, generator=g)
        cos, sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()
        gate, up = torch.randn(2, seq, 64, generator=g), torch.randn(2, seq, 64, generator=g)
        cases = [(elementwise.fused_rms_norm, elementwise.rms_norm_eager, (x, w, 1e-5)),
                 (elementwise.fused_rope, elementwise.rope_eager, (q, k, cos, sin)),
                 (elementwise.fused_swiglu, elementwise.swiglu_eager, (gate, up))]
        for fused, eager, xs in cases:
            tens = [t for t in xs if isinstance(t, torch.Tensor)]
            extra = [t for t in xs if not isinstance(t, torch.Tensor)]
            got = _run(lambda *a: fused(*a, *extra), *tens)
            ref = _run(lambda *a: eager(*a, *extra), *tens)
            truth = _run(lambda *a: eager(*a, *extra), *(t.double() for t in tens))
            for a, b, t in zip(got, ref, truth):  # bound: 4x the eager fp32 error against fp64 + 4 fp32 ulps
                bound = 4 * (b.double() - t).abs().max() + 4 * 2 ** -23 * t.abs().max()
                assert (a.double() - t).abs().max() <= bound, (fused.__name__, seq)
    assert elementwise._failed == set()
    assert counters["stats"]["unique_graphs"] <= 2 * 3, dict(counters["stats"])


def test_compiled_bf16_within_one_ulp_of_eager(compile_on_cpu):
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 16, 2, 8, generator=g).bfloat16(), torch.randn(1, 16, 2, 8, generator=g).bfloat16()
    ang = torch.rand(1, 16, 8, generator=g) * 6
    cos, sin = ang.cos().bfloat16(), ang.sin().bfloat16()
    gate, up = torch.randn(4, 64, generator=g).bfloat16(), torch.randn(4, 64, generator=g).bfloat16()
    x, w = torch.randn(4, 32, generator=g).bfloat16(), (torch.rand(32, generator=g) + 0.5).bfloat16()
    for got, ref in ((elementwise.fused_rope(q, k, cos, sin), elementwise.rope_eager(q, k, cos, sin)),
                     ((elementwise.fused_swiglu(gate, up),), (elementwise.swiglu_eager(gate, up),)),
                     ((elementwise.fused_rms_norm(x, w, 1e-6),), (elementwise.rms_norm_eager(x, w, 1e-6),))):
        for a, b in zip(got, ref):
            assert a.dtype == b.dtype == torch.bfloat16
            # eager rounds each bf16 op, the fused kernel once: <= 2 bf16 ulps of the result's magnitude
            assert ((a.float() - b.float()).abs() <= 2 * 2 ** -8 * b.float().abs() + 1e-6).all()


def test_dtensor_inputs_run_eagerly(compile_on_cpu):
    """Under TP / sequence parallel the norm input and weights are DTensors: the fused entry points must not
    hand them to torch.compile (one-rank gloo mesh here)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
        g = torch.Generator().manual_seed(3)
        x, w = torch.randn(2, 5, 8, generator=g), torch.rand(8, generator=g) + 0.5
        dx, dw = distribute_tensor(x, mesh, [Replicate()]), distribute_tensor(w, mesh, [Replicate()])
        out = elementwise.fused_rms_norm(dx, dw, 1e-6)
        assert isinstance(out, DTensor) and not elementwise._compiled
        assert torch.equal(out.to_local(), elementwise.rms_norm_eager(x, w, 1e-6))
    finally:
        if owns:
            dist.destroy_process_group()


def test_ernie_head_with_bias_fused_equals_unfused():
    """ERNIE-3.5-SE's LM head has a bias: the fused path adds it inside the chunked GEMM and returns its grad."""
    from paddlenlp_ext.transformers.ernie35 import Ernie35Config, Ernie35ForCausalLM

    torch.manual_seed(0)
    model = Ernie35ForCausalLM(Ernie35Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=3, num_attention_heads=4, max_position_embeddings=128,
                                             use_bias=True)).train()
    assert model.lm_head.bias is not None and use_fused_loss(model)
    batch = batch_of(2)
    ref, _, g_ref = _loss_and_grads(model, batch, fused=False)
    got, _, g_got = _loss_and_grads(model, batch, fused=True)
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=0)
    assert "lm_head.bias" in g_got and g_got.keys() == g_ref.keys()
    for k in g_ref:
        assert (g_got[k] - g_ref[k]).abs().max() <= 1e-6 * g_ref[k].abs().max(), k
