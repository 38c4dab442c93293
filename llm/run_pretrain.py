"""``python llm/run_pretrain.py config.json [--key value ...]``: the pretraining launcher, also installed as
``paddlenlp-pretrain``. The code is :mod:`paddlenlp_ext.cli.run_pretrain`, run in this script's namespace, so its
names are this module's."""

from paddlenlp_ext.cli import load_into

load_into(globals(), "paddlenlp_ext.cli.run_pretrain")

if __name__ == "__main__":
    cli()  # noqa: F821 (defined by load_into)
