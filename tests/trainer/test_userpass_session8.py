"""New-user pass, session 8: each test reproduces one bug found by following README.md as a new user and then
trying what users try (resume with a changed config, LoRA / DPO variants, odd data, PaddleNLP keys).

CPU only, no model weights (the SmolLM2 tokenizer files at most).
"""

import json
import logging
import os

import pytest
import torch

from paddlenlp_ext.trainer.trainer import Trainer
from trainer_fixtures import PackDataset


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def tiny_pairs(tmp_path_factory):
    from tests.trl._tiny import make_tiny_model_dir, write_pairs

    d = tmp_path_factory.mktemp("userpass8_pairs")
    return make_tiny_model_dir(str(d / "model")), write_pairs(str(d / "train.jsonl"), 8)


def test_tensorboard_eval_tags_are_eval_slash_metric(make_args, tiny_model, tmp_path):
    # was: eval metrics were written as eval/eval_loss (and eval/eval_rewards/accuracies for DPO): HF and
    # PaddleNLP's rewrite_logs write eval/loss, next to train/loss
    import glob

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = make_args(max_steps=2, report_to=["tensorboard"], evaluation_strategy="steps", eval_steps=2)
    Trainer(tiny_model(), args, train_dataset=PackDataset(n=4), eval_dataset=PackDataset(n=2, seed=1)).train()
    events = glob.glob(os.path.join(args.output_dir, "runs", "events.out.tfevents.*"))
    acc = EventAccumulator(events[0])
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "eval/loss" in tags and "train/loss" in tags
    assert not [t for t in tags if t.startswith("eval/eval_")]


def test_dropped_templated_examples_warning_names_max_length_not_src_length(caplog):
    # was: "dropped 1 of 1 SFT examples with no learnable token left after truncation to max_length=24,
    # src_length=16": with a chat template src_length is not used (a turn is never cut), so the warning sent users
    # to a key that changes nothing, and named no fix
    from paddlenlp_ext.datasets.sft import tokenize_sft_examples
    from paddlenlp_ext.transformers import AutoTokenizer, resolve_model_name_or_path

    tok = AutoTokenizer.from_pretrained(resolve_model_name_or_path("HuggingFaceTB/SmolLM2-135M-Instruct"))
    assert tok.chat_template
    long = {"src": ["word " * 40], "tgt": ["x"]}
    with caplog.at_level(logging.WARNING):
        assert list(tokenize_sft_examples([long], tok, 16, 24)) == []
    assert "dropped 1 of 1 SFT examples" in caplog.text
    assert "raise max_length" in caplog.text and "src_length=16" not in caplog.text


def test_sft_split_dir_with_jsonl_parts_warns_and_a_jsonl_only_dir_names_the_rename(tmp_path, caplog):
    # was: <dir>/train/part-1.jsonl next to part-0.json was skipped without a word (PaddleNLP's layout reads
    # *.json only), and a dir holding train.jsonl / dev.jsonl (the name the preference data uses) got "no data
    # found" without saying that the files were there under another extension
    from paddlenlp_ext.datasets.jsonl import sft_data_files

    row = json.dumps({"src": "a", "tgt": "b"}) + "\n"
    (tmp_path / "d" / "train").mkdir(parents=True)
    (tmp_path / "d" / "train" / "part-0.json").write_text(row)
    (tmp_path / "d" / "train" / "part-1.jsonl").write_text(row)
    with caplog.at_level(logging.WARNING):
        files = sft_data_files(str(tmp_path / "d"))
    assert [os.path.basename(f) for f in files["train"]] == ["part-0.json"]
    assert "1 file(s) ignored (part-1.jsonl)" in caplog.text and "rename them to .json" in caplog.text
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "train.jsonl").write_text(row)
    with pytest.raises(ValueError, match=r"no data found.*found train\.jsonl: the files must be named \.json"):
        sft_data_files(str(tmp_path / "e"))


@pytest.mark.parametrize("value, want", [(True, "true"), ("true", "true"), (False, "false"), ("false", "false"),
                                         (None, None), ("/x/checkpoint-4", "/x/checkpoint-4")])
def test_resume_from_checkpoint_takes_json_true_and_false(tmp_path, value, want):
    # was: "resume_from_checkpoint": true / false (PaddleNLP's Trainer takes the bools: the latest checkpoint / no
    # resume) were refused with "expected a string, got bool True", while the strings "true" / "false" worked and
    # an error even suggested "true"
    from paddlenlp_ext.trainer.arguments import parse_sft_args

    cfg = tmp_path / "sft.json"
    cfg.write_text(json.dumps({"output_dir": str(tmp_path / "out"), "dataset_name_or_path": "data/sft",
                               "resume_from_checkpoint": value}))
    _, _, training_args = parse_sft_args([str(cfg)])
    assert training_args.resume_from_checkpoint == want


def test_no_train_batch_error_names_the_counts_and_the_keys(make_args, tiny_model):
    # was: "the train dataset yields no batch (empty after packing, or fewer packs than data-parallel ranks x batch
    # size)": no numbers, and neither dataloader_drop_last (the cause here) nor a fix named
    args = make_args(per_device_train_batch_size=8, dataloader_drop_last=True, max_steps=1)
    with pytest.raises(ValueError, match=r"3 pack\(s\) for 1 rank\(s\) x per_device_train_batch_size=8 with "
                                         r"dataloader_drop_last=true\); lower per_device_train_batch_size, set "
                                         r"dataloader_drop_last false"):
        Trainer(tiny_model(), args, train_dataset=PackDataset(n=3)).train()


def test_merge_lora_params_refuses_an_output_dir_holding_an_adapter(tmp_path):
    # was: --output_path <another LoRA run's output_dir> wrote the merged weights beside that adapter's files, so
    # transformers (with peft) loads the merged model with that adapter applied on top (the reason --output_path =
    # --lora_path is refused); the base-directory case is refused since 0b88f9d
    from paddlenlp_ext.peft import apply_lora, save_lora
    from paddlenlp_ext.transformers import AutoModelForCausalLM
    from tests._scripts import load_script
    from tests.trl._tiny import make_tiny_model_dir

    base = make_tiny_model_dir(str(tmp_path / "base"))
    model = apply_lora(AutoModelForCausalLM.from_pretrained(base), {"lora_rank": 2})
    save_lora(model, str(tmp_path / "adapter"), base_model_name_or_path=base)
    save_lora(model, str(tmp_path / "other_adapter"), base_model_name_or_path=base)
    merge = load_script("llm/merge_lora_params.py")
    with pytest.raises(ValueError, match=r"holds a LoRA adapter \(adapter_config\.json\)"):
        merge.main(["--lora_path", str(tmp_path / "adapter"), "--output_path", str(tmp_path / "other_adapter")])
    assert not os.path.exists(tmp_path / "other_adapter" / "model.safetensors")
    assert merge.main(["--lora_path", str(tmp_path / "adapter"), "--output_path", str(tmp_path / "merged")]) == 0


@pytest.mark.parametrize("template", [True, False])
def test_sft_examples_kept_in_part_are_counted_in_a_warning(tmp_path, caplog, template):
    # was silent: older turns dropped to fit max_length (any template), questions capped at src_length and the
    # newest answer cut (chat_template none, PaddleNLP's rule); only fully dropped examples were counted
    from paddlenlp_ext.datasets.sft import tokenize_sft_examples
    from paddlenlp_ext.transformers import AutoTokenizer
    from tests.trl._tiny import make_tiny_model_dir

    tok = AutoTokenizer.from_pretrained(make_tiny_model_dir(str(tmp_path / "m")))
    short = {"src": ["hello"], "tgt": ["fine"]}
    long = {"src": ["hello how are you " * 3, "what is your name"], "tgt": ["fine thanks " * 3, "bot"]}
    chat_template = "auto" if template else None
    with caplog.at_level(logging.WARNING):
        out = list(tokenize_sft_examples([short, long], tok, 8, 24, chat_template))
    assert len(out) == 2
    assert "1 of 2 SFT examples kept only part of their text to fit max_length=24" in caplog.text
    assert ("src_length" in caplog.text) != template
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        list(tokenize_sft_examples([short], tok, 8, 24, chat_template))
    assert "kept only part" not in caplog.text


def test_adapter_whose_base_moved_names_adapter_config_and_the_fixes(tmp_path):
    # was: predict.py --model_name_or_path <adapter dir> (and merge_lora_params.py) said "model_name_or_path
    # '<old base>' is neither a local directory nor the embedded default model", a path the user never typed,
    # without naming adapter_config.json or --model_name_or_path of merge_lora_params.py
    import shutil

    from paddlenlp_ext.peft import apply_lora, load_merged_lora, save_lora
    from paddlenlp_ext.transformers import AutoModelForCausalLM
    from tests.trl._tiny import make_tiny_model_dir

    base = make_tiny_model_dir(str(tmp_path / "base"))
    save_lora(apply_lora(AutoModelForCausalLM.from_pretrained(base), {"lora_rank": 2}), str(tmp_path / "adapter"),
              base_model_name_or_path=base)
    shutil.move(base, tmp_path / "moved")
    with pytest.raises(FileNotFoundError, match=r"adapter_config\.json: the adapter's base model .*base' "
                                                r"\(base_model_name_or_path\) is not a local directory.*"
                                                r"--model_name_or_path <base dir>"):
        load_merged_lora(str(tmp_path / "adapter"), base)
    model, _ = load_merged_lora(str(tmp_path / "adapter"), str(tmp_path / "moved"))  # the explicit base works
    assert model is not None


