"""Value checks of the argument dataclasses: list-typed keys on the command line (JSON lists, commas), parallel
degrees that cannot mean anything (0, < -1), save_total_limit <= 0 (keeps all, said aloud when checkpoints are
saved), seed outside numpy's range, chat_max_new_tokens < 1 (run_finetune's chat after training)."""

import json
import logging

import pytest

from paddlenlp_ext.trainer.argparser import PdArgumentParser
from paddlenlp_ext.trainer.arguments import DataArgument, ModelArgument, SFTConfig, TrainingArguments
from paddlenlp_ext.trl.arguments import DPOTrainingArguments, RMTrainingArguments
from trainer_fixtures import load_run_finetune


def _parse(tmp_path, *cli, cfg=None):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"output_dir": str(tmp_path / "out"), **(cfg or {})}))
    return PdArgumentParser((ModelArgument, DataArgument, SFTConfig)).parse([str(path), *cli])


# ------------------------------------------------------------------------------------------------ list-typed keys
@pytest.mark.parametrize("cli, expected", [
    (["--report_to", "[]"], []),  # a JSON list, not the string '[]'
    (["--report_to", '["tensorboard"]'], ["tensorboard"]),
    (["--report_to", '["tensorboard", "visualdl"]'], ["tensorboard", "visualdl"]),
    (["--report_to", "tensorboard,visualdl"], ["tensorboard", "visualdl"]),
    (["--report_to", "tensorboard", "visualdl"], ["tensorboard", "visualdl"]),
    (["--report_to=[]"], []),
    (["--report_to", ""], []),
    (["--report_to", "null"], None),
])
def test_report_to_from_the_command_line(tmp_path, cli, expected):
    _, _, args = _parse(tmp_path, *cli, cfg={"report_to": ["tensorboard"]})
    assert args.report_to == expected


@pytest.mark.parametrize("cli, expected", [
    (["--lora_target_modules", '["q_proj", "v_proj"]'], ["q_proj", "v_proj"]),  # a JSON list, not split at its commas
    (["--lora_target_modules", "[q_proj,", "v_proj]"], ["q_proj", "v_proj"]),  # the shell's split of [q_proj, v_proj]
    (["--lora_target_modules", "[q_proj,v_proj]"], ["q_proj", "v_proj"]),
    (["--lora_target_modules", "q_proj,v_proj"], ["q_proj", "v_proj"]),
    (["--lora_target_modules", "[qv]_proj"], ["[qv]_proj"]),  # a regex character class is not a list
    (["--lora_target_modules", "[qv]_proj,o_proj"], ["[qv]_proj", "o_proj"]),
    (["--lora_target_modules", ".*self_attn.[qv]_proj"], [".*self_attn.[qv]_proj"]),
])
def test_lora_target_modules_from_the_command_line(tmp_path, cli, expected):
    model_args, _, _ = _parse(tmp_path, *cli)
    assert model_args.lora_target_modules == expected


def test_cli_list_equals_json_list(tmp_path):
    from_json = _parse(tmp_path, cfg={"report_to": [], "no_recompute_layers": [0, 2]})[2]
    from_cli = _parse(tmp_path, "--report_to", "[]", "--no_recompute_layers", "[0, 2]")[2]
    assert from_cli.report_to == from_json.report_to == []
    assert from_cli.no_recompute_layers == from_json.no_recompute_layers == [0, 2]


@pytest.mark.parametrize("value", ['["q_proj"', "['q_proj']", '[["q_proj"]]', '[{"a": 1}]'])
def test_unreadable_cli_list_names_the_flag_and_the_fix(tmp_path, value):
    with pytest.raises(ValueError) as e:
        _parse(tmp_path, "--lora_target_modules", value)
    msg = str(e.value)
    assert msg.startswith("command line: --lora_target_modules: cannot read")
    assert "JSON list such as '[]'" in msg and "comma-separated" in msg


def test_bad_report_to_names_key_and_fix(tmp_path):
    with pytest.raises(ValueError, match=r"report_to supports .*--report_to \[\] for no logger"):
        _parse(tmp_path, "--report_to", "wandb")


# ------------------------------------------------------------------------------------------------ parallel degrees
@pytest.mark.parametrize("key", ["tensor_parallel_degree", "sharding_parallel_degree", "pipeline_parallel_degree",
                                 "sep_parallel_degree", "context_parallel_degree"])
@pytest.mark.parametrize("value", [0, -2])
def test_impossible_parallel_degree_is_refused(tmp_path, key, value):
    with pytest.raises(ValueError, match=rf"{key} must be -1 \(unset, PaddleNLP's default\) or >= 1 .*got {value}"):
        _parse(tmp_path, f"--{key}", str(value))


@pytest.mark.parametrize("cls", [TrainingArguments, DPOTrainingArguments, RMTrainingArguments])
def test_degree_check_in_every_training_arguments(tmp_path, cls):
    with pytest.raises(ValueError, match="tensor_parallel_degree must be -1"):
        cls(output_dir=str(tmp_path / "o"), tensor_parallel_degree=0)
    for ok in (-1, 1, 4):  # PaddleNLP's unset value and real degrees still pass
        cls(output_dir=str(tmp_path / "o"), tensor_parallel_degree=ok, sharding_parallel_degree=ok)


def test_virtual_pp_degree_zero_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"virtual_pp_degree must be >= 1 \(1 = off\), got 0"):
        _parse(tmp_path, "--virtual_pp_degree", "0")


# ------------------------------------------------------------------------------------------------ save_total_limit
@pytest.mark.parametrize("value", [0, -1])
def test_save_total_limit_non_positive_keeps_all_and_warns(tmp_path, caplog, value):
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.trainer.arguments"):
        args = TrainingArguments(output_dir=str(tmp_path / "o"), save_total_limit=value)
    assert args.save_total_limit == value  # Hugging Face's semantics kept: the rotation skips <= 0
    msgs = [r.getMessage() for r in caplog.records if "save_total_limit" in r.getMessage()]
    assert len(msgs) == 1 and "keeps ALL checkpoints" in msgs[0] and "save_total_limit null" in msgs[0]


@pytest.mark.parametrize("value", [None, 1, 3])
def test_save_total_limit_none_or_positive_is_quiet(tmp_path, caplog, value):
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.trainer.arguments"):
        TrainingArguments(output_dir=str(tmp_path / "o"), save_total_limit=value)
    assert not [r for r in caplog.records if "save_total_limit" in r.getMessage()]


def test_save_total_limit_zero_rotates_nothing(tmp_path):
    """What the warning promises: with 0 every checkpoint stays (checkpoint.save_checkpoint's rotation)."""
    import torch

    from paddlenlp_ext.trainer.checkpoint import list_checkpoints, save_checkpoint

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    for step in (1, 2, 3):
        save_checkpoint(str(tmp_path), step, model, opt, sched, {"global_step": step}, {}, save_total_limit=0)
    assert [p.name for p in list_checkpoints(str(tmp_path))] == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_seed_out_of_numpys_range_names_the_key(tmp_path, seed):
    # a config error naming the key, at parse time (not numpy's bare message from set_seed after the output checks)
    with pytest.raises(ValueError, match=rf"seed must be in \[0, 2\*\*32 - 1\], got {seed}"):
        TrainingArguments(output_dir=str(tmp_path / "out"), seed=seed)


def test_seed_bounds_accepted(tmp_path):
    for seed in (0, 2**32 - 1):
        assert TrainingArguments(output_dir=str(tmp_path / "out"), seed=seed).seed == seed


def _limit_warnings(caplog):
    return [r.getMessage() for r in caplog.records if "save_total_limit" in r.getMessage()]


def test_save_total_limit_zero_without_saving_is_quiet(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        TrainingArguments(output_dir=str(tmp_path / "o"), save_total_limit=0, save_strategy="no")
    assert not _limit_warnings(caplog)


def test_save_total_limit_zero_with_saving_warns_once(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        TrainingArguments(output_dir=str(tmp_path / "o"), save_total_limit=0, save_strategy="steps")
    assert len(_limit_warnings(caplog)) == 1


def _chat_cfg(tmp_path, **over):
    cfg = {"model_name_or_path": "m", "dataset_name_or_path": "d", "output_dir": str(tmp_path / "out")}
    cfg.update(over)
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    return [str(tmp_path / "c.json")]


def test_chat_max_new_tokens_below_one_is_refused(tmp_path):
    # an empty reply is no chat; predict.py refuses --max_new_tokens < 1 the same way
    with pytest.raises(ValueError, match="chat_max_new_tokens must be >= 1"):
        load_run_finetune().parse_args(_chat_cfg(tmp_path, chat_max_new_tokens=0))


def test_chat_max_new_tokens_unchecked_without_the_chat(tmp_path):
    *_, chat = load_run_finetune().parse_args(_chat_cfg(tmp_path, chat_max_new_tokens=0, chat_after_train=False))
    assert not chat.chat_after_train
