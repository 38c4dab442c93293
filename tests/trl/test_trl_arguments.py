"""run_dpo / run_reward argument parsing: PaddleNLP configs parse verbatim; run_dpo.py's coercions; warnings for
keys that have no effect; a config of another launcher is named as such."""

import json
import logging
import os

import pytest

from paddlenlp_ext.trl.arguments import parse_dpo_args, parse_rm_args

SMOLLM2 = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "config",
                       "smollm2")


@pytest.mark.parametrize("path", ["config/llama/flashmask/dpo.json", "config/smollm2/dpo.json"])
def test_dpo_configs_parse(path):
    m, d, t, c = parse_dpo_args([path])
    assert c.loss_type == "sigmoid" and c.beta == 0.1 and d.max_seq_len > d.max_prompt_len
    assert t.num_train_epochs == 1  # max_steps > 0 -> one epoch (PaddleNLP rule)


@pytest.mark.parametrize("path", ["config/llama/flashmask/rm.json", "config/smollm2/rm.json"])
def test_rm_configs_parse(path):
    m, d, t = parse_rm_args([path])
    assert d.zero_padding and d.max_seq_len > d.max_prompt_len
    if "llama" in path:  # rm.json sets benchmark: true -> no eval, no save (as PaddleNLP)
        assert t.benchmark and t.save_strategy == "no"


def test_orpo_and_reference_rules():
    _, _, _, c = parse_dpo_args(["--output_dir", "x", "--loss_type", "orpo"])
    assert (c.loss_type, c.reference_free, c.sft_loss_ratio) == ("or", True, 1.0)
    _, _, _, c = parse_dpo_args(["--output_dir", "x", "--loss_type", "simpo"])
    assert c.reference_free
    with pytest.raises(ValueError, match="reference_free=True is not supported with loss_type 'kto_pair'"):
        parse_dpo_args(["--output_dir", "x", "--loss_type", "kto_pair", "--reference_free", "true"])
    with pytest.raises(ValueError, match="loss_type"):
        parse_dpo_args(["--output_dir", "x", "--loss_type", "bogus"])
    with pytest.raises(ValueError, match="precompute_reference_logps needs lazy=false"):
        parse_dpo_args(["--output_dir", "x", "--precompute_reference_logps", "true", "--lazy", "true",
                        "--max_steps", "3"])
    m, _, _, _ = parse_dpo_args(["--output_dir", "x", "--rslora_plus", "true"])
    assert (m.rslora, m.lora_plus_scale, m.lora_alpha) == (True, 4.0, 4.0)
    m, _, _, _ = parse_dpo_args(["--output_dir", "x", "--lora_rank", "16"])
    assert m.lora_alpha == 32.0


def test_unknown_key_names_nearest():
    with pytest.raises(ValueError, match="betta"):
        parse_dpo_args(["--output_dir", "x", "--betta", "0.2"])
    with pytest.raises(ValueError, match="PRM"):
        parse_rm_args(["--output_dir", "x", "--process_reward", "true"])


def test_dpo_flash_mask_alone_means_flashmask_attention_without_a_warning(tmp_path, caplog):
    # PaddleNLP's run_dpo.py sets use_flash_attention for flash_mask and uses FlashMask: no "false: ignored" warning
    # for a use_flash_attention left unset
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
    # recompute always checkpoints whole decoder layers: run_reward.py warns like run_finetune.py
    cfg = tmp_path / "rm.json"
    cfg.write_text(json.dumps({"output_dir": str(tmp_path / "out"), "train_dataset_path": "t.jsonl",
                               "recompute": True, "recompute_granularity": "core_attn"}))
    with caplog.at_level(logging.WARNING):
        parse_rm_args([str(cfg)])
    assert "not acted on by this build: recompute_granularity" in caplog.text


def test_dpo_lora_from_an_sft_adapter_warns_that_the_reference_is_the_bare_base(tmp_path, caplog):
    # DPO with lora + lora_path (SFT LoRA, then DPO LoRA from that adapter) takes the policy with every adapter
    # disabled as the reference, i.e. the base without the SFT adapter: training starts off-reference (on a tiny
    # run: eval_loss 0.721 instead of log 2, rewards/accuracies 0.25 at step 0)
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


def test_config_of_another_launcher_names_that_launcher():
    # a key of another launcher gets that launcher's name, not look-alike suggestions ('adam_beta1' for 'beta')
    with pytest.raises(ValueError) as e:
        parse_rm_args([os.path.join(SMOLLM2, "dpo.json")])
    assert "unknown key 'beta': it is a key of llm/run_dpo.py (DPO); use that launcher" in str(e.value)
    with pytest.raises(ValueError) as e:
        parse_dpo_args([os.path.join(SMOLLM2, "lora.json")])
    assert "unknown key 'dataset_name_or_path': it is a key of llm/run_finetune.py (SFT/LoRA)" in str(e.value)
    with pytest.raises(ValueError, match="the reward model has no LoRA"):
        parse_rm_args([os.path.join(SMOLLM2, "rm.json"), "--lora", "true"])
    with pytest.raises(ValueError, match=r"unknown key 'max_stepz'; did you mean 'max_steps'"):  # typos unchanged
        parse_rm_args([os.path.join(SMOLLM2, "rm.json"), "--max_stepz", "3"])


@pytest.mark.parametrize("extra, why", [(["--lora", "true"], "lora=true"),
                                        (["--loss_type", "simpo"], "reference_free")])
def test_ref_model_update_steps_without_a_reference_model_warns(extra, why):
    # with LoRA (reference = adapters disabled) or reference_free there is no reference model to update
    from paddlenlp_ext.trainer.argparser import PdArgumentParser
    from paddlenlp_ext.trl.arguments import (DPOConfig, DPODataArgument, DPOModelArgument, DPOTrainingArguments,
                                             finalize_dpo_args)

    def warnings(*extra_argv):
        argv = [os.path.join(SMOLLM2, "dpo.json"), "--ref_model_update_steps", "4", *extra_argv]
        parsed = PdArgumentParser((DPOModelArgument, DPODataArgument, DPOTrainingArguments, DPOConfig)).parse(argv)
        return [m for m in finalize_dpo_args(*parsed) if "ref_model_update_steps" in m]

    msgs = warnings(*extra)
    assert len(msgs) == 1 and f"ref_model_update_steps=4 has no effect with {why}" in msgs[0], msgs
    assert warnings() == []  # a reference model exists: it is updated, nothing to warn about


def test_negative_weight_decay_and_sft_loss_ratio_are_refused():
    """A negative AdamW decay grows the weights, a negative SFT ratio rewards a worse likelihood of the chosen
    answer: each is a ValueError naming the key."""
    with pytest.raises(ValueError, match=r"weight_decay must be >= 0.*-0\.1"):
        parse_dpo_args(["--output_dir", "x", "--weight_decay", "-0.1"])
    with pytest.raises(ValueError, match=r"sft_loss_ratio must be >= 0.*-1"):
        parse_dpo_args(["--output_dir", "x", "--sft_loss_ratio", "-1"])
    parse_dpo_args(["--output_dir", "x", "--weight_decay", "0.0", "--sft_loss_ratio", "0.5"])
