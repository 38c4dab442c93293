"""``python llm/predict.py --model_name_or_path <dir> [--prompt ...]``: chat and prediction, also installed as
``paddlenlp-predict``. The code is :mod:`paddlenlp_ext.cli.predict`, run in this script's namespace, so its names are
this module's."""

from paddlenlp_ext.cli import load_into

load_into(globals(), "paddlenlp_ext.cli.predict")

if __name__ == "__main__":
    cli()  # noqa: F821 (defined by load_into)
