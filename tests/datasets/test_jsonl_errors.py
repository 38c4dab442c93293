"""The SFT and preference jsonl readers: a mistake in a data file is one error naming the file and line (and the
fix where there is one); records that train nothing useful are counted in one warning per file, naming the lines;
a UTF-8 byte-order mark is skipped."""

import json
import logging

import pytest

from paddlenlp_ext.datasets.jsonl import iter_jsonl, read_jsonl
from paddlenlp_ext.datasets.preference import check_preference_data, read_preference_jsonl

SFT = '{"src": "hi", "tgt": "hello"}\n'
PREF = '{"src": ["q"], "tgt": [], "response": ["a", "b"], "sort": [1, 0]}\n'


def write_lines(path, lines):
    """``lines`` (text) one per line into ``path``; returns the path as a string."""
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _write_lines(path, rows):
    """``rows`` (JSON objects) one per line into ``path``; returns the path as a string."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("read,good", [(read_jsonl, SFT), (lambda p: list(read_preference_jsonl(p)), PREF)],
                         ids=["sft", "preference"])
def test_not_utf8_names_file_and_line(tmp_path, read, good):
    p = tmp_path / "train.json"
    p.write_bytes(good.encode() + b'{"src": "caf\xe9"}\n')  # Latin-1 byte on line 2
    with pytest.raises(ValueError, match=r"train\.json:2: not UTF-8 \(byte 0xe9"):
        read(str(p))


@pytest.mark.parametrize("read", [read_jsonl, lambda p: list(read_preference_jsonl(p))], ids=["sft", "preference"])
def test_directory_and_empty_file(tmp_path, read):
    with pytest.raises(FileNotFoundError, match="is a directory"):
        read(str(tmp_path))
    empty = tmp_path / "empty.json"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match=r"empty\.json: empty file"):
        read(str(empty))


@pytest.mark.parametrize("line, problem", [
    ('{"src": "a", "tgt": "b"', r"bad\.json:2: invalid JSON at column"),
    ('{"src": "a"}', r"bad\.json:2: missing key\(s\) \['tgt'\]"),
    ('{"src": ["a", "b"], "tgt": ["x"]}', r"bad\.json:2: \"src\" has 2 turns but \"tgt\" has 1"),
    ('{"src": 3, "tgt": "x"}', r"bad\.json:2: \"src\" must be a string or a list of strings"),
    ('{"src": [], "tgt": []}', r"bad\.json:2: \"src\" is an empty list"),
    ('["a", "b"]', r"bad\.json:2: expected a JSON object"),
])
def test_malformed_sft_line_names_file_and_line(tmp_path, line, problem):
    path = write_lines(tmp_path / "bad.json", ['{"src": "q", "tgt": "a"}', line])
    with pytest.raises(ValueError, match=problem):
        read_jsonl(path)


def test_invalid_json_column_is_on_the_line(tmp_path):
    """The column of an error at the end of a line is on that line (json.loads given the line with its newline
    would put the error on an empty second line, column 1)."""
    bad = '{"src": "q", "tgt": "a",'
    path = write_lines(tmp_path / "bad.json", ['{"src": "q", "tgt": "a"}', bad])
    with pytest.raises(ValueError, match=rf"bad\.json:2: invalid JSON at column {len(bad) + 1}: Expecting property"):
        read_jsonl(path)


def test_several_pretty_printed_objects_say_it_is_not_jsonl(tmp_path):
    """Records written one after another with json.dumps(r, indent=2): the error says so and gives the fix."""
    path = tmp_path / "train.json"
    path.write_text("".join(json.dumps({"src": f"q{i}", "tgt": "a"}, indent=2) + "\n" for i in range(3)))
    with pytest.raises(ValueError, match=r"train\.json:1: invalid JSON .*holds 3 JSON objects, each spread over "
                                         r"several lines .*jq -c \."):
        read_jsonl(str(path))
    path.write_text('{"src": "q",\n "tgt": "a"}\n[1]\n')  # not only objects: no claim about the file
    with pytest.raises(ValueError) as e:
        read_jsonl(str(path))
    assert "JSON objects" not in str(e.value)


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("kind", ["sft", "preference"])
def test_json_array_file_says_it_is_not_jsonl(tmp_path, indent, kind):
    """A JSON array of records (one line, or pretty-printed): the error says the file is a JSON array and how to
    convert it (not 'expected a JSON object, got list' / 'invalid JSON at column 1')."""
    rec = {"src": "q", "tgt": "a"} if kind == "sft" else {"src": "q", "tgt": [], "response": ["a", "b"], "sort": [1, 0]}
    path = tmp_path / "train.json"
    path.write_text(json.dumps([rec, rec], indent=indent))
    read = read_jsonl if kind == "sft" else (lambda p: list(read_preference_jsonl(p)))
    with pytest.raises(ValueError, match=r"train\.json:1: .*one JSON array of 2 item\(s\).*Convert it: python -c"):
        read(str(path))


def test_pretty_printed_object_says_it_is_not_jsonl(tmp_path):


    path = tmp_path / "train.json"
    path.write_text(json.dumps({"src": "q", "tgt": "a"}, indent=2) + "\n")
    with pytest.raises(ValueError, match=r"train\.json:1: invalid JSON .*one JSON object spread over several lines"):
        read_jsonl(str(path))


def test_preference_null_src_names_file_and_line(tmp_path):
    # a null src or a number as tgt is a ValueError naming file and line, not a TypeError from len()
    ok = {"src": "a", "tgt": "", "response": ["x", "y"], "sort": [1, 0]}
    path = _write_lines(tmp_path / "train.jsonl", [ok, {**ok, "src": None}])
    with pytest.raises(ValueError, match=r"train\.jsonl:2: src and tgt must be a string or a list of strings"):
        list(read_preference_jsonl(path))
    path = _write_lines(tmp_path / "dev.jsonl", [{**ok, "tgt": 3}])
    with pytest.raises(ValueError, match=r"dev\.jsonl:1: src and tgt"):
        list(read_preference_jsonl(path))


@pytest.mark.parametrize("key", ["add_generation_prompt", "tokenize", "messages"])
def test_sft_context_key_clashing_with_apply_chat_template_names_line(tmp_path, key):
    # a context key that apply_chat_template takes itself is refused when the file is read, naming the line
    # (not a TypeError "got multiple values for keyword argument" during tokenisation)
    path = _write_lines(tmp_path / "train.json", [{"src": "a", "tgt": "b"},
                                                  {"src": "a", "tgt": "b", "context": {key: 1}}])
    with pytest.raises(ValueError, match=rf"train\.json:2: \"context\" key\(s\) \['{key}'\]"):
        list(iter_jsonl(path))
    # ordinary template variables still pass
    path = _write_lines(tmp_path / "ok.json", [{"src": "a", "tgt": "b", "context": {"system": "be brief"}}])
    assert list(iter_jsonl(path))[0]["context"] == {"system": "be brief"}


def test_preference_file_given_to_sft_names_the_launcher_to_use(tmp_path):
    p = tmp_path / "train.json"
    p.write_text(json.dumps({"src": ["q"], "tgt": [], "response": ["a", "b"], "sort": [1, 0]}) + "\n")
    with pytest.raises(ValueError, match=r"train\.json:1: .*preference record .*run_dpo\.py or llm/run_reward\.py"):
        read_jsonl(str(p))


def test_sft_file_given_to_dpo_names_the_launcher_to_use(tmp_path):
    p = tmp_path / "train.jsonl"
    p.write_text(json.dumps({"src": "q", "tgt": "a"}) + "\n")
    with pytest.raises(ValueError, match=r"train\.jsonl:1: missing key 'response'.*SFT record.*run_finetune\.py"):
        list(read_preference_jsonl(str(p)))


def _preference(path):
    return [(e.src, e.tgt, e.chosen, e.rejected, e.sort_chosen) for e in read_preference_jsonl(path)]


@pytest.mark.parametrize("read,good", [(read_jsonl, SFT), (_preference, PREF)], ids=["sft", "preference"])
def test_leading_bom_is_skipped(tmp_path, read, good):
    plain, bom = tmp_path / "plain.json", tmp_path / "bom.json"
    plain.write_text(good * 2, encoding="utf-8")
    bom.write_text(good * 2, encoding="utf-8-sig")  # EF BB BF before line 1
    assert bom.read_bytes().startswith(b"\xef\xbb\xbf")
    assert read(str(bom)) == read(str(plain))


def test_bom_inside_the_file_is_still_an_error(tmp_path):
    p = tmp_path / "train.json"
    p.write_bytes(SFT.encode() + b"\xef\xbb\xbf" + SFT.encode())  # two files concatenated
    with pytest.raises(ValueError, match=r"train\.json:2: invalid JSON"):
        read_jsonl(str(p))


@pytest.mark.parametrize("sort", ["[NaN, 0]", "[0, NaN]", "[NaN, NaN]"])
def test_nan_sort_is_an_error(tmp_path, sort):
    p = tmp_path / "train.jsonl"
    p.write_text('{"src": ["q"], "tgt": [], "response": ["a", "b"], "sort": [1, 0]}\n'
                 '{"src": ["q"], "tgt": [], "response": ["a", "b"], "sort": %s}\n' % sort)
    with pytest.raises(ValueError, match=r"train\.jsonl:2: rule 'sort values are numbers' broken"):
        list(read_preference_jsonl(str(p)))


def test_infinite_sorts_still_order_the_pair():
    ex = check_preference_data({"src": "q", "tgt": [], "response": ["a", "b"], "sort": [float("-inf"), 0]})
    assert (ex.chosen, ex.rejected) == ("b", "a")


def _warnings(caplog, needle):
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and needle in r.getMessage()]


def test_sft_empty_answer_is_warned_with_its_lines(tmp_path, caplog):
    """``"tgt": ""`` (or whitespace) trains only the end-of-turn token: kept, and warned once naming the lines."""
    path = _write_lines(tmp_path / "train.json", [{"src": "q1", "tgt": "a1"}, {"src": "q2", "tgt": ""},
                                                  {"src": ["q3", "q4"], "tgt": ["a3", "  "]}])
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.datasets.jsonl"):
        assert len(read_jsonl(path)) == 3  # kept, as PaddleNLP does
        read_jsonl(path)  # a lazy stream re-reads the file every epoch: still one warning
    msgs = _warnings(caplog, "empty answer")
    assert len(msgs) == 1
    assert "2 of 3 SFT records" in msgs[0] and f"{path}:2, {path}:3" in msgs[0]


def test_sft_without_empty_answers_is_quiet(tmp_path, caplog):
    path = _write_lines(tmp_path / "train.json", [{"src": "q1", "tgt": "a1"}, {"src": "", "tgt": "a2"}])
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.datasets.jsonl"):
        read_jsonl(path)
    assert not _warnings(caplog, "empty answer")


def test_preference_identical_responses_are_warned_with_their_lines(tmp_path, caplog):
    """A pair with the same text twice (different sorts) has a margin of 0 whatever the model: warned."""
    rows = [{"src": "q", "tgt": [], "response": ["a", "b"], "sort": [1, 0]},
            {"src": "q", "tgt": [], "response": ["same", " same "], "sort": [0, 1]}]
    path = _write_lines(tmp_path / "train.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.datasets.jsonl"):
        assert len(list(read_preference_jsonl(path))) == 2
        list(read_preference_jsonl(path))
    msgs = _warnings(caplog, "identical responses")
    assert len(msgs) == 1 and "1 of 2 preference records" in msgs[0] and f"{path}:2" in msgs[0]
