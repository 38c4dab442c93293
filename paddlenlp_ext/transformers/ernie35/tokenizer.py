"""ERNIE-3.5-SE's tokenizer: a SentencePiece BPE model (``sentencepiece.bpe.model``) as a Hugging Face fast tokenizer.

Source: PaddleNLP ``llm/experimental/ernie-3.5-se/tokenizer.py`` (``Ernie35Tokenizer``) and its ``ernie-tokenizer/``
directory (``sentencepiece.bpe.model``, ``tokenizer_config.json``, ``special_tokens_map.json``). Conventions kept:
``<unk>``/``<s>``/``</s>``, the pad token is ``<unk>``, ``add_bos_token=True`` and ``add_eos_token=False`` (a
text becomes ``<s> pieces``), ``padding_side="left"`` (batched generation). Text between special tokens is encoded
by SentencePiece on its own, as PaddleNLP's slow tokenizer does.

The SentencePiece model is converted to a ``tokenizers`` pipeline (BPE with byte fallback, the model's normalizer
and dummy prefix) that gives SentencePiece's ids; :meth:`Ernie35Tokenizer.save_pretrained` writes both forms:
``tokenizer.json`` + ``tokenizer_config.json`` (``transformers.AutoTokenizer`` loads them, no code of ours needed)
and ``sentencepiece.bpe.model`` + ``special_tokens_map.json`` (PaddleNLP's ``Ernie35Tokenizer`` loads them).
"""

from __future__ import annotations

import json
import os
import shutil

from transformers import PreTrainedTokenizerFast

__all__ = ["Ernie35Tokenizer", "SPM_FILE", "BUNDLED_TOKENIZER_DIR", "is_sentencepiece_dir", "load_ernie_tokenizer"]

SPM_FILE = "sentencepiece.bpe.model"
# the tiny preset's tokenizer: 4096 BPE pieces trained on the bundled data (data/build_ernie_tokenizer.py)
BUNDLED_TOKENIZER_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ernie-tokenizer")
MODEL_MAX_LENGTH = 2048  # PaddleNLP's ernie-tokenizer/tokenizer_config.json


def is_sentencepiece_dir(path: str) -> bool:
    """A directory in PaddleNLP's ERNIE tokenizer layout: ``sentencepiece.bpe.model`` and no ``tokenizer.json``."""
    return (os.path.isdir(path) and os.path.isfile(os.path.join(path, SPM_FILE))
            and not os.path.isfile(os.path.join(path, "tokenizer.json")))


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _token_text(value) -> str | None:
    """``"<s>"`` or PaddleNLP's ``{"content": "<s>", ...}`` form."""
    return value.get("content") if isinstance(value, dict) else value


def _bpe_merges(pieces: list[str], mergeable: set[int]) -> list[tuple[str, str]]:
    """BPE merges that rebuild SentencePiece's segmentation: every split ``a + b`` of a piece whose halves are pieces,
    ordered by the merged piece's id (SentencePiece applies the highest-scored, i.e. lowest-id, merge first)."""
    ids = {p: i for i, p in enumerate(pieces) if i in mergeable}
    merges = []
    for merged, rank in ids.items():
        for k in range(1, len(merged)):
            a, b = merged[:k], merged[k:]
            if a in ids and b in ids:
                merges.append((rank, ids[a], ids[b], a, b))
    merges.sort()
    return [(a, b) for *_, a, b in merges]


def _sentencepiece_to_tokenizers(model_file: str, bos_token: str, add_bos: bool, eos_token: str, add_eos: bool):
    """A ``tokenizers.Tokenizer`` giving the SentencePiece BPE model's ids, plus its unk/bos/eos pieces."""
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    proto = sentencepiece_model_pb2.ModelProto()
    with open(model_file, "rb") as f:
        proto.ParseFromString(f.read())
    if proto.trainer_spec.model_type != sentencepiece_model_pb2.TrainerSpec.BPE:
        kind = sentencepiece_model_pb2.TrainerSpec.ModelType.Name(proto.trainer_spec.model_type)
        raise ValueError(f"{model_file}: a SentencePiece {kind} model; ERNIE-3.5-SE's tokenizer is BPE")
    pieces = [p.piece for p in proto.pieces]
    normal = {i for i, p in enumerate(proto.pieces) if p.type in (p.NORMAL, p.USER_DEFINED)}
    tk = Tokenizer(models.BPE({p: i for i, p in enumerate(pieces)}, _bpe_merges(pieces, normal),
                              unk_token=proto.trainer_spec.unk_piece, fuse_unk=True,
                              byte_fallback=proto.trainer_spec.byte_fallback))
    # SentencePiece's order: character map, whitespace clean-up, dummy prefix, spaces as "▁"
    spec = proto.normalizer_spec
    steps = [normalizers.Precompiled(spec.precompiled_charsmap)] if spec.precompiled_charsmap else []
    if spec.remove_extra_whitespaces:
        steps += [normalizers.Strip(), normalizers.Replace(Regex(" {2,}"), " ")]
    if spec.add_dummy_prefix:
        steps.append(normalizers.Prepend("▁"))
    tk.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", "▁")])
    if proto.trainer_spec.split_by_whitespace:  # pieces never cross a word start: BPE runs word by word
        tk.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
                                   + ([decoders.Strip(content=" ", left=1)] if spec.add_dummy_prefix else []))
    controls = [p.piece for p in proto.pieces if p.type in (p.CONTROL, p.UNKNOWN)]
    tk.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in controls])
    # PaddleNLP build_inputs_with_special_tokens: [bos] + a (+ b) (+ [eos])
    single = ([f"{bos_token}:0"] if add_bos else []) + ["$A:0"] + ([f"{eos_token}:0"] if add_eos else [])
    pair = single[:-1] + ["$B:0"] + single[-1:] if add_eos else single + ["$B:0"]
    special = [(t, pieces.index(t)) for t in {bos_token, eos_token} if t in pieces]
    tk.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)
    return tk, pieces


class Ernie35Tokenizer(PreTrainedTokenizerFast):
    """PaddleNLP's ``Ernie35Tokenizer`` as a ``transformers`` fast tokenizer (see the module docstring).

    Build it with :meth:`from_sentencepiece` (a ``sentencepiece.bpe.model`` file or PaddleNLP's tokenizer
    directory); it encodes as ``sentencepiece.SentencePieceProcessor`` with the BOS id in front.
    """

    # not "vocab_file": transformers would rebuild the pipeline from it with its own converter
    vocab_files_names = {"sentencepiece_model_file": SPM_FILE, "tokenizer_file": "tokenizer.json"}
    model_input_names = ["input_ids", "attention_mask"]


    @classmethod
    def from_sentencepiece(cls, path: str, **kwargs) -> "Ernie35Tokenizer":
        """Load ``path`` (a directory holding ``sentencepiece.bpe.model`` and optionally PaddleNLP's
        ``tokenizer_config.json`` / ``special_tokens_map.json``, or the ``.model`` file itself). ``kwargs`` override
        the config's keys (``add_bos_token``, ``add_eos_token``, ``padding_side``, ``model_max_length``, tokens).

        Raises:
            FileNotFoundError: no ``sentencepiece.bpe.model`` (the message lists what the directory holds).
            ValueError: not a BPE model, or a JSON file that does not parse (file, line, column).
        """
        if os.path.isdir(path):
            directory, model_file = path, os.path.join(path, SPM_FILE)
        else:
            directory, model_file = os.path.dirname(path) or ".", path
        if not os.path.isfile(model_file):
            held = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
            raise FileNotFoundError(
                f"{path}: no {SPM_FILE} (ERNIE-3.5-SE's SentencePiece model); the directory holds {held[:12]}. Point "
                f"tokenizer_name_or_path at PaddleNLP's ernie-tokenizer directory or at a directory saved by this "
                f"tokenizer")
        conf = {**_read_json(os.path.join(directory, "special_tokens_map.json")),
                **{k: v for k, v in _read_json(os.path.join(directory, "tokenizer_config.json")).items()
                   if k not in ("tokenizer_class", "auto_map", "name_or_path", "added_tokens_decoder")},
                **kwargs}
        unk = _token_text(conf.pop("unk_token", None)) or "<unk>"
        bos = _token_text(conf.pop("bos_token", None)) or "<s>"
        eos = _token_text(conf.pop("eos_token", None)) or "</s>"
        pad = _token_text(conf.pop("pad_token", None)) or unk  # PaddleNLP: pad = unk
        add_bos, add_eos = bool(conf.pop("add_bos_token", True)), bool(conf.pop("add_eos_token", False))
        conf.setdefault("padding_side", "left")
        conf.setdefault("model_max_length", MODEL_MAX_LENGTH)
        for k in ("sp_model_kwargs", "decode_with_prefix_space", "vocab_file", "clean_up_tokenization_spaces"):
            conf.pop(k, None)  # PaddleNLP slow-tokenizer options with no meaning here
        tk, _ = _sentencepiece_to_tokenizers(model_file, bos, add_bos, eos, add_eos)
        tok = cls(tokenizer_object=tk, unk_token=unk, bos_token=bos, eos_token=eos, pad_token=pad,
                  clean_up_tokenization_spaces=False, **conf)
        tok.add_bos_token, tok.add_eos_token = add_bos, add_eos
        tok.init_kwargs["sentencepiece_model_file"] = os.path.abspath(model_file)
        tok.init_kwargs.pop("tokenizer_object", None)
        return tok

    def save_pretrained(self, save_directory, *args, **kwargs):
        """``transformers``' files (``tokenizer.json``, ``tokenizer_config.json`` naming the generic fast tokenizer
        class, so plain ``transformers.AutoTokenizer`` loads it) plus PaddleNLP's (``sentencepiece.bpe.model``,
        ``special_tokens_map.json``, and ``add_bos_token``/``add_eos_token`` in the config)."""
        files = super().save_pretrained(save_directory, *args, **kwargs)
        cfg_path = os.path.join(save_directory, "tokenizer_config.json")
        cfg = _read_json(cfg_path)
        cfg.update(tokenizer_class="PreTrainedTokenizerFast", add_bos_token=self.add_bos_token,
                   add_eos_token=self.add_eos_token, padding_side=self.padding_side)
        _write_json(cfg_path, cfg)
        _write_json(os.path.join(save_directory, "special_tokens_map.json"),
                    {k: getattr(self, k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")})
        src = self.init_kwargs.get("sentencepiece_model_file")  # from_pretrained passes the directory's copy
        dst = os.path.join(save_directory, SPM_FILE)
        if src and os.path.isfile(src) and os.path.abspath(src) != os.path.abspath(dst):
            shutil.copyfile(src, dst)
        return tuple(files) + (dst,)


def _write_json(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)


def load_ernie_tokenizer(path: str | None = None, **kwargs) -> Ernie35Tokenizer:
    """:meth:`Ernie35Tokenizer.from_sentencepiece` of ``path``, or of the bundled tiny tokenizer when None."""
    return Ernie35Tokenizer.from_sentencepiece(path or BUNDLED_TOKENIZER_DIR, **kwargs)
