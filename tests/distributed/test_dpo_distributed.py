"""``llm/run_dpo.py`` and ``llm/run_reward.py`` under torchrun (2 processes, gloo) against one process.

DPO and RM log-probs/scores go through ``hidden_states_and_head`` (root forward under FSDP2, gathered vocab-sharded
head under TP); a plumbing error there (a trunk call that bypasses the FSDP root, a sharded head weight, pair counts
summed twice) moves the step losses by far more than the 1e-4 relative bound used here. Measured
relative differences over 3 steps: DPO 4.8e-8 (FSDP2) and 1.0e-7 (TP 2), RM 4.9e-8 and 0 (fp32 re-association).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.trl._tiny import make_tiny_model_dir, write_pairs

pytestmark = pytest.mark.distributed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RTOL = 1e-4


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("dpo_dist")
    make_tiny_model_dir(str(root / "model"))
    write_pairs(str(root / "train.jsonl"), 32)
    write_pairs(str(root / "dev.jsonl"), 8, seed=1)
    return root


def _launch(job, launcher: str, name: str, nproc: int, **over) -> list[float]:
    out = job / f"out_{name}"
    cfg = {"model_name_or_path": str(job / "model"), "train_dataset_path": str(job / "train.jsonl"),
           "dev_dataset_path": str(job / "dev.jsonl"), "output_dir": str(out), "max_seq_len": 64,
           "max_prompt_len": 24, "per_device_train_batch_size": 1, "gradient_accumulation_steps": 2,
           "max_steps": 3, "learning_rate": 3e-3, "logging_steps": 1, "save_strategy": "steps", "save_steps": 3,
           "do_train": True, "do_eval": False, "seed": 0, "report_to": "none", "disable_tqdm": True,
           "greedy_zero_padding": False, "dataloader_shuffle": False}
    cfg.update(over)
    path = job / f"{name}.json"
    path.write_text(json.dumps(cfg))
    script = os.path.join(ROOT, "llm", launcher)
    cmd = [sys.executable, script, str(path)] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
        "--master_port", str(29400 + os.getpid() % 1000), script, str(path)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stderr[-6000:]}"
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    return [h["loss"] for h in state["log_history"] if "loss" in h]


@pytest.mark.parametrize("launcher", ["run_dpo.py", "run_reward.py"])
# Same global batch (2 packs a step): one process accumulates 2 micro-batches; 2 sharding ranks read one each;
# TP ranks share the data, so they accumulate 2 like one process.
@pytest.mark.parametrize("layout", [{"sharding": "stage2", "gradient_accumulation_steps": 1},
                                    {"tensor_parallel_degree": 2}], ids=["fsdp2", "tp2"])
def test_alignment_launchers_match_one_process(job, launcher, layout):
    name = launcher.split(".")[0]
    ref = _launch(job, launcher, f"{name}_single", 1)
    two = _launch(job, launcher, f"{name}_{'_'.join(map(str, layout.values()))}", 2, **layout)
    assert len(ref) == len(two) == 3
    for a, b in zip(two, ref):
        assert abs(a - b) <= RTOL * abs(b), (two, ref)
    if launcher == "run_reward.py":  # the exported RM is the same HF sequence-classification directory
        from safetensors.torch import load_file

        dirs = [job / f"out_{name}_single", job / f"out_{name}_{'_'.join(map(str, layout.values()))}"]
        cfgs = [json.loads((d / "config.json").read_text()) for d in dirs]
        assert cfgs[0] == cfgs[1] and cfgs[1]["architectures"] == ["LlamaForSequenceClassification"]
        w1, w2 = (load_file(str(d / "model.safetensors")) for d in dirs)
        assert w1.keys() == w2.keys() and "score.weight" in w2
        for k in w1:
            assert (w1[k] - w2[k]).abs().max() <= 1e-4 * max(w1[k].abs().max(), 1e-6), k


def test_dpo_lora_head_tp2_loss_parallel_matches_one_process(job):
    """LoRA on ``lm_head`` makes the head no plain ``nn.Linear``, so DPO takes the full-logits path; under TP 2 with
    ``tensor_parallel_output`` those logits are a vocab-sharded DTensor, which the log-prob gather must handle (not
    "aten.index.Tensor got mixed torch.Tensor and DTensor")."""
    lora = {"lora": True, "lora_rank": 4, "lora_target_modules": "q_proj,lm_head"}
    ref = _launch(job, "run_dpo.py", "dpo_lora_head_single", 1, **lora)
    two = _launch(job, "run_dpo.py", "dpo_lora_head_tp2", 2, tensor_parallel_degree=2, tensor_parallel_output=True,
                  **lora)
    assert len(ref) == len(two) == 3
    for a, b in zip(two, ref):
        assert abs(a - b) <= RTOL * abs(b), (two, ref)
