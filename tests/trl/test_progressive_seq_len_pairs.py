"""Progressive sequence length (the ERNIE-3.5-SE 3B preset's ``use_progressive_seq_len``) in DPO and the RM.

Before step 500 a training step sees the first 512 tokens of each pack. A pair that ends within them scores as in
a pack holding only the pairs that fit; a pair that ends past them is left out of the step (its log-probs or
scores are not computed from a truncated response). Packs here: three examples ending near 190, 450 and 540.
"""

import copy

import torch

from paddlenlp_ext.datasets.preference import PreferenceCollator, check_preference_data, tokenize_preference_example
from paddlenlp_ext.datasets.zero_padding import ZeroPaddingMapDataset
from paddlenlp_ext.trainer.arguments import TrainingArguments
from paddlenlp_ext.transformers.ernie35 import Ernie35Config, Ernie35ForCausalLM
from paddlenlp_ext.trl.arguments import DPOConfig
from paddlenlp_ext.trl.dpo_trainer import DPOTrainer, policy_pair_logps
from paddlenlp_ext.trl.reward_model import LlamaForScore
from paddlenlp_ext.trl.rm_trainer import RewardTrainer
from tests.trl._stub_tokenizer import WordTokenizer

L = 600


def _words(n, start):
    return " ".join(f"w{(start + i) % 40}" for i in range(n))


# (prompt words, chosen words, rejected words): the pairs end near 192, 453 and 540 in one pack
SHAPES = [(150, 20, 20), (200, 30, 30), (45, 20, 20)]


def _examples(shapes):
    return [{"src": _words(p, k), "tgt": [], "response": [_words(c, k + 7), _words(r, k + 13)], "sort": [1, 0]}
            for k, (p, c, r) in enumerate(shapes)]


def _batch(shapes, layout, length=L):
    tok = WordTokenizer()
    tok.vocab.update({f"w{i}": 3 + i for i in range(40)})  # fixed ids, whatever the order of words
    recs = [tokenize_preference_example(check_preference_data(e), tok, max_seq_len=length, max_prompt_len=length - 64,
                                        layout=layout) for e in _examples(shapes)]
    ds = ZeroPaddingMapDataset(recs, max_length=length)
    assert len(ds) == 1
    return PreferenceCollator(length)([ds[0]])


def _config():
    """The 3B preset (progressive length and random positions on) at a tiny width."""
    cfg = Ernie35Config.from_pretrained("baidu/ernie-3.5-se-3b", hidden_size=32, intermediate_size=48,
                                        num_attention_heads=4, num_hidden_layers=3, vocab_size=64,
                                        max_position_embeddings=4096)
    assert cfg.use_progressive_seq_len and cfg.enable_random_position_ids
    return cfg


def _args(tmp_path):
    return TrainingArguments(output_dir=str(tmp_path), max_steps=1, report_to=["none"], device="cpu")


def test_dpo_scores_only_pairs_within_the_cut(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINER_GLOBAL_STEP", "0")
    torch.manual_seed(0)
    model = Ernie35ForCausalLM(_config()).train()
    full = _batch(SHAPES, "dpo")
    assert full["response_indexs"][:, 3].tolist()[1] <= 512 < full["response_indexs"][:, 3].tolist()[2]
    two = _batch(SHAPES[:2], "dpo", length=512)  # the pairs that fit, alone
    with torch.no_grad():
        got = policy_pair_logps(model, full)
        want = policy_pair_logps(model, two)
    assert got.chosen.shape == (2,)
    torch.testing.assert_close(got.chosen, want.chosen, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got.rejected, want.rejected, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got.chosen_tokens, want.chosen_tokens)

    # a whole step: the reference (a frozen copy, eval mode) sees the same cut batch; 2 pairs counted
    trainer = DPOTrainer(model, _args(tmp_path), dpo_config=DPOConfig(), ref_model=copy.deepcopy(model),
                         data_collator=PreferenceCollator(L))
    trainer.create_optimizer_and_scheduler(1)
    out = trainer.training_step([full])
    assert int(out["count"]) == 2 and torch.isfinite(out["loss_sum"])
    assert full["input_ids"].shape[1] == L  # the caller's batch is untouched


def test_dpo_precomputed_reference_follows_the_kept_pairs(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINER_GLOBAL_STEP", "0")
    torch.manual_seed(0)
    model = Ernie35ForCausalLM(_config()).train()
    full = _batch(SHAPES, "dpo")
    full["reference_chosen_logps"] = torch.tensor([-1.0, -2.0, -3.0])
    full["reference_rejected_logps"] = torch.tensor([-4.0, -5.0, -6.0])
    trainer = DPOTrainer(model, _args(tmp_path), dpo_config=DPOConfig(precompute_reference_logps=True),
                         data_collator=PreferenceCollator(L))
    cut = trainer.cut_for_training(full)
    ref = trainer.reference_pair_logps(cut)
    assert ref.chosen.tolist() == [-1.0, -2.0] and ref.rejected.tolist() == [-4.0, -5.0]
    assert cut["response_indexs"].shape == (2, 4) and cut["input_ids"].shape == (1, 512)
    assert (cut["chosen_labels"] != -100).sum() + (cut["rejected_labels"] != -100).sum() == \
        int(ref.chosen_tokens.sum() + ref.rejected_tokens.sum())


def test_dpo_step_with_no_pair_within_the_cut_still_backpropagates(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINER_GLOBAL_STEP", "0")
    torch.manual_seed(0)
    model = Ernie35ForCausalLM(_config()).train()
    batch = _batch([(500, 20, 20)], "dpo")  # its only pair ends at 541
    trainer = DPOTrainer(model, _args(tmp_path), dpo_config=DPOConfig(reference_free=True, loss_type="simpo"),
                         data_collator=PreferenceCollator(L))
    out = trainer.forward_backward([batch])
    assert int(out["count"]) == 0 and float(out["loss_sum"]) == 0.0
    assert all(p.grad is not None for p in model.parameters())  # every parameter took part (FSDP stays in step)


def test_reward_model_follows_the_schedule(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINER_GLOBAL_STEP", "0")
    torch.manual_seed(0)
    rm = LlamaForScore(_config())
    torch.nn.init.normal_(rm.score.weight, std=0.5)
    rm.load_state_dict(Ernie35ForCausalLM(_config()).state_dict(), strict=False)
    rm.train()
    full, two = _batch(SHAPES, "rm"), _batch(SHAPES[:2], "rm", length=512)
    assert rm.training_seq_len(L) == 512
    with torch.no_grad():
        got, want = rm.pair_scores(full), rm.pair_scores(two)
    assert got[0].shape == (2,)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("TRAINER_GLOBAL_STEP", "1500")  # past the warm-up: the whole pack, all three pairs
    with torch.no_grad():
        assert rm.pair_scores(full)[0].shape == (3,)
    monkeypatch.setenv("TRAINER_GLOBAL_STEP", "0")
    trainer = RewardTrainer(rm, _args(tmp_path), data_collator=PreferenceCollator(L))
    trainer.create_optimizer_and_scheduler(1)
    out = trainer.training_step([full])
    assert int(out["count"]) == 2 and torch.isfinite(out["loss_sum"])
    rm.eval()
    with torch.no_grad():  # evaluation is never cut
        assert rm.pair_scores(full)[0].shape == (3,)
