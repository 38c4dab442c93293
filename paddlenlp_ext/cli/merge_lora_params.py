"""Merge a trained LoRA adapter into its base model and save a full Hugging Face model directory.

Counterpart of PaddleNLP's ``llm/tools/merge_lora_params.py``; installed as ``paddlenlp-merge-lora``. Usage:

    python llm/merge_lora_params.py --lora_path ./checkpoints/smollm2_lora --output_path ./checkpoints/smollm2_merged
    python llm/merge_lora_params.py --lora_path <adapter dir> --model_name_or_path <base> --output_path <dir>

``--lora_path`` is a PEFT adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``, as a
``lora: true`` run writes). The base defaults to the adapter's ``base_model_name_or_path``. The merge is the one of
``merge_weights: true`` (``paddlenlp_ext.peft.load_lora`` + ``merge_lora``: ``W + scaling * B @ A`` folded in fp32,
rounded once to the base dtype); the output (``config.json``, safetensors, tokenizer files of the adapter
directory, else of the base) is written atomically: a temporary sibling directory, then rename.
Differences from PaddleNLP: merging runs on the CPU and the output is always safetensors; PaddleNLP's
``--device`` and ``--safe_serialization`` are accepted so its commands run unchanged (a note on stderr says when
they are not followed); ``--dtype`` picks the dtype the base is loaded, merged and saved in.
"""

from __future__ import annotations

import argparse
import os
import sys

from paddlenlp_ext.peft import adapter_base_model
from paddlenlp_ext.peft.lora import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME
from paddlenlp_ext.trainer.arguments import _file_ancestor
from paddlenlp_ext.trainer.checkpoint import TRAINER_STATE, export_command


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lora_path", required=True, help="PEFT adapter directory (adapter_config.json + weights)")
    p.add_argument("--model_name_or_path", default=None,
                   help="base model (local HF directory or the embedded SmolLM2 name); default: the adapter's "
                        "base_model_name_or_path")
    p.add_argument("--output_path", required=True,
                   help="directory for the merged model (neither --lora_path nor the base model's directory)")
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16: load, merge and save dtype")
    p.add_argument("--model_implementation", default="auto", choices=["auto", "native", "transformers"],
                   help="auto: native Llama / ERNIE-3.5-SE, transformers' code for other model types")
    p.add_argument("--trust_remote_code", action="store_true",
                   help="run the Python code of a model directory whose model_type transformers does not know")
    # PaddleNLP's flags, so its merge commands run unchanged
    p.add_argument("--device", default=None, choices=["gpu", "npu", "cpu"],
                   help="PaddleNLP's flag, accepted for compatibility: the merge always runs on the CPU")
    p.add_argument("--safe_serialization", default=None, type=_strtobool,
                   help="PaddleNLP's flag, accepted for compatibility: the output is always safetensors")
    return p.parse_args(argv)


def _strtobool(value: str) -> bool:
    """PaddleNLP's ``strtobool`` spellings (true/false, yes/no, t/f, y/n, 1/0), for ``--safe_serialization``."""
    v = value.lower()
    if v in ("true", "yes", "t", "y", "1"):
        return True
    if v in ("false", "no", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def compat_notes(args: argparse.Namespace) -> list:
    """Notes for PaddleNLP flags that this merge accepts but does not follow (``--device gpu|npu``,
    ``--safe_serialization false``)."""
    notes = []
    if args.device in ("gpu", "npu"):
        notes.append(f"--device {args.device}: ignored, the merge runs on the CPU")
    if args.safe_serialization is False:
        notes.append("--safe_serialization false: ignored, the merged model is written as safetensors "
                     "(there is no Paddle .pdparams format here)")
    return notes


def resolve_base(lora_path: str, model_name_or_path: str | None) -> str:
    """The base model: ``model_name_or_path`` if given, else ``base_model_name_or_path`` of the adapter.

    Raises:
        FileNotFoundError: ``lora_path`` is not an adapter directory (names the missing file).
        ValueError: ``lora_path`` is a training checkpoint (says how to export it), or no base given and the
            adapter names none.
    """
    if not os.path.isdir(lora_path):
        raise FileNotFoundError(f"--lora_path {lora_path}: no such directory (a LoRA run's output_dir holding "
                                f"{ADAPTER_CONFIG_NAME} and {ADAPTER_WEIGHTS_NAME})")
    if os.path.isfile(os.path.join(lora_path, TRAINER_STATE)):
        # a checkpoint-<step> directory holds no adapter_config.json: say how to export one from it
        raise ValueError(f"--lora_path {lora_path} is a training checkpoint (torch.distributed.checkpoint shards), "
                         "not an adapter: pass the run's output_dir (its final adapter), or export the checkpoint "
                         f"first: {export_command(lora_path)} (writes the adapter there)")
    for name in (ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME):
        if not os.path.isfile(os.path.join(lora_path, name)):
            raise FileNotFoundError(f"--lora_path {lora_path}: {name} not found; it is not a LoRA adapter directory "
                                    "(train with lora: true, or pass the run's output_dir)")
    if model_name_or_path:
        return model_name_or_path
    base = adapter_base_model(lora_path)
    if not base:
        raise ValueError(f"{os.path.join(lora_path, ADAPTER_CONFIG_NAME)}: base_model_name_or_path is empty; pass "
                         "--model_name_or_path <base model>")
    return base


def main(argv=None) -> int:
    args = parse_args(argv)
    for note in compat_notes(args):
        print(f"[merge_lora_params] {note}", file=sys.stderr)
    base = resolve_base(args.lora_path, args.model_name_or_path)
    out = os.path.abspath(args.output_path)
    if out == os.path.abspath(args.lora_path):
        # beside the adapter files, transformers (with peft installed) would load the merged weights and apply
        # the adapter a second time
        raise ValueError(f"--output_path {args.output_path} is the adapter directory; give a new directory")
    from paddlenlp_ext.transformers.auto import local_model_dir

    base_dir = local_model_dir(base)
    if base_dir is not None and os.path.realpath(out) == os.path.realpath(base_dir):
        # the adapter's base_model_name_or_path (a later merge, predict.py on the adapter) would then load the
        # merged weights and apply the adapter a second time; for the embedded SmolLM2's cache directory, every
        # later run that names the default model would start from this fine-tune
        raise ValueError(f"--output_path {args.output_path} is the base model's directory ({base}): the merged "
                         "weights would replace the base the adapter names, so loading the adapter again would "
                         "apply it twice; give a new directory")
    if os.path.exists(out) and not os.path.isdir(out):
        raise NotADirectoryError(f"--output_path {args.output_path} exists and is not a directory")
    if os.path.isfile(os.path.join(out, ADAPTER_CONFIG_NAME)):
        raise ValueError(f"--output_path {args.output_path} holds a LoRA adapter ({ADAPTER_CONFIG_NAME}); beside it "
                         "transformers (with peft) would apply that adapter to the merged weights. Give a new directory")
    blocker = _file_ancestor(out)
    if blocker:
        raise NotADirectoryError(f"--output_path {args.output_path}: cannot create it, {blocker} is a file; "
                                 "give a path under a directory")

    from paddlenlp_ext.peft import load_merged_lora
    from paddlenlp_ext.trainer.checkpoint import explain_write_errors
    from paddlenlp_ext.transformers.model_utils import atomic_save_dir

    print(f"[merge_lora_params] base {base} + adapter {args.lora_path} -> {out}", file=sys.stderr)
    model, tokenizer = load_merged_lora(args.lora_path, base, args.dtype, model_implementation=args.model_implementation,
                                        trust_remote_code=args.trust_remote_code)
    # disk full: one SaveError line naming the directory (run_cli prints it), the temporary directory removed
    with explain_write_errors(out, "the merged model", after="run merge_lora_params.py again"):
        with atomic_save_dir(out) as tmp:  # model and tokenizer appear together or not at all
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
    print(f"[merge_lora_params] saved the merged model to {out}", file=sys.stderr)
    return 0


def cli() -> None:
    """The ``paddlenlp-merge-lora`` command (and ``python llm/merge_lora_params.py``): :func:`main` on ``sys.argv``
    through ``run_cli`` (bad input: one ``error:`` line, exit 2; Ctrl-C 130, SIGTERM 143)."""
    from paddlenlp_ext.trainer.launch import run_cli

    run_cli(main)
