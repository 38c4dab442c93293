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


class _Recording(PackDataset):
    """PackDataset that records which pack indices the loader reads."""

    def __init__(self, n):
        super().__init__(n=n)
        self.read = []

    def __getitem__(self, i):
        self.read.append(int(i))
        return super().__getitem__(i)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("new_bs", [1, 4])
def test_resume_with_another_batch_size_reads_the_next_unseen_packs(make_args, tiny_model, tmp_path, new_bs,
                                                                     shuffle):
    # was: the checkpoint's micro-batch count (2 micro-batches of 2 packs) was skipped in micro-batches of the NEW
    # size: resumed with batch size 4 it skipped 8 packs (packs 4..7 never trained on), with 1 it skipped 2 (packs
    # 2..3 trained on twice), silently
    out = tmp_path / "out"
    kw = dict(output_dir=str(out), save_strategy="steps", save_steps=2, dataloader_shuffle=shuffle)
    first = _Recording(16)
    Trainer(tiny_model(), make_args(per_device_train_batch_size=2, max_steps=2, **kw), train_dataset=first).train()
    assert (out / "checkpoint-2").is_dir()
    seen = list(first.read)
    assert len(seen) == 4
    second = _Recording(16)
    Trainer(tiny_model(), make_args(per_device_train_batch_size=new_bs, max_steps=3, **kw),
            train_dataset=second).train(resume_from_checkpoint=True)
    # the epoch's order is that of the first run (same seed and epoch): the next packs follow the 4 already seen
    full = _Recording(16)
    Trainer(tiny_model(), make_args(per_device_train_batch_size=8, max_steps=1, output_dir=str(tmp_path / "o2"),
                                    save_strategy="no", dataloader_shuffle=shuffle), train_dataset=full).train()
    assert full.read[:4] == seen
    assert second.read == full.read[4:4 + new_bs]


def test_resume_with_a_batch_size_that_splits_a_micro_batch_warns(make_args, tiny_model, tmp_path, caplog):
    out = tmp_path / "out"
    kw = dict(output_dir=str(out), save_strategy="steps", save_steps=1, dataloader_shuffle=False)
    Trainer(tiny_model(), make_args(per_device_train_batch_size=3, max_steps=1, **kw), train_dataset=_Recording(16)
            ).train()
    second = _Recording(16)
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.trainer"):
        Trainer(tiny_model(), make_args(per_device_train_batch_size=2, max_steps=2, **kw), train_dataset=second
                ).train(resume_from_checkpoint=True)
    assert second.read == [2, 3]  # 3 packs read: one whole micro-batch of 2 kept, pack 2 read again
    assert "the last 1 are read again" in caplog.text


def test_dpo_flash_mask_without_use_flash_attention_is_not_warned_as_false(tmp_path, caplog):
    # was: flash_mask true with use_flash_attention unset warned "flash_mask/use_flash_attention false: ignored ...
    # (PaddleNLP would use a dense mask)": PaddleNLP's run_dpo.py sets use_flash_attention and uses FlashMask there
    from paddlenlp_ext.trl.arguments import parse_dpo_args

    cfg = tmp_path / "dpo.json"
    cfg.write_text(json.dumps({"output_dir": str(tmp_path / "out"), "train_dataset_path": "t.jsonl",
                               "flash_mask": True}))
    with caplog.at_level(logging.WARNING):
        model_args = parse_dpo_args([str(cfg)])[0]
    assert model_args.use_flash_attention
    assert "flash_mask" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        parse_dpo_args([str(cfg), "--flash_mask", "false", "--use_flash_attention", "true"])
    assert "flash_mask false: ignored" in caplog.text


def test_rm_recompute_granularity_is_warned_as_not_acted_on(tmp_path, caplog):
    # was: run_reward.py accepted recompute_granularity 'core_attn' silently (its RM model-argument copy was not
    # marked inert) while run_finetune.py warned; recompute always checkpoints whole decoder layers
    from paddlenlp_ext.trl.arguments import parse_rm_args

    cfg = tmp_path / "rm.json"
    cfg.write_text(json.dumps({"output_dir": str(tmp_path / "out"), "train_dataset_path": "t.jsonl",
                               "recompute": True, "recompute_granularity": "core_attn"}))
    with caplog.at_level(logging.WARNING):
        parse_rm_args([str(cfg)])
    assert "not acted on by this build: recompute_granularity" in caplog.text


@pytest.fixture(scope="module")
def tiny_pairs(tmp_path_factory):
    from tests.trl._tiny import make_tiny_model_dir, write_pairs

    d = tmp_path_factory.mktemp("userpass8_pairs")
    return make_tiny_model_dir(str(d / "model")), write_pairs(str(d / "train.jsonl"), 8)


@pytest.mark.parametrize("script", ["run_dpo", "run_reward"])
def test_dpo_and_rm_act_on_the_use_fused_keys(tiny_pairs, tmp_path, monkeypatch, script):
    # was: run_dpo.py / run_reward.py accepted use_fused_rms_norm / use_fused_rope / use_fused_swiglu / ... and
    # never copied them onto the model config (only run_finetune.py called set_llm_config), so the compiled ops
    # never ran there, silently; PaddleNLP's run_dpo.py copies them (LlmMetaConfig.set_llm_config)
    import paddlenlp_ext.distributed as distributed
    from tests._scripts import load_script

    seen = []
    original = distributed.parallelize_model

    def spy(model, *a, **kw):
        seen.append(model)
        return original(model, *a, **kw)

    monkeypatch.setattr(distributed, "parallelize_model", spy)
    model_dir, train = tiny_pairs
    load_script(f"llm/{script}.py").main([
        "--model_name_or_path", model_dir, "--train_dataset_path", train, "--output_dir", str(tmp_path / "out"),
        "--max_seq_len", "64", "--max_prompt_len", "24", "--max_steps", "1", "--do_train", "true",
        "--do_eval", "false", "--report_to", "none", "--use_fused_rms_norm", "true", "--use_fused_swiglu", "true"])
    config = seen[0].config
    assert config.use_fused_rms_norm and config.use_fused_swiglu and not config.use_fused_rope


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


def test_resume_with_a_new_learning_rate_and_weight_decay_uses_them(make_args, tiny_model, tmp_path, caplog):
    # was: the checkpoint's optimizer param groups and LambdaLR base_lrs were restored as they were, so a run
    # resumed with --learning_rate 1e-5 trained on at the old 1e-2 (and the old weight_decay), silently; PaddleNLP's
    # optimizer / scheduler states hold no such values, so there the config's values apply on resume
    out = tmp_path / "out"
    kw = dict(output_dir=str(out), save_strategy="steps", save_steps=2, lr_scheduler_type="linear", warmup_steps=0,
              max_steps=4)
    Trainer(tiny_model(), make_args(learning_rate=1e-2, weight_decay=0.01, **kw), train_dataset=PackDataset(n=8)
            ).train()
    t = Trainer(tiny_model(), make_args(learning_rate=1e-5, weight_decay=0.0, **kw), train_dataset=PackDataset(n=8))
    t.compute_max_steps = lambda: 3  # stop after one resumed step; the schedule still spans 4 steps
    t.create_optimizer_and_scheduler(4)
    with caplog.at_level(logging.INFO, logger="paddlenlp_ext.trainer"):
        t.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    lrs = [h["lr"] for h in t.state.log_history if "lr" in h]
    # linear decay over 4 steps, read after step 3: 1e-5 * (4 - 3) / 4
    assert lrs[-1] == pytest.approx(1e-5 * 1 / 4)
    assert [g["weight_decay"] for g in t.optimizer.param_groups] == [0.0, 0.0]
    assert "resuming with this run's learning_rate, weight_decay" in caplog.text


def test_resume_with_the_same_hyperparameters_logs_nothing(make_args, tiny_model, tmp_path, caplog):
    out = tmp_path / "out"
    kw = dict(output_dir=str(out), save_strategy="steps", save_steps=2, max_steps=2)
    Trainer(tiny_model(), make_args(**kw), train_dataset=PackDataset(n=8)).train()
    with caplog.at_level(logging.INFO, logger="paddlenlp_ext.trainer"):
        Trainer(tiny_model(), make_args(**{**kw, "max_steps": 3}), train_dataset=PackDataset(n=8)
                ).train(resume_from_checkpoint=True)
    assert "resuming with this run's" not in caplog.text


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


def test_truncated_preference_examples_are_counted_in_one_warning(tmp_path, caplog):
    # was: run_dpo.py / run_reward.py cut examples longer than max_seq_len (responses losing their tails and end
    # token) without a word; SFT warns about what it drops. Now one warning per file, also for a lazy stream read
    # again every epoch
    from paddlenlp_ext.datasets.preference import _TokenizedPreferenceStream
    from paddlenlp_ext.transformers import AutoTokenizer
    from tests.trl._tiny import make_tiny_model_dir, write_pairs

    tok = AutoTokenizer.from_pretrained(make_tiny_model_dir(str(tmp_path / "m")))
    pairs = write_pairs(str(tmp_path / "p.jsonl"), 6)
    roomy = _TokenizedPreferenceStream(pairs, tok, 128, 64, "dpo", True)
    with caplog.at_level(logging.WARNING):
        assert len(list(roomy)) == 6
    assert "preference examples cut" not in caplog.text
    tight = _TokenizedPreferenceStream(pairs, tok, 12, 4, "dpo", True)
    with caplog.at_level(logging.WARNING):
        assert len(list(tight)) == 6 and len(list(tight)) == 6  # two epochs
    assert caplog.text.count("6 of 6 preference examples cut to fit max_seq_len=12") == 1
    assert "raise max_seq_len" in caplog.text


def test_dpo_lora_from_an_sft_adapter_warns_that_the_reference_is_the_bare_base(tmp_path, caplog):
    # was silent: DPO with lora + lora_path (SFT LoRA, then DPO LoRA from that adapter) takes the policy with every
    # adapter disabled as the reference, i.e. the base WITHOUT the SFT adapter; training starts off-reference
    # (measured on a tiny run: eval_loss 0.721 instead of log 2, rewards/accuracies 0.25 at step 0)
    from paddlenlp_ext.trl.arguments import parse_dpo_args

    cfg = tmp_path / "dpo.json"
    cfg.write_text(json.dumps({"output_dir": str(tmp_path / "out"), "train_dataset_path": "t.jsonl", "lora": True,
                               "lora_path": str(tmp_path / "sft_adapter")}))
    with caplog.at_level(logging.WARNING):
        parse_dpo_args([str(cfg)])
    assert "the reference model is the policy with its adapters disabled, the loaded one included" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        parse_dpo_args([str(cfg), "--lora_path", ""])  # a fresh adapter: the base is the right reference
        parse_dpo_args([str(cfg), "--loss_type", "simpo"])  # reference-free
    assert "adapters disabled, the loaded one" not in caplog.text


def test_resume_on_data_that_packs_differently_warns(make_args, tiny_model, tmp_path, caplog):
    # was silent: resumed with another max_length (or data file), the checkpoint's "N micro-batches into epoch E"
    # pointed into a different list of packs, so some packs were never trained on and others twice
    out = tmp_path / "out"
    kw = dict(output_dir=str(out), save_strategy="steps", save_steps=2)
    Trainer(tiny_model(), make_args(max_steps=2, **kw), train_dataset=PackDataset(n=16)).train()
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.trainer"):
        Trainer(tiny_model(), make_args(max_steps=3, **kw), train_dataset=PackDataset(n=16)
                ).train(resume_from_checkpoint=True)
    assert "packs into" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.trainer"):
        Trainer(tiny_model(), make_args(max_steps=4, **kw), train_dataset=PackDataset(n=12)
                ).train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert "the train data packs into 12 packs, the checkpoint's run had 16" in caplog.text


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


def test_missing_preference_file_names_the_key_and_its_default(tmp_path, monkeypatch):
    # was: "data file './data/dev.jsonl' does not exist" for a dpo.json without dev_dataset_path and do_eval true:
    # the default path of a key the user never set, not named, and only after the train split was tokenised
    from types import SimpleNamespace

    from paddlenlp_ext.datasets.preference import create_preference_datasets
    from paddlenlp_ext.transformers import AutoTokenizer
    from tests.trl._tiny import make_tiny_model_dir, write_pairs

    tok = AutoTokenizer.from_pretrained(make_tiny_model_dir(str(tmp_path / "m")))
    monkeypatch.chdir(tmp_path)
    train = write_pairs(str(tmp_path / "train.jsonl"), 2)
    args = SimpleNamespace(train_dataset_path=train, dev_dataset_path="./data/dev.jsonl", max_seq_len=64,
                           max_prompt_len=32, greedy_zero_padding=False, lazy=False, chat_template=None)
    with pytest.raises(FileNotFoundError, match=r"dev_dataset_path='\./data/dev\.jsonl' \(its default\) does not "
                                                r"exist, relative to the current directory .*set dev_dataset_path"):
        create_preference_datasets(args, tok, splits=("train", "dev"))


def test_dpo_sft_term_is_invariant_to_micro_batching(tmp_path):
    # was: the SFT term (sft_loss_ratio > 0, e.g. ORPO) was a token mean per micro-batch (PaddleNLP's sft_loss), so
    # the step's loss and gradient depended on how the pairs were split into micro-batches / data ranks (through
    # run_dpo.py on a tiny model: step-1 sft_loss 10.8067 with 2 micro-batches of 1 pack, 10.8469 with 1 of 2);
    # now DPOTrainer gives the criterion the step's pairs / chosen tokens and the term is the step's token mean
    from paddlenlp_ext.datasets.preference import PreferenceCollator
    from paddlenlp_ext.trainer.arguments import TrainingArguments
    from paddlenlp_ext.transformers.llama import LlamaForCausalLM
    from paddlenlp_ext.trl.arguments import DPOConfig
    from paddlenlp_ext.datasets.zero_padding import ZeroPaddingMapDataset
    from paddlenlp_ext.trl.dpo_trainer import DPOTrainer, _token_counts
    from tests.trl._stub_tokenizer import WordTokenizer
    from tests.trl.test_trl_packed_equivalence import EXAMPLES, L, _config, _records

    torch.manual_seed(0)
    model = LlamaForCausalLM(_config())
    collate = PreferenceCollator(L)
    ds = ZeroPaddingMapDataset(_records(WordTokenizer(), EXAMPLES, "dpo"), max_length=L, one_per_pack=True)
    packs = [ds[0], ds[1]]  # one pair each
    per_pair = [(_token_counts(collate([p]))[0].float().mean()).item() for p in packs]
    assert per_pair[0] != per_pair[1]  # else any split gives the same token mean and the test has no teeth
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, report_to=["none"], device="cpu")
    trainer = DPOTrainer(model, args, dpo_config=DPOConfig(loss_type="or", reference_free=True, sft_loss_ratio=1.0),
                         data_collator=collate)

    def step(groups):
        model.zero_grad(set_to_none=True)
        out = trainer.forward_backward([collate(g) for g in groups])
        return out["loss_sum"] / out["count"], [p.grad.clone() for p in model.parameters() if p.grad is not None]

    (whole, g_whole), (split, g_split) = step([packs]), step([[packs[0]], [packs[1]]])
    torch.testing.assert_close(split, whole, rtol=1e-6, atol=0)
    for a, b in zip(g_split, g_whole):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_rotation_after_resuming_an_earlier_checkpoint_keeps_the_new_one(make_args, tiny_model, tmp_path, caplog):
    # was: checkpoints 2, 4, 6 of a first run; resumed from checkpoint-2 with save_total_limit 1, the run wrote its
    # checkpoint-4 and the rotation (newest by step) removed it, keeping the first run's checkpoint-6: this run's
    # progress was lost and a rerun resumed the abandoned run
    out = tmp_path / "out"
    kw = dict(output_dir=str(out), save_strategy="steps", save_steps=2)
    Trainer(tiny_model(), make_args(max_steps=6, **kw), train_dataset=PackDataset(n=16)).train()
    assert sorted(os.listdir(out)) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    second = Trainer(tiny_model(), make_args(max_steps=4, save_total_limit=1, learning_rate=1e-3, **kw),
                     train_dataset=PackDataset(n=16))
    with caplog.at_level(logging.WARNING, logger="paddlenlp_ext.trainer"):
        second.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert "later checkpoints of another run (checkpoint-4, checkpoint-6)" in caplog.text
    assert sorted(os.listdir(out)) == ["checkpoint-4", "checkpoint-6"]
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    losses = [h["loss"] for h in state["log_history"] if "loss" in h]
    assert losses == [h["loss"] for h in second.state.log_history if "loss" in h]  # this run's checkpoint-4
