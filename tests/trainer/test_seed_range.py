"""seed outside numpy's [0, 2**32 - 1] is a config error naming the key (was numpy's bare "Seed must be between
0 and 2**32 - 1" from set_seed, after the output_dir checks, with no key named)."""

import pytest

from paddlenlp_ext.trainer.arguments import TrainingArguments


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_seed_out_of_range(tmp_path, seed):
    with pytest.raises(ValueError, match=rf"seed must be in \[0, 2\*\*32 - 1\], got {seed}"):
        TrainingArguments(output_dir=str(tmp_path / "out"), seed=seed)


def test_seed_bounds_accepted(tmp_path):
    for seed in (0, 2**32 - 1):
        assert TrainingArguments(output_dir=str(tmp_path / "out"), seed=seed).seed == seed
