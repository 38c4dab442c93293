"""Triton FlashMask kernel vs the PyTorch reference, on CPU under TRITON_INTERPRET=1 (fp32 and fp16).

Checked per case: output, LSE (incl. -inf on empty rows) and dq/dk/dv against a float64 reference; the
tolerance is derived from the same computation in the kernel's dtype in plain PyTorch (tests/ops/tolerance.py).
Sizes are small because the interpreter is slow (the whole file runs in about a minute or two on 2 cores).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")

from flashmask import flashmask_attention  # noqa: E402
from flashmask.dense import to_dense  # noqa: E402
from flashmask.reference import flashmask_attention_reference  # noqa: E402
from flashmask.autograd import flashmask_attention_triton  # noqa: E402
from tolerance import assert_close_to_ref  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


# ------------------------------------------------------------------------------------------ helpers

def random_sri(b: int, hm: int, s_k: int, causal: bool, c: int, s_q: int | None = None, gen=None) -> torch.Tensor:
    """Random valid ``startend_row_indices`` int32 ``[b, hm, s_k, c]`` for a mode; about a quarter of the
    columns keep the default (no extra masking) so tiles of every class occur."""
    s_q = s_k if s_q is None else s_q
    r = torch.randint(0, s_q + 1, (b, hm, s_k, 4), generator=gen)
    r = torch.sort(r, dim=-1).values  # LTS <= LTE ... keeps intervals well formed and varied
    keep = torch.rand(b, hm, s_k, generator=gen) < 0.25
    if causal:
        j = torch.arange(s_k)
        lts = torch.maximum(r[..., 2], j + 1).clamp(max=s_q)  # lower interval below the diagonal
        lte = torch.maximum(r[..., 3], lts)
        lts = torch.where(keep, s_q, lts)
        vec = [lts] if c == 1 else [lts, torch.where(keep, s_q, lte)]
    elif c == 2:
        lts, ute = r[..., 2], r[..., 1]  # visible rows: [UTE, LTS)
        vec = [torch.where(keep, s_q, lts), torch.where(keep, 0, ute)]
    else:
        # masked [LTS, LTE) below and [UTS, UTE) above: UTS <= UTE <= LTS <= LTE
        uts, ute, lts, lte = r.unbind(-1)
        vec = [torch.where(keep, s_q, lts), lte, uts, torch.where(keep, 0, ute)]
    return torch.stack(vec, -1).to(torch.int32).to(DEV)


def make_qkv(b, s_q, s_k, h_q, h_k, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s_q, h_q, d, generator=g).to(DEV, dtype)
    k = torch.randn(b, s_k, h_k, d, generator=g).to(DEV, dtype)
    v = torch.randn(b, s_k, h_k, d, generator=g).to(DEV, dtype)
    do = torch.randn(b, s_q, h_q, d, generator=g).to(DEV, dtype)
    return q, k, v, do


def _run(fn, q, k, v, do, lse_weight=None):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out, lse = fn(q, k, v)
    loss = (out.float() * do.float()).sum()
    if lse_weight is not None:
        loss = loss + (torch.nan_to_num(lse, neginf=0.0) * lse_weight).sum()
    dq, dk, dv = torch.autograd.grad(loss, (q, k, v))
    return out, lse, dq, dk, dv


def check_case(q, k, v, do, sri, causal, deterministic=False, lse_weight=None):
    """Run kernel, fp64 reference and same-dtype torch; assert all five outputs within tolerance."""
    scale = q.shape[-1] ** -0.5
    kern = _run(lambda a, b_, c: flashmask_attention_triton(a, b_, c, sri, causal, scale, deterministic),
                q, k, v, do, lse_weight)
    ref = _run(lambda a, b_, c: flashmask_attention_reference(a, b_, c, sri, causal, scale, torch.float64),
               *(t.double() for t in (q, k, v, do)), lse_weight)
    same = _run(lambda a, b_, c: flashmask_attention_reference(a, b_, c, sri, causal, scale, None),
                q, k, v, do, lse_weight)
    for name, a, r, t in zip(("out", "lse", "dq", "dk", "dv"), kern, ref, same):
        assert a.dtype == (torch.float32 if name == "lse" else q.dtype), f"{name} dtype {a.dtype}"
        assert_close_to_ref(a, r, t, name, dtype=q.dtype)
    return kern


# ------------------------------------------------------------------------------------------ golden N=8

# flashmask.md §1.5(b): (name, causal, vectors as [LTS, (LTE, UTS,) UTE] lists) for N = 8
GOLDEN = [
    ("E1 full", False, [[8] * 8, [0] * 8]),
    ("E2 causal", True, [[8] * 8]),
    ("E3 sliding w=2", True, [[3, 4, 5, 6, 7, 8, 8, 8]]),
    ("E4 causal document", True, [[3, 3, 3, 6, 6, 6, 8, 8]]),
    ("E5 document", False, [[3, 3, 3, 6, 6, 6, 8, 8], [0, 0, 0, 3, 3, 3, 6, 6]]),
    ("E6 share question", True, [[8, 8, 8, 6, 6, 6, 8, 8]]),
    ("E7 global+sliding", False, [[8, 3, 4, 5, 6, 7, 8, 8], [8] * 8, [0, 0, 0, 1, 1, 1, 1, 1],
                                  [0, 0, 0, 2, 3, 4, 5, 6]]),
    ("E8 prefix-LM causal", False, [[8] * 8, [0, 0, 0, 3, 4, 5, 6, 7]]),
    ("E9 prefix-LM document", False, [[4, 4, 4, 4, 8, 8, 8, 8], [0, 0, 2, 3, 4, 5, 6, 7]]),
    ("E10 causal blockwise", True, [[3, 3, 3, 6, 6, 6, 8, 8], [6, 6, 6, 6, 6, 6, 8, 8]]),
    ("E11 QK-sparse", True, [[8, 8, 2, 3, 4, 8, 8, 8], [8, 8, 5, 5, 5, 8, 8, 8]]),
    ("E12 random eviction", True, [[5, 8, 4, 8, 7, 8, 8, 8]]),
    ("E13 key padding", False, [[8, 8, 8, 8, 8, 8, 0, 0], [0] * 8]),
    ("E14 query padding tail", True, [[6] * 8]),
    ("E15 block-causal", False, [[8] * 8, [0, 0, 0, 3, 3, 3, 6, 6]]),
    ("E16 sink + sliding", True, [[8, 4, 5, 6, 7, 8, 8, 8]]),
]
# allowed rows (1 = attend) of the cases whose pictures carry extra information (E6, E7, E11, E14)
GOLDEN_ROWS = {
    "E6 share question": ["10000000", "11000000", "11100000", "11110000", "11111000", "11111100", "11100010",
                          "11100011"],
    "E7 global+sliding": ["11111111", "11100000", "11110000", "10111000", "10011100", "10001110", "10000111",
                          "10000011"],
    "E11 QK-sparse": ["10000000", "11000000", "11000000", "11000000", "11000000", "11111100", "11111110",
                      "11111111"],
    "E14 query padding tail": ["10000000", "11000000", "11100000", "11110000", "11111000", "11111100",
                               "00000000", "00000000"],
}


@pytest.mark.parametrize("name,causal,vecs", GOLDEN, ids=[g[0] for g in GOLDEN])
def test_golden_n8(name, causal, vecs):
    sri = torch.tensor(vecs, dtype=torch.int32).T[None, None].contiguous().to(DEV)  # [1, 1, 8, C]
    if name in GOLDEN_ROWS:
        want = torch.tensor([[int(c) for c in row] for row in GOLDEN_ROWS[name]], dtype=torch.bool)
        assert torch.equal(to_dense(sri.cpu(), causal)[0, 0], want)
    q, k, v, do = make_qkv(1, 8, 8, 2, 1, 16, torch.float32, seed=len(name))
    out, lse, dq, dk, dv = check_case(q, k, v, do, sri, causal)
    empty = ~to_dense(sri.cpu(), causal)[0, 0].any(-1)  # rows that attend to nothing
    assert torch.equal(torch.isneginf(lse[0, 0].cpu()), empty)
    assert torch.all(out[0, empty.to(DEV)] == 0) and torch.all(dq[0, empty.to(DEV)] == 0)


# ------------------------------------------------------------------------------------------ random masks

MODES = [(True, None), (False, None), (True, 1), (True, 2), (False, 2), (False, 4)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("s", [1, 17, 64, 100])
@pytest.mark.parametrize("causal,c", MODES, ids=[f"{'causal' if m[0] else 'full'}-C{m[1]}" for m in MODES])
def test_random_masks(causal, c, s, dtype):
    """Every mode x length x dtype; batch 2 with different masks, GQA 4:2, per-head masks when C is even."""
    d = {1: 16, 17: 32, 64: 16, 100: 64}[s]
    h_q, h_k = (4, 2) if s != 100 else (2, 1)
    gen = torch.Generator().manual_seed(1000 * s + (c or 0) + causal)
    hm = h_k if (c or 0) % 2 == 0 else 1
    sri = None if c is None else random_sri(2, hm, s, causal, c, gen=gen)
    q, k, v, do = make_qkv(2, s, s, h_q, h_k, d, dtype, seed=s)
    check_case(q, k, v, do, sri, causal)


@pytest.mark.parametrize("causal,c", [(True, 1), (False, 4)])
def test_cross_lengths_and_odd_head_dim(causal, c):
    """S_q != S_k (non-causal) and a head dim that is not a power of two (D=24 padded to 32)."""
    s_q, s_k = (40, 40) if causal else (24, 40)
    gen = torch.Generator().manual_seed(7)
    sri = random_sri(2, 1, s_k, causal, c, s_q=s_q, gen=gen)
    q, k, v, do = make_qkv(2, s_q, s_k, 3, 1, 24, torch.float32, seed=3)
    check_case(q, k, v, do, sri, causal)


def test_fully_masked_rows_and_lse_gradient():
    """Query padding tail + key padding: empty rows give 0 output, -inf LSE, zero grads; LSE gradient flows."""
    s = 33
    lts = torch.full((2, 1, s, 1), s, dtype=torch.int32)
    lts[0, :, :, 0] = 20  # rows >= 20 of sample 0 see nothing
    lts[1, :, 25:, 0] = 0  # key columns >= 25 of sample 1 are padding
    sri = lts.to(DEV)
    q, k, v, do = make_qkv(2, s, s, 2, 2, 16, torch.float32, seed=5)
    w = torch.randn(2, 2, s, generator=torch.Generator().manual_seed(1)).to(DEV)
    out, lse, dq, dk, dv = check_case(q, k, v, do, sri, True, lse_weight=w)
    assert torch.all(out[0, 20:] == 0) and torch.all(torch.isneginf(lse[0, :, 20:]))
    assert torch.all(dq[0, 20:] == 0) and torch.all(dk[1, 25:] == 0) and torch.all(dv[1, 25:] == 0)


def test_mask_builders():
    """Masks from flashmask.masks (when present): share question, document, global+sliding, prefix LM."""
    masks = pytest.importorskip("flashmask.masks")
    cases = [
        masks.share_question_mask([[(5, [7, 4]), (6, [3, 5])], [(10, [9, 8])]]),
        masks.document_mask([[11, 9, 10], [30]]),
        masks.global_sliding_window_mask(30, 2, (3, 4), batch_size=2),
        masks.prefix_lm_document_mask([[12, 18], [30]], [[4, 9], [7]]),
        masks.causal_blockwise_mask([[10, 12, 8], [15, 15]]),
    ]
    for i, m in enumerate(cases):
        sri = m.startend_row_indices.to(DEV)
        s = sri.shape[2]
        q, k, v, do = make_qkv(2, s, s, 2, 1, 32, torch.float16, seed=i)
        check_case(q, k, v, do, sri, m.causal)


def test_deterministic_bitwise_and_api():
    """deterministic=True: two runs give bitwise-equal grads; the public API dispatches impl='triton'."""
    gen = torch.Generator().manual_seed(11)
    sri = random_sri(2, 2, 48, False, 4, gen=gen)
    q, k, v, do = make_qkv(2, 48, 48, 4, 2, 32, torch.float16, seed=9)
    a = check_case(q, k, v, do, sri, False, deterministic=True)
    b = _run(lambda x, y, z: flashmask_attention_triton(x, y, z, sri, False, 32 ** -0.5, True), q, k, v, do)
    for t1, t2 in zip(a, b):
        assert torch.equal(t1, t2)
    out = flashmask_attention(q, k, v, sri, causal=False, impl="triton")
    assert torch.equal(out, a[0])


def test_bf16_rejected_on_cpu():
    """The interpreter's bf16 math is wrong, so bf16 on CPU raises a ValueError naming the fix."""
    if DEV == "cuda":
        pytest.skip("CUDA present")
    q, k, v, _ = make_qkv(1, 4, 4, 1, 1, 16, torch.bfloat16)
    with pytest.raises(ValueError, match="float32/float16"):
        flashmask_attention_triton(q, k, v, None, True, 0.25, False)


def test_interpreter_guard_message():
    """Without CUDA and without TRITON_INTERPRET the Triton path raises a RuntimeError that says what to do."""
    if DEV == "cuda":
        pytest.skip("CUDA present")
    q, k, v, _ = make_qkv(1, 4, 4, 1, 1, 16, torch.float32)
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
            flashmask_attention_triton(q, k, v, None, True, 0.25, False)
    finally:
        os.environ["TRITON_INTERPRET"] = old if old is not None else "1"


def test_mask_preprocessing_cached_per_index_tensor():
    """Layers sharing one index tensor preprocess it once; an in-place edit (version bump) rebuilds it."""
    from flashmask.mask_cache import mask_vectors as _mask_vectors

    sri = torch.tensor([[[[3], [3], [3], [8], [8], [8], [8], [8]]]], dtype=torch.int32)
    first = _mask_vectors(sri, True, 8, 8, sri.device)
    assert _mask_vectors(sri, True, 8, 8, sri.device) is first
    sri[0, 0, 0, 0] = 8
    rebuilt = _mask_vectors(sri, True, 8, 8, sri.device)
    assert rebuilt is not first and int(rebuilt.lts[0, 0]) == 8


def test_no_mask_preprocessing_cached_per_mode_and_length():
    """Without an index tensor the visit lists depend only on (causal, S_q, S_k, device): reused across calls,
    rebuilt for another mode or length, and the cached lists still give the reference result."""
    from flashmask.mask_cache import mask_vectors as _mask_vectors

    dev = torch.device(DEV)
    causal = _mask_vectors(None, True, 40, 40, dev)
    assert _mask_vectors(None, True, 40, 40, dev) is causal
    assert _mask_vectors(None, False, 40, 40, dev) is not causal
    assert _mask_vectors(None, True, 48, 48, dev) is not causal
    q, k, v, do = make_qkv(1, 40, 40, 2, 1, 16, torch.float32, seed=4)
    for _ in range(2):  # the second call runs on the cached lists
        check_case(q, k, v, do, None, True)


def test_range_loops_match_indirect_lists(monkeypatch):
    """Rows whose unmasked blocks form one run take the affine ``range`` loop; others keep the list. Both
    forms visit the same blocks in the same order, so results are bitwise equal with the runs hidden."""
    from flashmask.triton_prep import MaskVectors

    masks = pytest.importorskip("flashmask.masks")
    m = masks.global_sliding_window_mask(128, 16, (16, 16), batch_size=1)  # global rows + band: two runs
    sri = m.startend_row_indices.to(DEV)
    mv = MaskVectors(sri, m.causal, 128, 128, sri.device)
    for by_key in (False, True):  # forward/dQ and dK/dV orientations (the CPU tiles are 16 x 16)
        full_lo = mv.block_lists(16, 16, by_key)[3]
        assert bool((full_lo == -1).any()) and bool((full_lo >= 0).any())  # both loop forms occur
    q, k, v, do = make_qkv(1, 128, 128, 2, 1, 16, torch.float32, seed=3)
    fn = lambda x, y, z: flashmask_attention_triton(x, y, z, sri, m.causal, 0.25, True)  # noqa: E731
    ranged = _run(fn, q, k, v, do)
    real_lists = MaskVectors.block_lists

    def lists_without_runs(self, *args, **kwargs):  # full_lo = -1: every unmasked block through the list
        idx, n_part, n_full, full_lo, n_vec = real_lists(self, *args, **kwargs)
        return idx, n_part, n_full, torch.full_like(full_lo, -1), n_vec

    monkeypatch.setattr(MaskVectors, "block_lists", lists_without_runs)
    listed = _run(fn, q, k, v, do)
    for a, b in zip(ranged, listed):
        assert torch.equal(a, b)


@pytest.mark.parametrize("causal,c", [(True, 2), (False, 4)])
def test_dp_first_orders_match(monkeypatch, causal, c):
    """``launch_config.dp_first`` only moves dP = dO V^T before or after the softmax math in both backward
    kernels: the two orders agree bitwise, and the default order passes the reference check (GQA 4:2, per-head
    masks, partial tail tiles)."""
    from flashmask import triton_launch

    gen = torch.Generator().manual_seed(11 + c)
    sri = random_sri(2, 2, 47, causal, c, gen=gen)
    q, k, v, do = make_qkv(2, 47, 47, 4, 2, 32, torch.float32, seed=13)
    fn = lambda x, y, z: flashmask_attention_triton(x, y, z, sri, causal, 0.25, True)  # noqa: E731
    runs = []
    for order in (True, False):
        monkeypatch.setattr(triton_launch, "dp_first", lambda d_pad, order=order: order)
        runs.append(_run(fn, q, k, v, do))
    for a, b in zip(*runs):
        assert torch.equal(a, b)
    monkeypatch.undo()
    check_case(q, k, v, do, sri, causal)


@pytest.mark.parametrize("causal,c", MODES, ids=[f"{'causal' if m[0] else 'full'}-C{m[1]}" for m in MODES])
def test_tma_descriptor_path(monkeypatch, causal, c):
    """The forward's tensor-descriptor (TMA) loads, taken when the launch is EVEN: every mode against the
    reference, GQA 4:2, fp16, and bitwise equal to the pointer path (same math, only the loads differ)."""
    from flashmask import triton_launch

    gen = torch.Generator().manual_seed(77 + (c or 0) + causal)
    sri = None if c is None else random_sri(2, 2 if (c or 0) % 2 == 0 else 1, 64, causal, c, gen=gen)
    q, k, v, do = make_qkv(2, 64, 64, 4, 2, 16, torch.float16, seed=21)
    descriptors = []
    real_tma_2d = triton_launch._tma_2d
    monkeypatch.setattr(triton_launch, "_tma_2d", lambda *a: descriptors.append(1) or real_tma_2d(*a))
    tma = check_case(q, k, v, do, sri, causal)
    assert descriptors  # the TMA path ran
    monkeypatch.setattr(triton_launch, "_tma_enabled", lambda t: False)
    ptr = _run(lambda a, b_, c_: flashmask_attention_triton(a, b_, c_, sri, causal, 0.25), q, k, v, do)
    for a, b in zip(tma, ptr):
        assert torch.equal(a, b)


def _tiles_from_dense(dq, tile: int, bases):
    """The tiled accumulator layout of ``triton_bwd.DQ_TILE_BASES`` built from a dense ``[B, S, H, D]`` tensor in
    plain PyTorch: offset bit i of a tile holds coordinate bases[i]."""
    b, s, h, d = dq.shape
    offs = torch.arange(tile * tile)
    rows = sum(((offs >> i) & 1) * r for i, (r, _) in enumerate(bases))
    cols = sum(((offs >> i) & 1) * c for i, (_, c) in enumerate(bases))
    tiles = dq.reshape(b, s // tile, tile, h, d // tile, tile).permute(0, 3, 1, 4, 2, 5)  # b h m part r c
    return tiles[..., rows, cols].contiguous().reshape(-1)


@pytest.mark.parametrize("d", [64, 128])
def test_dq_from_tiles_reads_the_tiled_accumulator_and_rounds_like_torch_mul(d):
    """The Gluon backward's tiled dQ accumulator converts to ``[B, S, H, D]``: every element lands where the tile
    layout (``DQ_TILE_BASES``, a bijection of the 4096 offsets) puts it, rounded once like ``torch.mul``."""
    from flashmask.triton_bwd import DQ_TILE, DQ_TILE_BASES
    from flashmask.triton_launch import dq_from_tiles

    assert sorted(r * DQ_TILE + c for r, c in (
        (sum(((o >> i) & 1) * br for i, (br, _) in enumerate(DQ_TILE_BASES)),
         sum(((o >> i) & 1) * bc for i, (_, bc) in enumerate(DQ_TILE_BASES))) for o in range(DQ_TILE ** 2))) \
        == list(range(DQ_TILE ** 2))
    dense = torch.randn(2, 128, 3, d, generator=torch.Generator().manual_seed(1)) * 40
    acc = _tiles_from_dense(dense, DQ_TILE, DQ_TILE_BASES).to(DEV)
    expected = torch.empty(dense.shape, dtype=torch.float16, device=DEV)
    torch.mul(dense.to(DEV), 0.125 ** 0.5, out=expected)
    assert torch.equal(dq_from_tiles(acc, 0.125 ** 0.5, torch.float16, dense.shape), expected)
    with pytest.raises(ValueError, match="multiples of 64"):
        dq_from_tiles(acc[:100], 1.0, torch.float16, (1, 100, 1, 1))


def test_torch_reference_preprocessing_gives_the_same_attention(monkeypatch):
    """The pure-PyTorch min/max and visit lists (``MaskVectors.*_reference``) in place of the Triton
    preprocessing kernels give bitwise the same outputs and gradients."""
    from flashmask.triton_prep import MaskVectors

    q, k, v, do = make_qkv(1, 50, 50, 2, 1, 16, torch.float32, seed=8)
    runs = []
    for use_reference in (True, False):
        if use_reference:
            monkeypatch.setattr(MaskVectors, "block_minmax", MaskVectors.block_minmax_reference)
            monkeypatch.setattr(MaskVectors, "block_lists", MaskVectors.block_lists_reference)
        else:
            monkeypatch.undo()
        sri = random_sri(1, 1, 50, False, 4, gen=torch.Generator().manual_seed(2)).to(DEV)  # fresh: no cache
        runs.append(_run(lambda a, b_, c_: flashmask_attention_triton(a, b_, c_, sri, False, 0.25), q, k, v, do))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_unknown_environment_switch_is_an_error(monkeypatch):
    """A typo in a kernel switch must not silently pick a path: ValueError naming the variable."""
    q, k, v, do = make_qkv(1, 16, 16, 2, 1, 16, torch.float32)
    for var in ("FLASHMASK_FWD", "FLASHMASK_BWD"):
        monkeypatch.setenv(var, "off")
        with pytest.raises(ValueError, match=var):
            _run(lambda a, b_, c_: flashmask_attention_triton(a, b_, c_, None, True, 0.25), q, k, v, do)
        monkeypatch.delenv(var)


@pytest.mark.parametrize("causal,c", [(True, 2), (False, 4), (True, None)])
def test_compiles_as_one_graph(causal, c):
    """``flashmask_attention`` is one opaque custom op to ``torch.compile``: ``fullgraph=True`` traces a block
    around it (no graph break inside the launchers) and gives bitwise the eager output and gradients."""
    gen = torch.Generator().manual_seed(31 + (c or 0))
    sri = None if c is None else random_sri(2, 2, 40, causal, c, gen=gen).to(DEV)
    q, k, v, do = make_qkv(2, 40, 40, 4, 2, 16, torch.float32, seed=17)

    def block(x, y, z):
        out, lse = flashmask_attention(x * 1.5, y, z, sri, causal=causal, return_softmax_lse=True, impl="triton")
        return out + 1.0, lse

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    for a, b in zip(_run(block, q, k, v, do, lse_weight=0.5), _run(compiled, q, k, v, do, lse_weight=0.5)):
        assert torch.equal(a, b)


def test_custom_ops_pass_opcheck():
    """Schema, fake (meta) kernels and autograd registration of ``flashmask::triton_fwd`` / ``triton_bwd``
    (``torch.library.opcheck``)."""
    from flashmask.autograd import _bwd_op, _fwd_op

    sri = random_sri(1, 1, 24, False, 4, gen=torch.Generator().manual_seed(4)).to(DEV)
    q, k, v, do = make_qkv(1, 24, 24, 2, 1, 16, torch.float32, seed=5)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    torch.library.opcheck(_fwd_op, (q, k, v, sri, False, 0.25, False))
    o, lse = _fwd_op(q.detach(), k.detach(), v.detach(), sri, False, 0.25, False)
    torch.library.opcheck(_bwd_op, (do, q.detach(), k.detach(), v.detach(), o, lse, None, sri, False, 0.25, False))


@pytest.mark.parametrize("causal,c", MODES, ids=[f"{'causal' if m[0] else 'full'}-C{m[1]}" for m in MODES])
@pytest.mark.parametrize("use_lse", [False, True], ids=["out", "out+lse"])
def test_eager_function_equals_custom_op(monkeypatch, causal, c, use_lse):
    """Eager calls run a plain autograd.Function (less host time), ``torch.compile`` and tensor subclasses the
    custom ops: the two paths give bitwise the same out, LSE and gradients, with and without a loss on the LSE
    (the eager path passes ``dlse = None`` when the LSE is unused)."""
    import flashmask.autograd as T

    gen = torch.Generator().manual_seed(7 + (c or 0) + causal)
    sri = None if c is None else random_sri(2, 2 if (c or 0) % 2 == 0 else 1, 37, causal, c, gen=gen)
    q, k, v, do = make_qkv(2, 37, 37, 4, 2, 16, torch.float32, seed=3)
    fn = lambda a, b_, c_: flashmask_attention_triton(a, b_, c_, sri, causal, 0.25, False)  # noqa: E731
    w = torch.linspace(-1, 1, 37) if use_lse else None
    calls = []
    real_fn, real_op = T._EagerFunction.apply, T._fwd_op
    monkeypatch.setattr(T._EagerFunction, "apply", lambda *a: calls.append("fn") or real_fn(*a))
    monkeypatch.setattr(T, "_fwd_op", lambda *a: calls.append("op") or real_op(*a))
    eager = _run(fn, q, k, v, do, w)
    monkeypatch.setattr(T, "_use_custom_op", lambda *tensors: True)
    op = _run(fn, q, k, v, do, w)
    assert calls == ["fn", "op"]
    for a, b in zip(eager, op):
        assert torch.equal(a, b)


def test_delta_preprocessing_zeroes_the_dq_accumulator_in_the_same_pass():
    """``triton_launch.preprocess(..., dq_accum)`` (the Gluon backward's set-up): the fp32 ``[B, S, H, D]``
    accumulator comes back zeroed, Delta and the log2 LSE as without it; a tail block (S % 64 != 0) and D < its
    power of two included."""
    from flashmask.triton_launch import preprocess

    g = torch.Generator().manual_seed(5)
    b, s, h, d = 2, 70, 3, 24
    o, do = (torch.randn(b, s, h, d, generator=g).to(DEV) for _ in range(2))
    lse = torch.randn(b, h, s, generator=g).to(DEV)
    lse[0, 1, 3] = float("-inf")
    buf = torch.full((b * s * h * d + 2 * 64,), 7.0, device=DEV)  # guard regions either side
    acc = buf[64:-64].view(b, s, h, d)
    want = preprocess(o, do, lse, None)
    got = preprocess(o, do, lse, None, acc)
    assert torch.equal(acc, torch.zeros_like(acc))
    assert bool((buf[:64] == 7).all()) and bool((buf[-64:] == 7).all())  # nothing written outside it
    for a, r in zip(got, want):
        assert torch.equal(a, r)
    torch.testing.assert_close(got[0], (o * do).sum(-1).transpose(1, 2))
