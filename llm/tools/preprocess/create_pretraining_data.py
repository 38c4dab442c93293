"""Tokenise jsonl documents into a pretraining corpus: ``python llm/tools/preprocess/create_pretraining_data.py
--model_name_or_path <dir> --input_path docs.jsonl --output_prefix <prefix>``, the same as the installed
``paddlenlp-create-pretraining-data``. The code is :mod:`paddlenlp_ext.cli.create_pretraining_data`, run in this
script's namespace (its names are this module's)."""

import os
import sys

# the repository root: runs from a checkout without the package installed
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

from paddlenlp_ext.cli import load_into  # noqa: E402

load_into(globals(), "paddlenlp_ext.cli.create_pretraining_data")

if __name__ == "__main__":
    cli()  # noqa: F821 (defined by load_into)
