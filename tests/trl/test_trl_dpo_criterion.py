"""Preference losses against naive per-pair Python-float implementations (PaddleNLP formulas, spec 3.3)."""

import math

import pytest
import torch

from paddlenlp_ext.trl.dpo_criterion import LOSS_TYPES, DPOCriterion, PairLogps, preference_loss


def _logsig(x):
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def _sig(x):
    return math.exp(_logsig(x))


def naive_losses(pc, pr, rc, rr, loss_type, beta, eps, gamma, lam):
    """One Python-float loss per pair; kto_pair returns the mean of its two halves per pair."""
    n = len(pc)
    out = []
    kl_c = max(0.0, sum(pc[i] - rc[i] for i in range(n)) / n)
    kl_r = max(0.0, sum(pr[i] - rr[i] for i in range(n)) / n)
    for i in range(n):
        h = (pc[i] - pr[i]) - (rc[i] - rr[i])
        if loss_type == "sigmoid":
            v = -_logsig(beta * h) * (1 - eps) - _logsig(-beta * h) * eps
        elif loss_type == "hinge":
            v = max(0.0, 1 - beta * h)
        elif loss_type == "ipo":
            v = (h - 1 / (2 * beta)) ** 2
        elif loss_type == "simpo":
            # -log sigma(beta * (avg_c - avg_r) - gamma), smoothed.
            z = beta * h - gamma
            v = -_logsig(z) * (1 - eps) - _logsig(-z) * eps
        elif loss_type == "dpop":
            v = -_logsig(beta * (h - lam * max(0.0, rc[i] - pc[i])))
        elif loss_type == "kto_pair":
            a = 1 - _sig(beta * ((pc[i] - rc[i]) - kl_r))
            b = 1 - _sig(beta * (kl_c - (pr[i] - rr[i])))
            v = 0.5 * (a + b)
        elif loss_type == "sppo_hard":
            v = (pc[i] - rc[i] - 0.5 / beta) ** 2 + (pr[i] - rr[i] + 0.5 / beta) ** 2
        elif loss_type == "nca_pair":
            c, r = beta * (pc[i] - rc[i]), beta * (pr[i] - rr[i])
            v = -_logsig(c) - 0.5 * _logsig(-c) - 0.5 * _logsig(-r)
        elif loss_type == "or":
            odds = (pc[i] - pr[i]) - (math.log(1 - math.exp(pc[i])) - math.log(1 - math.exp(pr[i])))
            v = -_logsig(odds)
        out.append(v)
    return out


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("beta", [0.05, 0.1, 1.0])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_loss_matches_naive(loss_type, beta, label_smoothing):
    g = torch.Generator().manual_seed(LOSS_TYPES.index(loss_type) * 100 + int(beta * 10) + int(label_smoothing * 10))
    n = 7
    # Length-averaged-style magnitudes keep exp(logp) < 1 for "or"; summed-style for the rest.
    scale = 1.5 if loss_type in ("or", "ipo", "simpo") else 30.0
    pc, pr, rc, rr = (-(torch.rand(n, generator=g, dtype=torch.float64) * scale + 0.05) for _ in range(4))
    got = preference_loss(pc, pr, rc, rr, loss_type=loss_type, beta=beta, label_smoothing=label_smoothing,
                          simpo_gamma=0.7, dpop_lambda=5.0)
    want = naive_losses(pc.tolist(), pr.tolist(), rc.tolist(), rr.tolist(), loss_type, beta, label_smoothing, 0.7, 5.0)
    assert got.shape == (n,)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_sigmoid_is_symmetric_and_label_smoothing_changes_it():
    pc, pr = torch.tensor([-3.0]), torch.tensor([-5.0])
    z = torch.zeros(1)
    base = preference_loss(pc, pr, z, z, beta=0.5)
    flipped = preference_loss(pr, pc, z, z, beta=0.5)
    assert base < flipped  # preferring the chosen answer gives a lower loss
    smoothed = preference_loss(pc, pr, z, z, beta=0.5, label_smoothing=0.3)
    assert not torch.allclose(base, smoothed)


def test_reference_free_is_zero_reference():
    pc, pr = torch.tensor([-2.0, -4.0]), torch.tensor([-3.0, -1.0])
    z = torch.zeros(2)
    torch.testing.assert_close(preference_loss(pc, pr, None, None), preference_loss(pc, pr, z, z))


def _pairs(c, r, nc, nr):
    return PairLogps(torch.tensor(c), torch.tensor(r), torch.tensor(nc), torch.tensor(nr))


def test_criterion_averages_by_own_token_counts_and_metrics():
    pol = _pairs([-6.0, -9.0], [-8.0, -4.0], [3, 3], [4, 2])
    ref = _pairs([-7.0, -9.0], [-7.0, -5.0], [3, 3], [4, 2])
    crit = DPOCriterion(loss_type="ipo", beta=0.1)
    loss_sum, m = crit(pol, ref)
    pc = torch.tensor([-2.0, -3.0]); pr = torch.tensor([-2.0, -2.0])
    rc = torch.tensor([-7 / 3, -3.0]); rr = torch.tensor([-7 / 4, -2.5])
    want = preference_loss(pc, pr, rc, rr, loss_type="ipo", beta=0.1).sum()
    torch.testing.assert_close(loss_sum, want)
    torch.testing.assert_close(m["rewards/chosen"], (0.1 * (pc - rc)).sum())
    torch.testing.assert_close(m["rewards/accuracies"], ((pc - rc) > (pr - rr)).float().sum())
    assert set(m) >= {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
                      "logps/chosen", "logps/rejected", "ipo_loss", "sft_loss"}


def test_criterion_sft_term_is_token_mean_times_pairs():
    pol = _pairs([-6.0, -2.0], [-1.0, -1.0], [3, 1], [1, 1])
    crit = DPOCriterion(loss_type="sigmoid", beta=0.1, sft_loss_ratio=0.5, pref_loss_ratio=2.0)
    ref = _pairs([-6.0, -2.0], [-1.0, -1.0], [3, 1], [1, 1])
    loss_sum, m = crit(pol, ref)
    pref = preference_loss(pol.chosen, pol.rejected, ref.chosen, ref.rejected, beta=0.1).sum() * 2.0
    sft = 8.0 / 4.0
    torch.testing.assert_close(loss_sum, pref + 0.5 * sft * 2)
    torch.testing.assert_close(m["sft_loss"], torch.tensor(sft * 2))


def test_criterion_errors():
    with pytest.raises(ValueError, match="needs a reference model"):
        DPOCriterion(loss_type="kto_pair", reference_free=True)
    with pytest.raises(ValueError, match="unknown loss_type"):
        DPOCriterion(loss_type="bogus")
    with pytest.raises(ValueError, match="needs reference log-probs"):
        DPOCriterion(loss_type="sigmoid")(_pairs([-1.0], [-2.0], [1], [1]))
    assert DPOCriterion(loss_type="simpo").reference_free


def test_gradients_flow():
    pc = torch.tensor([-3.0, -2.0], requires_grad=True)
    pr = torch.tensor([-2.5, -4.0], requires_grad=True)
    for lt in LOSS_TYPES:
        s = 0.5 if lt in ("or",) else 1.0
        loss = preference_loss(pc * s, pr * s, torch.zeros(2) - 2.0 * s, torch.zeros(2) - 3.0 * s, loss_type=lt).sum()
        (gc,) = torch.autograd.grad(loss, pc)
        assert torch.isfinite(gc).all()
