"""ERNIE-3.5-SE: config, hatf structure, fused projection order, FlashMask packing, positions, checkpoints."""

import math
import os
import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from paddlenlp_ext.transformers.ernie35 import (
    ERNIE_PRETRAINED_INIT_CONFIGURATION,
    Ernie35Config,
    Ernie35ForCausalLM,
    UnsafePickleError,
    count_parameters_formula,
    from_preset_or_pretrained,
    load_pdparams,
    save_paddle_checkpoint,
)
from paddlenlp_ext.transformers.ernie35.positions import resolve_position_ids

V = 97


def tiny_config(**kw):
    base = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_hidden_layers=4, vocab_size=V,
                max_position_embeddings=256, use_bias=True, enable_random_position_ids=False)
    base.update(kw)
    return Ernie35Config.from_pretrained("ernie/tiny-random-ernie", **base)


def tiny_model(seed=0, **kw):
    torch.manual_seed(seed)
    model = Ernie35ForCausalLM(tiny_config(**kw))
    with torch.no_grad():  # non-zero biases so that bias handling is exercised
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.02)
    return model


def pack_sft(seqs, length):
    """Design-doc packed batch: input_ids, position_ids, LTS startend [1, 1, L, 1] (padding columns 0)."""
    ids, pos, sri = [], [], []
    for s in seqs:
        start = len(ids)
        ids += s
        pos += list(range(len(s)))
        sri += [start + len(s)] * len(s)
    pad = length - len(ids)
    ids, pos, sri = ids + [0] * pad, pos + [0] * pad, sri + [0] * pad
    return (torch.tensor([ids]), torch.tensor([pos]), torch.tensor(sri, dtype=torch.int32).view(1, 1, length, 1))


# ---- config ---------------------------------------------------------------------------------------------------

def test_config_defaults_follow_paddlenlp():
    c = Ernie35Config()
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.max_position_embeddings) == (65536, 768, 11008, 2048)
    assert (c.num_hidden_layers, c.num_attention_heads, c.layer_norm_eps) == (2, 2, 1e-6)
    assert c.use_bias is False and c.parallel_attn_hatf is True and c.weight_share_add_bias is True
    assert c.enable_random_position_ids is False and c.use_progressive_seq_len is False
    assert c.ignored_index == -100 and (c.pad_token_id, c.bos_token_id, c.eos_token_id) == (0, 1, 2)
    # PaddleNLP quirk: tie_word_embeddings is overwritten by weight_share
    assert Ernie35Config(tie_word_embeddings=True).tie_word_embeddings is False
    assert Ernie35Config(weight_share=True).tie_word_embeddings is True


def test_presets_and_config_round_trip(tmp_path):
    for name, d in ERNIE_PRETRAINED_INIT_CONFIGURATION.items():
        c = Ernie35Config.from_pretrained(name)
        for k, v in d.items():
            assert getattr(c, k) == v, (name, k)
    c = Ernie35Config.from_pretrained("baidu/ernie-3.5-se-3b")
    c.save_pretrained(tmp_path)
    assert Ernie35Config.from_pretrained(str(tmp_path)) == c
    # a config.json written by PaddleNLP records tying only as tie_word_embeddings (no weight_share attribute)
    (tmp_path / "config.json").write_text('{"model_type": "ernie", "tie_word_embeddings": true, "hidden_size": 64}')
    assert Ernie35Config.from_pretrained(str(tmp_path)).weight_share is True
    with pytest.raises(FileNotFoundError, match="neither a preset"):
        Ernie35Config.from_pretrained("ernie/none")
    with pytest.raises(ValueError, match="divisible"):
        Ernie35Config(hidden_size=30, num_attention_heads=4)


# ---- structure ------------------------------------------------------------------------------------------------

def test_hatf_first_layer_attention_only_last_ffn_only():
    m = Ernie35ForCausalLM(tiny_config())
    first, *middle, last = m.model.layers
    assert first.self_attn is not None and first.mlp is None and first.self_attn_mlp is None
    assert first.post_attention_layernorm is None
    assert last.self_attn is None and last.self_attn_mlp is None and last.mlp is not None
    assert last.input_layernorm is None and last.post_attention_layernorm is not None
    for layer in middle:
        assert layer.self_attn_mlp is not None and layer.self_attn is None and layer.mlp is None
        assert layer.self_attn_mlp.qkv_gate_up_proj.weight.shape == (3 * 32 + 2 * 48, 32)
        assert layer.self_attn_mlp.o_proj.weight.shape == (32, 48 + 32)
    assert isinstance(first.input_layernorm, torch.nn.LayerNorm) and first.input_layernorm.bias is not None
    assert m.lm_head.bias is not None  # use_bias and weight_share_add_bias
    flat = Ernie35ForCausalLM(tiny_config(parallel_attn_hatf=False))
    assert all(layer.self_attn_mlp is not None for layer in flat.model.layers)
    nobias = Ernie35ForCausalLM(tiny_config(use_bias=False))
    assert all(not n.endswith("_proj.bias") for n, _ in nobias.named_parameters()) and nobias.lm_head.bias is None


def test_init_scales_output_projections():
    torch.manual_seed(0)
    cfg = tiny_config(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_hidden_layers=3)
    m = Ernie35ForCausalLM(cfg)
    std = math.sqrt(0.3333 / 256)
    assert cfg.initializer_range == pytest.approx(std)
    factor = 1 / math.sqrt(2 * 3)
    assert m.model.layers[0].self_attn.q_proj.weight.std().item() == pytest.approx(std, rel=0.05)
    assert m.model.layers[0].self_attn.o_proj.weight.std().item() == pytest.approx(std * factor, rel=0.05)
    assert m.model.layers[1].self_attn_mlp.o_proj.weight.std().item() == pytest.approx(std * factor, rel=0.05)
    assert m.model.layers[2].mlp.down_proj.weight.std().item() == pytest.approx(std * factor, rel=0.05)
    assert m.model.layers[2].mlp.up_proj.weight.std().item() == pytest.approx(std, rel=0.05)


def test_3b_parameter_count_on_meta_device():
    with torch.device("meta"):
        m = Ernie35ForCausalLM(Ernie35Config.from_pretrained("baidu/ernie-3.5-se-3b"))
    n = sum(p.numel() for p in m.parameters())
    h, i, v, L = 3072, 8192, 32000, 32
    by_hand = (2 * v * h + v  # embedding, untied LM head + bias
               + 4 * (h * h + h) + 2 * h  # layer 0: q, k, v, o + LN
               + 2 * (h * i + i) + (i * h + h) + 2 * h  # layer 31: gate, up, down + LN
               + (L - 2) * (h * (3 * h + 2 * i) + 3 * h + 2 * i + (i + h) * h + h + 2 * h)  # parallel layers
               + 2 * h)  # final norm
    assert n == by_hand == count_parameters_formula(m.config) == 3_708_367_104


def test_parallel_block_matches_paddle_split_order():
    """Recompute one parallel layer by hand: columns [QKV head-interleaved | G | U], silu(G) * U, o_proj over
    concat([ffn, attn]) (PaddleNLP Ernie35MLPAttention)."""
    m = tiny_model(num_hidden_layers=3).eval()
    layer = m.model.layers[1]
    blk = layer.self_attn_mlp
    x = torch.randn(2, 9, 32)
    cos, sin = _cos_sin(9, 8)
    got = layer(x, cos, sin)
    h, i, nh, d = 32, 48, 4, 8
    xn = layer.input_layernorm(x)
    w, b = blk.qkv_gate_up_proj.weight, blk.qkv_gate_up_proj.bias
    q, k, v = [], [], []
    for head in range(nh):
        base = head * 3 * d
        q.append(F.linear(xn, w[base:base + d], b[base:base + d]))
        k.append(F.linear(xn, w[base + d:base + 2 * d], b[base + d:base + 2 * d]))
        v.append(F.linear(xn, w[base + 2 * d:base + 3 * d], b[base + 2 * d:base + 3 * d]))
    q, k, v = (torch.stack(t, 2) for t in (q, k, v))  # [B, L, H, D]
    rot = lambda t: torch.cat([-t[..., d // 2:], t[..., :d // 2]], -1)  # noqa: E731
    q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
    attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    attn = attn.transpose(1, 2).reshape(2, 9, h)
    g = F.linear(xn, w[3 * h:3 * h + i], b[3 * h:3 * h + i])
    u = F.linear(xn, w[3 * h + i:], b[3 * h + i:])
    ref = x + blk.o_proj(torch.cat([F.silu(g) * u, attn], -1))
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def _cos_sin(seq, d):
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    f = torch.arange(seq).float()[:, None] * inv
    emb = torch.cat([f, f], -1)[None, :, None, :]
    return emb.cos(), emb.sin()


# ---- packing ---------------------------------------------------------------------------------------------------

def _max_diff_same_dtype_rerun(model, ids):
    """Noise floor: the same unpacked example at two different padded lengths (fp32 reference path)."""
    a = model(ids)
    b = model(torch.cat([ids, torch.zeros_like(ids)], 1))[:, : ids.shape[1]]
    return (a - b).abs().max().item()


@pytest.mark.parametrize("random_ids", [False, True])
def test_packed_equals_unpacked_fp32(random_ids):
    """With random ids on, eval mode maps each example to the interval positions, so packing still commutes."""
    m = tiny_model(enable_random_position_ids=random_ids).eval()
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(1, V, (n,), generator=g).tolist() for n in (7, 5, 3)]
    ids, pos, sri = pack_sft(seqs, 18)
    with torch.no_grad():
        packed = m(ids, pos, sri)
        floor = max(_max_diff_same_dtype_rerun(m, torch.tensor([s])) for s in seqs)
        start = 0
        for s in seqs:
            alone = m(torch.tensor([s]))
            diff = (packed[:, start:start + len(s)] - alone).abs().max().item()
            assert diff <= max(4 * floor, 1e-6), (diff, floor)
            start += len(s)


def test_dpo_pack_equals_separate_runs():
    """A DPO pack <prompt | chosen | rejected>: rejected rows must not see chosen keys (LTS of chosen columns =
    rejected start); positions of the rejected response continue from the prompt."""
    m = tiny_model().eval()
    g = torch.Generator().manual_seed(2)
    p, c, r = (torch.randint(1, V, (n,), generator=g).tolist() for n in (4, 3, 5))
    ids = torch.tensor([p + c + r])
    pos = torch.tensor([list(range(4)) + list(range(4, 7)) + list(range(4, 9))])
    end, rej = 12, 7
    sri = torch.tensor([end] * 4 + [rej] * 3 + [end] * 5, dtype=torch.int32).view(1, 1, 12, 1)
    with torch.no_grad():
        packed = m(ids, pos, sri)
        chosen_alone = m(torch.tensor([p + c]))
        rejected_alone = m(torch.tensor([p + r]))
    torch.testing.assert_close(packed[:, :7], chosen_alone, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed[:, 7:], rejected_alone[:, 4:], rtol=1e-5, atol=1e-5)


def test_lora_and_backward_on_packs():
    from paddlenlp_ext.peft import apply_lora

    m = apply_lora(tiny_model(), {"lora_rank": 2})
    wrapped = {n.rsplit(".", 1)[-1] for n, mod in m.named_modules() if hasattr(mod, "lora_A")}
    assert wrapped == {"q_proj", "k_proj", "v_proj", "o_proj", "qkv_gate_up_proj", "gate_proj", "up_proj",
                       "down_proj"}
    ids, pos, sri = pack_sft([[5, 6, 7, 8], [9, 10, 11]], 8)
    m.train()
    m(ids, pos, sri).sum().backward()
    grads = {n for n, p in m.named_parameters() if p.grad is not None}
    assert grads and all("lora_" in n for n in grads)


# ---- positions -------------------------------------------------------------------------------------------------

def test_random_position_ids_match_paddle_draw_and_are_reproducible():
    got = resolve_position_ids(None, 2, 10, max_pos=64, random_ids=True, training=True, seed=7, device="cpu")
    ref = np.sort(np.random.RandomState(7).permutation(64)[:10])
    assert got.tolist() == [ref.tolist()] * 2
    ev = resolve_position_ids(None, 1, 5, max_pos=64, random_ids=True, training=False, seed=7, device="cpu")
    assert ev.tolist() == [[7, 15, 23, 31, 39]]  # times = 8: pos_i = 8 (i + 1) - 1
    m = tiny_model(enable_random_position_ids=True).train()
    ids = torch.randint(1, V, (1, 12))
    m.model.global_step = 3
    a, b = m(ids), m(ids)
    m.model.global_step = 4
    c = m(ids)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert (a - c).abs().max() > 1e-6


def test_random_position_ids_per_packed_example():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 0]])
    out = resolve_position_ids(pos, 1, 7, max_pos=50, random_ids=True, training=True, seed=0, device="cpu")[0]
    assert out[0] < out[1] < out[2] and out[3] < out[4]
    assert out.max() < 50
    with pytest.raises(ValueError, match="max_position_embeddings"):
        resolve_position_ids(torch.arange(60)[None], 1, 60, max_pos=50, random_ids=True, training=True, seed=0,
                             device="cpu")


def test_progressive_seq_len_truncates_in_training_only():
    m = tiny_model(use_progressive_seq_len=True, max_position_embeddings=4096)
    ids = torch.randint(1, V, (1, 600))
    m.model.global_step = 10
    with torch.no_grad():
        assert m.train()(ids).shape[1] == 512
        assert m.eval()(ids).shape[1] == 600
    m.model.global_step = 1500
    with torch.no_grad():
        assert m.train()(ids).shape[1] == 600


# ---- checkpoints -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["pdparams", "safetensors"])
def test_paddle_checkpoint_import_round_trip(tmp_path, fmt):
    m = tiny_model().eval()
    save_paddle_checkpoint(m, tmp_path / "pd", fmt=fmt)
    if fmt == "pdparams":
        raw = load_pdparams(str(tmp_path / "pd" / "model_state.pdparams"))
        assert raw["lm_head.weight"].shape == (32, V)  # Paddle [in, out]
        assert raw["ernie.layers.1.self_attn_mlp.qkv_gate_up_proj.weight"].shape == (32, 3 * 32 + 2 * 48)
        assert raw["ernie.embed_tokens.weight"].shape == (V, 32)
    imported = Ernie35ForCausalLM.from_pretrained(str(tmp_path / "pd"))
    ref = m.state_dict()
    got = imported.state_dict()
    assert set(got) == set(ref) and all(torch.equal(got[k], ref[k]) for k in ref)
    imported.save_pretrained(str(tmp_path / "ours"))
    again = Ernie35ForCausalLM.from_pretrained(str(tmp_path / "ours"))
    assert all(torch.equal(again.state_dict()[k], ref[k]) for k in ref)
    assert again.config == imported.config
    ids = torch.randint(1, V, (1, 6))
    torch.testing.assert_close(again(ids), m(ids), rtol=0, atol=0)


def test_paddle_bf16_and_tied_import(tmp_path):
    m = tiny_model(weight_share=True).to(torch.bfloat16)
    save_paddle_checkpoint(m, tmp_path)
    raw = load_pdparams(str(tmp_path / "model_state.pdparams"))
    assert raw["ernie.norm.weight"].dtype == np.uint16  # Paddle's numpy form of bf16
    back = Ernie35ForCausalLM.from_pretrained(str(tmp_path))
    assert back.lm_head.weight is back.model.embed_tokens.weight
    assert all(torch.equal(back.state_dict()[k], v) for k, v in m.state_dict().items())


class _Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_restricted_unpickler_refuses_code(tmp_path):
    marker = tmp_path / "pwned"
    bad = tmp_path / "model_state.pdparams"
    bad.write_bytes(pickle.dumps({"ernie.norm.weight": np.ones(3, np.float32), "x": _Evil(marker)}, protocol=2))
    with pytest.raises(UnsafePickleError, match="refusing to unpickle global 'posix.system'|'os.system'"):
        load_pdparams(str(bad))
    assert not marker.exists()
    bad.write_bytes(pickle.dumps({"w": np.ones(3, np.float32), "f": eval}, protocol=4))
    with pytest.raises(UnsafePickleError, match="builtins.eval"):
        load_pdparams(str(bad))


def test_pdparams_protocol2_and_big_param_slices(tmp_path):
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    payload = {"a@@.0": w.flatten()[:5], "a@@.1": w.flatten()[5:], "b": np.ones(2, np.float16),
               "UnpackBigParamInfor@@": {"a": {"OriginShape": (3, 4), "slices": ["a@@.0", "a@@.1"]}},
               "StructuredToParameterName@@": {"a": "linear_0.w_0"}}
    f = tmp_path / "x.pdparams"
    f.write_bytes(pickle.dumps(payload, protocol=2))
    out = load_pdparams(str(f))
    assert set(out) == {"a", "b"} and np.array_equal(out["a"], w) and out["b"].dtype == np.float16


def test_preset_random_init_resolves():
    torch.manual_seed(0)
    m = from_preset_or_pretrained("ernie/tiny-random-ernie", num_hidden_layers=3, hidden_size=64,
                                  intermediate_size=64, num_attention_heads=4)
    assert m.config.vocab_size == 32000 and len(m.model.layers) == 3  # PaddleNLP's; the bundled tokenizer fits
    with pytest.raises(FileNotFoundError):
        from_preset_or_pretrained("ernie/not-a-preset")


# ---- launchers and configs -------------------------------------------------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ERNIE_CONFIGS = os.path.join(ROOT, "config", "ernie35se")


def _run_finetune_module():
    from tests._scripts import load_script

    return load_script("llm/run_finetune.py")


@pytest.mark.parametrize("name", ["sft.json", "lora.json"])
def test_ernie_sft_configs_parse_and_resolve_the_preset(name):
    model_args, data_args, training_args, _ = _run_finetune_module().parse_args([os.path.join(ERNIE_CONFIGS, name)])
    assert model_args.model_name_or_path == "ernie/tiny-random-ernie" and data_args.zero_padding
    assert model_args.flash_mask and model_args.lora == (name == "lora.json")
    with torch.device("meta"):  # what the launcher gets for this name: the preset, random init, its own vocab
        m = from_preset_or_pretrained(model_args.model_name_or_path)
    assert m.config.hidden_size == 768 and len(m.model.layers) == 3 and m.config.vocab_size == 32000


def test_ernie_dpo_config_parses():
    from paddlenlp_ext.trl.arguments import parse_dpo_args

    model_args, data_args, training_args, dpo_config = parse_dpo_args([os.path.join(ERNIE_CONFIGS, "dpo.json")])
    assert model_args.model_name_or_path == "ernie/tiny-random-ernie" and dpo_config.lora
    assert model_args.flash_mask and data_args.max_seq_len == 256


def test_lora_launcher_on_tiny_ernie_packs(tmp_path):
    """llm/run_finetune.py with config/ernie35se/lora.json on a tiny random ERNIE directory: FlashMask packs,
    LoRA adapter saved in PEFT format and reloadable onto the base ERNIE."""
    import json
    import shutil

    from paddlenlp_ext.peft import load_lora
    from paddlenlp_ext.transformers.ernie35 import BUNDLED_TOKENIZER_DIR, preset_config

    tok_dir = BUNDLED_TOKENIZER_DIR  # PaddleNLP's ernie-tokenizer layout
    torch.manual_seed(0)
    cfg = preset_config("ernie/tiny-random-ernie", hidden_size=32, intermediate_size=64, num_attention_heads=4,
                        max_position_embeddings=512)
    Ernie35ForCausalLM(cfg).save_pretrained(str(tmp_path / "model"))
    for f in ("sentencepiece.bpe.model", "tokenizer_config.json", "special_tokens_map.json"):
        if os.path.exists(os.path.join(tok_dir, f)):
            shutil.copy(os.path.join(tok_dir, f), tmp_path / "model")
    (tmp_path / "data").mkdir()
    rows = [{"src": f"Question {i}?", "tgt": f"Answer number {i}."} for i in range(12)]
    (tmp_path / "data" / "train.json").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "data" / "dev.json").write_text("\n".join(json.dumps(r) for r in rows[:3]) + "\n")
    out = tmp_path / "out"
    summary = _run_finetune_module().main([
        os.path.join(ERNIE_CONFIGS, "lora.json"), "--model_name_or_path", str(tmp_path / "model"),
        "--tokenizer_name_or_path", str(tmp_path / "model"), "--dataset_name_or_path", str(tmp_path / "data"),
        "--output_dir", str(out), "--max_steps", "2", "--max_length", "128", "--src_length", "64",
        "--chat_after_train", "false"])
    assert summary["global_step"] == 2
    conf = json.loads((out / "adapter_config.json").read_text())
    assert "qkv_gate_up_proj" in conf["target_modules"] and conf["lora_alpha"] == 16
    base = Ernie35ForCausalLM.from_pretrained(str(tmp_path / "model"))
    tuned = load_lora(base, str(out))
    assert any(m.lora_B.weight.abs().sum() > 0 for m in tuned.modules() if hasattr(m, "lora_B"))


# ---- DPO and RM on ERNIE packs (the team's preference pipeline) ---------------------------------------------------

PREF_EXAMPLES = [
    {"src": "p1 p2 p3", "tgt": [], "response": ["w1 w2", "c1 c2 c3 c4"], "sort": [0, 1]},
    {"src": ["u1 u2", "v1 v2 v3"], "tgt": ["a1 a2"], "response": ["c5 c6", "w3 w4 w5"], "sort": [5, 2]},
    {"src": "q1", "tgt": [], "response": ["c7", "w6 w7"], "sort": [1, 0]},
]


def _pref_batch(layout):
    from paddlenlp_ext.datasets.preference import PreferenceCollator, check_preference_data, tokenize_preference_example
    from paddlenlp_ext.datasets.zero_padding import ZeroPaddingMapDataset
    from tests.trl._stub_tokenizer import WordTokenizer

    tok = WordTokenizer()
    recs = [tokenize_preference_example(check_preference_data(dict(e)), tok, max_seq_len=64, max_prompt_len=32,
                                        layout=layout) for e in PREF_EXAMPLES]
    ds = ZeroPaddingMapDataset(recs, max_length=64)
    assert len(ds) == 1
    return recs, PreferenceCollator(64)([ds[0]])


def test_dpo_logps_on_ernie_pack_with_lora_reference():
    """Pair log-probs of a packed ERNIE (LoRA policy, LoRA-disabled reference) equal each pair run alone."""
    from paddlenlp_ext.peft import LoRALinear, apply_lora, disable_lora
    from paddlenlp_ext.trl.dpo_trainer import policy_pair_logps

    m = apply_lora(tiny_model(vocab_size=64), {"lora_rank": 2}).eval()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, LoRALinear):
                mod.lora_B.weight.normal_(0, 0.1)
    recs, batch = _pref_batch("dpo")

    def alone(prompt, resp):
        lp = m(torch.tensor([prompt + resp]))[0].log_softmax(-1)
        return sum(lp[len(prompt) - 1 + i, t] for i, t in enumerate(resp))

    with torch.no_grad():
        policy = policy_pair_logps(m, batch)
        with disable_lora(m):
            ref = policy_pair_logps(m, batch)
        want = []
        for rec in recs:
            ids, (p, _, _, _) = rec["input_ids"], rec["response_indexs"][0]
            prompt = ids[:p] + [ids[p]]  # the labels are shifted: the first response token is predicted at p
            a = [t for t in rec["chosen_labels"] if t != -100]
            b = [t for t in rec["rejected_labels"] if t != -100]
            want += [alone(prompt, a), alone(prompt, b)]
    got = torch.stack([policy.chosen, policy.rejected], 1).flatten()
    torch.testing.assert_close(got, torch.stack(want), rtol=1e-5, atol=1e-4)
    assert (policy.chosen - ref.chosen).abs().max() > 1e-4  # the reference pass really ran without adapters


def test_rm_scores_on_ernie_pack():
    from paddlenlp_ext.trl.reward_model import LlamaForScore

    torch.manual_seed(0)
    rm = LlamaForScore(tiny_config(vocab_size=64)).eval()
    recs, batch = _pref_batch("rm")
    with torch.no_grad():
        s_c, s_r = rm.pair_scores(batch)
        want = []
        for rec in recs:
            ids, (p, r0, s, _) = rec["input_ids"], rec["response_indexs"][0]
            for resp in (ids[p:r0], ids[r0:s]):
                want.append(rm.score(rm(torch.tensor([ids[:p] + resp]))[0, -1]).squeeze())
    torch.testing.assert_close(torch.stack([s_c, s_r], 1).flatten(), torch.stack(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fused", [True, False])
def test_progressive_seq_len_cuts_labels_and_count(fused):
    """use_progressive_seq_len (3B preset): before step 500 the forward keeps 512 tokens; the SFT loss and the
    trainer's denominator count only the labels of those tokens, in both loss paths, and the loss equals the
    loss of the batch cut by hand."""
    from paddlenlp_ext.trainer import Trainer
    from paddlenlp_ext.trainer.arguments import TrainingArguments
    from paddlenlp_ext.trainer.loss import sft_loss

    model = tiny_model(max_position_embeddings=1024, use_progressive_seq_len=True).train()
    model.model.global_step = 0
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(1, V, (n,), generator=g).tolist() for n in (300, 250, 150)]
    ids, pos, sri = pack_sft(seqs, 700)
    labels = torch.roll(ids, -1, 1)
    labels[:, ::3] = -100
    batch = dict(input_ids=ids, position_ids=pos, attn_mask_startend_row_indices=sri, labels=labels)
    cut = {k: (v[:, :512] if v.dim() == 2 else v[:, :, :512].clamp(max=512)) for k, v in batch.items()}
    loss, count, _ = sft_loss(model, batch, fused=fused)
    ref_loss, ref_count, _ = sft_loss(model, cut, fused=fused)
    assert int(count) == int(ref_count) == int((labels[:, :512] != -100).sum()) < int((labels != -100).sum())
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    trainer = Trainer(model, TrainingArguments(output_dir="unused", device="cpu", disable_tqdm=True))
    assert int(trainer.count_loss_units(batch)) == int(count)
