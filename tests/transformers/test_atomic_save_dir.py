"""``atomic_save_dir``: new files replace old ones; stale model shards go only when a model is saved again."""

import os

from paddlenlp_ext.transformers.model_utils import WEIGHTS_INDEX_NAME, WEIGHTS_NAME, atomic_save_dir


def _save(d, files):
    with atomic_save_dir(str(d)) as tmp:
        for name, data in files.items():
            with open(os.path.join(tmp, name), "w") as f:
                f.write(data)


def test_model_save_removes_stale_shards_adapter_save_keeps_model(tmp_path):
    d = tmp_path / "out"
    _save(d, {WEIGHTS_INDEX_NAME: "i", "model-00001-of-00002.safetensors": "a", "tokenizer.json": "t"})
    _save(d, {WEIGHTS_NAME: "m", "config.json": "c"})  # re-saved unsharded: the old shards are stale
    assert sorted(os.listdir(d)) == ["config.json", WEIGHTS_NAME, "tokenizer.json"]
    _save(d, {"adapter_model.safetensors": "l", "adapter_config.json": "ac"})  # adapter beside the model
    assert sorted(os.listdir(d)) == ["adapter_config.json", "adapter_model.safetensors", "config.json",
                                     WEIGHTS_NAME, "tokenizer.json"]
    assert (d / WEIGHTS_NAME).read_text() == "m"
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".out.tmp")]
