"""``python llm/merge_lora_params.py --lora_path <adapter> --output_path <dir>``: a LoRA adapter merged into its base
model, also installed as ``paddlenlp-merge-lora``. The code is :mod:`paddlenlp_ext.cli.merge_lora_params`, run in
this script's namespace, so its names are this module's."""

from paddlenlp_ext.cli import load_into

load_into(globals(), "paddlenlp_ext.cli.merge_lora_params")

if __name__ == "__main__":
    cli()  # noqa: F821 (defined by load_into)
