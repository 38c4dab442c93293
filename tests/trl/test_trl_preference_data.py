"""Preference tokenization and share-question layout: PaddleNLP's worked examples (spec 2.6, 2.7), our fixes."""

import json
import logging

import pytest
import torch

from flashmask.dense import to_dense
from paddlenlp_ext.datasets.preference import (
    check_preference_data,
    encode_response,
    read_preference_jsonl,
    tokenize_preference_example,
    truncate,
)
from tests.trl._stub_tokenizer import ChatWordTokenizer, WordTokenizer


def _tok(ex, tok, layout="dpo", max_seq_len=64, max_prompt_len=32, **kw):
    return tokenize_preference_example(check_preference_data(ex), tok, max_seq_len=max_seq_len,
                                       max_prompt_len=max_prompt_len, layout=layout, **kw)


def test_spec_worked_dpo_example():
    tok = WordTokenizer()
    rec = _tok({"src": ["P1 P2"], "tgt": [], "response": ["R1 R2", "C1 C2 C3"], "sort": [0, 1]}, tok)
    w = tok.words
    assert w(rec["input_ids"]) == "<s> P1 P2 C1 C2 C3 P2 R1 R2".split()
    assert rec["position_ids"] == [0, 1, 2, 3, 4, 5, 2, 3, 4]
    assert w(rec["chosen_labels"]) == "- - C1 C2 C3 </s> - - -".split()
    assert w(rec["rejected_labels"]) == "- - - - - - R1 R2 </s>".split()  # R1 is a target (PaddleNLP drops it)
    assert rec["response_indexs"] == [[2, 6, 9, 1]]
    assert rec["attn_mask_startend_row_indices"] == [9, 9, 6, 6, 6, 6, 9, 9, 9]


def test_share_question_mask_matches_spec_table():
    tok = WordTokenizer()
    rec = _tok({"src": "P1 P2", "tgt": [], "response": ["R1 R2", "C1 C2 C3"], "sort": [0, 1]}, tok)
    sri = torch.tensor(rec["attn_mask_startend_row_indices"], dtype=torch.int32)[None, None, :, None]
    dense = to_dense(sri, causal=True)[0, 0].int()
    want = torch.tensor([
        [1, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 1, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 1, 0, 0],
        [1, 1, 0, 0, 0, 0, 1, 1, 0],
        [1, 1, 0, 0, 0, 0, 1, 1, 1]], dtype=torch.int32)
    assert torch.equal(dense, want)


def test_spec_multi_turn_example():
    tok = WordTokenizer()
    rec = _tok({"src": ["U1", "U2 U2b"], "tgt": ["A1"], "response": ["C", "R"], "sort": [2, 1]}, tok)
    assert tok.words(rec["input_ids"]) == "<s> U1 A1 </s> <s> U2 U2b C U2b R".split()
    assert rec["position_ids"] == [0, 1, 2, 3, 4, 5, 6, 7, 6, 7]


def test_rm_layout_no_bos_before_responses_and_history_in_order():
    tok = WordTokenizer()
    rec = _tok({"src": "P1 P2", "tgt": [], "response": ["C1 C2 C3", "R1 R2"], "sort": [1, 0]}, tok, layout="rm")
    assert tok.words(rec["input_ids"]) == "<s> P1 P2 C1 C2 C3 </s> R1 R2 </s>".split()
    assert rec["position_ids"] == [0, 1, 2, 3, 4, 5, 6, 3, 4, 5]
    assert rec["response_indexs"] == [[3, 7, 10, 1]]
    assert rec["attn_mask_startend_row_indices"] == [10] * 3 + [7] * 4 + [10] * 3
    assert "chosen_labels" not in rec
    rec = _tok({"src": ["U1", "U2"], "tgt": ["A1"], "response": ["C", "R"], "sort": [1, 0]}, tok, layout="rm")
    assert tok.words(rec["input_ids"]) == "<s> U1 A1 </s> <s> U2 C </s> R </s>".split()  # PaddleNLP: <s> U2 <s> A1 ...


def test_truncation_prompt_from_end_then_proportional():
    p, a, b, cut = truncate(list(range(10)), [1] * 6, [2] * 3, budget=12, max_prompt_len=4)
    assert cut and p == [6, 7, 8, 9] and len(a) == 5 and len(b) == 3  # M = 8: int(6/9*8) = 5, 3
    assert truncate([1], [2], [3], budget=3, max_prompt_len=1)[3] is False
    assert truncate(list(range(10)), [1], [2], budget=4, max_prompt_len=3) is None


def test_truncated_example_fits_and_drops_history():
    tok = WordTokenizer()
    ex = {"src": ["H1", "a b c d e f g h"], "tgt": ["H2"], "response": ["x " * 20, "y " * 10], "sort": [1, 0]}
    rec = _tok(ex, tok, max_seq_len=16, max_prompt_len=4)
    assert len(rec["input_ids"]) <= 16
    words = tok.words(rec["input_ids"])
    assert "H1" not in words and "H2" not in words  # no history after a cut
    # The layout prompt keeps the last max_prompt_len=4 tokens before the moved last prompt token "h".
    assert words[:5] == ["d", "e", "f", "g", "h"]
    chosen = [t for t in tok.words(rec["chosen_labels"]) if t != "-"]
    assert "</s>" not in chosen and set(chosen) == {"x"}  # a cut response gets no end token


def test_chat_template_path():
    tok = ChatWordTokenizer()
    rec = _tok({"src": ["U1", "U2"], "tgt": ["A1"], "response": ["C", "R"], "sort": [1, 0]}, tok)
    words = tok.words(rec["input_ids"])
    assert words == "<sys> <u> U1 </t> \n <a> A1 </t> \n <u> U2 </t> \n <a> C <a> R".split()
    assert tok.words([t for t in rec["chosen_labels"] if t != -100]) == ["C", "</t>"]
    assert tok.words([t for t in rec["rejected_labels"] if t != -100]) == ["R", "</t>"]
    assert "A1" in words and "U1" in words
    raw = _tok({"src": ["U1"], "tgt": [], "response": ["C", "R"], "sort": [1, 0]}, tok, use_chat_template=False)
    assert tok.words(raw["input_ids"]) == "<s> U1 C U1 R".split()


@pytest.mark.parametrize("bad, rule", [
    ({"src": ["a", "b"], "tgt": [], "response": ["x", "y"], "sort": [1, 0]}, "len\\(src\\) == len\\(tgt\\) \\+ 1"),
    ({"src": "a", "tgt": [], "response": ["x"], "sort": [1]}, "exactly 2 responses"),
    ({"src": "a", "tgt": [], "response": ["x", " "], "sort": [1, 0]}, "non-empty"),
    ({"src": "a", "tgt": [], "response": ["x", "y"], "sort": [1, 1]}, "differ"),
    ({"src": "a", "tgt": [], "response": ["x", "y"]}, "missing key 'sort'"),
    ({"src": "q", "tgt": [], "response": ["a"], "sort": [1, 0]}, "exactly 2 responses and 2 sorts"),
    ({"src": "q", "tgt": [], "response": ["a", "b", "c"], "sort": [2, 1, 0]}, "exactly 2 responses and 2 sorts"),
    ({"src": "q", "tgt": [], "response": ["a", "b"], "sort": ["1", "0"]}, "sort values are numbers"),
    ({"src": "q", "tgt": [], "response": ["", "b"], "sort": [1, 0]}, "non-empty strings"),
    ({"src": ["q"], "tgt": ["x"], "response": ["a", "b"], "sort": [1, 0]}, r"len\(src\) == len\(tgt\) \+ 1"),
])
def test_validation_names_file_line_rule(tmp_path, bad, rule):
    path = tmp_path / "d.jsonl"
    good = {"src": "q", "tgt": [], "response": ["x", "y"], "sort": [1, 0]}
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=f"d.jsonl:3: .*{rule}"):
        list(read_preference_jsonl(str(path)))


def test_invalid_json_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"src": "q",\n')
    with pytest.raises(ValueError, match="d.jsonl:1: invalid JSON"):
        list(read_preference_jsonl(str(path)))


def test_truncated_preference_examples_are_counted_in_one_warning(tmp_path, caplog):
    # examples longer than max_seq_len lose their responses' tails and end token: counted in one warning per file
    # (as SFT warns about what it drops), also for a lazy stream read again every epoch
    from paddlenlp_ext.datasets.preference import _TokenizedPreferenceStream
    from paddlenlp_ext.transformers import AutoTokenizer
    from tests.trl._tiny import make_tiny_model_dir, write_pairs

    tok = AutoTokenizer.from_pretrained(make_tiny_model_dir(str(tmp_path / "m")))
    pairs = write_pairs(str(tmp_path / "p.jsonl"), 6)
    roomy = _TokenizedPreferenceStream(pairs, tok, 128, 64, "dpo", True)
    with caplog.at_level(logging.WARNING):
        assert len(list(roomy)) == 6
    assert "preference examples cut" not in caplog.text
    tight = _TokenizedPreferenceStream(pairs, tok, 12, 4, "dpo", True)
    with caplog.at_level(logging.WARNING):
        assert len(list(tight)) == 6 and len(list(tight)) == 6  # two epochs
    assert caplog.text.count("6 of 6 preference examples cut to fit max_seq_len=12") == 1
    assert "raise max_seq_len" in caplog.text


def test_missing_preference_file_names_the_key_and_its_default(tmp_path, monkeypatch):
    # a dpo.json without dev_dataset_path and do_eval true: the error names the key whose default path is missing,
    # before the train split is tokenised
    from types import SimpleNamespace

    from paddlenlp_ext.datasets.preference import create_preference_datasets
    from paddlenlp_ext.transformers import AutoTokenizer
    from tests.trl._tiny import make_tiny_model_dir, write_pairs

    tok = AutoTokenizer.from_pretrained(make_tiny_model_dir(str(tmp_path / "m")))
    monkeypatch.chdir(tmp_path)
    train = write_pairs(str(tmp_path / "train.jsonl"), 2)
    args = SimpleNamespace(train_dataset_path=train, dev_dataset_path="./data/dev.jsonl", max_seq_len=64,
                           max_prompt_len=32, greedy_zero_padding=False, lazy=False, chat_template=None)
    with pytest.raises(FileNotFoundError, match=r"dev_dataset_path='\./data/dev\.jsonl' \(its default\) does not "
                                                r"exist, relative to the current directory .*set dev_dataset_path"):
        create_preference_datasets(args, tok, splits=("train", "dev"))


# ---- a chat template whose assistant turn ends with no special token ---------------------------------------------
# SFT appends eos_token to such a turn (tests/datasets/test_sft_end_of_turn.py); so does encode_response, else the
# chosen response never teaches the policy to stop. The raw encoding (chat_template: none) ends each response with
# eos as PaddleNLP does; templates whose turn ends in a special token (ChatML's <|im_end|>) are unchanged.

PLAIN = ("{# preference test #}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
         "{% if add_generation_prompt %}assistant: {% endif %}")


@pytest.fixture()
def smollm2_tokenizer():
    from paddlenlp_ext.transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct")


def test_plain_template_response_ends_with_eos(smollm2_tokenizer, caplog):
    tokenizer = smollm2_tokenizer
    chatml = encode_response(tokenizer, ["Hi"], [], "Hello there", True)
    assert chatml[-1] == tokenizer.eos_token_id  # <|im_end|> ends the ChatML turn already
    tokenizer.chat_template = PLAIN
    with caplog.at_level(logging.WARNING):
        ids = encode_response(tokenizer, ["Hi"], [], "Hello there", True)
    assert ids[-1] == tokenizer.eos_token_id and ids.count(tokenizer.eos_token_id) == 1
    assert tokenizer.decode(ids[:-1]) == "Hello there\n"  # the rendered turn, then the appended end token
    assert "appending eos_token" in caplog.text


def test_raw_encoding_ends_each_response_with_eos(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    ids = encode_response(tokenizer, ["Hi"], [], "Hello there", False)
    assert ids[-1] == tokenizer.eos_token_id and tokenizer.decode(ids[:-1]) == "Hello there"
