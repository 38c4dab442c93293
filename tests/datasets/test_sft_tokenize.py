"""SFT tokenization: spec 2.3's worked examples (no template), multi-turn labels with a template (stub ChatML
and the real SmolLM2 template), truncation, and the warnings counting dropped and cut examples."""

import logging

import pytest

from _data_tokenizers import smollm2_tokenizer
from paddlenlp_ext.datasets import tokenize_sft_example, tokenize_sft_examples

IGN = -100


def toks(tok, ids):
    return [tok.convert_ids_to_tokens(i) if i != IGN else IGN for i in ids]


def test_worked_example_A_B_C(stub_tok):
    a = tokenize_sft_example({"src": ["a b c"], "tgt": ["x y"]}, stub_tok, src_length=6, max_length=12)
    assert toks(stub_tok, a["input_ids"]) == ["<s>", "a", "b", "c", "x", "y"]
    assert toks(stub_tok, a["labels"]) == [IGN, IGN, IGN, "x", "y", "</s>"]
    assert a["position_ids"] == list(range(6)) and a["attn_mask_startend_row_indices"] == [6] * 6
    b = tokenize_sft_example({"src": ["d e"], "tgt": ["z"]}, stub_tok, src_length=6, max_length=12)
    assert toks(stub_tok, b["labels"]) == [IGN, IGN, "z", "</s>"] and b["attn_mask_startend_row_indices"] == [4] * 4
    # C: source right-truncated to src_length=6 (BOS kept), target cut to 6 tokens without </s>
    c = tokenize_sft_example({"src": ["f g h i j k l m"], "tgt": ["p q r s t u v"]}, stub_tok, 6, 12)
    assert toks(stub_tok, c["input_ids"]) == ["<s>", "f", "g", "h", "i", "j", "p", "q", "r", "s", "t"]
    assert toks(stub_tok, c["labels"]) == [IGN] * 5 + ["p", "q", "r", "s", "t", "u"]
    assert c["position_ids"] == list(range(11)) and c["attn_mask_startend_row_indices"] == [11] * 11


def test_no_template_keeps_every_turn(stub_tok):
    r = tokenize_sft_example({"src": ["a b", "c"], "tgt": ["x", "y z"]}, stub_tok, 6, 32)
    assert toks(stub_tok, r["input_ids"]) == ["<s>", "a", "b", "x", "</s>", "<s>", "c", "y", "z"]
    assert toks(stub_tok, r["labels"]) == [IGN, IGN, "x", "</s>", IGN, IGN, "y", "z", "</s>"]


def test_truncation_drops_oldest_whole_turns(stub_tok):
    ex = {"src": ["a b c", "d", "e"], "tgt": ["x", "y", "z"]}  # turns of 6, 4, 4 tokens
    r = tokenize_sft_example(ex, stub_tok, 6, 9)  # 4 + 4 fit, 6 more does not: turn 0 dropped
    assert toks(stub_tok, r["input_ids"]) == ["<s>", "d", "y", "</s>", "<s>", "e", "z"]
    # an older turn that does not fit stops the loop even if an older one would fit
    ex2 = {"src": ["a", "b c d e f", "g"], "tgt": ["x", "y", "z"]}  # turns of 4, 7, 4
    r2 = tokenize_sft_example(ex2, stub_tok, 6, 9)
    assert toks(stub_tok, r2["input_ids"]) == ["<s>", "g", "z"]


def test_chat_template_labels_every_assistant_turn(stub_chat_tok):
    tok = stub_chat_tok
    r = tokenize_sft_example({"src": ["a b", "c"], "tgt": ["x y", "z"]}, tok, 6, 64)
    ids = r["input_ids"] + [None]
    full = toks(tok, r["input_ids"])
    assert full == ["<|im_start|>", "user", "a", "b", "<|im_end|>", "<|im_start|>", "assistant", "x", "y",
                    "<|im_end|>", "<|im_start|>", "user", "c", "<|im_end|>", "<|im_start|>", "assistant", "z"]
    learned = [t for t in toks(tok, r["labels"]) if t != IGN]
    assert learned == ["x", "y", "<|im_end|>", "z", "<|im_end|>"]
    # labels are the next token wherever they are not ignored
    for t, lab in enumerate(r["labels"]):
        if lab != IGN:
            assert ids[t + 1] in (lab, None)


def test_chat_template_repeated_answer_text_is_not_confused(stub_chat_tok):
    """The answer 'a' also appears in the user turn before it: span finding must not match there."""
    r = tokenize_sft_example({"src": ["a", "a"], "tgt": ["a", "b"]}, stub_chat_tok, 6, 64)
    assert [t for t in toks(stub_chat_tok, r["labels"]) if t != IGN] == ["a", "<|im_end|>", "b", "<|im_end|>"]


def test_chat_template_truncation_and_none(stub_chat_tok):
    ex = {"src": ["a b c", "d"], "tgt": ["x", "y"]}
    r = tokenize_sft_example(ex, stub_chat_tok, 6, 12)  # turns of 10 and 8 tokens: only the last fits
    assert toks(stub_chat_tok, r["input_ids"])[:3] == ["<|im_start|>", "user", "d"]
    # chat_template=None forces the plain path even though the tokenizer has a template
    p = tokenize_sft_example(ex, stub_chat_tok, 6, 64, chat_template=None)
    assert toks(stub_chat_tok, p["input_ids"])[:2] == ["<s>", "a"]


def test_unfittable_examples_are_dropped_and_counted(stub_chat_tok, caplog):
    # last turn alone overflows: user head kept to src_length=8, leaving no room for the answer
    ex = {"src": ["a b c d e f g h i j"], "tgt": ["x"]}
    assert tokenize_sft_example(ex, stub_chat_tok, 8, 8) is None
    stats = {}
    with caplog.at_level(logging.WARNING):
        out = list(tokenize_sft_examples([ex, {"src": ["a"], "tgt": ["x"]}], stub_chat_tok, 8, 8, stats=stats))
    assert stats == {"seen": 2, "dropped": 1} and len(out) == 1
    assert "dropped 1 of 2 SFT examples" in caplog.text


def test_chat_template_never_cuts_a_turn(stub_chat_tok, caplog):
    """With a template, a newest turn that does not fit whole drops the example (a cut would remove the
    end-of-user and assistant-header tokens and glue the answer to the cut question); the plain path keeps
    PaddleNLP's cut."""
    ex = {"src": ["a b c d e f g h i j"], "tgt": ["x"]}
    assert tokenize_sft_example(ex, stub_chat_tok, 6, 12) is None
    with caplog.at_level(logging.WARNING):
        assert list(tokenize_sft_examples([ex], stub_chat_tok, 6, 12)) == []
    assert "dropped 1 of 1 SFT examples" in caplog.text
    plain = tokenize_sft_example(ex, stub_chat_tok, 6, 12, chat_template=None)
    assert plain is not None and toks(stub_chat_tok, plain["input_ids"])[:2] == ["<s>", "a"]


def test_smollm2_chat_template_multi_turn_labels():
    """Real SmolLM2 tokenizer and ChatML template (with its default system prompt)."""
    tok = smollm2_tokenizer()
    ex = {"src": ["What is your name?", "And your favourite colour?"], "tgt": ["I am SmolLM.", "Blue, like 42 skies."]}
    r = tokenize_sft_example(ex, tok, 1024, 2048)
    full = tok.apply_chat_template([{"role": "user", "content": ex["src"][0]},
                                    {"role": "assistant", "content": ex["tgt"][0]},
                                    {"role": "user", "content": ex["src"][1]},
                                    {"role": "assistant", "content": ex["tgt"][1]}], tokenize=False)
    ids = tok(full, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids[-1]) == "\n"  # the template's trailing newline is not part of the example
    assert r["input_ids"] == ids[:-2] and len(r["labels"]) == len(r["input_ids"])
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    learned = [lab for lab in r["labels"] if lab != IGN]
    assert tok.decode(learned) == "I am SmolLM.<|im_end|>Blue, like 42 skies.<|im_end|>"
    assert learned.count(im_end) == 2
    # the system prompt, user turns and assistant headers are all ignored
    assert "system" not in tok.decode(learned) and "user" not in tok.decode(learned)
    assert r["position_ids"] == list(range(len(ids) - 2))


def test_missing_eos_is_an_error():
    from _data_tokenizers import make_stub_tokenizer

    tok = make_stub_tokenizer()
    tok.eos_token = None
    with pytest.raises(ValueError, match="eos_token_id"):
        tokenize_sft_example({"src": ["a"], "tgt": ["b"]}, tok, 4, 8)


def test_smollm2_dropped_turns_leave_a_well_formed_conversation():
    """Real SmolLM2 template: when older turns do not fit, the kept turns are the conversation they would be on
    their own (default system prompt first), not the tail of the full render (which started with the "\\n"
    after the dropped turn's <|im_end|> and had no system prompt)."""
    tok = smollm2_tokenizer()
    ex = {"src": ["What is your name? " * 20, "And your favourite colour?"], "tgt": ["I am SmolLM.", "Blue."]}
    alone = tokenize_sft_example({"src": ex["src"][1:], "tgt": ex["tgt"][1:]}, tok, 1024, 2048)
    both = tokenize_sft_example(ex, tok, 1024, 2048)
    r = tokenize_sft_example(ex, tok, 1024, len(alone["input_ids"]) + 5)  # room for the last turn only
    assert len(both["input_ids"]) > len(r["input_ids"])
    assert r == alone
    assert tok.decode(r["input_ids"]).startswith("<|im_start|>system\n")


def test_dropped_templated_examples_warning_names_max_length_not_src_length(caplog):
    # with a chat template src_length is not used (a turn is never cut): the warning names max_length and the fix,
    # not a key that changes nothing
    from paddlenlp_ext.transformers import AutoTokenizer, resolve_model_name_or_path

    tok = AutoTokenizer.from_pretrained(resolve_model_name_or_path("HuggingFaceTB/SmolLM2-135M-Instruct"))
    assert tok.chat_template
    long = {"src": ["word " * 40], "tgt": ["x"]}
    with caplog.at_level(logging.WARNING):
        assert list(tokenize_sft_examples([long], tok, 16, 24)) == []
    assert "dropped 1 of 1 SFT examples" in caplog.text
    assert "raise max_length" in caplog.text and "src_length=16" not in caplog.text


@pytest.mark.parametrize("template", [True, False])
def test_sft_examples_kept_in_part_are_counted_in_a_warning(tmp_path, caplog, template):
    # older turns dropped to fit max_length (any template), questions capped at src_length and the newest answer cut
    # (chat_template none, PaddleNLP's rule) are counted like fully dropped examples
    from paddlenlp_ext.transformers import AutoTokenizer
    from tests.trl._tiny import make_tiny_model_dir

    tok = AutoTokenizer.from_pretrained(make_tiny_model_dir(str(tmp_path / "m")))
    short = {"src": ["hello"], "tgt": ["fine"]}
    long = {"src": ["hello how are you " * 3, "what is your name"], "tgt": ["fine thanks " * 3, "bot"]}
    chat_template = "auto" if template else None
    with caplog.at_level(logging.WARNING):
        out = list(tokenize_sft_examples([short, long], tok, 8, 24, chat_template))
    assert len(out) == 2
    assert "1 of 2 SFT examples kept only part of their text to fit max_length=24" in caplog.text
    assert ("src_length" in caplog.text) != template
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        list(tokenize_sft_examples([short], tok, 8, 24, chat_template))
    assert "kept only part" not in caplog.text
