"""Session-8 user pass over distributed training on CPU (gloo), through ``llm/run_finetune.py`` under torchrun,
and over ``llm/merge_lora_params.py`` on the adapters such runs write.

Each test is a case a user met following README.md / docs/distributed.md that failed before its fix.
"""

from __future__ import annotations

import json
import os

import pytest

from tests._scripts import load_script
from tests.distributed.launcher_run import run_finetune

RTOL = 1e-4  # the launcher plumbing bound of test_launcher_distributed.py (measured FSDP 2 vs one process: ~1e-6)


@pytest.fixture(scope="module")
def job(tmp_path_factory, make_tiny_sft_job):
    return make_tiny_sft_job(tmp_path_factory.mktemp("userpass8_dist"), n_train=16, n_dev=1)


def _launch(job, name: str, nproc: int, **over) -> tuple[dict, str]:
    """Run the launcher for 2 steps; return (checkpoint-2's trainer_state, stderr)."""
    out = job / f"out_{name}"
    cfg = {"model_name_or_path": str(job / "model"), "dataset_name_or_path": str(job / "data"),
           "output_dir": str(out), "per_device_train_batch_size": 1, "gradient_accumulation_steps": 2,
           "max_steps": 2, "learning_rate": 3e-3, "warmup_steps": 1, "logging_steps": 1, "save_strategy": "steps",
           "save_steps": 2, "max_length": 96, "src_length": 48, "flash_mask": True, "zero_padding": True,
           "do_train": True, "do_eval": False, "disable_tqdm": True, "chat_after_train": False,
           "dataloader_shuffle": False, "report_to": []}
    cfg.update(over)
    proc = run_finetune(job, name, nproc, cfg, port_base=28700)
    return json.loads((out / "checkpoint-2" / "trainer_state.json").read_text()), proc.stderr


def _losses(state) -> list[float]:
    return [h["loss"] for h in state["log_history"] if "loss" in h]


@pytest.mark.distributed
def test_sharding_offload_on_cpu_trains_like_fsdp(job):
    """``sharding: "stage2 offload"`` on a CPU-only machine: FSDP2's CPUOffloadPolicy pins memory, so
    ``fully_shard`` died with "Cannot access accelerator device when none is available". On the CPU the shards
    are in host memory already: offload is skipped with one warning and the run equals one process."""
    ref, _ = _launch(job, "one", 1, per_device_train_batch_size=2)  # the same global batch as 2 ranks x 1
    got, err = _launch(job, "offload", 2, sharding="stage2 offload")
    assert err.count("sharding 'offload' has no effect on the CPU") == 1, err[-3000:]
    want = _losses(ref)
    assert len(want) == 2 and len(_losses(got)) == 2, (want, _losses(got))
    assert all(abs(a - b) <= RTOL * abs(b) for a, b in zip(_losses(got), want)), (_losses(got), want)



@pytest.mark.distributed
def test_lora_on_lm_head_under_tp_trains_like_one_process(job):
    """``lora_target_modules: "q_proj,lm_head"`` under ``tensor_parallel_degree: 2``: the LM head kept torch's stock
    ``ColwiseParallel``, which walks the LoRALinear's submodule parameters by dotted name and died in
    ``parallelize_module`` with KeyError "parameter name can't contain '.'". It now gets the LoRA style (``lora_B``
    vocab-split like the head): losses equal one process's and the gathered adapter equals its adapter."""
    from safetensors.torch import load_file

    lora = {"lora": True, "lora_rank": 4, "lora_target_modules": "q_proj,lm_head", "learning_rate": 1e-2}
    ref, _ = _launch(job, "lora_head_one", 1, **lora)
    got, _ = _launch(job, "lora_head_tp2", 2, tensor_parallel_degree=2, tensor_parallel_output=True, **lora)
    assert len(_losses(got)) == 2 and all(abs(a - b) <= RTOL * abs(b) for a, b in zip(_losses(got), _losses(ref)))
    a = load_file(str(job / "out_lora_head_tp2" / "adapter_model.safetensors"))
    b = load_file(str(job / "out_lora_head_one" / "adapter_model.safetensors"))
    assert sorted(a) == sorted(b) and any("lm_head.lora_B" in k for k in a)
    for k in a:  # whole (gathered) adapters, within the launcher bound of the one-process run
        assert a[k].shape == b[k].shape and (a[k] - b[k]).abs().max() <= RTOL * b[k].abs().max(), k


def test_merge_refuses_the_base_model_directory_as_output(tmp_path, monkeypatch):
    """``merge_lora_params.py --output_path <the base model's directory>`` replaced the base in place: the adapter's
    ``base_model_name_or_path`` then named merged weights, so ``predict.py`` on the adapter (or another merge)
    applied it twice. Now refused before anything is loaded; the base files stay byte-identical. The embedded
    SmolLM2's cache directory (the base behind its alias) is refused the same way."""
    from paddlenlp_ext.peft import apply_lora, save_lora
    from paddlenlp_ext.transformers import AutoModelForCausalLM
    from tests.trl._tiny import make_tiny_model_dir

    mod = load_script("llm/merge_lora_params.py")
    base = make_tiny_model_dir(str(tmp_path / "base"))
    save_lora(apply_lora(AutoModelForCausalLM.from_pretrained(base), {"lora_rank": 2}), str(tmp_path / "lora"),
              base_model_name_or_path=base)
    before = {f.name: f.read_bytes() for f in (tmp_path / "base").iterdir()}

    def no_load(*a, **k):
        raise AssertionError("the base model was loaded before the output path was checked")

    monkeypatch.setattr("paddlenlp_ext.peft.load_merged_lora", no_load)
    for out in (base, str(tmp_path / "x" / ".." / "base") + os.sep):  # the same directory spelled another way
        with pytest.raises(ValueError, match=r"--output_path .* is the base model's directory"):
            mod.main(["--lora_path", str(tmp_path / "lora"), "--output_path", out])
    assert {f.name: f.read_bytes() for f in (tmp_path / "base").iterdir()} == before

    monkeypatch.setenv("PADDLENLP_EXT_HOME", str(tmp_path / "home"))  # the alias' cache dir, never converted here
    with pytest.raises(ValueError, match=r"is the base model's directory \(HuggingFaceTB/SmolLM2-135M-Instruct\)"):
        mod.main(["--lora_path", str(tmp_path / "lora"), "--model_name_or_path", "HuggingFaceTB/SmolLM2-135M-Instruct",
                  "--output_path", str(tmp_path / "home" / "SmolLM2-135M-Instruct")])


def test_sequence_parallel_odd_length_error_names_the_keys():
    """``sequence_parallel`` with ``zero_padding: false``: batches are padded to their longest row, so a run trained
    step 1 and died at step 2 on an odd length, telling the user to "pad batches to max_length" without saying how.
    The error now names the keys that do it (checked: ``pad_to_multiple_of: 2`` then trains 6 steps under TP 2)."""
    import torch

    from paddlenlp_ext.distributed.parallelize import _check_sequence_divisible

    hook = _check_sequence_divisible(2)
    hook(None, (torch.zeros(1, 44, dtype=torch.long),), {})  # even: passes
    with pytest.raises(ValueError, match=r"sequence length 45 .* zero_padding: true \(packs\) or "
                                         r"pad_to_max_length: true, else pad_to_multiple_of: 2"):
        hook(None, (torch.zeros(1, 45, dtype=torch.long),), {})
