"""llm/predict.py's command line end to end on tiny random Llamas: --prompt answers like ``chat``; LoRA output
directories and --lora_path; PaddleNLP's predictor flags (--data_file / --output_file, --device, --max_length,
--decode_strategy); --tokenizer_name_or_path; the prompt cap; one-line errors for bad options and paths.

``tiny_chat_model`` (tests/llm/conftest.py) uses the real SmolLM2 tokenizer and chat template."""

from __future__ import annotations

import json
import os
import types

import pytest
import torch

from paddlenlp_ext.peft import LoRALinear, apply_lora, save_lora
from paddlenlp_ext.transformers import AutoModelForCausalLM, AutoTokenizer
from paddlenlp_ext.transformers.generation import chat
from tests.trl._tiny import make_tiny_model_dir


def test_predict_prompt_prints_the_chat_reply(tiny_chat_model, predict, capsys):
    rc = predict.main(["--model_name_or_path", tiny_chat_model, "--prompt", "Hello there",
                       "--max_new_tokens", "6", "--num_threads", str(torch.get_num_threads())])
    out = capsys.readouterr()
    assert rc == 0 and "tokens/s" in out.err
    model = AutoModelForCausalLM.from_pretrained(tiny_chat_model).eval()
    expected = chat(model, AutoTokenizer.from_pretrained(tiny_chat_model), "Hello there", max_new_tokens=6)
    assert out.out == expected + "\n"


def test_predict_on_a_lora_output_directory(tiny_chat_model, predict, tmp_path, capsys):
    """A LoRA run's output (PEFT adapter + tokenizer, no config.json): predict.py loads the base named in
    adapter_config.json, merges the adapter and answers like the base + adapter model."""
    model = apply_lora(AutoModelForCausalLM.from_pretrained(tiny_chat_model), {"lora_rank": 4})
    torch.manual_seed(1)
    with torch.no_grad():  # a non-zero adapter, so merging it changes the answer's logits
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    save_lora(model, str(tmp_path / "lora"), base_model_name_or_path=tiny_chat_model)
    rc = predict.main(["--model_name_or_path", str(tmp_path / "lora"), "--prompt", "Hello there",
                       "--max_new_tokens", "6", "--num_threads", str(torch.get_num_threads())])
    out = capsys.readouterr()
    assert rc == 0 and "LoRA adapter" in out.err
    expected = chat(model.eval(), AutoTokenizer.from_pretrained(tiny_chat_model), "Hello there", max_new_tokens=6)
    assert out.out == expected + "\n"


@pytest.mark.parametrize("argv,msg", [(["--max_new_tokens", "0"], "--max_new_tokens must be >= 1"),
                                      (["--device", "cuda"], "use --device cpu")])
def test_predict_bad_options(predict, argv, msg):
    if "cuda" in argv and torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    with pytest.raises(ValueError, match=msg):
        predict.main(["--prompt", "hi"] + argv)


@pytest.mark.parametrize("prompt", ["", "   "])
def test_predict_blank_prompt_is_an_empty_reply_without_a_model_call(tiny_chat_model, predict, capsys, prompt):
    """As a blank piped line: one empty stdout line and a note, no generation."""
    rc = predict.main(["--model_name_or_path", tiny_chat_model, "--prompt", prompt, "--max_new_tokens", "6"])
    out = capsys.readouterr()
    assert rc == 0 and out.out == "\n"
    assert "--prompt is blank" in out.err and "tokens/s" not in out.err


def test_predict_sampling_flags_without_sampling_are_named(tiny_chat_model, predict, capsys):
    """--temperature / --top_p without --do_sample: greedy decoding, and stderr says the flags did nothing; with
    --do_sample no such note."""
    common = ["--model_name_or_path", tiny_chat_model, "--prompt", "Hi", "--max_new_tokens", "3"]
    assert predict.main(common + ["--temperature", "0.2", "--top_p", "0.5"]) == 0
    err = capsys.readouterr().err
    assert "--temperature, --top_p only apply when sampling" in err
    assert predict.main(common + ["--do_sample", "--temperature", "0.2"]) == 0
    assert "only apply when sampling" not in capsys.readouterr().err


def test_prompt_cap_defaults_to_the_model_context_minus_max_new_tokens(predict):
    p = predict
    model = types.SimpleNamespace(config=types.SimpleNamespace(max_position_embeddings=64))
    assert p.prompt_cap(model, 16, None) == 48 and p.prompt_cap(model, 16, 20) == 20
    with pytest.raises(ValueError, match="--max_new_tokens 64 leaves no room"):
        p.prompt_cap(model, 64, None)


def test_tokenizer_name_or_path_for_a_model_saved_without_tokenizer(tmp_path, capsys, monkeypatch, predict):
    """A model directory without tokenizer files: the loader's error says "set tokenizer_name_or_path", and
    ``--tokenizer_name_or_path`` loads the tokenizer from there; the answer equals the one of a directory that holds
    both. A bad tokenizer path is refused before the model loads."""
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


def test_src_length_plus_max_new_tokens_past_the_model_context_is_refused(tmp_path, predict):
    """PaddleNLP's ``create_predictor`` refuses ``src_length + max_length > max_position_embeddings`` (positions the
    model never trained on; the KV cache is sized for prompt + max_new_tokens up front); so does ``predict.py``,
    before generating."""
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


def test_prompt_with_undecodable_argv_bytes_is_answered(tiny_chat_model, capsys, predict):
    """``--prompt $'\\xff'`` (argv decoded with surrogateescape) is answered, with a notice."""
    rc = predict.main(["--model_name_or_path", tiny_chat_model, "--max_new_tokens", "3", "--num_threads", "1",
                       "--prompt", b"\xffhi".decode("utf-8", "surrogateescape")])
    out = capsys.readouterr()
    assert rc == 0 and out.out.strip()
    assert "--prompt is not valid UTF-8" in out.err


def test_predict_source_compiles_without_escape_warnings():
    """The docstring's backslash notation must not be an invalid escape (SyntaxWarning on 3.12, an error later)."""
    import warnings

    from tests._scripts import ROOT

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compile((ROOT / "llm" / "predict.py").read_text(), "llm/predict.py", "exec")


@pytest.mark.parametrize("argv,msg", [(["--device", "gpu"], "--device gpu: no CUDA GPU"),
                                      (["--device", "tpu"], "--device tpu: not a torch device"),
                                      (["--dtype", "float64"], "--dtype float64: use float32, bfloat16 or float16")])
def test_predict_device_and_dtype_errors_are_one_line(argv, msg, predict):
    """``--device gpu`` (PaddleNLP's name) without a GPU and ``--dtype float64`` are one ValueError each, before the
    model loads (not torch's RuntimeError, or a failure inside the attention)."""
    if "gpu" in argv and torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    with pytest.raises(ValueError, match=msg):
        predict.main(["--model_name_or_path", "/nonexistent/model", "--prompt", "hi"] + argv)


def test_predict_data_file_writes_one_json_line_per_record(tiny_chat_model, tmp_path, capsys, predict):
    """PaddleNLP's ``--data_file``/``--output_file``: one {src, tgt, output} line per record; a single-turn record
    is answered as ``--prompt`` would; a too-long one gets "" and a notice."""
    rows = [{"src": "Hello there", "tgt": "Hi"}, {"src": ["a", "b"], "tgt": ["x", "y"]},
            {"src": "word " * 300, "tgt": "t"}]
    data = tmp_path / "dev.json"
    data.write_text(json.dumps(rows[0]) + "\n\n" + "".join(json.dumps(r) + "\n" for r in rows[1:]))
    out = tmp_path / "pred" / "output.json"
    common = ["--model_name_or_path", tiny_chat_model, "--max_length", "4", "--num_threads", "1"]
    assert predict.main(common + ["--data_file", str(data), "--output_file", str(out), "--batch_size", "4",
                                  "--decode_strategy", "greedy_search"]) == 0
    err = capsys.readouterr().err
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(g["src"], g["tgt"]) for g in got] == [(r["src"], r["tgt"]) for r in rows]
    assert got[1]["output"] and got[2]["output"] == ""
    assert f"{data}:4: not answered" in err and "wrote 3 prediction(s)" in err
    assert predict.main(common + ["--prompt", "Hello there"]) == 0
    assert capsys.readouterr().out == got[0]["output"] + "\n"


def test_predict_data_file_bad_line_fails_before_the_model_loads(tmp_path, predict):
    data = tmp_path / "dev.json"
    data.write_text('{"src": "q", "tgt": "a"}\n{"prompt": "q"}\n')
    with pytest.raises(ValueError, match=rf"{data}:2: no \"src\""):
        predict.main(["--model_name_or_path", "/nonexistent/model", "--data_file", str(data)])
    with pytest.raises(ValueError, match="--output_file .* is the --data_file"):
        predict.main(["--data_file", str(data), "--output_file", str(data)])


def test_predict_lora_path_merges_into_the_base(tiny_chat_model, tmp_path, capsys, predict):
    """PaddleNLP's ``--model_name_or_path <base> --lora_path <adapter>`` answers as the adapter directory alone."""
    model = apply_lora(AutoModelForCausalLM.from_pretrained(tiny_chat_model), {"lora_rank": 2})
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(3))
    save_lora(model, str(tmp_path / "lora"), base_model_name_or_path=tiny_chat_model)
    common = ["--prompt", "Hello there", "--max_new_tokens", "5", "--num_threads", "1"]
    assert predict.main(["--model_name_or_path", tiny_chat_model, "--lora_path", str(tmp_path / "lora")] + common) == 0
    via_flag = capsys.readouterr().out
    assert predict.main(["--model_name_or_path", str(tmp_path / "lora")] + common) == 0
    assert capsys.readouterr().out == via_flag
    assert predict.main(["--model_name_or_path", tiny_chat_model] + common) == 0
    assert capsys.readouterr().out != via_flag  # the adapter changed the reply


def test_training_checkpoint_as_model_gives_the_export_command(tmp_path, predict):
    """``--model_name_or_path <out>/checkpoint-7``: the error names the checkpoint and the resume command that
    exports it."""
    ckpt = tmp_path / "out" / "checkpoint-7"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text("{}")
    with pytest.raises(ValueError, match=r"is a training checkpoint .* --resume_from_checkpoint .*checkpoint-7 "
                                         r"--max_steps 7 --output_dir"):
        predict.main(["--model_name_or_path", str(ckpt), "--prompt", "hi"])
