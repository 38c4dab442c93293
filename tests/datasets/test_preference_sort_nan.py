"""A NaN sort (Python's json reads the bare token NaN) cannot order a pair: it is an error naming file and line
instead of silently making the second response the chosen one (every comparison with NaN is False)."""

import pytest

from paddlenlp_ext.datasets.preference import check_preference_data, read_preference_jsonl


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
