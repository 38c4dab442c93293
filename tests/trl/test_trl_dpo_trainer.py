"""DPOTrainer reference sources: LoRA-disabled policy, frozen copy, precomputed log-probs; RM trainer loss."""

import copy

import torch

from paddlenlp_ext.datasets.preference import PreferenceCollator
from paddlenlp_ext.datasets.zero_padding import ZeroPaddingMapDataset
from paddlenlp_ext.peft import apply_lora
from paddlenlp_ext.trainer.arguments import TrainingArguments
from paddlenlp_ext.transformers.llama import LlamaForCausalLM
from paddlenlp_ext.trl.arguments import DPOConfig
from paddlenlp_ext.trl.dpo_trainer import DPOTrainer, policy_pair_logps
from paddlenlp_ext.trl.reward_model import LlamaForScore, bradley_terry_loss
from paddlenlp_ext.trl.rm_trainer import RewardTrainer
from tests.trl._stub_tokenizer import WordTokenizer
from tests.trl.test_trl_packed_equivalence import EXAMPLES, L, _config, _records


def _dataset(layout):
    return ZeroPaddingMapDataset(_records(WordTokenizer(), EXAMPLES, layout), max_length=L)


def _args(tmp_path):
    return TrainingArguments(output_dir=str(tmp_path), max_steps=2, report_to=["none"], device="cpu")


def test_lora_reference_is_base_model(tmp_path):
    torch.manual_seed(0)
    base = LlamaForCausalLM(_config())
    model = apply_lora(copy.deepcopy(base), {"lora_rank": 4})
    for n, p in model.named_parameters():
        if "lora_B" in n:
            p.data.normal_(0, 0.5)  # make the adapters matter
    trainer = DPOTrainer(model, _args(tmp_path), dpo_config=DPOConfig(lora=True),
                         data_collator=PreferenceCollator(L))
    batch = PreferenceCollator(L)([_dataset("dpo")[0]])
    ref = trainer.reference_pair_logps(batch)
    with torch.no_grad():
        want = policy_pair_logps(base, batch)
        pol = policy_pair_logps(model, batch)
    torch.testing.assert_close(ref.chosen, want.chosen, rtol=0, atol=1e-6)
    torch.testing.assert_close(ref.rejected, want.rejected, rtol=0, atol=1e-6)
    assert not torch.allclose(pol.chosen, want.chosen)


def test_precomputed_reference_equals_live_reference(tmp_path):
    torch.manual_seed(0)
    model = LlamaForCausalLM(_config())
    ref = copy.deepcopy(model)
    collate = PreferenceCollator(L)
    ds = _dataset("dpo")
    live = DPOTrainer(model, _args(tmp_path), dpo_config=DPOConfig(), ref_model=ref, data_collator=collate)
    batch = collate([ds[0]])
    loss_live, n, m_live = live.compute_loss(model, batch)
    pre = DPOTrainer(model, _args(tmp_path), dpo_config=DPOConfig(precompute_reference_logps=True),
                     data_collator=collate)
    assert pre.precompute_reference_logps(ds) == 3
    batch = collate([ds[0]])
    assert "reference_chosen_logps" in batch and batch["reference_chosen_logps"].shape == (3,)
    loss_pre, n2, m_pre = pre.compute_loss(model, batch)
    assert n == n2 == 3
    torch.testing.assert_close(loss_pre, loss_live, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(m_pre["rewards/margins"], torch.tensor(0.0), atol=1e-5, rtol=0)  # policy == ref


def test_ref_model_update_steps_copies_policy(tmp_path):
    torch.manual_seed(0)
    model = LlamaForCausalLM(_config())
    ref = copy.deepcopy(model)
    args = _args(tmp_path)
    args.learning_rate = 1e-2
    cfg = DPOConfig(ref_model_update_steps=2)
    trainer = DPOTrainer(model, args, dpo_config=cfg, ref_model=ref, train_dataset=_dataset("dpo"),
                         data_collator=PreferenceCollator(L))
    trainer.args.max_steps = 1
    trainer.train()
    w = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(ref.state_dict()[w], model.state_dict()[w])  # step 1: not copied
    trainer.state.global_step = 1
    trainer.args.max_steps = 2
    trainer.train()
    assert torch.equal(ref.state_dict()[w], model.state_dict()[w])  # step 2: copied


def test_reward_trainer_loss_is_bradley_terry(tmp_path):
    torch.manual_seed(0)
    rm = LlamaForScore(_config())
    collate = PreferenceCollator(L)
    batch = collate([_dataset("rm")[0]])
    trainer = RewardTrainer(rm, _args(tmp_path), data_collator=collate)
    loss_sum, n, metrics = trainer.compute_loss(rm, batch)
    s_c, s_r = rm.pair_scores(batch)
    assert n == 3
    torch.testing.assert_close(loss_sum, bradley_terry_loss(s_c, s_r).sum())
    torch.testing.assert_close(loss_sum, -torch.nn.functional.logsigmoid(s_c - s_r).sum())
    assert metrics["accuracy"] == (s_c > s_r).float().sum()


def test_reward_model_ernie_trunk_scores_pairs():
    from paddlenlp_ext.transformers.ernie35 import Ernie35Config

    torch.manual_seed(0)
    cfg = Ernie35Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=128)
    rm = LlamaForScore(cfg).eval()
    batch = PreferenceCollator(L)([_dataset("rm")[0]])
    with torch.no_grad():
        s_c, s_r = rm.pair_scores(batch)
    assert s_c.shape == s_r.shape == (3,) and torch.isfinite(s_c).all() and torch.isfinite(s_r).all()


def test_reference_precompute_shows_progress(tmp_path, capsys):
    """The reference pass runs for minutes on a CPU before the first step: a progress bar on stderr (none with
    disable_tqdm)."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(_config())
    trainer = DPOTrainer(model, _args(tmp_path), dpo_config=DPOConfig(precompute_reference_logps=True),
                         data_collator=PreferenceCollator(L))
    trainer.precompute_reference_logps(_dataset("dpo"))
    assert "reference log-probs:" in capsys.readouterr().err  # the bar ("desc: 100%|..."), not the log line
    quiet = TrainingArguments(output_dir=str(tmp_path), max_steps=2, report_to=["none"], device="cpu",
                              disable_tqdm=True)
    DPOTrainer(model, quiet, dpo_config=DPOConfig(precompute_reference_logps=True),
               data_collator=PreferenceCollator(L)).precompute_reference_logps(_dataset("dpo"))
    assert "reference log-probs:" not in capsys.readouterr().err


def test_dpo_sft_term_is_invariant_to_micro_batching(tmp_path):
    # the SFT term (sft_loss_ratio > 0, e.g. ORPO) is the step's token mean: DPOTrainer gives the criterion the
    # step's pairs / chosen tokens. A token mean per micro-batch (PaddleNLP's sft_loss) would make the step's loss
    # and gradient depend on how the pairs are split into micro-batches / data ranks (through run_dpo.py on a tiny
    # model: step-1 sft_loss 10.8067 with 2 micro-batches of 1 pack, 10.8469 with 1 of 2)
    from paddlenlp_ext.trl.dpo_trainer import _token_counts

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
