"""``python llm/run_finetune.py config.json [--key value ...]``: the SFT / LoRA launcher, also installed as
``paddlenlp-finetune``. The code is :mod:`paddlenlp_ext.cli.run_finetune`, run in this script's namespace, so its
names are this module's."""

from paddlenlp_ext.cli import load_into

load_into(globals(), "paddlenlp_ext.cli.run_finetune")

if __name__ == "__main__":
    cli()  # noqa: F821 (defined by load_into)
