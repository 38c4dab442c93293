"""The launchers as installed commands (``[project.scripts]`` in ``pyproject.toml``): every entry point resolves to
a callable in the package, each ``llm/`` script has one, ``--help`` and a bad-input error go through the
command's entry as through the script, and a script's module still holds the launcher's names (replacing one
changes what its ``main`` calls)."""

from __future__ import annotations

import importlib
import sys

import pytest

from tests._scripts import ROOT, load_script

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

SCRIPTS = {"run_finetune": "llm/run_finetune.py", "run_dpo": "llm/run_dpo.py", "run_reward": "llm/run_reward.py",
           "run_pretrain": "llm/run_pretrain.py", "predict": "llm/predict.py",
           "merge_lora_params": "llm/merge_lora_params.py",
           "create_pretraining_data": "llm/tools/preprocess/create_pretraining_data.py"}


def _entry_points() -> dict[str, str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["scripts"]


def _resolve(target: str):
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def test_every_entry_point_resolves_to_a_callable_and_no_name_is_paddlenlps():
    eps = _entry_points()
    assert "paddlenlp" not in eps  # PaddleNLP's own command (its setup.py: paddlenlp = paddlenlp.cli:main)
    for name, target in eps.items():
        assert name.startswith("paddlenlp-"), name
        assert callable(_resolve(target)), f"{name} = {target}"
    assert eps["paddlenlp-launch"] == "paddlenlp_ext.distributed.launch:main"


def test_each_llm_script_has_a_command_running_its_package_module():
    targets = {t.partition(":")[0] for t in _entry_points().values()}
    for module, script in SCRIPTS.items():
        assert (ROOT / script).is_file(), script
        assert f"paddlenlp_ext.cli.{module}" in targets, f"{script} has no [project.scripts] entry"
        assert f'load_into(globals(), "paddlenlp_ext.cli.{module}")' in (ROOT / script).read_text()


def test_help_through_main_and_through_the_command(monkeypatch, capsys):
    from paddlenlp_ext.cli import run_dpo

    with pytest.raises(SystemExit) as e:
        run_dpo.main(["--help"])
    assert e.value.code == 0
    assert "--beta (" in capsys.readouterr().out  # a DPO key, with its type
    monkeypatch.setattr(sys, "argv", ["/venv/bin/paddlenlp-dpo", "--help"])
    with pytest.raises(SystemExit) as e:
        _resolve(_entry_points()["paddlenlp-dpo"])()
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith("usage: paddlenlp-dpo CONFIG.json")  # the command as typed


def test_the_command_turns_bad_input_into_one_error_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(sys, "argv", ["paddlenlp-merge-lora", "--lora_path", str(tmp_path / "missing"),
                                      "--output_path", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as e:
        _resolve(_entry_points()["paddlenlp-merge-lora"])()
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --lora_path {tmp_path / 'missing'}: no such directory")
    assert "Traceback" not in err


def test_script_module_holds_the_launcher_names_and_replacing_one_reaches_main():
    from paddlenlp_ext.cli import merge_lora_params

    mod = load_script("llm/merge_lora_params.py", "merge_lora_params_console")
    public = {n for n, v in vars(merge_lora_params).items() if callable(v) and not n.startswith("__")}
    assert public <= set(vars(mod)), public - set(vars(mod))
    assert mod.main is not merge_lora_params.main and mod.__doc__ == merge_lora_params.__doc__

    def replaced(argv=None):
        raise RuntimeError("replaced parse_args")

    mod.parse_args = replaced
    with pytest.raises(RuntimeError, match="replaced parse_args"):
        mod.main(["--lora_path", "a", "--output_path", "b"])
    assert merge_lora_params.parse_args is not replaced  # the package module is untouched
