"""The default main job (config/smollm2/sft.json on the bundled data), shortened to 4 steps of one pack each and
scored on the first 30 of the 90 dev conversations, as a subprocess (about 1.7 min on one thread).

Checks what a user sees: per-step losses logged, dev loss lower after training than before, a Hugging Face
directory that ``transformers`` loads and generates from, and a chat reply printed by the launcher.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_main_job_short_run(tmp_path):
    out, data = tmp_path / "sft", tmp_path / "data"
    data.mkdir()
    shutil.copy(os.path.join(ROOT, "data", "sft", "train.json"), data / "train.json")
    with open(os.path.join(ROOT, "data", "sft", "dev.json")) as f:
        (data / "dev.json").write_text("".join(f.readlines()[:30]))
    cmd = [sys.executable, os.path.join(ROOT, "llm", "run_finetune.py"), os.path.join(ROOT, "config", "smollm2", "sft.json"),
           "--output_dir", str(out), "--max_steps", "4", "--save_steps", "4", "--logging_steps", "1",
           "--gradient_accumulation_steps", "1", "--dataset_name_or_path", str(data)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]

    losses = [float(x) for x in re.findall(r"\[train\] step \d+: loss: ([0-9.eE+-]+)", log)]
    assert len(losses) == 4 and all(0 < x < 20 for x in losses), log[-3000:]
    summary = json.loads(re.search(r"\[summary\] (\{.*\})", log).group(1))
    assert summary["global_step"] == 4
    assert summary["dev_loss_after"] < summary["dev_loss_before"], summary
    reply = re.search(r"\[chat\] assistant: (.*)", log).group(1).strip()
    assert reply, "the fine-tuned model printed an empty chat reply"
    assert (out / "checkpoint-4" / "trainer_state.json").is_file()
    assert list((out / "runs").glob("events.out.tfevents.*"))

    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    enc = tok.apply_chat_template([{"role": "user", "content": "Hello, how are you?"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    with torch.no_grad():
        gen = model.generate(**enc, max_new_tokens=8, do_sample=False)
    text = tok.decode(gen[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert text.strip(), "transformers generated nothing from the saved model"
