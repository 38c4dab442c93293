"""PdArgumentParser and the argument dataclasses: JSON + CLI overrides, strict keys with suggestions, the inert
warning, JSON errors with line/column (encoding, BOM, empty file, trailing comma), collected validation errors, the
four PaddleNLP flashmask configs, and command-line mistakes as one line naming the flag."""

import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field
from typing import List, Optional

import pytest

from paddlenlp_ext.trainer.argparser import PdArgumentParser, inert, inert_fields
from paddlenlp_ext.trainer.arguments import (
    DataArgument,
    ModelArgument,
    SFTConfig,
    TrainingArguments,
    finalize_sft_args,
    parse_sft_args,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "config", "llama", "flashmask")
SFT_JSON = os.path.join(ROOT, "config", "smollm2", "sft.json")


@dataclass
class Toy:
    name: str = field(default="a", metadata={"help": "a name"})
    steps: int = field(default=1, metadata={"help": "steps"})
    rate: float = field(default=0.5, metadata={"help": "rate"})
    flag: bool = field(default=False, metadata={"help": "flag"})
    tags: Optional[List[str]] = field(default=None, metadata={"help": "tags"})
    maybe: Optional[int] = field(default=None, metadata={"help": "maybe"})
    legacy: str = field(default="", metadata=inert("not implemented here", help="legacy"))
    legacy2: int = field(default=0, metadata=inert("also not implemented", help="legacy2"))


def write(tmp_path, obj, name="cfg.json"):
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(p)


def test_cli_overrides_json_and_types(tmp_path):
    cfg = write(tmp_path, {"name": "json", "steps": 3, "rate": 1, "flag": False, "tags": ["x"]})
    (toy,) = PdArgumentParser(Toy).parse_json_file_and_cmd_lines(
        [cfg, "--steps", "7", "--flag", "--tags", "p", "q", "--rate=2.5e-1", "--maybe", "None"])
    assert (toy.name, toy.steps, toy.rate, toy.flag, toy.tags, toy.maybe) == ("json", 7, 0.25, True, ["p", "q"], None)
    (toy,) = PdArgumentParser(Toy).parse_json_file_and_cmd_lines([cfg, "--flag", "false", "--tags", "a,b"])
    assert toy.flag is False and toy.tags == ["a", "b"] and isinstance(toy.rate, float)
    (toy,) = PdArgumentParser(Toy).parse_args_into_dataclasses(["--maybe", "4"])
    assert toy.maybe == 4 and toy.steps == 1


def test_unknown_key_names_key_file_and_suggestion(tmp_path):
    cfg = write(tmp_path, {"stesp": 3, "nmae": "x"})
    with pytest.raises(ValueError) as e:
        PdArgumentParser(Toy).parse_json_file_and_cmd_lines([cfg, "--rat", "1"])
    msg = str(e.value)
    assert "3 problem(s)" in msg
    assert f"{cfg}: unknown key 'stesp'; did you mean 'steps'" in msg
    assert "unknown key 'nmae'; did you mean 'name'" in msg
    assert "command line: unknown key 'rat'; did you mean 'rate'" in msg


def test_bad_values_are_collected(tmp_path):
    cfg = write(tmp_path, {"steps": "many", "flag": "maybe", "rate": True})
    with pytest.raises(ValueError) as e:
        PdArgumentParser(Toy).parse_json_file(cfg)
    msg = str(e.value)
    assert "key 'steps': expected an int, got 'many'" in msg
    assert "key 'flag': expected a bool" in msg and "key 'rate': expected a float" in msg


def test_invalid_json_reports_line_and_column(tmp_path):
    cfg = write(tmp_path, '{\n  "steps": 3,\n  "name": "x",,\n}')
    with pytest.raises(ValueError, match=r"cfg\.json:3:15: invalid JSON"):
        PdArgumentParser(Toy).parse_json_file(cfg)
    dup = write(tmp_path, '{"steps": 1, "steps": 2}', "dup.json")
    with pytest.raises(ValueError, match="duplicate key 'steps'"):
        PdArgumentParser(Toy).parse_json_file(dup)
    with pytest.raises(ValueError, match="top level must be a JSON object"):
        PdArgumentParser(Toy).parse_json_file(write(tmp_path, "[1, 2]", "list.json"))
    with pytest.raises(ValueError, match="expected a .json config path"):
        PdArgumentParser(Toy).parse_json_file_and_cmd_lines(["--steps", "1"])


def test_inert_keys_warn_once_listing_all(tmp_path, caplog):
    cfg = write(tmp_path, {"legacy": "x", "steps": 2})
    parser = PdArgumentParser(Toy)
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.trainer.argparser"):
        parser.parse_json_file_and_cmd_lines([cfg, "--legacy2", "5"])
    warnings = [r for r in caplog.records if "not acted on" in r.getMessage()]
    assert len(warnings) == 1
    assert "legacy (not implemented here)" in warnings[0].getMessage()
    assert "legacy2 (also not implemented)" in warnings[0].getMessage()
    assert parser.inert_keys_set == [("legacy", "not implemented here"), ("legacy2", "also not implemented")]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.trainer.argparser"):
        parser.parse_dict({"steps": 2})
    assert not [r for r in caplog.records if "not acted on" in r.getMessage()]


def test_missing_required_and_post_init_errors_are_collected(tmp_path):
    cfg = write(tmp_path, {"lr_scheduler_type": "poly", "bf16": True, "fp16": True, "src_length": 10,
                           "max_length": 8})
    with pytest.raises(ValueError) as e:
        PdArgumentParser((DataArgument, TrainingArguments)).parse_json_file(cfg)
    assert "required key 'output_dir' (TrainingArguments) is missing" in str(e.value)
    cfg = write(tmp_path, {"output_dir": "o", "lr_scheduler_type": "poly", "bf16": True, "fp16": True,
                           "src_length": 10, "max_length": 8, "sharding": "stage4"}, "b.json")
    with pytest.raises(ValueError) as e:
        PdArgumentParser((DataArgument, TrainingArguments)).parse_json_file(cfg)
    msg = str(e.value)
    for part in ("lr_scheduler_type must be one of", "bf16 and fp16 are both true",
                 "src_length (10) must be smaller than max_length (8)", "sharding must be"):
        assert part in msg


@pytest.mark.parametrize("name", ["sft", "lora"])
def test_paddlenlp_sft_configs_parse(name, caplog):
    with caplog.at_level(logging.WARNING):
        model_args, data_args, training_args = parse_sft_args([os.path.join(CONFIGS, f"{name}.json")])
    assert model_args.flash_mask and model_args.use_flash_attention and data_args.zero_padding
    assert data_args.max_length == 8192 and data_args.src_length == 8000 and data_args.lazy
    assert training_args.tensor_parallel_degree == 2 and training_args.bf16 and training_args.max_steps == 12000
    assert training_args.sharding_stage == (2 if name == "sft" else 1)
    assert "unified_checkpoint" in caplog.text and "fp16_opt_level" not in caplog.text  # O2 is acted on
    if name == "lora":
        assert model_args.lora and training_args.learning_rate == 2e-4
        assert model_args.lora_alpha == 16  # PaddleNLP's 2 * lora_rank
        assert training_args.do_eval is False and training_args.save_strategy == "no"  # benchmark mode
    else:
        assert training_args.learning_rate == 2e-5 and training_args.tensor_parallel_output is True


@pytest.mark.parametrize("name", ["dpo", "rm"])
def test_preference_configs_training_keys_belong_to_training_arguments(name):
    """Every key of dpo.json / rm.json that is not a data/model/loss key is a TrainingArguments field."""
    with open(os.path.join(CONFIGS, f"{name}.json")) as f:
        cfg = json.load(f)
    data_model = {"model_name_or_path", "train_dataset_path", "dev_dataset_path", "max_seq_len", "max_prompt_len",
                  "greedy_zero_padding", "lazy", "use_flash_attention", "flash_mask"}
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert sorted(set(cfg) - data_model - fields) == []


@pytest.mark.parametrize("name", ["dpo", "rm"])
def test_preference_configs_parse_with_trl_arguments(name):
    trl_args = pytest.importorskip("paddlenlp_ext.trl.arguments")
    parse = trl_args.parse_dpo_args if name == "dpo" else trl_args.parse_rm_args
    out = parse([os.path.join(CONFIGS, f"{name}.json")])
    assert any(getattr(a, "max_seq_len", None) == 8192 for a in out)


def test_flash_mask_turns_packing_on_and_reports_it():
    m = ModelArgument(flash_mask=True)
    d = DataArgument(zero_padding=False)
    t = SFTConfig(output_dir="o", max_steps=3)
    msgs = finalize_sft_args(m, d, t)
    assert d.zero_padding and m.use_flash_attention
    assert any("zero_padding=True" in x for x in msgs)
    # already packed: nothing to say (use_flash_attention is implied, attention is always FlashMask here)
    m1, d1 = ModelArgument(flash_mask=True), DataArgument(zero_padding=True)
    assert finalize_sft_args(m1, d1, SFTConfig(output_dir="o", max_steps=3)) == [] and m1.use_flash_attention
    m2, d2 = ModelArgument(), DataArgument(lazy=True)
    with pytest.raises(ValueError, match="max_steps must be > 0"):
        finalize_sft_args(m2, d2, SFTConfig(output_dir="o"))
    m3 = ModelArgument(merge_weights=True)  # lora off: nothing to merge, said rather than ignored
    assert finalize_sft_args(m3, DataArgument(), SFTConfig(output_dir="o", max_steps=3)) == [
        "merge_weights=True has no effect without lora=True (there is no adapter to merge)"]


def test_inert_markers_are_declared_on_fields():
    marked = inert_fields([ModelArgument, DataArgument, SFTConfig])
    for key in ("amp_master_grad", "unified_checkpoint", "pipeline_parallel_config", "pipeline_parallel_degree",
                "eval_accumulation_steps", "autotuner_benchmark", "benchmark"):
        assert key in marked, key
    for key in ("zero_padding", "flash_mask", "learning_rate", "lora", "lazy", "max_length", "fp16_opt_level",
                "load_best_model_at_end", "metric_for_best_model", "greater_is_better", "eval_with_do_generation"):
        assert key not in marked, key


def test_sft_defaults_match_paddlenlp():
    t = SFTConfig(output_dir="o")
    assert (t.learning_rate, t.tensor_parallel_output, t.unified_checkpoint, t.per_device_train_batch_size,
            t.logging_steps, t.save_steps, t.lr_scheduler_type, t.seed, t.eval_steps) == \
        (2e-5, False, False, 8, 500, 500, "linear", 42, 500)
    d, m = DataArgument(), ModelArgument()
    assert (d.src_length, d.max_length, d.zero_padding, d.greedy_zero_padding, d.lazy) == \
        (1024, 2048, False, False, False)
    assert (m.lora_rank, m.lora_alpha, m.continue_training, m.flash_mask) == (8, -1, True, False)
    assert ModelArgument(lora_rank=4).effective_lora_alpha() == 8
    assert ModelArgument(rslora=True).effective_lora_alpha() == 4


@dataclass
class LiveLegacy:
    legacy: str = field(default="", metadata={"help": "this class acts on it"})


def test_key_shared_by_two_dataclasses_sets_both_and_warns_only_if_inert_in_all(caplog):
    parser = PdArgumentParser((Toy, LiveLegacy))
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.trainer.argparser"):
        toy, live = parser.parse_args_into_dataclasses(["--legacy", "v", "--legacy2", "1"])
    assert toy.legacy == live.legacy == "v"
    assert parser.inert_keys_set == [("legacy2", "also not implemented")]


def test_yaml_config_and_cli(tmp_path):
    cfg = write(tmp_path, "steps: 4\ntags: [a, b]\nflag: true\n", "cfg.yaml")
    (toy,) = PdArgumentParser(Toy).parse_json_file_and_cmd_lines([cfg, "--steps", "5"])
    assert (toy.steps, toy.tags, toy.flag) == (5, ["a", "b"], True)
    bad = write(tmp_path, "steps: [1\n", "bad.yaml")
    with pytest.raises(ValueError, match=r"bad\.yaml:\d+:\d+: invalid YAML"):
        PdArgumentParser(Toy).parse_yaml_file(bad)


def test_type_and_value_errors_are_reported_together(tmp_path):
    """A value that does not convert (bf16: "maybe") still lets the value checks of its dataclass's __post_init__
    (lr_scheduler_type, sharding, warmup_ratio) run, so all problems show in one run: one problem per line, and no
    problem about the default that stands in for the bad value."""
    cfg = write(tmp_path, {"output_dir": "o", "bf16": "maybe", "max_steps": True, "lr_scheduler_type": "cosin",
                           "sharding": "stage9", "warmup_ratio": 2.0, "fp16_opt_level": "O2"})
    with pytest.raises(ValueError) as e:
        PdArgumentParser((DataArgument, TrainingArguments)).parse_json_file(cfg)
    lines = str(e.value).splitlines()
    assert lines[0] == "5 problem(s) in the arguments:", lines
    for part in ("key 'bf16': expected a bool", "key 'max_steps': expected an int", "lr_scheduler_type must be one of",
                 "sharding must be", "warmup_ratio must be in [0, 1]"):
        assert sum(part in line for line in lines) == 1, part
    # fp16_opt_level O2 needs bf16 or fp16: with bf16 unreadable that check says nothing about the user's config
    assert not any("O2" in line for line in lines)


def test_config_json_with_utf8_bom_parses(tmp_path):
    # a config saved by a Windows editor starts with a BOM: skipped, as the data readers do
    path = tmp_path / "sft.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"output_dir": str(tmp_path / "out"), "max_steps": 3,
                                                   "dataset_name_or_path": "data/sft"}).encode())
    _, _, training_args = parse_sft_args([str(path)])
    assert training_args.max_steps == 3


def test_config_json_not_utf8_names_file_line_and_column(tmp_path):
    # the file, line and column, and the fix (not the codec's bare message)
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{\n "output_dir": "/tmp/caf\xe9"\n}\n')
    with pytest.raises(ValueError, match=r"latin1\.json:2:\d+: not UTF-8 \(byte 0xe9\); save the config file as UTF-8"):
        parse_sft_args([str(path)])


@pytest.mark.parametrize("value, want", [(True, "true"), ("true", "true"), (False, "false"), ("false", "false"),
                                         (None, None), ("/x/checkpoint-4", "/x/checkpoint-4")])
def test_resume_from_checkpoint_takes_json_true_and_false(tmp_path, value, want):
    # PaddleNLP's Trainer takes the JSON bools: true = the latest checkpoint, false = no resume
    cfg = tmp_path / "sft.json"
    cfg.write_text(json.dumps({"output_dir": str(tmp_path / "out"), "dataset_name_or_path": "data/sft",
                               "resume_from_checkpoint": value}))
    _, _, training_args = parse_sft_args([str(cfg)])
    assert training_args.resume_from_checkpoint == want


def test_mistyped_config_path_says_the_file_is_missing(tmp_path):
    """A first argument meant as the config file but not a .json/.yaml path (a typo, or the config's directory) is
    one error about that file, with the config files beside it (not 'unexpected value ... (values must follow a
    --key)' plus 'required key output_dir is missing')."""
    (tmp_path / "sft.json").write_text("{}")
    with pytest.raises(ValueError) as e:
        parse_sft_args([str(tmp_path / "sft.jsn")])
    msg = str(e.value)
    assert "does not exist" in msg and f"did you mean {str(tmp_path / 'sft.json')!r}" in msg
    assert "output_dir" not in msg and "\n" not in msg
    with pytest.raises(ValueError,
                       match=r"is a directory\. The first argument must be a config file.*holds: sft\.json"):
        parse_sft_args([str(tmp_path)])


def _cli_error(*argv: str) -> str:
    with pytest.raises(ValueError) as info:
        parse_sft_args([SFT_JSON, *argv])
    return str(info.value)


@pytest.mark.parametrize("argv,expected", [
    (["--output_dir"], "command line: --output_dir needs a value (str) but it is the last argument; "
                       "write --output_dir <value>"),
    (["--output_dir", "--max_steps", "3"], "command line: --output_dir needs a value (str) but it is followed by "
                                           "--max_steps; write --output_dir <value>"),
    (["--max_steps", "--bf16", "false"], "--max_steps needs a value (int) but it is followed by --bf16"),
    (["--foo", "3"], "command line: unknown key 'foo'; --help lists every key"),
    (["--max_stesp", "3"], "command line: unknown key 'max_stesp'; did you mean 'max_steps'"),
    (["--max_steps", "3", "--max_steps", "4"], "command line: --max_steps given twice; keep one"),
    (["--max_steps=3", "--max_steps", "4"], "command line: --max_steps given twice; keep one"),
    (["--max_steps", "3", "4"], "command line: --max_steps takes one value, got 2: 3 4"),
    (["--max_steps=x"], "command line: --max_steps: expected an int, got 'x'"),
    (["--max_steps", "3", SFT_JSON], "the config file must be the first argument"),
    (["3"], "command line: unexpected value '3' (values must follow a --key)"),
])
def test_malformed_command_line_is_one_line_naming_the_flag(argv, expected):
    msg = _cli_error(*argv)
    assert expected in msg
    assert "\n" not in msg  # one line: no "N problem(s)" list with a second, misleading entry
    assert "sft.json" not in msg or "config file" in msg  # the JSON is not blamed for a command-line mistake


def test_command_line_accepts_equals_dashes_and_bare_booleans():
    _, _, args = parse_sft_args([SFT_JSON, "--max_steps=3", "--output-dir", "/tmp/o", "--bf16", "--do_eval",
                                 "false", "--report_to", "none"])
    assert (args.max_steps, args.output_dir, args.bf16, args.do_eval) == (3, "/tmp/o", True, False)


def test_several_command_line_problems_are_listed_together():
    msg = _cli_error("--output_dir", "--foo", "1")
    assert msg.startswith("2 problem(s) in the arguments:")
    assert "--output_dir needs a value" in msg and "unknown key 'foo'" in msg
    assert "required key 'output_dir'" not in msg  # the flag's own error, not a second 'missing' one


def test_no_arguments_asks_for_a_config_file():
    with pytest.raises(ValueError, match="no arguments: give a JSON config first"):
        PdArgumentParser((TrainingArguments,)).parse([])


@pytest.mark.parametrize("text,expected", [("", "the config file is empty"),
                                           ('{"output_dir": "o",\n}', "trailing comma"),
                                           ('{"report_to": ["none",]}', "trailing comma")])
def test_empty_config_and_trailing_comma_are_named(tmp_path, text, expected):
    cfg = tmp_path / "c.json"
    cfg.write_text(text)
    with pytest.raises(ValueError, match=expected):
        PdArgumentParser((TrainingArguments,)).parse([str(cfg)])


def test_post_init_value_error_names_the_config_file(tmp_path):
    """A value rejected by a dataclass's __post_init__ names the config file it came from."""
    from trainer_fixtures import load_run_finetune

    cfg = json.loads(open(SFT_JSON).read())
    cfg["evaluation_strategy"] = "step"  # a typo of "steps"
    path = tmp_path / "my_sft.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError) as e:
        load_run_finetune().parse_args([str(path)])
    assert "evaluation_strategy" in str(e.value)  # names the key and the allowed values already
    assert str(path) in str(e.value)
