"""``python llm/run_dpo.py config.json [--key value ...]``: the DPO launcher, also installed as ``paddlenlp-dpo``. The
code is :mod:`paddlenlp_ext.cli.run_dpo`, run in this script's namespace, so its names are this module's."""

from paddlenlp_ext.cli import load_into

load_into(globals(), "paddlenlp_ext.cli.run_dpo")

if __name__ == "__main__":
    cli()  # noqa: F821 (defined by load_into)
