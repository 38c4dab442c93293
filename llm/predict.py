"""Chat with a causal LM from the command line (counterpart of PaddleNLP's ``llm/predict/predictor.py``).

Usage:
    python llm/predict.py --model_name_or_path HuggingFaceTB/SmolLM2-135M-Instruct --prompt "What is 2+2?"
    python llm/predict.py --model_name_or_path ./checkpoints/llama_sft_flashmask      # interactive (a tty)

``--model_name_or_path`` is a local HF directory (ours or transformers'), the embedded SmolLM2 name, or a LoRA
output directory (PEFT ``adapter_config.json`` + ``adapter_model.safetensors``: the base model named in its
``base_model_name_or_path`` is loaded and the adapter merged into it). Replies use the tokenizer's chat template;
without ``--prompt``, a tty gets an interactive multi-turn loop and piped stdin is answered line by line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from paddlenlp_ext.peft.lora import ADAPTER_CONFIG_NAME
from paddlenlp_ext.trainer.checkpoint import TRAINER_STATE
from paddlenlp_ext.transformers import AutoModelForCausalLM, AutoTokenizer
from paddlenlp_ext.transformers.generation import chat


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model_name_or_path", default="HuggingFaceTB/SmolLM2-135M-Instruct",
                   help="local HF directory, or HuggingFaceTB/SmolLM2-135M-Instruct (embedded)")
    p.add_argument("--prompt", default=None, help="one user message; without it, read prompts interactively")
    p.add_argument("--system", default=None, help="optional system message")
    p.add_argument("--max_new_tokens", type=int, default=128)
    p.add_argument("--do_sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top_k", type=int, default=0)
    p.add_argument("--top_p", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16 (bf16/fp16 need a GPU)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--num_threads", type=int, default=0,
                   help="CPU threads for torch (0: torch's default); 1 is much faster on a busy shared CPU")
    return p.parse_args(argv)


def load_model_and_tokenizer(path: str, dtype: str):
    """``(model, tokenizer)`` for a model directory / name, or for a LoRA adapter directory (base + merged adapter).

    Raises:
        FileNotFoundError / ValueError: from the loaders, naming the directory and what is missing.
    """
    if os.path.isfile(os.path.join(path, TRAINER_STATE)):
        raise ValueError(f"{path} is a training checkpoint (torch.distributed.checkpoint shards), not a model "
                         "directory: pass the run's output_dir (its final model), or resume training from it")
    adapter_cfg = os.path.join(path, ADAPTER_CONFIG_NAME)
    if os.path.isfile(adapter_cfg) and not os.path.isfile(os.path.join(path, "config.json")):
        from paddlenlp_ext.peft import adapter_base_model, load_merged_lora

        base = adapter_base_model(path)
        if not base:
            raise ValueError(f"{adapter_cfg}: a LoRA adapter without base_model_name_or_path; load the base model "
                             "and paddlenlp_ext.peft.load_lora yourself, or train with merge_weights: true")
        print(f"[predict] {path} is a LoRA adapter: loading its base {base} and merging the adapter",
              file=sys.stderr)
        return load_merged_lora(path, base, dtype)
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype), AutoTokenizer.from_pretrained(path)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.max_new_tokens < 1:
        raise ValueError(f"--max_new_tokens must be >= 1, got {args.max_new_tokens}")
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device}: no CUDA GPU is available in this torch build/machine; "
                         "use --device cpu")
    if args.num_threads > 0:
        torch.set_num_threads(args.num_threads)
    model, tokenizer = load_model_and_tokenizer(args.model_name_or_path, args.dtype)
    model = model.to(args.device)
    gen = dict(do_sample=args.do_sample, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    if args.do_sample:
        gen["generator"] = torch.Generator(device=args.device).manual_seed(args.seed)
    base = [{"role": "system", "content": args.system}] if args.system else []
    history = list(base)

    def reply(text: str) -> str:
        history.append({"role": "user", "content": text})
        t0 = time.perf_counter()
        answer = chat(model, tokenizer, history, args.max_new_tokens, **gen)
        n = len(tokenizer(answer)["input_ids"])
        print(f"[{n} tokens, {n / (time.perf_counter() - t0):.1f} tokens/s]", file=sys.stderr)
        history.append({"role": "assistant", "content": answer})
        return answer

    if args.prompt is not None:
        print(reply(args.prompt))
        return 0
    if not sys.stdin.isatty():  # piped input: one prompt per line, each answered without history
        for line in sys.stdin:
            if line.strip():
                history[:] = base
                print(reply(line.strip()))
        return 0
    print("Interactive chat; empty line or Ctrl-D to quit.", file=sys.stderr)
    while True:
        try:
            text = input("user> ").strip()
        except EOFError:
            break
        if not text:
            break
        print("assistant>", reply(text))
    return 0


if __name__ == "__main__":
    from paddlenlp_ext.trainer.launch import run_cli

    run_cli(main)
