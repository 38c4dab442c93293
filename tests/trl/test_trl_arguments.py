"""run_dpo / run_reward argument parsing: PaddleNLP configs parse verbatim; run_dpo.py's coercions."""

import pytest

from paddlenlp_ext.trl.arguments import parse_dpo_args, parse_rm_args


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
