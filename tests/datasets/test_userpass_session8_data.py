"""Session-8 user pass: cases a new user met with the bundled data, the dataset readers and ``llm/predict.py``
(the model-loading side of the data a user brings), each failing before its fix. CPU, tiny models, no processes.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests._scripts import load_script


def test_predict_tokenizer_name_or_path_for_a_model_saved_without_tokenizer(tmp_path, capsys, monkeypatch):
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

    class NoModelLoad:
        @staticmethod
        def from_pretrained(*a, **k):
            raise AssertionError("the model was loaded before the tokenizer path was checked")

    monkeypatch.setattr(predict, "AutoModelForCausalLM", NoModelLoad)
    with pytest.raises(ValueError, match=r"tokenizer '.*nowhere' \(tokenizer_name_or_path"):
        predict.main(["--model_name_or_path", str(bare), "--tokenizer_name_or_path", os.fspath(tmp_path / "nowhere"),
                      *args])


def test_predict_src_length_plus_max_new_tokens_past_the_model_context(tmp_path):
    """An explicit ``--src_length`` was taken as is: ``--src_length 1000`` on a model of ``max_position_embeddings``
    256 generated at positions it never trained on (and the KV cache is sized for prompt + max_new_tokens up front).
    PaddleNLP's ``create_predictor`` refuses ``src_length + max_length > max_position_embeddings``; so does
    ``predict.py`` now, before generating."""
    import types

    from tests.trl._tiny import make_tiny_model_dir

    predict = load_script("llm/predict.py", "llm_predict_userpass8_cap")
    model = types.SimpleNamespace(config=types.SimpleNamespace(max_position_embeddings=256))
    assert predict.prompt_cap(model, 16, 240) == 240  # exactly fills the context
    assert predict.prompt_cap(model, 16, None) == 240
    with pytest.raises(ValueError, match=r"--src_length 241 \+ --max_new_tokens 16 = 257 > the model's "
                                         r"max_position_embeddings 256; .*--src_length 240"):
        predict.prompt_cap(model, 16, 241)
    no_limit = types.SimpleNamespace(config=types.SimpleNamespace())
    assert predict.prompt_cap(no_limit, 16, 5000) == 5000  # a model that states no limit: taken as is

    d = make_tiny_model_dir(str(tmp_path / "m"))  # max_position_embeddings 256
    with pytest.raises(ValueError, match=r"--src_length 1000 \+ --max_new_tokens 5 = 1005 > the model's"):
        predict.main(["--model_name_or_path", d, "--prompt", "hello", "--src_length", "1000",
                      "--max_new_tokens", "5", "--num_threads", str(torch.get_num_threads())])


