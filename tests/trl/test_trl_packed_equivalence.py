"""A pair inside a pack scores exactly as the pair run alone as two separate sequences (fp32, tiny random Llama)."""

import pytest
import torch
import transformers

from paddlenlp_ext.datasets.preference import (
    PreferenceCollator,
    check_preference_data,
    tokenize_preference_example,
)
from paddlenlp_ext.datasets.zero_padding import ZeroPaddingMapDataset
from paddlenlp_ext.transformers.llama import LlamaConfig, LlamaForCausalLM
from paddlenlp_ext.trl.dpo_trainer import policy_pair_logps
from paddlenlp_ext.trl.reward_model import LlamaForScore
from tests.ops.tolerance import assert_close_to_ref
from tests.trl._stub_tokenizer import WordTokenizer

EXAMPLES = [
    {"src": "p1 p2 p3", "tgt": [], "response": ["w1 w2", "c1 c2 c3 c4"], "sort": [0, 1]},
    {"src": ["u1 u2", "v1 v2 v3"], "tgt": ["a1 a2"], "response": ["c5 c6", "w3 w4 w5"], "sort": [5, 2]},
    {"src": "q1", "tgt": [], "response": ["c7", "w6 w7"], "sort": [1, 0]},
]
L = 64


def _config():
    return LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rope_theta=100.0)


def _records(tok, examples, layout):
    return [tokenize_preference_example(check_preference_data(dict(e)), tok, max_seq_len=L, max_prompt_len=L // 2,
                                        layout=layout) for e in examples]


def _batch(records):
    ds = ZeroPaddingMapDataset(records, max_length=L)
    assert len(ds) == 1, "all examples should share one pack"
    return PreferenceCollator(L)([ds[0]])


def _pieces(rec, shift):
    """Recover (prompt, chosen, rejected) token lists of a single-example record."""
    ids = rec["input_ids"]
    P, R0, S, _ = rec["response_indexs"][0]
    if shift:
        prompt = ids[:P] + [ids[P]]
        a = [t for t in rec["chosen_labels"] if t != -100]
        b = [t for t in rec["rejected_labels"] if t != -100]
    else:
        prompt, a, b = ids[:P], ids[P:R0], ids[R0:S]
    return prompt, a, b


def _alone_logp(model, prompt, resp):
    """log p(resp | prompt) of one plain causal sequence (positions 0..n-1, no mask indices)."""
    x = torch.tensor([prompt + resp])
    out = model(x)
    logits = (out.logits if hasattr(out, "logits") else out)[0]
    lp = logits.log_softmax(-1)
    return sum(lp[len(prompt) - 1 + i, t] for i, t in enumerate(resp))


@pytest.fixture(scope="module")
def models():
    """Our fp32 Llama, and the same weights in transformers' LlamaForCausalLM (eager) in fp64 = the reference."""
    torch.manual_seed(0)
    cfg = _config()
    m32 = LlamaForCausalLM(cfg).eval()
    hc = transformers.LlamaConfig(**{k: v for k, v in cfg.to_dict().items() if k not in ("architectures", "extra")},
                                  attn_implementation="eager")
    hf64 = transformers.LlamaForCausalLM(hc).eval()
    hf64.load_state_dict(m32.state_dict())
    return m32, hf64.double()


def test_dpo_logps_packed_equal_alone(models):
    m32, hf64 = models
    tok = WordTokenizer()
    recs = _records(tok, EXAMPLES, "dpo")
    with torch.no_grad():
        packed = policy_pair_logps(m32, _batch(recs), chunk_size=7)
        alone, ref = [], []
        for k, rec in enumerate(recs):
            prompt, a, b = _pieces(rec, shift=True)
            for resp in (a, b):
                alone.append(_alone_logp(m32, prompt, resp))
                ref.append(_alone_logp(hf64, prompt, resp))
            assert packed.chosen_tokens[k] == len(a) and packed.rejected_tokens[k] == len(b)
    out = torch.stack([packed.chosen, packed.rejected], 1).flatten()  # [c0, r0, c1, r1, ...]
    # budget: 2 x |fp32 alone - fp64| + fp32 floor (tests/ops/tolerance.py rule)
    assert_close_to_ref(out, torch.stack(ref), torch.stack(alone).float(), "pair logps", dtype=torch.float32)


def test_changing_chosen_does_not_change_rejected(models):
    m32, _ = models
    tok = WordTokenizer()
    changed = [dict(e) for e in EXAMPLES]
    changed[0]["response"] = ["w1 w2", "c9 c9 c8"]  # chosen of pair 0: different text and length
    changed[1]["response"] = ["c5 c6 c6 c6 c5", "w3 w4 w5"]
    with torch.no_grad():
        base = policy_pair_logps(m32, _batch(_records(tok, EXAMPLES, "dpo")))
        other = policy_pair_logps(m32, _batch(_records(tok, changed, "dpo")))
    assert not torch.allclose(base.chosen[:2], other.chosen[:2])
    torch.testing.assert_close(other.rejected, base.rejected, rtol=0, atol=1e-5)


def test_rm_scores_packed_equal_alone(models):
    m32, hf64 = models
    torch.manual_seed(1)
    rm = LlamaForScore(_config()).eval()
    rm.model.load_state_dict(m32.model.state_dict())
    w64 = rm.score.weight.detach().double()
    tok = WordTokenizer()
    recs = _records(tok, EXAMPLES, "rm")
    with torch.no_grad():
        s_c, s_r = rm.pair_scores(_batch(recs))
        alone, ref = [], []
        for rec in recs:
            prompt, a, b = _pieces(rec, shift=False)
            for resp in (a, b):
                x = torch.tensor([prompt + resp])
                alone.append(rm.score(rm(x)[0, -1]).squeeze().float())
                ref.append((hf64.model(x).last_hidden_state[0, -1] @ w64[0]))
    out = torch.stack([s_c, s_r], 1).flatten()
    assert_close_to_ref(out, torch.stack(ref), torch.stack(alone), "rm scores", dtype=torch.float32)
