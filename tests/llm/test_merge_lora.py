"""llm/merge_lora_params.py (PaddleNLP's llm/tools/merge_lora_params.py): merged model == base + adapter; atomic
output; PaddleNLP's --device / --safe_serialization flags accepted; one-line errors for bad paths, refused before
the base model loads: an --output_path under a file, holding another adapter or being the base model's directory, an
adapter on a random-init preset base (also warned when such an adapter is saved), a training checkpoint given as the
adapter."""

import json
import logging
import os
import shutil
import subprocess
import sys
import types

import pytest
import torch

from paddlenlp_ext.peft import LoRALinear, apply_lora, load_merged_lora, merge_lora, save_lora
from paddlenlp_ext.trainer.launch import save_adapter
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


def test_output_path_under_a_file_is_refused_before_loading(tmp_path, monkeypatch):
    # one error naming the file (not os.makedirs' FileExistsError after the load and merge)
    mod = _load_script()
    base = make_tiny_model_dir(str(tmp_path / "base"))
    save_lora(apply_lora(AutoModelForCausalLM.from_pretrained(base), {"lora_rank": 2}), str(tmp_path / "lora"),
              base_model_name_or_path=base)
    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file, not a directory")

    def no_load(*a, **k):
        raise AssertionError("the base model was loaded before the output path was checked")

    monkeypatch.setattr("paddlenlp_ext.peft.load_merged_lora", no_load)
    with pytest.raises(NotADirectoryError, match=r"--output_path .*notes\.txt/merged: .*notes\.txt is a file"):
        mod.main(["--lora_path", str(tmp_path / "lora"), "--output_path", str(blocker / "merged")])


def _adapter_dir(path, base):
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8,
                                                          "base_model_name_or_path": base}))
    (path / "adapter_model.safetensors").write_bytes(b"")  # never read: refused before any load
    return str(path)


def test_load_merged_lora_refuses_a_random_preset_base(tmp_path):
    # the preset's random weights were never saved: loading it again builds another random model, and the adapter
    # would be applied to weights it was not trained with
    lora = _adapter_dir(tmp_path / "lora", "ernie/tiny-random-ernie")
    with pytest.raises(ValueError, match=r"random-init ERNIE preset.*merge_weights: true"):
        load_merged_lora(lora, "ernie/tiny-random-ernie")


def test_adapter_on_a_random_preset_base_is_refused(tmp_path):
    mod = _load_script()
    lora = _adapter_dir(tmp_path / "lora", "ernie/tiny-random-ernie")
    with pytest.raises(ValueError, match="ernie/tiny-random-ernie"):
        mod.main(["--lora_path", lora, "--output_path", str(tmp_path / "merged")])
    assert not (tmp_path / "merged").exists()


def test_output_dir_holding_an_adapter_is_refused(tmp_path):
    # merged weights beside another adapter's files would load in transformers (with peft) with that adapter applied
    # on top (the reason --output_path = --lora_path is refused too)
    base = make_tiny_model_dir(str(tmp_path / "base"))
    model = apply_lora(AutoModelForCausalLM.from_pretrained(base), {"lora_rank": 2})
    save_lora(model, str(tmp_path / "adapter"), base_model_name_or_path=base)
    save_lora(model, str(tmp_path / "other_adapter"), base_model_name_or_path=base)
    merge = _load_script()
    with pytest.raises(ValueError, match=r"holds a LoRA adapter \(adapter_config\.json\)"):
        merge.main(["--lora_path", str(tmp_path / "adapter"), "--output_path", str(tmp_path / "other_adapter")])
    assert not os.path.exists(tmp_path / "other_adapter" / "model.safetensors")
    assert merge.main(["--lora_path", str(tmp_path / "adapter"), "--output_path", str(tmp_path / "merged")]) == 0


def test_base_model_directory_as_output_is_refused(tmp_path, monkeypatch):
    """``--output_path <the base model's directory>`` would replace the base in place: the adapter's
    ``base_model_name_or_path`` would then name merged weights, and ``predict.py`` on the adapter (or another merge)
    would apply it twice. Refused before anything is loaded; the base files stay byte-identical. The embedded
    SmolLM2's cache directory (the base behind its alias) is refused the same way."""
    mod = _load_script()
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


def test_paddlenlp_device_and_safe_serialization_flags_are_accepted(tmp_path, capsys):
    """PaddleNLP's documented merge command (``--device gpu --safe_serialization true``) merges, with a note that
    the merge runs on the CPU."""
    base = make_tiny_model_dir(str(tmp_path / "base"))
    model = apply_lora(AutoModelForCausalLM.from_pretrained(base), {"lora_rank": 2})
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.weight.fill_(0.05)
    save_lora(model, str(tmp_path / "lora"), base_model_name_or_path=base)
    merge = _load_script()
    out = tmp_path / "merged"
    rc = merge.main(["--model_name_or_path", base, "--lora_path", str(tmp_path / "lora"), "--output_path", str(out),
                     "--safe_serialization", "True", "--device", "gpu"])
    assert rc == 0 and (out / "model.safetensors").is_file()
    assert "--device gpu: ignored, the merge runs on the CPU" in capsys.readouterr().err
    ids = torch.tensor([[1, 3, 7, 10]])
    with torch.no_grad():
        torch.testing.assert_close(AutoModelForCausalLM.from_pretrained(str(out)).eval()(ids), model.eval()(ids))


def test_merge_safe_serialization_false_is_noted():
    merge = _load_script()
    args = merge.parse_args(["--lora_path", "a", "--output_path", "b", "--safe_serialization", "false",
                             "--device", "cpu"])
    assert merge.compat_notes(args) == ["--safe_serialization false: ignored, the merged model is written as "
                                        "safetensors (there is no Paddle .pdparams format here)"]
    with pytest.raises(SystemExit):
        merge.parse_args(["--lora_path", "a", "--output_path", "b", "--safe_serialization", "maybe"])


def test_training_checkpoint_as_adapter_gives_the_export_command(tmp_path):
    """``--lora_path <out>/checkpoint-7``: the error names the checkpoint and the resume command that exports it (not
    only 'adapter_config.json not found')."""
    ckpt = tmp_path / "out" / "checkpoint-7"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text("{}")
    with pytest.raises(ValueError, match=r"is a training checkpoint .* --resume_from_checkpoint .*checkpoint-7 "
                                         r"--max_steps 7 --output_dir"):
        _load_script().main(["--lora_path", str(ckpt), "--output_path", str(tmp_path / "merged")])


@pytest.mark.parametrize("base,merge,warned", [("ernie/tiny-random-ernie", False, True),
                                               ("ernie/tiny-random-ernie", True, False),  # SFT merges in-run
                                               ("/models/llama", False, False)])
def test_adapter_saved_on_a_random_preset_base_is_warned(tmp_path, monkeypatch, caplog, base, merge, warned):
    # config/ernie35se/dpo.json: the base weights are never saved, so the adapter alone can never be merged or
    # reloaded; an SFT run with merge_weights writes the merged model itself
    monkeypatch.setattr("paddlenlp_ext.peft.save_lora", lambda *a, **k: None)
    trainer = types.SimpleNamespace(model=None, tokenizer=None, dp=types.SimpleNamespace(is_main=True))
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.trainer.launch"):
        save_adapter(trainer, types.SimpleNamespace(model_name_or_path=base, merge_weights=merge), str(tmp_path))
    hits = [r.getMessage() for r in caplog.records if "random-init" in r.getMessage()]
    assert bool(hits) == warned, hits
