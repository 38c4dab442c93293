"""Chat with a causal LM from the command line (counterpart of PaddleNLP's ``llm/predict/predictor.py``).

Usage (``paddlenlp-predict`` is the same command):
    python llm/predict.py --model_name_or_path HuggingFaceTB/SmolLM2-135M-Instruct --prompt "What is 2+2?"
    python llm/predict.py --model_name_or_path ./checkpoints/llama_sft_flashmask      # interactive (a tty)

``--model_name_or_path`` is a local HF directory (ours or transformers'), the embedded SmolLM2 name, or a LoRA
output directory (PEFT ``adapter_config.json`` + ``adapter_model.safetensors``: the base model named in its
``base_model_name_or_path`` is loaded and the adapter merged into it). Without ``--prompt``, a tty gets an
interactive multi-turn chat and piped stdin is answered line by line, each line on its own (no history).

Piped stdin (``python llm/predict.py ... < prompts.txt > replies.txt``): exactly one stdout line per input line,
so line N of the output answers line N of the input. A blank (or whitespace-only) line gets an empty line (the
model is not called); a line past ``--src_length`` gets an empty line and a notice on stderr naming its line
number; a line that is not valid UTF-8 is answered with the bad bytes replaced by U+FFFD (notice on stderr). A
reply that itself spans lines is written on one line with ``\\`` as ``\\\\``, newline as ``\\n`` and carriage
return as ``\\r`` (reversible: :func:`unescape_reply`); replies with none of these are written unchanged.
Notices and token rates go to stderr only. A reader that closes the pipe early (``| head -n 3``) ends the run
quietly with exit status 141, as shell tools do. On a stdout that is not UTF-8 (``PYTHONIOENCODING=ascii``, a
cp1252 console) characters it cannot show are written as ``?`` (one notice) instead of stopping the run.

PaddleNLP predictor flags (``llm/predict/predictor.py``, ERNIE-3.5-SE's ``predict_generation.py``), so their
commands run: ``--data_file dev.json [--output_file|--predict_file output.json]`` answers each record
(``{"src"}`` or ``{"src", "tgt"}`` jsonl; the last ``src`` turn after the earlier turns; every line is checked
before the model loads, errors name ``file:line``) and writes ``{"src", "tgt", "output"}`` per line, generating
``--batch_size`` records at a time (left padding); ``--lora_path <adapter>`` merges an adapter into
``--model_name_or_path``; ``--max_length`` / ``--tgt_length`` are ``--max_new_tokens``;
``--decode_strategy greedy_search|sampling`` (ERNIE-3.5-SE samples with temperature 0.95, top_k 3, top_p 0.8
unless given); ``--repetition_penalty``; ``--pos_decoding_interval`` (ERNIE-3.5-SE); ``--device gpu`` is
``cuda``. Defaults differ: greedy decoding (PaddleNLP samples), float32 (PaddleNLP needs ``--dtype``).

Interactive chat: every turn sees the whole conversation so far. ``/reset`` starts a new conversation (the
``--system`` message stays), ``/exit``, ``/quit`` or Ctrl-D ends; an empty line is ignored. The prompt is capped
at ``--src_length`` tokens (default: the model's ``max_position_embeddings`` minus ``--max_new_tokens``); when
the conversation grows past it, the oldest whole turns (user message + reply) are dropped, the system message
kept, and a notice is printed. A single message longer than the cap is refused with a notice.

Prompt format (:func:`encode_conversation`), as PaddleNLP's ``BasePredictor._preprocess``: with a chat template,
the conversation goes through ``tokenizer.apply_chat_template`` (PaddleNLP applies the template to the whole
conversation and adds no other special tokens); without one, turns are concatenated as plain token ids in the
layout SFT trains on without a template (``paddlenlp_ext.datasets.sft``: ``<bos> user`` + ``reply </s>`` per
finished turn, then ``<bos> user``; PaddleNLP tokenizes the raw text with its special tokens). Difference:
PaddleNLP cuts an over-long prompt to its last ``src_length`` tokens, mid-turn and losing the system prompt; we
drop whole oldest turns, as our SFT truncation does.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable, Iterable, Sequence

import torch

from paddlenlp_ext.peft.lora import ADAPTER_CONFIG_NAME
from paddlenlp_ext.trainer.checkpoint import TRAINER_STATE, export_command
from paddlenlp_ext.transformers import AutoModelForCausalLM, AutoTokenizer
from paddlenlp_ext.transformers.batch_generation import ERNIE_SAMPLING, generate_batch, pos_decoding_interval
from paddlenlp_ext.transformers.generation import encode_conversation, generate  # noqa: F401 (re-exported)
from paddlenlp_ext.transformers.model_utils import to_torch_dtype
from paddlenlp_ext.transformers.predict_data import predict_file, read_data_file  # noqa: F401 (re-exported)

SAMPLING = {"temperature": 0.7, "top_k": 0, "top_p": 0.9}  # defaults of the flags that only apply when sampling


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog="Interactive chat (a tty, no --prompt): multi-turn; /reset starts over, /exit, "
                                       "/quit or Ctrl-D quits; the oldest turns are dropped past --src_length. "
                                       "Piped stdin: one output line per input line, each line answered on its "
                                       "own; a blank or too-long line gets an empty output line (notice on "
                                       "stderr); a multi-line reply is written on one line with \\ as \\\\, "
                                       "newline as \\n, carriage return as \\r.")
    p.add_argument("--model_name_or_path", default="HuggingFaceTB/SmolLM2-135M-Instruct",
                   help="local HF directory, or HuggingFaceTB/SmolLM2-135M-Instruct (embedded)")
    p.add_argument("--tokenizer_name_or_path", default=None,
                   help="tokenizer directory (PaddleNLP's training key); default: the model's, or for a LoRA adapter "
                        "its own tokenizer files, else its base's")
    p.add_argument("--prompt", default=None, help="one user message; without it, read prompts interactively")
    p.add_argument("--system", default=None, help="optional system message")
    p.add_argument("--max_new_tokens", type=int, default=128)
    p.add_argument("--src_length", type=int, default=None,
                   help="prompt cap in tokens (PaddleNLP's name); the oldest turns are dropped past it. Default: "
                        "the model's max_position_embeddings - max_new_tokens, also its largest allowed value")
    p.add_argument("--max_length", "--tgt_length", type=int, dest="max_new_tokens", default=argparse.SUPPRESS,
                   help="PaddleNLP predictors' names for --max_new_tokens (the reply's token budget)")
    p.add_argument("--lora_path", default=None,
                   help="PaddleNLP predictor's flag: a LoRA adapter directory merged into --model_name_or_path (the "
                        "base); without it, --model_name_or_path may itself be the adapter directory")
    p.add_argument("--data_file", default=None,
                   help="PaddleNLP predictor's flag: jsonl of {\"src\"} or SFT {\"src\", \"tgt\"}; each record's "
                        "last src turn is answered after its earlier turns, one JSON line per record goes to "
                        "--output_file")
    p.add_argument("--output_file", "--predict_file", default="output.json",
                   help="with --data_file: jsonl of {\"src\", \"tgt\" (when given), \"output\"} (--predict_file: "
                        "ERNIE-3.5-SE predictor's name)")
    p.add_argument("--batch_size", type=int, default=1,
                   help="--data_file records generated together (left-padded batch; greedy gives the same replies "
                        "as one at a time)")
    p.add_argument("--repetition_penalty", type=float, default=1.0,
                   help="> 1 lowers the logits of tokens already in the prompt or reply (PaddleNLP's; 1 = off)")
    p.add_argument("--pos_decoding_interval", type=int, default=None,
                   help="ERNIE-3.5-SE with random position ids: spacing of inference positions; default the "
                        "pos_decoding_interval environment variable, else 8, or max_position_embeddings // "
                        "(src_length + tgt_length) past 4096 (PaddleNLP's predictor)")
    p.add_argument("--decode_strategy", default=None, choices=["greedy_search", "sampling"],
                   help="PaddleNLP predictor's flag: sampling = --do_sample; default greedy (PaddleNLP: sampling)")
    p.add_argument("--do_sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=None,
                   help=f"with --do_sample (default {SAMPLING['temperature']}; ERNIE-3.5-SE: "
                        f"{ERNIE_SAMPLING['temperature']})")
    p.add_argument("--top_k", type=int, default=None,
                   help=f"with --do_sample (default {SAMPLING['top_k']}: off; ERNIE-3.5-SE: {ERNIE_SAMPLING['top_k']})")
    p.add_argument("--top_p", type=float, default=None,
                   help=f"with --do_sample (default {SAMPLING['top_p']}; ERNIE-3.5-SE: {ERNIE_SAMPLING['top_p']})")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16 (half precision is for GPUs: on the CPU it runs, slowly)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cpu | cuda | cuda:N (PaddleNLP's gpu means cuda)")
    p.add_argument("--model_implementation", default="auto", choices=["auto", "native", "transformers"],
                   help="auto: native Llama / ERNIE-3.5-SE, transformers' code for other model types")
    p.add_argument("--trust_remote_code", action="store_true",
                   help="run the Python code of a model directory whose model_type transformers does not know")
    p.add_argument("--num_threads", type=int, default=0,
                   help="CPU threads for torch (0: torch's default); 1 is much faster on a busy shared CPU")
    return p.parse_args(argv)


def load_model_and_tokenizer(path: str, dtype: str, tokenizer_name_or_path: str | None = None,
                             lora_path: str | None = None, **load_kwargs):
    """``(model, tokenizer)`` for a model directory / name, or for a LoRA adapter directory (base + merged adapter).
    ``tokenizer_name_or_path`` (optional) loads the tokenizer from there instead, e.g. for a model directory saved
    without tokenizer files (the loader's error for such a directory names this key). ``lora_path`` (PaddleNLP
    predictor's flag): an adapter directory merged into ``path`` as its base. ``load_kwargs``
    (``model_implementation``, ``trust_remote_code``) go to ``AutoModelForCausalLM.from_pretrained``.

    Raises:
        FileNotFoundError / ValueError: from the loaders, naming the directory and what is missing.
    """
    # first: a wrong tokenizer path fails before the model is loaded
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_name_or_path) if tokenizer_name_or_path else None
    if lora_path:
        from paddlenlp_ext.peft import load_merged_lora

        if not os.path.isfile(os.path.join(lora_path, ADAPTER_CONFIG_NAME)):
            raise FileNotFoundError(f"--lora_path {lora_path}: no {ADAPTER_CONFIG_NAME}; give a LoRA run's "
                                    "output_dir (PEFT adapter), or leave --lora_path out for a full model")
        print(f"[predict] merging the LoRA adapter {lora_path} into {path}", file=sys.stderr)
        model, own = load_merged_lora(lora_path, path, dtype, **load_kwargs)
        return model, (own if tokenizer is None else tokenizer)
    if os.path.isfile(os.path.join(path, TRAINER_STATE)):
        raise ValueError(f"{path} is a training checkpoint (torch.distributed.checkpoint shards), not a model "
                         "directory: pass the run's output_dir (its final model), or export the checkpoint first: "
                         f"{export_command(path)}")
    adapter_cfg = os.path.join(path, ADAPTER_CONFIG_NAME)
    if os.path.isfile(adapter_cfg) and not os.path.isfile(os.path.join(path, "config.json")):
        from paddlenlp_ext.peft import adapter_base_model, load_merged_lora

        base = adapter_base_model(path)
        if not base:
            raise ValueError(f"{adapter_cfg}: a LoRA adapter without base_model_name_or_path; load the base model "
                             "and paddlenlp_ext.peft.load_lora yourself, or train with merge_weights: true")
        print(f"[predict] {path} is a LoRA adapter: loading its base {base} and merging the adapter",
              file=sys.stderr)
        model, own = load_merged_lora(path, base, dtype, **load_kwargs)
        return model, (own if tokenizer is None else tokenizer)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **load_kwargs)
    return model, (AutoTokenizer.from_pretrained(path) if tokenizer is None else tokenizer)


Message = dict  # {"role": "system" | "user" | "assistant", "content": str}


def fit_history(messages: Sequence[Message], count_tokens: Callable[[Sequence[Message]], int],
                max_tokens: int) -> tuple[list[Message], int]:
    """Drop the oldest whole turns of ``messages`` until ``count_tokens(kept) <= max_tokens``.

    Args:
        messages: an optional leading system message, then user/assistant turns, ending with the new user message.
        count_tokens: the prompt length in tokens of a message list (e.g. ``len(encode_conversation(tok, m))``).
        max_tokens: the cap (``--src_length``).

    Returns ``(kept, dropped_turns)``: the system message (if any) and the newest turns that fit; a turn is a
    user message with the replies after it, so the conversation never starts with a reply.

    Raises:
        ValueError: the system message and the new user message alone exceed ``max_tokens``.
    """
    head = [m for m in messages[:1] if m["role"] == "system"]
    turns: list[list[Message]] = []
    for m in messages[len(head):]:
        if m["role"] == "user" or not turns:
            turns.append([m])
        else:
            turns[-1].append(m)
    dropped = 0
    while True:
        kept = head + [m for t in turns[dropped:] for m in t]
        n = count_tokens(kept)
        if n <= max_tokens:
            return kept, dropped
        if dropped == len(turns) - 1:
            raise ValueError(f"the message is too long: {n} prompt tokens (with the system message and template) > "
                             f"the cap of {max_tokens} (--src_length); shorten it, or raise the cap: pass a larger "
                             f"--src_length, or, when it is left at its default (max_position_embeddings - "
                             f"max_new_tokens), a smaller --max_new_tokens")
        dropped += 1


class Conversation:
    """The interactive chat's history with its token cap (see :func:`fit_history`).

    Args:
        encode: ``messages -> prompt token ids`` (:func:`encode_conversation` with a tokenizer).
        max_tokens: prompt cap in tokens.
        system: optional system message, kept across :meth:`reset` and truncation.
    """

    def __init__(self, encode: Callable[[Sequence[Message]], list[int]], max_tokens: int, system: str | None = None):
        self.encode, self.max_tokens = encode, max_tokens
        self.base: list[Message] = [{"role": "system", "content": system}] if system else []
        self.messages: list[Message] = list(self.base)

    def reset(self) -> None:
        self.messages = list(self.base)

    def prompt_for(self, text: str) -> tuple[list[int], int]:
        """Add the user message ``text``; returns ``(prompt ids, oldest turns dropped to fit)``.
        Raises ValueError (history unchanged) when the message alone does not fit."""
        kept, dropped = fit_history(self.messages + [{"role": "user", "content": text}],
                                    lambda m: len(self.encode(m)), self.max_tokens)
        self.messages = kept
        return self.encode(kept), dropped

    def add_reply(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})


def interactive(conv: Conversation, respond: Callable[[list[int]], str], read: Callable[[str], str],
                say: Callable[[str], None], notify: Callable[[str], None]) -> None:
    """The interactive loop: ``read(prompt) -> line`` (EOFError ends), ``respond(ids) -> reply``, ``say`` prints
    a reply, ``notify`` a notice. Commands: ``/reset``, ``/exit``, ``/quit``; empty lines are ignored."""
    notify("Interactive chat (multi-turn): /reset starts over, /exit or Ctrl-D quits.")
    while True:
        try:
            text = read("user> ").strip()
        except (EOFError, KeyboardInterrupt):
            notify("")
            return
        if not text:
            continue
        if text in ("/exit", "/quit"):
            return
        if text == "/reset":
            conv.reset()
            notify("[conversation reset]")
            continue
        try:
            ids, dropped = conv.prompt_for(text)
        except ValueError as e:
            notify(f"[not sent: {e}]")
            continue
        if dropped:
            notify(f"[context: the conversation passed {conv.max_tokens} tokens (--src_length); dropped the oldest "
                   f"{dropped} turn(s)]")
        answer = respond(ids)
        conv.add_reply(answer)
        say(f"assistant> {answer}")


_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r"}
_UNESCAPES = {v[1]: k for k, v in _ESCAPES.items()}  # "\\" -> "\\", "n" -> "\n", "r" -> "\r"


def escape_reply(text: str) -> str:
    """``text`` on one line for piped output: backslash -> ``\\\\``, newline -> ``\\n``, carriage return ->
    ``\\r`` (other characters unchanged). Reversed by :func:`unescape_reply`."""
    return "".join(_ESCAPES.get(c, c) for c in text)


def unescape_reply(line: str) -> str:
    """Inverse of :func:`escape_reply`: one piped output line (without its line end) -> the model's reply."""
    out, i = [], 0
    while i < len(line):
        if line[i] == "\\" and i + 1 < len(line) and line[i + 1] in _UNESCAPES:
            out.append(_UNESCAPES[line[i + 1]])
            i += 2
        else:
            out.append(line[i])
            i += 1
    return "".join(out)


def to_text(raw: bytes | str, where: str, notify: Callable[[str], None]) -> str:
    """A prompt as clean UTF-8 text: bytes are decoded as UTF-8; a ``str`` from ``sys.argv`` / ``input()`` may
    hold lone surrogates for undecodable bytes (Python's ``surrogateescape``), which the tokenizer rejects with a
    TypeError. Undecodable bytes become U+FFFD, with a notice naming ``where`` (e.g. ``stdin line 3``)."""
    if isinstance(raw, str):
        try:  # back to the bytes the user typed: U+DC80..U+DCFF stand for undecodable bytes
            raw = raw.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # other lone surrogates: no bytes behind them
            raw = raw.encode("utf-8", "replace")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        notify(f"[predict] {where} is not valid UTF-8 (byte 0x{raw[e.start]:02x} at byte offset {e.start}): "
               "undecodable bytes replaced by U+FFFD; save the prompts as UTF-8 (e.g. iconv -t UTF-8)")
        return raw.decode("utf-8", "replace")


def answer_lines(lines: Iterable[bytes], conv: "Conversation", respond: Callable[[list[int]], str],
                 say: Callable[[str], None], notify: Callable[[str], None]) -> int:
    """Piped mode: answer each of ``lines`` (raw stdin lines, bytes) on its own, ``say`` exactly one output line
    per input line (see the module docstring); returns the number of lines answered by the model.

    A blank line -> an empty output line (no model call); a line past the prompt cap -> an empty output line and
    a notice naming its line number; a multi-line reply -> :func:`escape_reply`. A UTF-8 byte-order mark at the
    start of the input is dropped (as the data readers do)."""
    answered, blank = 0, []
    for lineno, raw in enumerate(lines, 1):
        if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark (Windows editors): not text
            raw = raw[3:]
        text = to_text(raw, f"stdin line {lineno}", notify).strip()
        if not text:
            blank.append(lineno)
            say("")  # keeps output line N aligned with input line N
            continue
        conv.reset()
        try:
            ids, _ = conv.prompt_for(text)
        except ValueError as e:
            notify(f"[predict] stdin line {lineno} skipped (empty output line): {e}")
            say("")
            continue
        say(escape_reply(respond(ids)))
        answered += 1
    if blank:
        shown = ", ".join(map(str, blank[:10])) + (", ..." if len(blank) > 10 else "")
        notify(f"[predict] {len(blank)} blank stdin line(s) ({shown}) answered with an empty line")
    return answered


def prompt_cap(model, max_new_tokens: int, src_length: int | None) -> int:
    """``src_length`` or ``max_position_embeddings - max_new_tokens``: the prompt cap in tokens.

    Raises:
        ValueError: ``src_length < 1``; no room for a prompt; or ``src_length + max_new_tokens`` past the model's
            ``max_position_embeddings`` (PaddleNLP's ``create_predictor`` refuses that sum too: tokens past it sit
            at positions the model never trained on, and the KV cache is allocated for all of them up front).
    """
    if src_length is not None and src_length < 1:
        raise ValueError(f"--src_length must be >= 1, got {src_length}")
    max_pos = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if not max_pos:
        return src_length if src_length is not None else 1 << 30  # the model states no limit
    if max_pos - max_new_tokens < 1:
        raise ValueError(f"--max_new_tokens {max_new_tokens} leaves no room for a prompt in the model's "
                         f"max_position_embeddings {max_pos}; lower --max_new_tokens")
    if src_length is not None and src_length + max_new_tokens > max_pos:
        raise ValueError(f"--src_length {src_length} + --max_new_tokens {max_new_tokens} = "
                         f"{src_length + max_new_tokens} > the model's max_position_embeddings {max_pos}; lower them "
                         f"(e.g. --src_length {max_pos - max_new_tokens}, or leave --src_length out for that default)")
    return max_pos - max_new_tokens if src_length is None else src_length


def parse_device(device: str) -> str:
    """``--device`` as a torch device string; PaddleNLP's ``gpu`` (``gpu:N``) means ``cuda`` (``cuda:N``).

    Raises:
        ValueError: not a device torch knows (instead of torch's RuntimeError with a traceback).
    """
    if device == "gpu" or device.startswith("gpu:"):
        device = "cuda" + device[3:]
    try:
        torch.device(device)
    except RuntimeError:
        raise ValueError(f"--device {device}: not a torch device; use cpu, cuda or cuda:N") from None
    return device


def stop_on_closed_stdout() -> None:
    """Exit with status 141 (128 + SIGPIPE, what shell tools give) and no traceback once the process reading our
    stdout has closed it (``... | head -n 1``); stdout is pointed at /dev/null so the interpreter's final flush
    cannot raise again (Python's documented recipe, ``signal`` module notes on SIGPIPE)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    raise SystemExit(141)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.max_new_tokens < 1:
        raise ValueError(f"--max_new_tokens must be >= 1, got {args.max_new_tokens}")
    typed, args.device = args.device, parse_device(args.device)
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {typed}: no CUDA GPU is available in this torch build/machine; "
                         "use --device cpu")
    try:
        dtype = to_torch_dtype(args.dtype.lower())
    except ValueError:
        dtype = None
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"--dtype {args.dtype}: use float32, bfloat16 or float16 (the attention takes no other)")
    if args.decode_strategy is not None:
        args.do_sample = args.decode_strategy == "sampling"
    given = [f"--{k}" for k in SAMPLING if getattr(args, k) is not None]
    if given and not args.do_sample:  # greedy decoding ignores them: say so rather than drop them silently
        print(f"[predict] {', '.join(given)} only apply when sampling (--do_sample or --decode_strategy sampling); "
              "decoding is greedy", file=sys.stderr)
    if args.batch_size < 1:
        raise ValueError(f"--batch_size must be >= 1, got {args.batch_size}")
    if args.repetition_penalty <= 0:
        raise ValueError(f"--repetition_penalty must be > 0 (1 = off), got {args.repetition_penalty}")
    if args.data_file and args.prompt is not None:
        raise ValueError("--data_file and --prompt are two inputs; give one")
    records = read_data_file(args.data_file, args.output_file) if args.data_file else None  # before the model
    if args.num_threads > 0:
        torch.set_num_threads(args.num_threads)
    model, tokenizer = load_model_and_tokenizer(args.model_name_or_path, args.dtype, args.tokenizer_name_or_path,
                                                args.lora_path, model_implementation=args.model_implementation,
                                                trust_remote_code=args.trust_remote_code)
    model = model.to(args.device)
    from paddlenlp_ext.transformers.vocab_check import check_tokenizer_fits_model

    check_tokenizer_fits_model(tokenizer, model.config, args.model_name_or_path, args.tokenizer_name_or_path)
    cap = prompt_cap(model, args.max_new_tokens, args.src_length)
    ernie = getattr(model.config, "model_type", None) == "ernie"
    for k, default in (ERNIE_SAMPLING if ernie else SAMPLING).items():  # PaddleNLP's ERNIE predictor's defaults
        if getattr(args, k) is None:
            setattr(args, k, default)
    if ernie and model.config.enable_random_position_ids:
        # PaddleNLP: one spacing for the prompt and every generated token, fixed from src_length + tgt_length
        interval = pos_decoding_interval(model.config.max_position_embeddings, cap, args.max_new_tokens,
                                         args.pos_decoding_interval)
        model.model.pos_decoding_interval = interval
        print(f"[predict] ERNIE-3.5-SE positions: pos_decoding_interval {interval}", file=sys.stderr)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    gen = dict(do_sample=args.do_sample, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
               eos_token_id=tokenizer.eos_token_id, pad_token_id=pad, repetition_penalty=args.repetition_penalty)
    if args.do_sample:
        gen["generator"] = torch.Generator(device=args.device).manual_seed(args.seed)

    def respond_batch(prompts: list) -> list:
        t0 = time.perf_counter()
        outs = generate_batch(model, prompts, args.max_new_tokens, **gen)
        n = sum(len(o) for o in outs)
        print(f"[{n} tokens, {n / (time.perf_counter() - t0):.1f} tokens/s]", file=sys.stderr)
        return [tokenizer.decode(o, skip_special_tokens=True).strip() for o in outs]

    def respond(ids: list[int]) -> str:
        if args.repetition_penalty != 1.0:
            return respond_batch([ids])[0]
        t0 = time.perf_counter()
        prompt = torch.tensor([ids], dtype=torch.long, device=args.device)  # [1, L]
        out = generate(model, prompt, args.max_new_tokens,
                       **{k: v for k, v in gen.items() if k != "repetition_penalty"})
        new = out[0, prompt.shape[1]:]
        print(f"[{new.numel()} tokens, {new.numel() / (time.perf_counter() - t0):.1f} tokens/s]", file=sys.stderr)
        return tokenizer.decode(new, skip_special_tokens=True).strip()

    def notify(msg: str) -> None:
        print(msg, file=sys.stderr)

    encoding = (getattr(sys.stdout, "encoding", None) or "utf-8").lower().replace("_", "-")
    if encoding not in ("utf-8", "utf8") and hasattr(sys.stdout, "reconfigure"):
        # a reply character the stdout encoding cannot show (e.g. ascii, cp1252) raised UnicodeEncodeError mid-run,
        # losing every later line
        sys.stdout.reconfigure(errors="replace")
        notify(f"[predict] stdout is {sys.stdout.encoding}: characters it cannot show are written as '?'; set "
               "PYTHONUTF8=1 (or PYTHONIOENCODING=utf-8) for the exact text")

    system = to_text(args.system, "--system", notify) if args.system is not None else None
    conv = Conversation(lambda m: encode_conversation(tokenizer, m), cap, system)
    if args.data_file:
        predict_file(records, args.output_file, conv, respond_batch, notify, args.batch_size, to_text)
        return 0
    if args.prompt is not None:
        text = to_text(args.prompt, "--prompt", notify)
        if not text.strip():  # as a blank piped line: an empty reply, no model call
            notify("[predict] --prompt is blank: nothing to answer")
            print()
            return 0
        ids, _ = conv.prompt_for(text)  # too long: ValueError, one error line
        print(respond(ids))
        return 0
    if not sys.stdin.isatty():  # piped input: one prompt per line, each answered without history
        try:
            answer_lines(sys.stdin.buffer, conv, respond, lambda line: print(line, flush=True), notify)
        except BrokenPipeError:  # the reader stopped early (| head -n 3): quit quietly, as shell tools do
            stop_on_closed_stdout()
        return 0

    def read(prompt: str) -> str:
        try:
            return to_text(input(prompt), "the line", notify)
        except UnicodeDecodeError as e:  # a strict-decoding stdin (non-UTF-8 bytes under e.g. en_US.UTF-8)
            notify(f"[not sent: the line is not valid UTF-8 ({e.reason}); type it again]")
            return ""

    interactive(conv, respond, read, print, notify)
    return 0


def cli() -> None:
    """The ``paddlenlp-predict`` command (and ``python llm/predict.py``): :func:`main` on ``sys.argv``
    through ``run_cli`` (bad input: one ``error:`` line, exit 2; Ctrl-C 130, SIGTERM 143)."""
    from paddlenlp_ext.trainer.launch import run_cli

    run_cli(main)
