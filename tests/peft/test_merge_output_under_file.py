"""llm/merge_lora_params.py: an --output_path below an existing file is refused before the base model is loaded,
with one error naming that file (was os.makedirs' FileExistsError traceback after the load and merge)."""

import pytest

from paddlenlp_ext.peft import apply_lora, save_lora
from paddlenlp_ext.transformers import AutoModelForCausalLM
from tests._scripts import load_script
from tests.trl._tiny import make_tiny_model_dir


def test_output_path_under_a_file(tmp_path, monkeypatch):
    mod = load_script("llm/merge_lora_params.py")
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
