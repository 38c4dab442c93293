"""``python llm/run_reward.py config.json [--key value ...]``: the reward-model launcher, also installed as
``paddlenlp-reward``. The code is :mod:`paddlenlp_ext.cli.run_reward`, run in this script's namespace, so its names
are this module's."""

from paddlenlp_ext.cli import load_into

load_into(globals(), "paddlenlp_ext.cli.run_reward")

if __name__ == "__main__":
    cli()  # noqa: F821 (defined by load_into)
