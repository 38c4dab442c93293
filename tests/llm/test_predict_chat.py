"""llm/predict.py's interactive chat on a terminal: each reply sees the conversation so far (chat template, or the
plain no-template SFT layout), /reset starts over keeping the system message, /exit quits, and past the prompt cap
the oldest whole turns are dropped with a notice."""

from __future__ import annotations

import os

import pytest
import torch

from tests._scripts import load_script


def _predict():
    return load_script("llm/predict.py", "llm_predict")


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


def _reader(lines):
    """``input()`` stand-in: the lines in order, then EOFError (Ctrl-D)."""
    it = iter(lines)

    def read(prompt):
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None
    return read, it


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


def test_interactive_chat_end_to_end_drops_the_oldest_turn_past_the_cap(tmp_path, monkeypatch, capsys):
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
