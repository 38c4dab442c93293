"""``llm/run_finetune.py`` under torchrun (2 processes, gloo): the trainer's calls into paddlenlp_ext.distributed.

One process vs FSDP x 1 and TP 2 (+ vocab-parallel loss, stock gradient clipping) on a tiny random Llama with
the SmolLM2 tokenizer; then a checkpoint written under FSDP 2 is resumed under TP 2 (reshard on load). The same for a
tiny ERNIE-3.5-SE under TP 2, resumed in one process. Losses and gradient norms come from ``trainer_state.json``.

``sharding: "stage2 offload"`` on the CPU (offload skipped with one warning) and LoRA on the LM head under TP 2
equal one process too.

This is a plumbing test (token counts, data slices, gradient scale, loss_parallel, clipping, checkpoint
resharding through the real trainer); the tight numerics are in test_distributed.py. Bound: 1e-4 relative.
Measured: TP 2 differs from one process by 6e-7 at step 1 (vocab-parallel log-sum-exp over 2 x 24576 instead of
49152 terms) growing to 1.1e-5 at step 4 (AdamW amplifies fp32 noise in near-zero gradients of the 49k-row
tied embedding); any plumbing error (double-counted tokens, wrong slice, gradients off by the dp size) moves
these numbers by >= 1e-2.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from tests.distributed.launcher_run import run_finetune

pytestmark = pytest.mark.distributed

RTOL = 1e-4


@pytest.fixture(scope="module")
def job(tmp_path_factory, make_tiny_sft_job):
    return make_tiny_sft_job(tmp_path_factory.mktemp("launch"), n_train=24, n_dev=1)


def _launch(job, name: str, nproc: int, **over) -> dict:
    """Run the launcher; return checkpoint-4's trainer_state (log_history of all 4 steps), plus the printed
    ``[summary]`` JSON under ``"summary"`` and the launcher's stderr under ``"stderr"``."""
    out = job / ("out_" + over.pop("out", name))
    cfg = {"model_name_or_path": str(job / "model"), "dataset_name_or_path": str(job / "data"),
           "output_dir": str(out), "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2,
           "per_device_eval_batch_size": 1, "max_steps": 4, "learning_rate": 3e-3, "warmup_steps": 1,
           "logging_steps": 1, "save_strategy": "steps", "save_steps": 2, "max_length": 96, "src_length": 48,
           "flash_mask": True, "zero_padding": True, "greedy_zero_padding": False, "do_train": True,
           "do_eval": False, "disable_tqdm": True, "chat_after_train": False, "dataloader_shuffle": False}
    cfg.update(over)
    proc = run_finetune(job, name, nproc, cfg, port_base=29700)
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    summary = [line for line in proc.stdout.splitlines() if line.startswith("[summary] ")]
    state["summary"] = json.loads(summary[-1][len("[summary] "):]) if summary else {}
    state["stderr"] = proc.stderr
    return state


def _hist(state, key):
    return [h[key] for h in state["log_history"] if key in h]


def _close(got, want):
    for key in ("loss", "grad_norm"):
        g, w = _hist(got, key), _hist(want, key)
        assert len(g) == len(w) == 4, (key, g, w)
        assert all(abs(a - b) <= RTOL * abs(b) for a, b in zip(g, w)), (key, g, w)


@pytest.fixture(scope="module")
def one_process(job):
    """The one-process reference run (4 steps, global batch 4) the FSDP and TP runs of this module must equal."""
    return _launch(job, "one", 1)


def test_launcher_tp2_loss_parallel_and_reshard_resume(job, one_process):
    ref = one_process
    # do_eval: evaluate() under loss_parallel gets a DTensor loss
    tp = _launch(job, "tp2", 2, tensor_parallel_degree=2, tensor_parallel_output=True, do_eval=True)
    _close(tp, ref)
    # FSDP 2 run to step 4 (checkpoints 2 and 4), drop checkpoint-4, resume the same output_dir under TP 2.
    # do_eval: the launcher's "dev loss before" runs no-grad forwards before the optimizer exists.
    fsdp = _launch(job, "fsdp2", 2, sharding="stage2", per_device_train_batch_size=1, out="resh", do_eval=True)
    _close(fsdp, ref)
    for key in ("dev_loss_before", "dev_loss_after"):  # the same model, evaluated under TP and under FSDP
        a, b = tp["summary"][key], fsdp["summary"][key]
        assert abs(a - b) <= RTOL * abs(b), (key, a, b)
    shutil.rmtree(job / "out_resh" / "checkpoint-4")
    resumed = _launch(job, "resume_tp2", 2, tensor_parallel_degree=2, out="resh")
    assert [h["step"] for h in resumed["log_history"]] == [1, 2, 3, 4]
    _close(resumed, ref)  # steps 3 and 4 are computed after the reshard


@pytest.fixture(scope="module")
def ernie_job(job, tmp_path_factory):
    """The same data and tokenizer with a tiny random ERNIE-3.5-SE (head attention, fused parallel, tail FFN)."""
    from paddlenlp_ext.transformers.ernie35 import Ernie35Config, Ernie35ForCausalLM

    root = tmp_path_factory.mktemp("launch_ernie")
    vocab = json.load(open(job / "model" / "config.json"))["vocab_size"]
    torch.manual_seed(0)
    Ernie35ForCausalLM(Ernie35Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                     num_attention_heads=4, max_position_embeddings=256, weight_share=True)
                       ).save_pretrained(str(root / "model"))
    for f in os.listdir(job / "model"):
        if f.startswith(("tokenizer", "special_tokens")):
            shutil.copy(job / "model" / f, root / "model")
    shutil.copytree(job / "data", root / "data")
    return root


def test_launcher_ernie_tp2_and_resume_in_one_process(ernie_job):
    """ERNIE-3.5-SE with its fused qkv_gate_up_proj split over TP 2 (+ vocab-parallel loss) through the trainer
    equals one process; its TP 2 checkpoint-2 resumes in one process (the fused weights and AdamW states are
    stored unpermuted). Measured on CPU: TP 2 losses within 1.2e-7 relative of one process."""
    ref = _launch(ernie_job, "one", 1)
    tp = _launch(ernie_job, "tp2", 2, tensor_parallel_degree=2, tensor_parallel_output=True, out="resh")
    _close(tp, ref)
    shutil.rmtree(ernie_job / "out_resh" / "checkpoint-4")
    resumed = _launch(ernie_job, "resume_one", 1, out="resh")
    assert [h["step"] for h in resumed["log_history"]] == [1, 2, 3, 4]
    _close(resumed, ref)


def test_launcher_sequence_parallel_with_unpacked_batches(job):
    """``sequence_parallel`` with unpacked rows (``flash_mask`` and ``zero_padding`` false): rows are padded to the
    batch's longest, and an odd length cannot be sharded over 2 ranks; the launcher rounds the padding up to a
    multiple of tensor_parallel_degree: no loss changes."""
    data = job / "data_varied"  # prompts of 1..24 words: rows of odd and even token counts
    data.mkdir(exist_ok=True)
    (data / "train.json").write_text("".join(json.dumps({"src": "word " * n + "?", "tgt": "yes " * (n % 3 + 1)}) + "\n"
                                             for n in range(1, 25)))
    one_row = dict(zero_padding=False, flash_mask=False, per_device_train_batch_size=1,
                   gradient_accumulation_steps=4, dataset_name_or_path=str(data))
    ref = _launch(job, "one_unpacked", 1, **one_row)
    sp = _launch(job, "tp2_sp_unpacked", 2, tensor_parallel_degree=2, sequence_parallel=True, **one_row)
    _close(sp, ref)


def test_sharding_offload_on_cpu_trains_like_fsdp(job, one_process):
    """``sharding: "stage2 offload"`` on a CPU-only machine: FSDP2's CPUOffloadPolicy pins memory (``fully_shard``
    would die with "Cannot access accelerator device when none is available"), but on the CPU the shards are in host
    memory already: offload is skipped with one warning and the run equals one process."""
    out = job / "out_offload"
    got = _launch(job, "offload", 2, sharding="stage2 offload", per_device_train_batch_size=1)
    _close(got, one_process)  # 2 ranks x 1 pack = the reference's batch of 2
    err = got["stderr"]
    assert err.count("sharding 'offload' has no effect on the CPU") == 1, err[-3000:]
    assert (out / "checkpoint-4").is_dir()


def test_lora_on_lm_head_under_tp_trains_like_one_process(job):
    """``lora_target_modules: "q_proj,lm_head"`` under ``tensor_parallel_degree: 2``: the LM head's LoRALinear gets
    the LoRA tensor-parallel style (``lora_B`` vocab-split like the head; torch's stock ``ColwiseParallel`` would walk
    its submodule parameters by dotted name and fail): losses equal one process's and the gathered adapter equals its
    adapter."""
    from safetensors.torch import load_file

    lora = {"lora": True, "lora_rank": 4, "lora_target_modules": "q_proj,lm_head", "learning_rate": 1e-2}
    ref = _launch(job, "lora_head_one", 1, **lora)
    got = _launch(job, "lora_head_tp2", 2, tensor_parallel_degree=2, tensor_parallel_output=True, **lora)
    _close(got, ref)
    a = load_file(str(job / "out_lora_head_tp2" / "adapter_model.safetensors"))
    b = load_file(str(job / "out_lora_head_one" / "adapter_model.safetensors"))
    assert sorted(a) == sorted(b) and any("lm_head.lora_B" in k for k in a)
    for k in a:  # whole (gathered) adapters, within the launcher bound of the one-process run
        assert a[k].shape == b[k].shape and (a[k] - b[k]).abs().max() <= RTOL * b[k].abs().max(), k
