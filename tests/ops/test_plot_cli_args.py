"""flashmask.plot command line: out-of-range or missing arguments give one argparse error line (exit 2)."""

import pytest


@pytest.mark.parametrize("argv,msg", [
    (["causal", "--seq-len", "-3", "--text"], "--seq-len must be >= 1"),
    (["causal", "--seq-len", "0", "--text"], "--seq-len must be >= 1"),
    (["causal_document", "--lengths", "3,3;4,2", "--batch", "5", "--text"], "--batch 5: the mask has 2 batch row"),
    (["causal", "--seq-len", "4", "--batch", "-1", "--text"], "--batch -1"),
    (["prefix_lm_document", "--lengths", "2,2", "--text"], "needs --prefixes"),
    (["qk_sparse", "--seq-len", "5", "--ranges", "1", "--text"], "each range is a-b"),
])
def test_plot_cli_bad_arguments(argv, msg, capsys):
    from flashmask.plot import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and msg in err, err


def test_plot_cli_batch_row_selects_row(capsys):
    from flashmask.plot import main

    assert main(["causal_document", "--lengths", "3,3;4,2", "--batch", "1", "--text"]) == 0
    assert "LTS   : 4 4 4 4 6 6" in capsys.readouterr().out
