"""``to_static``: ``torch.compile`` of each decoder layer for training passes (``apply_compile``).

On the CPU the layers compile through inductor's C++ backend and the attention is the FlashMask kernel in Triton's
interpreter. Compiled and eager runs must give the same loss and gradients (fp32; inductor may reorder sums, so
the bound is twice the eager fp32 run's distance to an fp64 copy of the model), evaluation under ``no_grad`` and generation with a KV cache must stay eager, and the state dict must keep its names.
"""

from __future__ import annotations

import copy
import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "transformers"))
from _llama_testing import hf_twin, tiny_model  # noqa: E402

from paddlenlp_ext.distributed import apply_compile, parallelize_model  # noqa: E402


def _batch():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 97, (1, 24), generator=g)
    pos = torch.cat([torch.arange(10), torch.arange(14)])[None]
    # two packed examples: keys of the first are masked for the second's rows (LTS = end of own example)
    sri = torch.tensor([10] * 10 + [24] * 14, dtype=torch.int32).view(1, 1, 24, 1)
    return ids, pos, sri


def _loss_and_grads(model, ids, pos=None, sri=None):
    model.zero_grad(set_to_none=True)
    kwargs = {} if pos is None else {"position_ids": pos, "attn_mask_startend_row_indices": sri}
    logits = model(ids, **kwargs)
    logits = getattr(logits, "logits", logits)  # transformers returns an output object
    loss = torch.nn.functional.cross_entropy(logits[0, :-1].double(), ids[0, 1:])
    loss.backward()
    return loss.detach(), {n: p.grad.detach().double() for n, p in model.named_parameters()}


def _errors(got, exact):
    loss, grads = got
    return [abs(loss - exact[0]).item()] + [(grads[n] - exact[1][n]).abs().max().item() for n in sorted(exact[1])]


def test_compiled_layers_match_eager_and_keep_names():
    """Budget per quantity: twice the eager fp32 model's distance to transformers' Llama in fp64 (same weights,
    plain causal batch), plus 1e-6. The packed batch then compares compiled with eager under the same budgets."""
    import torch._dynamo

    torch._dynamo.reset()
    eager = tiny_model(seed=1).train()
    compiled = copy.deepcopy(eager)
    keys = list(compiled.state_dict())
    assert apply_compile(compiled) == 2
    assert list(compiled.state_dict()) == keys  # checkpoints and adapters keep their names
    ids, pos, sri = _batch()
    hf64 = hf_twin(eager, torch.float64).train()
    exact = _loss_and_grads(hf64, ids)
    exact = (exact[0], {n: g for n, g in exact[1].items() if n in dict(eager.named_parameters())})
    budget = [2 * e + 1e-6 for e in _errors(_loss_and_grads(eager, ids), exact)]
    frames = torch._dynamo.utils.counters["frames"]["ok"]
    err = _errors(_loss_and_grads(compiled, ids), exact)
    assert torch._dynamo.utils.counters["frames"]["ok"] > frames  # the layers did go through dynamo
    assert all(e <= b for e, b in zip(err, budget)), list(zip(err, budget))
    packed = _errors(_loss_and_grads(compiled, ids, pos, sri), _loss_and_grads(eager, ids, pos, sri))
    assert all(e <= b for e, b in zip(packed, budget)), list(zip(packed, budget))


def test_no_grad_and_generation_stay_eager():
    import torch._dynamo

    torch._dynamo.reset()
    model = tiny_model(seed=2)
    reference = copy.deepcopy(model)
    apply_compile(model)
    ids, pos, sri = _batch()
    frames = dict(torch._dynamo.utils.counters["frames"])
    with torch.no_grad():
        out = model(ids, position_ids=pos, attn_mask_startend_row_indices=sri)
        want = reference(ids, position_ids=pos, attn_mask_startend_row_indices=sri)
    from paddlenlp_ext.transformers.generation import generate

    prompt = ids[:, :6]
    got = generate(model, prompt, max_new_tokens=4, do_sample=False)
    ref = generate(reference, prompt, max_new_tokens=4, do_sample=False)
    assert dict(torch._dynamo.utils.counters["frames"]) == frames  # nothing traced: these calls ran eagerly
    assert torch.equal(out, want) and torch.equal(got, ref)


def test_parallelize_model_compiles_only_with_to_static():
    class Args:
        to_static = False

    model = tiny_model(seed=4)
    parallelize_model(model, None, Args())
    assert all("forward" not in vars(layer) for layer in model.model.layers)
    Args.to_static = True
    parallelize_model(model, None, Args(), compile=False)
    assert all("forward" not in vars(layer) for layer in model.model.layers)
    parallelize_model(model, None, Args())
    assert all("forward" in vars(layer) for layer in model.model.layers)


def test_apply_compile_without_layers_names_the_model():
    with pytest.raises(ValueError, match="to_static: found no decoder layers.*Linear"):
        apply_compile(torch.nn.Linear(2, 2))


def test_launcher_trains_with_to_static_and_recompute(tmp_path, make_tiny_sft_job):
    from trainer_fixtures import load_run_finetune

    job = make_tiny_sft_job(tmp_path, n_train=6, n_dev=2)
    cfg = {"model_name_or_path": str(job / "model"), "dataset_name_or_path": str(job / "data"),
           "output_dir": str(job / "out"), "per_device_train_batch_size": 1, "max_steps": 2, "learning_rate": 3e-3,
           "logging_steps": 1, "save_strategy": "no", "max_length": 96, "src_length": 48, "flash_mask": True,
           "do_train": True, "do_eval": True, "disable_tqdm": True, "chat_after_train": False,
           "to_static": True, "recompute": True}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    summary = load_run_finetune().main([str(path)])
    assert summary["global_step"] == 2 and torch.isfinite(torch.tensor(summary["train_loss"]))
    assert (job / "out" / "model.safetensors").is_file()


def test_new_lengths_compile_once_dynamic():
    """A new batch length recompiles the layers once (dynamic shapes), not once per length: the attention's input
    checks build their messages only on failure (formatting a symbolic length pinned it; every length recompiled)."""
    import torch._dynamo

    torch._dynamo.reset()
    model = tiny_model(seed=5, num_hidden_layers=3).train()
    apply_compile(model)
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for length in (24, 32, 40, 48):
        model(torch.randint(0, 97, (1, length))).sum().backward()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - before <= 2  # static first, then dynamic


def test_deep_copy_of_a_compiled_model_runs_its_own_weights():
    """``copy.deepcopy`` after ``apply_compile`` (a reference or EMA model): the copy's layers must run the copy's
    weights, eagerly and compiled (an instance ``forward`` closed over the original layer's bound method would be
    copied as is, and the copy would silently run the original layers)."""
    import torch._dynamo

    torch._dynamo.reset()
    model = tiny_model(seed=5)
    apply_compile(model)
    twin = copy.deepcopy(model)
    plain = tiny_model(seed=5)
    with torch.no_grad():
        for p, q in zip(twin.parameters(), plain.parameters()):
            p.mul_(0.5)
            q.mul_(0.5)
    ids, pos, sri = _batch()
    with torch.no_grad():
        assert torch.equal(twin(ids), plain(ids))
    assert all(layer.forward.__self__ is layer for layer in twin.model.layers)
    got, want = twin(ids, position_ids=pos, attn_mask_startend_row_indices=sri), plain(ids, position_ids=pos,
                                                                                      attn_mask_startend_row_indices=sri)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["qwen2", "gemma3_text"])
def test_compiled_layers_of_transformers_models_match_eager(family, monkeypatch):
    """``to_static`` on the generic path (``HFCausalLM`` over transformers' own decoder layers, the FlashMask
    backend, sliding-window layers folded into the vectors): a packed batch's loss and gradients, compiled ==
    eager within twice the eager fp32 run's distance to transformers' ``eager`` attention in fp64 on each example
    alone (same weights), plus 1e-6."""
    import torch._dynamo

    monkeypatch.syspath_prepend(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    from tests._hf_tiny import tiny_config

    from paddlenlp_ext.transformers.hf_causal_lm import HFCausalLM

    torch._dynamo.reset()
    torch.manual_seed(6)
    eager = HFCausalLM.from_config(tiny_config(family)).train()
    compiled = copy.deepcopy(eager)
    assert apply_compile(compiled) == len(eager.model.layers)
    exact = HFCausalLM.from_config(tiny_config(family), attn_implementation="eager")
    exact.load_state_dict(eager.state_dict())
    exact = exact.double().train()
    ids, pos, sri = _batch()
    ids = ids % 96  # the tiny families' vocabulary
    exact.zero_grad(set_to_none=True)
    logits = torch.cat([exact(ids[:, :10]), exact(ids[:, 10:])], dim=1)  # the two examples alone
    loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])
    loss.backward()
    want = (loss.detach(), {n: p.grad.detach() for n, p in exact.named_parameters()})
    budget = [2 * e + 1e-6 for e in _errors(_loss_and_grads(eager, ids, pos, sri), want)]
    frames = torch._dynamo.utils.counters["frames"]["ok"]
    err = _errors(_loss_and_grads(compiled, ids, pos, sri), want)
    assert torch._dynamo.utils.counters["frames"]["ok"] > frames  # the layers did go through dynamo
    assert all(e <= b for e, b in zip(err, budget)), list(zip(err, budget))
