"""A failed write of a checkpoint, the final model, the tokenizer files or a LoRA adapter (a full disk: ENOSPC) is one
SaveError naming the directory and the fix; what was written before stays intact and no temporary files are left.
A Ctrl-C inside a write stays an interrupt; other errors pass through unchanged."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import pytest
import torch

from paddlenlp_ext.trainer import checkpoint as ckpt
from paddlenlp_ext.trainer.trainer import Trainer
from trainer_fixtures import PackDataset


def _digest(directory: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``directory``."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _trained(make_args, tiny_model, out):
    """A Trainer that ran 3 steps and saved ``out/checkpoint-3``."""
    args = make_args(output_dir=str(out), max_steps=3, save_steps=3, save_strategy="steps")
    t = Trainer(tiny_model(), args, train_dataset=PackDataset(n=4))
    t.train()
    assert (out / "checkpoint-3").is_dir()
    return t


@pytest.mark.parametrize("writer", ["dcp", "torch.save"])
def test_checkpoint_enospc_is_one_clear_error_and_keeps_the_previous_checkpoint(make_args, tiny_model, tmp_path,
                                                                                monkeypatch, writer):
    out = tmp_path / "o"
    t = _trained(make_args, tiny_model, out)
    before = _digest(out / "checkpoint-3")
    if writer == "dcp":  # DCP's per-item writer: DCP wraps the OSError in a CheckpointException (a BaseException)
        import torch.distributed.checkpoint.filesystem as dcp_fs

        monkeypatch.setattr(dcp_fs, "_write_item", _enospc)
    else:  # torch.save of the RNG / data / scheduler state, after DCP wrote the tensors into the temp dir
        monkeypatch.setattr(torch, "save", _enospc)
    t.state.global_step = 4
    with pytest.raises(ckpt.SaveError) as info:
        t.save_checkpoint()
    e = info.value
    msg = str(e)
    assert isinstance(e, OSError) and e.errno == errno.ENOSPC
    assert e.__cause__ is not None  # the writer's own error stays chained
    assert str(out) in msg and "checkpoint-4" in msg and "ENOSPC" in msg
    assert f"previous checkpoint {out / 'checkpoint-3'} is intact" in msg
    assert "free disk space" in msg and "output_dir" in msg and "MiB" in msg
    assert sorted(os.listdir(out)) == ["checkpoint-3"]  # temp dir removed: the disk is not left fuller
    assert _digest(out / "checkpoint-3") == before


def test_checkpoint_enospc_without_an_earlier_checkpoint_says_so(make_args, tiny_model, tmp_path, monkeypatch):
    import torch.distributed.checkpoint.filesystem as dcp_fs

    out = tmp_path / "o"
    t = Trainer(tiny_model(), make_args(output_dir=str(out), max_steps=1), train_dataset=PackDataset(n=4))
    t.create_optimizer_and_scheduler(1)
    monkeypatch.setattr(dcp_fs, "_write_item", _enospc)
    with pytest.raises(ckpt.SaveError, match="no earlier checkpoint"):
        t.save_checkpoint()
    assert os.listdir(out) == []


def test_other_save_errors_pass_through_unchanged(make_args, tiny_model, tmp_path, monkeypatch):
    t = _trained(make_args, tiny_model, tmp_path / "o")

    def bug(*a, **k):
        raise TypeError("a bug, not a disk problem")

    monkeypatch.setattr(ckpt, "_rng_state", bug)
    t.state.global_step = 4
    with pytest.raises(TypeError, match="a bug"):
        t.save_checkpoint()
    assert not isinstance(ckpt.write_failure(KeyboardInterrupt()), tuple)


def _tiny_llama():
    from paddlenlp_ext.transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    return LlamaForCausalLM(cfg)


def _safetensors_enospc(*args, **kwargs):
    from safetensors import SafetensorError

    path = args[1] if len(args) > 1 else kwargs.get("filename")
    Path(path).write_bytes(b"\0" * 100)  # a partial file in the temporary directory
    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


@pytest.mark.parametrize("fail", [_enospc, _safetensors_enospc], ids=["OSError", "SafetensorError"])
def test_final_model_enospc_names_the_directory_and_keeps_the_earlier_model(make_args, tmp_path, monkeypatch, fail):
    out = tmp_path / "o"
    t = Trainer(_tiny_llama(), make_args(output_dir=str(out)))
    t.save_model()
    before = _digest(out)
    with torch.no_grad():
        next(t.model.parameters()).add_(1.0)  # a different model, so an overwrite would show
    monkeypatch.setattr("safetensors.torch.save_file", fail)
    with pytest.raises(ckpt.SaveError) as info:
        t.save_model()
    msg = str(info.value)
    assert info.value.errno == errno.ENOSPC and info.value.__cause__ is not None
    assert f"could not write the final model to {out}" in msg and "ENOSPC" in msg
    assert "files already there are untouched" in msg and "output_dir" in msg
    assert sorted(os.listdir(tmp_path)) == ["o"]  # atomic_save_dir's temporary sibling is gone
    assert _digest(out) == before


def test_tokenizer_enospc_says_the_model_is_complete_and_how_to_write_the_tokenizer(make_args, tmp_path):
    class Tok:
        name_or_path = "/models/base"

        def save_pretrained(self, d):
            _enospc()

    out = tmp_path / "o"
    t = Trainer(_tiny_llama(), make_args(output_dir=str(out)), tokenizer=Tok())
    with pytest.raises(ckpt.SaveError) as info:
        t.save_model()
    msg = str(info.value)
    assert "could not write the tokenizer files" in msg and "weights and config.json there are complete" in msg
    assert f"AutoTokenizer.from_pretrained('/models/base').save_pretrained('{out}')" in msg
    assert (out / "model.safetensors").is_file()


def test_lora_adapter_enospc_is_one_save_error_and_leaves_nothing(tmp_path, monkeypatch):
    import types

    import safetensors.torch

    from paddlenlp_ext.peft import apply_lora
    from paddlenlp_ext.trainer.launch import save_adapter

    out = tmp_path / "o"
    trainer = types.SimpleNamespace(model=apply_lora(_tiny_llama(), {"lora_rank": 2}), tokenizer=None,
                                    dp=types.SimpleNamespace(is_main=True))
    monkeypatch.setattr(safetensors.torch, "save_file", _safetensors_enospc)
    with pytest.raises(ckpt.SaveError, match=f"could not write the LoRA adapter to {out}"):
        save_adapter(trainer, types.SimpleNamespace(model_name_or_path="base"), str(out))
    assert os.listdir(tmp_path) == []


def test_write_failure_reads_each_writers_error():
    from torch.distributed.checkpoint.api import CheckpointException

    wrapped = CheckpointException("write", {0: (OSError(errno.ENOSPC, "No space left on device"), [])})
    assert ckpt.write_failure(wrapped) == (errno.ENOSPC, "No space left on device")
    # torch.save's stream writer on a full disk (torch 2.13, measured by writing to /dev/full): no errno
    torch_err = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    assert ckpt.write_failure(torch_err)[0] is None
    assert ckpt.write_failure(RuntimeError("disk full")) is None  # not a writer's message: left alone
    assert ckpt.write_failure(ValueError("bad")) is None


def test_ctrl_c_inside_a_checkpoint_write_is_an_interrupt_not_a_full_disk(make_args, tiny_model, tmp_path,
                                                                        monkeypatch):
    """A Ctrl-C inside torch.save surfaces as the stream writer's RuntimeError with the KeyboardInterrupt as its
    context (seen with ``timeout -s INT``): it must stay a KeyboardInterrupt (run_cli prints one line), not a
    SaveError telling the user to free disk space; the temporary directory is still removed."""
    out = tmp_path / "o"
    t = _trained(make_args, tiny_model, out)

    def interrupted_save(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(torch, "save", interrupted_save)
    t.state.global_step = 4
    with pytest.raises(KeyboardInterrupt):
        t.save_checkpoint()
    assert sorted(os.listdir(out)) == ["checkpoint-3"]


def test_reraise_interrupt_finds_it_inside_dcp_failures():
    from torch.distributed.checkpoint.api import CheckpointException

    wrapped = CheckpointException("write", {0: (KeyboardInterrupt(), [])})
    with pytest.raises(KeyboardInterrupt):
        ckpt.reraise_interrupt(wrapped)
    ckpt.reraise_interrupt(RuntimeError("unrelated"))  # no interrupt in the chain: returns
