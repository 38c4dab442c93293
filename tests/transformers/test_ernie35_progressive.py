"""Progressive sequence length (the 3B preset's ``use_progressive_seq_len``) in SFT: the trainer cuts the whole pack.

Before step 500 a step trains on the first 512 tokens: the loss, its token count and the gradients equal those of
the pack cut by hand (input_ids, labels, position ids, FlashMask LTS clamped to the cut).
"""

import copy

import pytest
import torch

from paddlenlp_ext.trainer import Trainer
from paddlenlp_ext.trainer.arguments import TrainingArguments
from paddlenlp_ext.transformers.ernie35 import Ernie35Config, Ernie35ForCausalLM

V = 64


def _pack(lengths, total, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids, pos, lts, labels = [], [], [], []
    for n in lengths:
        start = len(ids)
        seq = torch.randint(1, V, (n,), generator=g).tolist()
        ids += seq
        pos += list(range(n))
        lts += [start + n] * n
        labels += seq[1:] + [-100]
    pad = total - len(ids)
    return dict(input_ids=torch.tensor([ids + [0] * pad]), position_ids=torch.tensor([pos + [0] * pad]),
                labels=torch.tensor([labels + [-100] * pad]),
                attn_mask_startend_row_indices=torch.tensor(lts + [0] * pad, dtype=torch.int32).view(1, 1, total, 1))


@pytest.mark.parametrize("fused", [True, False])
def test_sft_step_trains_on_the_cut_pack(tmp_path, monkeypatch, fused):
    monkeypatch.setenv("TRAINER_GLOBAL_STEP", "0")
    cfg = Ernie35Config.from_pretrained("baidu/ernie-3.5-se-3b", hidden_size=32, intermediate_size=48,
                                        num_attention_heads=4, num_hidden_layers=3, vocab_size=V,
                                        max_position_embeddings=4096, use_fused_linear_cross_entropy=fused)
    assert cfg.use_progressive_seq_len
    torch.manual_seed(0)
    model = Ernie35ForCausalLM(cfg).train()
    twin = copy.deepcopy(model)
    batch = _pack([300, 250, 120], 700)  # the second example crosses token 512
    by_hand = dict(input_ids=batch["input_ids"][:, :512], position_ids=batch["position_ids"][:, :512],
                   labels=batch["labels"][:, :512],
                   attn_mask_startend_row_indices=torch.tensor([300] * 300 + [512] * 212,
                                                               dtype=torch.int32).view(1, 1, 512, 1))
    args = TrainingArguments(output_dir=str(tmp_path), device="cpu", report_to=["none"])
    got = Trainer(model, args).forward_backward([batch])
    want = Trainer(twin, args).forward_backward([by_hand])
    assert int(got["count"]) == int(want["count"]) == int((batch["labels"][:, :512] != -100).sum())
    assert int(got["tokens"]) == 512
    torch.testing.assert_close(got["loss_sum"], want["loss_sum"], rtol=1e-6, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_sft_step_after_the_warm_up_keeps_the_whole_pack(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINER_GLOBAL_STEP", "1500")
    cfg = Ernie35Config.from_pretrained("baidu/ernie-3.5-se-3b", hidden_size=32, intermediate_size=48,
                                        num_attention_heads=4, num_hidden_layers=3, vocab_size=V,
                                        max_position_embeddings=4096)
    model = Ernie35ForCausalLM(cfg).train()
    batch = _pack([300, 250, 120], 700)
    trainer = Trainer(model, TrainingArguments(output_dir=str(tmp_path), device="cpu", report_to=["none"]))
    assert trainer.cut_for_training(batch) is batch
    assert int(trainer.count_loss_units(batch)) == int((batch["labels"] != -100).sum())
