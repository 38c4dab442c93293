"""The default main job (config/smollm2/sft.json on the bundled data), shortened to 4 steps, as a subprocess.

Checks what a user sees: per-step losses logged, dev loss lower after training than before, a Hugging Face
directory that ``transformers`` loads and generates from, and a chat reply printed by the launcher.
"""

import json
import os
import re
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_main_job_short_run(tmp_path):
    out = tmp_path / "sft"
    cmd = [sys.executable, os.path.join(ROOT, "llm", "run_finetune.py"), os.path.join(ROOT, "config", "smollm2", "sft.json"),
           "--output_dir", str(out), "--max_steps", "4", "--save_steps", "4", "--logging_steps", "1"]
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
