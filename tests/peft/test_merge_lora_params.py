"""llm/merge_lora_params.py: merged model == base + adapter; atomic output; one-line errors for bad paths."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from paddlenlp_ext.peft import LoRALinear, apply_lora, merge_lora, save_lora
from paddlenlp_ext.transformers import AutoModelForCausalLM
from tests._scripts import load_script
from tests.trl._tiny import make_tiny_model_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "llm", "merge_lora_params.py")


def _load_script():
    return load_script("llm/merge_lora_params.py")


@pytest.fixture(scope="module")
def base_and_adapter(tmp_path_factory):
    """A tiny random Llama directory and a non-zero rank-4 adapter on it (base named in adapter_config.json)."""
    d = tmp_path_factory.mktemp("merge")
    base = make_tiny_model_dir(str(d / "base"))
    model = apply_lora(AutoModelForCausalLM.from_pretrained(base), {"lora_rank": 4})
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # lora_B starts at zero: make the adapter change the logits
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.weight.copy_(torch.randn(m.lora_B.weight.shape, generator=g) * 0.2)
    save_lora(model, str(d / "lora"), base_model_name_or_path=base)
    return base, str(d / "lora"), model.eval()


IDS = torch.tensor([[1, 3, 7, 10, 12, 20, 4, 2, 15, 9]])


def test_merged_model_logits_equal_base_plus_adapter(base_and_adapter, tmp_path):
    base, lora, model = base_and_adapter
    out = tmp_path / "merged"
    assert _load_script().main(["--lora_path", lora, "--output_path", str(out)]) == 0  # base from adapter_config
    assert not (out / "adapter_config.json").exists()
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(out))
    assert [p.name for p in tmp_path.iterdir()] == ["merged"]  # no temporary directory left
    merged = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert not any(isinstance(m, LoRALinear) for m in merged.modules())
    with torch.no_grad():
        with_adapter = model(IDS)  # [1, L, V] base + unmerged adapter branch, fp32
        got = merged(IDS)
        plain = AutoModelForCausalLM.from_pretrained(base).eval()(IDS)
        # the in-memory fold of merge_weights: true (merge_lora), bit-identical after the safetensors round trip
        ref = merge_lora(apply_lora(AutoModelForCausalLM.from_pretrained(base), {"lora_path": lora})).eval()(IDS)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
    # fold vs. adapter branch: fp32 reassociation only (default fp32 tolerances), and far from the base alone
    torch.testing.assert_close(got, with_adapter)
    assert (got - plain).abs().max() > 100 * (got - with_adapter).abs().max()


def test_explicit_base_overrides_adapter_config(base_and_adapter, tmp_path):
    base, lora, _ = base_and_adapter
    moved = tmp_path / "lora_nobase"
    shutil.copytree(lora, moved)
    conf = json.loads((moved / "adapter_config.json").read_text())
    conf["base_model_name_or_path"] = None
    (moved / "adapter_config.json").write_text(json.dumps(conf))
    script = _load_script()
    with pytest.raises(ValueError, match="base_model_name_or_path is empty; pass --model_name_or_path"):
        script.main(["--lora_path", str(moved), "--output_path", str(tmp_path / "m")])
    assert script.main(["--lora_path", str(moved), "--model_name_or_path", base,
                        "--output_path", str(tmp_path / "m")]) == 0
    assert (tmp_path / "m" / "model.safetensors").is_file()


def test_bad_paths_give_one_line_errors_and_exit_2(base_and_adapter, tmp_path):
    _, lora, _ = base_and_adapter
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PADDLENLP_EXT_TRACEBACK", None)
    cases = [(["--lora_path", str(tmp_path / "nope"), "--output_path", str(tmp_path / "o")], "no such directory"),
             (["--lora_path", str(tmp_path), "--output_path", str(tmp_path / "o")], "adapter_config.json not found"),
             (["--lora_path", lora, "--output_path", lora], "is the adapter directory"),
             (["--lora_path", lora, "--model_name_or_path", str(tmp_path / "nobase"), "--output_path",
               str(tmp_path / "o")], "nobase")]
    script = _load_script()
    for argv, msg in cases[:-1]:  # in process: the exception types run_cli turns into "error:"
        with pytest.raises((ValueError, FileNotFoundError), match=msg):
            script.main(argv)
    r = subprocess.run([sys.executable, SCRIPT] + cases[-1][0], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines()[-2].startswith("error: ") and cases[-1][1] in r.stderr.splitlines()[-2]
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


def test_full_disk_is_one_save_error_and_leaves_nothing(base_and_adapter, tmp_path, monkeypatch):
    """ENOSPC while writing the merged model: checkpoint.SaveError naming the output directory and the rerun,
    the temporary directory removed, no output directory left behind."""
    import errno

    from paddlenlp_ext.trainer.checkpoint import SaveError

    def enospc(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    _, lora, _ = base_and_adapter
    out = tmp_path / "merged"
    monkeypatch.setattr("safetensors.torch.save_file", enospc)
    with pytest.raises(SaveError) as info:
        _load_script().main(["--lora_path", lora, "--output_path", str(out)])
    msg = str(info.value)
    assert info.value.errno == errno.ENOSPC and f"could not write the merged model to {out}" in msg
    assert "run merge_lora_params.py again" in msg
    assert os.listdir(tmp_path) == []
