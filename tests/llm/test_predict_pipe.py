"""llm/predict.py with piped stdin: exactly one output line per input line (blank, too-long and non-UTF-8 lines get
an empty line and a notice on stderr; a reply spanning lines is escaped onto one), a byte-order mark is skipped, a
stdout that cannot show a character gets '?', and ``| head`` ends it quietly (status 141).

The model is the tiny random Llama with SmolLM2's tokenizer and chat template (``tiny_chat_model``).
"""

from __future__ import annotations

import io
import sys

import pytest
import torch

from tests._scripts import load_script


def _pipe(monkeypatch, capsys, data: bytes, model_dir: str, *extra: str):
    """Run predict.main with ``data`` as piped (non-tty) stdin; returns (stdout lines, stderr, the module)."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8",
                                                       errors="surrogateescape"))
    predict = load_script("llm/predict.py", "llm_predict")
    rc = predict.main(["--model_name_or_path", model_dir, "--max_new_tokens", "3", "--num_threads", "1", *extra])
    out = capsys.readouterr()
    assert rc == 0
    return out.out.split("\n")[:-1], out.err, predict


def test_blank_lines_keep_output_aligned(tiny_chat_model, monkeypatch, capsys):
    """Blank input lines get an empty output line each, so output line N answers input line N."""
    lines, err, _ = _pipe(monkeypatch, capsys, b"hello\n\n   \nworld\n", tiny_chat_model)
    assert len(lines) == 4, lines
    assert lines[1] == "" and lines[2] == ""
    assert lines[0] and lines[3]  # the model answered the two real prompts
    assert "2 blank stdin line(s) (2, 3)" in err


def test_multiline_reply_is_escaped_onto_one_line(tiny_chat_model, monkeypatch, capsys):
    """A reply holding a newline is escaped (reversibly) onto one output line."""
    from paddlenlp_ext.transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_chat_model)
    reply = "a\\b\nc"  # a backslash and a newline
    reply_ids = torch.tensor(tok.encode(reply, add_special_tokens=False))
    assert tok.decode(reply_ids) == reply

    def fake_generate(model, prompt, max_new_tokens, **kw):  # [1, L] -> [1, L + n]
        return torch.cat([prompt, reply_ids[None]], dim=1)

    predict = load_script("llm/predict.py", "llm_predict")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"q1\nq2\n"), encoding="utf-8"))
    monkeypatch.setattr(predict, "generate", fake_generate)
    assert predict.main(["--model_name_or_path", tiny_chat_model, "--max_new_tokens", "8", "--num_threads", "1"]) == 0
    lines = capsys.readouterr().out.split("\n")[:-1]
    assert lines == ["a\\\\b\\nc"] * 2
    assert predict.unescape_reply(lines[0]) == reply


def test_non_utf8_line_is_answered_with_a_notice(tiny_chat_model, monkeypatch, capsys):
    """A non-UTF-8 line is answered (its bytes decoded with replacement) with a notice; later lines go on."""
    lines, err, _ = _pipe(monkeypatch, capsys, b"hi\n\xff\xfe bad\nok\n", tiny_chat_model)
    assert len(lines) == 3 and all(lines)
    assert "stdin line 2 is not valid UTF-8 (byte 0xff" in err


def test_too_long_line_gets_an_empty_line_naming_it(tiny_chat_model, monkeypatch, capsys):
    lines, err, _ = _pipe(monkeypatch, capsys, b"hi\n" + b"word " * 400 + b"\nok\n", tiny_chat_model)
    assert len(lines) == 3 and lines[1] == "" and lines[0] and lines[2]
    assert "stdin line 2 skipped (empty output line): the message is too long" in err


def test_empty_stdin_prints_nothing(tiny_chat_model, monkeypatch, capsys):
    lines, err, _ = _pipe(monkeypatch, capsys, b"", tiny_chat_model)
    assert lines == [] and "blank" not in err


@pytest.mark.parametrize("text", ["", "plain", "a\\nb", "x\r\ny\\", "\\\\n\n\\"])
def test_escape_reply_round_trip(text):
    predict = load_script("llm/predict.py", "llm_predict")
    line = predict.escape_reply(text)
    assert "\n" not in line and "\r" not in line
    assert predict.unescape_reply(line) == text


def test_byte_order_mark_is_skipped(tiny_chat_model, monkeypatch, capsys):
    """A prompts file saved with a UTF-8 BOM (Windows editors): U+FEFF is not part of the first prompt."""
    with_bom, _, _ = _pipe(monkeypatch, capsys, b"\xef\xbb\xbfHello there\n", tiny_chat_model)
    plain, _, _ = _pipe(monkeypatch, capsys, b"Hello there\n", tiny_chat_model)
    assert with_bom == plain and plain[0]
    only_bom, err, _ = _pipe(monkeypatch, capsys, b"\xef\xbb\xbf\nhi\n", tiny_chat_model)
    assert only_bom[0] == "" and "1 blank stdin line(s) (1)" in err


def test_non_utf8_stdout_writes_question_marks_and_keeps_going(tiny_chat_model, monkeypatch, capsys):
    """A reply character the stdout encoding cannot show (PYTHONIOENCODING=ascii, a cp1252 console) is written as
    '?', with one notice; the following lines are still answered."""
    from paddlenlp_ext.transformers import AutoTokenizer

    reply_ids = torch.tensor(AutoTokenizer.from_pretrained(tiny_chat_model).encode("café", add_special_tokens=False))
    predict = load_script("llm/predict.py", "llm_predict")
    monkeypatch.setattr(predict, "generate", lambda model, prompt, n, **kw: torch.cat([prompt, reply_ids[None]], 1))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"q1\nq2\n"), encoding="utf-8"))
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="ascii", write_through=True)
    monkeypatch.setattr(sys, "stdout", out)
    assert predict.main(["--model_name_or_path", tiny_chat_model, "--max_new_tokens", "8", "--num_threads", "1"]) == 0
    out.flush()
    assert raw.getvalue() == b"caf?\ncaf?\n"
    assert "stdout is ascii" in capsys.readouterr().err


def test_pipe_into_head_exits_141_without_traceback(tiny_chat_model):
    """``predict.py < prompts | head -n 1``: exit status 141, no BrokenPipeError traceback."""
    import subprocess

    from tests._scripts import ROOT

    proc = subprocess.Popen([sys.executable, str(ROOT / "llm" / "predict.py"), "--model_name_or_path",
                             tiny_chat_model, "--max_new_tokens", "2", "--num_threads", "1"], cwd=str(ROOT),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdin.write(b"hello\n" * 500)  # far more replies than are read: the pipe closes long before the end
    proc.stdin.close()
    assert proc.stdout.readline()
    proc.stdout.close()  # what head does after its first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err
