"""Usability leftovers of the user pass: a full disk while saving, malformed command lines, predict.py's chat.

Each test failed on the code before its fix (raw DCP / safetensors errors; a JSON-blaming message for a flag
without a value; no conversation cap in predict.py).
"""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import pytest
import torch

from paddlenlp_ext.trainer import checkpoint as ckpt
from paddlenlp_ext.trainer.trainer import Trainer
from trainer_fixtures import PackDataset


def _digest(directory: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``directory``."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


# ---- 1. a full disk while writing a checkpoint or the final model ------------------------------------------------

def _trained(make_args, tiny_model, out):
    """A Trainer that ran 3 steps and saved ``out/checkpoint-3``."""
    args = make_args(output_dir=str(out), max_steps=3, save_steps=3, save_strategy="steps")
    t = Trainer(tiny_model(), args, train_dataset=PackDataset(n=4))
    t.train()
    assert (out / "checkpoint-3").is_dir()
    return t


@pytest.mark.parametrize("writer", ["dcp", "torch.save"])
def test_checkpoint_enospc_is_one_clear_error_and_keeps_the_previous_checkpoint(make_args, tiny_model, tmp_path,
                                                                                monkeypatch, writer):
    out = tmp_path / "o"
    t = _trained(make_args, tiny_model, out)
    before = _digest(out / "checkpoint-3")
    if writer == "dcp":  # DCP's per-item writer: DCP wraps the OSError in a CheckpointException (a BaseException)
        import torch.distributed.checkpoint.filesystem as dcp_fs

        monkeypatch.setattr(dcp_fs, "_write_item", _enospc)
    else:  # torch.save of the RNG / data / scheduler state, after DCP wrote the tensors into the temp dir
        monkeypatch.setattr(torch, "save", _enospc)
    t.state.global_step = 4
    with pytest.raises(ckpt.SaveError) as info:
        t.save_checkpoint()
    e = info.value
    msg = str(e)
    assert isinstance(e, OSError) and e.errno == errno.ENOSPC
    assert e.__cause__ is not None  # the writer's own error stays chained
    assert str(out) in msg and "checkpoint-4" in msg and "ENOSPC" in msg
    assert f"previous checkpoint {out / 'checkpoint-3'} is intact" in msg
    assert "free disk space" in msg and "output_dir" in msg and "MiB" in msg
    assert sorted(os.listdir(out)) == ["checkpoint-3"]  # temp dir removed: the disk is not left fuller
    assert _digest(out / "checkpoint-3") == before


def test_checkpoint_enospc_without_an_earlier_checkpoint_says_so(make_args, tiny_model, tmp_path, monkeypatch):
    import torch.distributed.checkpoint.filesystem as dcp_fs

    out = tmp_path / "o"
    t = Trainer(tiny_model(), make_args(output_dir=str(out), max_steps=1), train_dataset=PackDataset(n=4))
    t.create_optimizer_and_scheduler(1)
    monkeypatch.setattr(dcp_fs, "_write_item", _enospc)
    with pytest.raises(ckpt.SaveError, match="no earlier checkpoint"):
        t.save_checkpoint()
    assert os.listdir(out) == []


def test_other_save_errors_pass_through_unchanged(make_args, tiny_model, tmp_path, monkeypatch):
    t = _trained(make_args, tiny_model, tmp_path / "o")

    def bug(*a, **k):
        raise TypeError("a bug, not a disk problem")

    monkeypatch.setattr(ckpt, "_rng_state", bug)
    t.state.global_step = 4
    with pytest.raises(TypeError, match="a bug"):
        t.save_checkpoint()
    assert not isinstance(ckpt.write_failure(KeyboardInterrupt()), tuple)


def _tiny_llama():
    from paddlenlp_ext.transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    return LlamaForCausalLM(cfg)


def _safetensors_enospc(*args, **kwargs):
    from safetensors import SafetensorError

    path = args[1] if len(args) > 1 else kwargs.get("filename")
    Path(path).write_bytes(b"\0" * 100)  # a partial file in the temporary directory
    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


@pytest.mark.parametrize("fail", [_enospc, _safetensors_enospc], ids=["OSError", "SafetensorError"])
def test_final_model_enospc_names_the_directory_and_keeps_the_earlier_model(make_args, tmp_path, monkeypatch, fail):
    out = tmp_path / "o"
    t = Trainer(_tiny_llama(), make_args(output_dir=str(out)))
    t.save_model()
    before = _digest(out)
    with torch.no_grad():
        next(t.model.parameters()).add_(1.0)  # a different model, so an overwrite would show
    monkeypatch.setattr("safetensors.torch.save_file", fail)
    with pytest.raises(ckpt.SaveError) as info:
        t.save_model()
    msg = str(info.value)
    assert info.value.errno == errno.ENOSPC and info.value.__cause__ is not None
    assert f"could not write the final model to {out}" in msg and "ENOSPC" in msg
    assert "files already there are untouched" in msg and "output_dir" in msg
    assert sorted(os.listdir(tmp_path)) == ["o"]  # atomic_save_dir's temporary sibling is gone
    assert _digest(out) == before


def test_tokenizer_enospc_says_the_model_is_complete_and_how_to_write_the_tokenizer(make_args, tmp_path):
    class Tok:
        name_or_path = "/models/base"

        def save_pretrained(self, d):
            _enospc()

    out = tmp_path / "o"
    t = Trainer(_tiny_llama(), make_args(output_dir=str(out)), tokenizer=Tok())
    with pytest.raises(ckpt.SaveError) as info:
        t.save_model()
    msg = str(info.value)
    assert "could not write the tokenizer files" in msg and "weights and config.json there are complete" in msg
    assert f"AutoTokenizer.from_pretrained('/models/base').save_pretrained('{out}')" in msg
    assert (out / "model.safetensors").is_file()


def test_lora_adapter_enospc(tmp_path, monkeypatch):
    import types

    import safetensors.torch

    from paddlenlp_ext.peft import apply_lora
    from paddlenlp_ext.trainer.launch import save_adapter

    out = tmp_path / "o"
    trainer = types.SimpleNamespace(model=apply_lora(_tiny_llama(), {"lora_rank": 2}), tokenizer=None,
                                    dp=types.SimpleNamespace(is_main=True))
    monkeypatch.setattr(safetensors.torch, "save_file", _safetensors_enospc)
    with pytest.raises(ckpt.SaveError, match=f"could not write the LoRA adapter to {out}"):
        save_adapter(trainer, types.SimpleNamespace(model_name_or_path="base"), str(out))
    assert os.listdir(tmp_path) == []


def test_write_failure_reads_each_writers_error():
    from torch.distributed.checkpoint.api import CheckpointException

    wrapped = CheckpointException("write", {0: (OSError(errno.ENOSPC, "No space left on device"), [])})
    assert ckpt.write_failure(wrapped) == (errno.ENOSPC, "No space left on device")
    # torch.save's stream writer on a full disk (torch 2.13, measured by writing to /dev/full): no errno
    torch_err = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    assert ckpt.write_failure(torch_err)[0] is None
    assert ckpt.write_failure(RuntimeError("disk full")) is None  # not a writer's message: left alone
    assert ckpt.write_failure(ValueError("bad")) is None


def test_run_cli_prints_a_save_error_as_one_line(capsys, monkeypatch):
    import sys

    from paddlenlp_ext.trainer.launch import run_cli

    def main(argv):
        raise ckpt.SaveError(errno.ENOSPC, "could not write checkpoint checkpoint-4 to /x (...)")

    monkeypatch.setattr(sys, "argv", ["run_finetune.py"])
    monkeypatch.setenv("PADDLENLP_EXT_TRACEBACK", "0")
    with pytest.raises(SystemExit) as info:
        run_cli(main)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: could not write checkpoint checkpoint-4 to /x") and "Traceback" not in err


# ---- 2. malformed command lines: one line naming the flag ---------------------------------------------------------

SFT_JSON = str(Path(__file__).resolve().parents[2] / "config" / "smollm2" / "sft.json")


def _cli_error(*argv: str) -> str:
    from paddlenlp_ext.trainer.arguments import parse_sft_args

    with pytest.raises(ValueError) as info:
        parse_sft_args([SFT_JSON, *argv])
    return str(info.value)


@pytest.mark.parametrize("argv,expected", [
    (["--output_dir"], "command line: --output_dir needs a value (str) but it is the last argument; "
                       "write --output_dir <value>"),
    (["--output_dir", "--max_steps", "3"], "command line: --output_dir needs a value (str) but it is followed by "
                                           "--max_steps; write --output_dir <value>"),
    (["--max_steps", "--bf16", "false"], "--max_steps needs a value (int) but it is followed by --bf16"),
    (["--foo", "3"], "command line: unknown key 'foo'; --help lists every key"),
    (["--max_stesp", "3"], "command line: unknown key 'max_stesp'; did you mean 'max_steps'"),
    (["--max_steps", "3", "--max_steps", "4"], "command line: --max_steps given twice; keep one"),
    (["--max_steps=3", "--max_steps", "4"], "command line: --max_steps given twice; keep one"),
    (["--max_steps", "3", "4"], "command line: --max_steps takes one value, got 2: 3 4"),
    (["--max_steps=x"], "command line: --max_steps: expected an int, got 'x'"),
    (["--max_steps", "3", SFT_JSON], "the config file must be the first argument"),
    (["3"], "command line: unexpected value '3' (values must follow a --key)"),
])
def test_malformed_command_line_is_one_line_naming_the_flag(argv, expected):
    msg = _cli_error(*argv)
    assert expected in msg
    assert "\n" not in msg  # one line: no "N problem(s)" list with a second, misleading entry
    assert "sft.json" not in msg or "config file" in msg  # the JSON is not blamed for a command-line mistake


def test_command_line_syntax_still_accepted():
    from paddlenlp_ext.trainer.arguments import parse_sft_args

    _, _, args = parse_sft_args([SFT_JSON, "--max_steps=3", "--output-dir", "/tmp/o", "--bf16", "--do_eval",
                                 "false", "--report_to", "none"])
    assert (args.max_steps, args.output_dir, args.bf16, args.do_eval) == (3, "/tmp/o", True, False)


def test_several_problems_are_still_listed_together():
    msg = _cli_error("--output_dir", "--foo", "1")
    assert msg.startswith("2 problem(s) in the arguments:")
    assert "--output_dir needs a value" in msg and "unknown key 'foo'" in msg
    assert "required key 'output_dir'" not in msg  # the flag's own error, not a second 'missing' one


def test_launcher_prints_the_missing_value_error_line():
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "llm" / "run_finetune.py"
    proc = subprocess.run([sys.executable, str(script), SFT_JSON, "--output_dir"], capture_output=True, text=True,
                          env=dict(os.environ, PADDLENLP_EXT_TRACEBACK="0"), timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[0] == ("error: command line: --output_dir needs a value (str) but it is the "
                                           "last argument; write --output_dir <value> (or --output_dir=<value>)")


# ---- 3. predict.py's interactive chat: history, /reset, /exit, the context cap ------------------------------------

def _predict():
    from tests._scripts import load_script

    return load_script("llm/predict.py", "llm_predict_leftovers")


class WordTokenizer:
    """Tokenizer-free fake: one id per whitespace word (ids from a growing vocabulary), bos 1, eos 2, no template."""

    chat_template = None
    bos_token_id, eos_token_id, pad_token_id = 1, 2, 2

    def __init__(self):
        self.vocab: dict[str, int] = {}

    def encode(self, text, add_special_tokens=False):
        return [self.vocab.setdefault(w, 10 + len(self.vocab)) for w in text.split()]


def _msgs(*pairs):
    return [{"role": r, "content": c} for r, c in pairs]


def test_encode_conversation_without_template_is_the_plain_sft_layout():
    p, tok = _predict(), WordTokenizer()
    ids = p.encode_conversation(tok, _msgs(("system", "be brief"), ("user", "hi there"), ("assistant", "hello"),
                                           ("user", "bye")))
    w = tok.vocab
    # <bos> system+user1, reply1 </s>, <bos> user2 (system prepended to the first user message as text)
    assert ids == [1, w["be"], w["brief"], w["hi"], w["there"], w["hello"], 2, 1, w["bye"]]


def test_fit_history_drops_oldest_whole_turns_and_keeps_the_system_message():
    p = _predict()
    count = lambda ms: sum(len(m["content"].split()) for m in ms)  # noqa: E731  (one token per word)
    history = _msgs(("system", "sys"), ("user", "a a a"), ("assistant", "b b b"), ("user", "c c"),
                    ("assistant", "d d"), ("user", "e"))
    kept, dropped = p.fit_history(history, count, max_tokens=100)
    assert (kept, dropped) == (history, 0)
    kept, dropped = p.fit_history(history, count, max_tokens=6)  # 1 + 3 + 3 + 2 + 2 + 1 = 12 > 6 > 1 + 2 + 2 + 1
    assert dropped == 1 and kept == [history[0]] + history[3:]
    kept, dropped = p.fit_history(history, count, max_tokens=2)
    assert dropped == 2 and kept == [history[0], history[-1]]  # never starts with a reply
    with pytest.raises(ValueError, match="too long: 2 prompt tokens .* cap of 1 .*pass a larger --src_length"):
        p.fit_history(history, count, max_tokens=1)


def _reader(lines):
    """``input()`` stand-in: the lines in order, then EOFError (Ctrl-D)."""
    it = iter(lines)

    def read(prompt):
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None
    return read, it


def test_interactive_loop_keeps_history_resets_and_exits():
    p, tok = _predict(), WordTokenizer()
    conv = p.Conversation(lambda m: p.encode_conversation(tok, m), max_tokens=12)
    read, rest = _reader(["one two", "", "three four", "/reset", "five", "six seven eight nine ten eleven",
                          "w " * 20, "/exit", "never read"])
    prompts, said, notices = [], [], []

    def respond(ids):
        prompts.append(ids)
        return f"r{len(prompts)}"

    p.interactive(conv, respond, read, said.append, notices.append)
    w = tok.vocab
    assert prompts[0] == [1, w["one"], w["two"]]
    assert prompts[1] == [1, w["one"], w["two"], w["r1"], 2, 1, w["three"], w["four"]]  # multi-turn
    assert prompts[2] == [1, w["five"]]  # after /reset
    assert prompts[3] == [1, w["five"], w["r3"], 2, 1] + [w[x] for x in "six seven eight nine ten eleven".split()]
    assert len(prompts) == 4  # the 20-word message (21 tokens > 12) was not sent
    assert said == ["assistant> r1", "assistant> r2", "assistant> r3", "assistant> r4"]
    assert "[conversation reset]" in notices
    assert any(n.startswith("[not sent: the message is too long: 21 prompt tokens") for n in notices)
    assert conv.messages[-1] == {"role": "assistant", "content": "r4"}  # the refused message left no trace
    assert next(rest) == "never read"  # /exit stopped the loop


def test_interactive_loop_drops_the_oldest_turn_with_a_notice():
    p, tok = _predict(), WordTokenizer()
    conv = p.Conversation(lambda m: p.encode_conversation(tok, m), max_tokens=8, system="sys")
    read, _ = _reader(["a b", "c d", "/reset", "e f"])
    prompts, notices = [], []

    def respond(ids):
        prompts.append(ids)
        return "ok"

    p.interactive(conv, respond, read, lambda s: None, notices.append)  # ends at EOF (Ctrl-D)
    w = tok.vocab
    assert prompts[0] == [1, w["sys"], w["a"], w["b"]]
    # with turn 1 the prompt is [1 sys a b ok 2 1 c d] = 9 > 8 tokens: turn 1 is dropped, the system message stays
    assert prompts[1] == [1, w["sys"], w["c"], w["d"]]
    assert prompts[2] == [1, w["sys"], w["e"], w["f"]]  # /reset keeps the system message
    dropped = [n for n in notices if "dropped the oldest" in n]
    assert dropped == ["[context: the conversation passed 8 tokens (--src_length); dropped the oldest 1 turn(s)]"]


def test_prompt_cap_from_the_model_config():
    import types

    p = _predict()
    model = types.SimpleNamespace(config=types.SimpleNamespace(max_position_embeddings=64))
    assert p.prompt_cap(model, 16, None) == 48 and p.prompt_cap(model, 16, 20) == 20
    with pytest.raises(ValueError, match="--max_new_tokens 64 leaves no room"):
        p.prompt_cap(model, 64, None)


def test_predict_interactive_end_to_end_on_a_tiny_model(tmp_path, monkeypatch, capsys):
    """predict.main on a tty: a tiny random Llama (max_position_embeddings 96) with the bundled SmolLM2 tokenizer
    and chat template; the third turn passes the cap and the oldest turn is dropped with a notice."""
    import builtins
    import shutil
    import sys

    from paddlenlp_ext.transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, resolve_model_name_or_path

    tok_dir = resolve_model_name_or_path("HuggingFaceTB/SmolLM2-135M-Instruct")  # converted once, cached
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=96,
                      tie_word_embeddings=True)
    LlamaForCausalLM(cfg).save_pretrained(str(tmp_path / "m"))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(os.path.join(tok_dir, name), tmp_path / "m" / name)
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "m"))
    assert tok.chat_template  # the template path
    questions = ["What is the capital of France?", "And of Italy?", "And of Spain?"]

    def run(*extra):
        read, _ = _reader(questions + ["/exit"])
        monkeypatch.setattr(builtins, "input", read)
        monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
        rc = _predict().main(["--model_name_or_path", str(tmp_path / "m"), "--max_new_tokens", "4",
                              "--num_threads", str(torch.get_num_threads()), *extra])
        out = capsys.readouterr()
        assert rc == 0 and "Interactive chat (multi-turn)" in out.err
        return [ln[len("assistant> "):] for ln in out.out.splitlines()], out.err

    replies, err = run()  # default cap: 96 - 4 = 92 tokens, enough for the three turns
    assert len(replies) == 3 and "dropped" not in err
    convo = []
    for q, r in zip(questions, replies):
        convo += [{"role": "user", "content": q}, {"role": "assistant", "content": r}]
    third = len(tok.apply_chat_template(convo[:5], add_generation_prompt=True, return_dict=True)["input_ids"])
    replies2, err = run("--src_length", str(third - 1))  # the third prompt is one token over the cap
    assert replies2[:2] == replies[:2]  # greedy: the same first two turns
    assert f"[context: the conversation passed {third - 1} tokens (--src_length); dropped the oldest 1 turn(s)]" in err


def test_ctrl_c_inside_a_checkpoint_write_is_an_interrupt_not_a_full_disk(make_args, tiny_model, tmp_path,
                                                                        monkeypatch):
    """A Ctrl-C inside torch.save surfaces as the stream writer's RuntimeError with the KeyboardInterrupt as its
    context (seen with ``timeout -s INT``): it must stay a KeyboardInterrupt (run_cli prints one line), not a
    SaveError telling the user to free disk space; the temporary directory is still removed."""
    out = tmp_path / "o"
    t = _trained(make_args, tiny_model, out)

    def interrupted_save(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(torch, "save", interrupted_save)
    t.state.global_step = 4
    with pytest.raises(KeyboardInterrupt):
        t.save_checkpoint()
    assert sorted(os.listdir(out)) == ["checkpoint-3"]


def test_reraise_interrupt_finds_it_inside_dcp_failures():
    from torch.distributed.checkpoint.api import CheckpointException

    wrapped = CheckpointException("write", {0: (KeyboardInterrupt(), [])})
    with pytest.raises(KeyboardInterrupt):
        ckpt.reraise_interrupt(wrapped)
    ckpt.reraise_interrupt(RuntimeError("unrelated"))  # no interrupt in the chain: returns


def test_no_arguments_asks_for_a_config_file():
    from paddlenlp_ext.trainer.argparser import PdArgumentParser
    from paddlenlp_ext.trainer.arguments import TrainingArguments

    with pytest.raises(ValueError, match="no arguments: give a JSON config first"):
        PdArgumentParser((TrainingArguments,)).parse([])


@pytest.mark.parametrize("text,expected", [("", "the config file is empty"),
                                           ('{"output_dir": "o",\n}', "trailing comma"),
                                           ('{"report_to": ["none",]}', "trailing comma")])
def test_empty_config_and_trailing_comma_are_named(tmp_path, text, expected):
    from paddlenlp_ext.trainer.argparser import PdArgumentParser
    from paddlenlp_ext.trainer.arguments import TrainingArguments

    cfg = tmp_path / "c.json"
    cfg.write_text(text)
    with pytest.raises(ValueError, match=expected):
        PdArgumentParser((TrainingArguments,)).parse([str(cfg)])
