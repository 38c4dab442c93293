"""Session-8 user pass: cases a new user met with the bundled data, the dataset readers and ``llm/predict.py``
(the model-loading side of the data a user brings), each failing before its fix. CPU, tiny models, no processes.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests._scripts import load_script


def test_predict_tokenizer_name_or_path_for_a_model_saved_without_tokenizer(tmp_path, capsys):
    """A model directory without tokenizer files: the loader's error says "set tokenizer_name_or_path", but
    ``predict.py`` had no such flag (argparse: unrecognized arguments). ``--tokenizer_name_or_path`` now loads the
    tokenizer from there; the answer equals the one of a directory that holds both."""
    from tests.trl._tiny import make_tiny_model_dir

    predict = load_script("llm/predict.py", "llm_predict_userpass8")
    full = make_tiny_model_dir(str(tmp_path / "full"))
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((tmp_path / "full" / name).read_bytes())
    args = ["--prompt", "hello how are you", "--max_new_tokens", "5", "--num_threads", str(torch.get_num_threads())]

    with pytest.raises(ValueError, match=r"no tokenizer files .* set tokenizer_name_or_path"):
        predict.main(["--model_name_or_path", str(bare), *args])
    assert predict.main(["--model_name_or_path", full, *args]) == 0
    want = capsys.readouterr().out
    assert predict.main(["--model_name_or_path", str(bare), "--tokenizer_name_or_path", full, *args]) == 0
    assert capsys.readouterr().out == want

    def no_model_load(*a, **k):
        raise AssertionError("the model was loaded before the tokenizer path was checked")

    predict.AutoModelForCausalLM.from_pretrained = no_model_load  # this module's own copy (load_script)
    with pytest.raises(ValueError, match=r"tokenizer '.*nowhere' \(tokenizer_name_or_path"):
        predict.main(["--model_name_or_path", str(bare), "--tokenizer_name_or_path", os.fspath(tmp_path / "nowhere"),
                      *args])
