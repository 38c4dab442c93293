"""Real SmolLM2-135M-Instruct + its tokenizer and ChatML template: packed pairs score as the pairs run alone."""

import pytest
import torch

from paddlenlp_ext.datasets.preference import PreferenceCollator, check_preference_data, tokenize_preference_example
from paddlenlp_ext.datasets.zero_padding import ZeroPaddingMapDataset
from paddlenlp_ext.trl.dpo_trainer import policy_pair_logps
from tests.ops.tolerance import assert_close_to_ref

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
ROWS = [
    {"src": ["what is the capital of France?"], "tgt": [], "response": ["Paris.", "I like turtles."], "sort": [1, 0]},
    {"src": ["hi", "how are you?"], "tgt": ["Hello!"], "response": ["Banana bread.", "I am fine, thanks."],
     "sort": [0, 1]},
]


@pytest.mark.slow
@pytest.mark.xdist_group("smollm2")
def test_smollm2_chat_template_pack_equals_alone(smollm2):
    _, model, tok = smollm2
    recs = [tokenize_preference_example(check_preference_data(dict(r)), tok, max_seq_len=256, max_prompt_len=128)
            for r in ROWS]
    text = tok.decode(recs[1]["input_ids"])
    assert "<|im_start|>assistant\nHello!<|im_end|>" in text  # multi-turn history kept, in template form
    assert tok.decode([t for t in recs[1]["chosen_labels"] if t != -100]) == "I am fine, thanks.<|im_end|>"
    ds = ZeroPaddingMapDataset(recs, max_length=512)
    batch = PreferenceCollator(512, tok.pad_token_id)([ds[0]])
    import transformers

    from flashmask.dense import to_dense
    from paddlenlp_ext.transformers import resolve_model_name_or_path
    from paddlenlp_ext.trl.logprobs import pair_logps_from_logits

    path = resolve_model_name_or_path(SMOLLM2)
    hf32 = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                             attn_implementation="eager").eval()
    hf64 = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()

    def alone(m, prompt, resp):
        lp = m(torch.tensor([prompt + resp])).logits[0].double().log_softmax(-1)
        return sum(lp[len(prompt) - 1 + i, t] for i, t in enumerate(resp))

    with torch.no_grad():
        packed = policy_pair_logps(model, batch)
        # the same packed computation in plain PyTorch fp32: transformers' eager Llama, dense share-question mask
        allowed = to_dense(batch["attn_mask_startend_row_indices"], causal=True)  # [B, 1, L, L]
        mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
        logits = hf32(input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=mask).logits
        same = pair_logps_from_logits(logits, batch)
        ref = []
        for rec in recs:
            P = rec["response_indexs"][0][0]
            prompt = rec["input_ids"][: P + 1]  # the layout moves the last prompt token into each response
            for labels in (rec["chosen_labels"], rec["rejected_labels"]):
                ref.append(alone(hf64, prompt, [t for t in labels if t != -100]))  # each answer alone, fp64
    out = torch.stack([packed.chosen, packed.rejected], 1).flatten()
    torch_same = torch.stack([same.chosen, same.rejected], 1).flatten()
    # budget: 2 x |plain-PyTorch fp32 of the pack - fp64 alone| + a floor (tests/ops/tolerance.py rule). The floor
    # scales with the sums: rounding of an fp32 accumulation of n terms of size |ref| is ~ eps32 * |ref| * sqrt(n)
    # (the fixed 2e-5 of tolerance.py is for O(1) attention outputs; here |ref| ~ 15-50 and the chunked
    # log-softmax sums in another order than transformers').
    ref_t = torch.stack(ref)
    n = max(sum(t != -100 for t in r[k]) for r in recs for k in ("chosen_labels", "rejected_labels"))
    floor = 8 * torch.finfo(torch.float32).eps * float(ref_t.abs().max()) * n ** 0.5
    assert_close_to_ref(out, ref_t, torch_same, "smollm2 pair logps", dtype=torch.float32, atol_floor=floor)
    assert packed.chosen[0] > packed.rejected[0]  # the model prefers the sensible answer


@pytest.mark.slow
def test_smollm2_dpo_config_improves_dev_rewards(tmp_path):
    """config/smollm2/dpo.json end to end, shortened to 12 steps at learning rate 3e-5 (the config: 24 at 1e-5)
    and scored on the first 40 of the 83 dev pairs: about 2.6 min on one thread, half the full run's time. Dev reward
    accuracy and margin rise from 0 (policy = reference) to 0.8 and 0.44 here; the full config on the whole dev set
    reaches 0.855 and 0.387 (docs/alignment.md)."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "llm"))
    import run_dpo

    dev = tmp_path / "dev.jsonl"
    with open("data/preference/dev.jsonl") as f:
        dev.write_text("".join(f.readlines()[:40]))
    summary = run_dpo.main(["config/smollm2/dpo.json", "--output_dir", str(tmp_path / "dpo"), "--report_to", "none",
                            "--dev_dataset_path", str(dev), "--max_steps", "12", "--learning_rate", "3e-5"])
    before, after = summary["dev_before"], summary["dev_after"]
    assert after["eval_rewards/accuracies"] >= 0.7 > before["eval_rewards/accuracies"]
    assert after["eval_rewards/margins"] > before["eval_rewards/margins"] + 0.1
    assert after["eval_loss"] < before["eval_loss"]
