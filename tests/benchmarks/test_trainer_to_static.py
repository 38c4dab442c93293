"""``benchmarks/trainer_to_static.py`` on the CPU (``--tiny``): both settings train through the real Trainer, the
compiled run goes through dynamo, both reach the same loss, and the table prints; bad settings are refused."""

import pytest
import torch

from tests._scripts import load_script


def test_tiny_run_trains_both_settings(capsys):
    import torch._dynamo

    mod = load_script("benchmarks/trainer_to_static.py", "trainer_to_static_test")
    torch._dynamo.reset()
    frames = torch._dynamo.utils.counters["frames"]["ok"]
    rows = mod.main(["--tiny", "--pack-len", "256", "--steps", "4", "--window", "2", "--settings", "off,on"])
    assert [r["to_static"] for r in rows] == [False, True]
    assert torch._dynamo.utils.counters["frames"]["ok"] > frames  # the "on" run compiled its layers
    assert all(r["tokens_per_s"] and r["tokens_per_s"] > 0 for r in rows)
    # gross-breakage check only (the derived-tolerance comparison is tests/trainer/test_to_static.py)
    assert rows[1]["train_loss"] == pytest.approx(rows[0]["train_loss"], rel=1e-4)
    assert "| to_static | tokens/s" in capsys.readouterr().out


def test_bad_settings_are_refused():
    mod = load_script("benchmarks/trainer_to_static.py", "trainer_to_static_test_bad")
    with pytest.raises(SystemExit):
        mod.main(["--tiny", "--settings", "off,maybe"])
