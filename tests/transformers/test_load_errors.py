"""Loading a model or tokenizer from a path that is not a usable model directory: one ValueError naming the path,
the key to set and the fix. A model directory without tokenizer files is not blamed on a missing sentencepiece or
tiktoken; a missing tokenizer_name_or_path is not reported as a bad model_name_or_path; a training checkpoint
given as a model says to give the run's output_dir; an unsupported model_type names its config.json."""

import json

import pytest
from _llama_testing import tiny_model

from paddlenlp_ext.transformers import AutoModelForCausalLM, AutoTokenizer, resolve_model_name_or_path


def test_missing_tokenizer_path_names_the_tokenizer_keys(tmp_path):
    with pytest.raises(ValueError, match=r"tokenizer .*no_such_dir.*tokenizer_name_or_path"):
        AutoTokenizer.from_pretrained(str(tmp_path / "no_such_dir"))


def test_directory_without_tokenizer_files(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a model directory written without its tokenizer
    with pytest.raises(ValueError, match=r"no tokenizer files \(tokenizer\.json.*tokenizer_name_or_path"):
        AutoTokenizer.from_pretrained(str(tmp_path))


def test_checkpoint_dir_as_model_name_or_path_says_so(tmp_path):
    # run_dpo.py / run_reward.py / run_finetune.py --model_name_or_path <out>/checkpoint-N: the fix is the run's
    # output_dir, not "set tokenizer_name_or_path" or "no config.json"
    ckpt = tmp_path / "checkpoint-3"
    (ckpt / "distcp").mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text("{}")
    for load in (resolve_model_name_or_path, AutoTokenizer.from_pretrained):
        with pytest.raises(ValueError, match=r"checkpoint-3' is a training checkpoint .* give the run's output_dir"):
            load(str(ckpt))


def test_unsupported_model_type_names_the_config_file(tmp_path):
    """A model_type neither native nor known to transformers: the error names the config.json."""
    tiny_model().save_pretrained(tmp_path / "llama")
    cfg = json.loads((tmp_path / "llama" / "config.json").read_text())
    cfg.update(model_type="qwen99", architectures=["Qwen99ForCausalLM"])
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=rf"{tmp_path}/config.json: model_type 'qwen99' is not a model"):
        AutoModelForCausalLM.from_pretrained(str(tmp_path))
