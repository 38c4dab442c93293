"""DPO-family preference losses: pure functions plus the ``DPOCriterion`` module.

Source: PaddleNLP ``paddlenlp/transformers/dpo_criterion.py`` (``DPOCriterion.dpo_loss`` / ``dpo_logps``),
spec section 3.3. Papers: DPO (Rafailov et al. 2023, arXiv:2305.18290), IPO (Azar et al., arXiv:2310.12036),
SimPO (Meng et al., arXiv:2405.14734), DPOP (Pal et al., arXiv:2402.13228), KTO-pair (Ethayarajh et al.,
arXiv:2402.01306), SPPO-hard (Wu et al., arXiv:2405.00675), NCA (Chen et al., arXiv:2402.05369),
ORPO (Hong et al., arXiv:2403.07691).

Differences from PaddleNLP (all deliberate, "correct by default"):

- Log-probabilities are sums over each response's own target tokens (every chosen token and every rejected
  token, the end token included). PaddleNLP (``ignore_eos_token=True``) drops the first rejected token.
- Length averaging (``ipo``, ``or``, ``simpo``) divides each sum by the number of tokens summed. PaddleNLP
  divides the chosen sum by ``R0 - 1`` and the rejected sum by ``R1`` (swapped off-by-one).
- Losses are returned per pair (``[N]``) so the trainer can take a global mean over pairs across
  micro-batches and ranks; PaddleNLP takes a mean per micro-batch. ``kto_pair``'s two halves are averaged
  per pair, which gives the same mean as PaddleNLP's ``concat`` over ``2N``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

LOSS_TYPES = ("sigmoid", "hinge", "ipo", "simpo", "dpop", "kto_pair", "sppo_hard", "nca_pair", "or")
# Loss types that use length-averaged log-probs (PaddleNLP: ``average_log_prob``).
AVERAGE_LOGP_LOSS_TYPES = frozenset({"ipo", "or", "simpo"})
# Loss types that may run without a reference model (PaddleNLP's DPOTrainer raises for the others).
REFERENCE_FREE_LOSS_TYPES = frozenset({"sigmoid", "hinge", "ipo", "or", "simpo"})
# Loss types that never use a reference model.
NO_REFERENCE_LOSS_TYPES = frozenset({"or", "simpo"})


def preference_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    reference_chosen_logps: torch.Tensor | None = None,
    reference_rejected_logps: torch.Tensor | None = None,
    *,
    loss_type: str = "sigmoid",
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    simpo_gamma: float = 0.5,
    dpop_lambda: float = 50.0,
) -> torch.Tensor:
    """Per-pair preference loss.

    Args:
        policy_chosen_logps, policy_rejected_logps: float ``[N]``, the policy's log-probabilities of each
            pair's chosen / rejected response (summed, or length-averaged for ipo/or/simpo; the caller decides).
        reference_chosen_logps, reference_rejected_logps: float ``[N]`` or ``None`` (reference-free: zeros).
        loss_type: one of ``LOSS_TYPES``.
        beta, label_smoothing, simpo_gamma, dpop_lambda: PaddleNLP ``DPOConfig`` fields of the same names.

    Returns:
        float ``[N]``: the loss of each pair (PaddleNLP's ``loss.mean()`` is ``preference_loss(...).mean()``;
        ``pref_loss_ratio`` is applied by ``DPOCriterion``). Formulas as PaddleNLP ``DPOCriterion.dpo_loss``;
        ``kto_pair`` returns the mean of its chosen and rejected halves per pair, whose KL baselines are
        micro-batch means (so that loss depends on the other pairs of the batch, as in PaddleNLP and TRL).

    Raises:
        ValueError: unknown ``loss_type``, shape mismatch, or ``beta <= 0`` where ``1/beta`` is used.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"unknown loss_type {loss_type!r}; expected one of {', '.join(LOSS_TYPES)} (or 'orpo')")
    if policy_chosen_logps.shape != policy_rejected_logps.shape or policy_chosen_logps.dim() != 1:
        raise ValueError(
            "policy_chosen_logps and policy_rejected_logps must both be [N]; got "
            f"{tuple(policy_chosen_logps.shape)} and {tuple(policy_rejected_logps.shape)}"
        )
    if beta <= 0 and loss_type in ("ipo", "simpo", "sppo_hard"):
        raise ValueError(f"loss_type {loss_type!r} divides by beta; beta must be > 0, got {beta}")
    pc, pr = policy_chosen_logps, policy_rejected_logps
    rc = torch.zeros_like(pc) if reference_chosen_logps is None else reference_chosen_logps.to(pc.dtype)
    rr = torch.zeros_like(pr) if reference_rejected_logps is None else reference_rejected_logps.to(pr.dtype)
    logits = (pc - pr) - (rc - rr)  # [N]
    eps = label_smoothing

    if loss_type == "sigmoid":
        return -F.logsigmoid(beta * logits) * (1 - eps) - F.logsigmoid(-beta * logits) * eps
    if loss_type == "hinge":
        return torch.relu(1 - beta * logits)
    if loss_type == "ipo":
        return (logits - 1 / (2 * beta)) ** 2
    if loss_type == "simpo":
        logits = logits - simpo_gamma / beta
        return -F.logsigmoid(beta * logits) * (1 - eps) - F.logsigmoid(-beta * logits) * eps
    if loss_type == "dpop":
        positive_reg = torch.clamp(rc - pc, min=0)
        return -F.logsigmoid(beta * (logits - dpop_lambda * positive_reg))
    if loss_type == "kto_pair":
        chosen_kl = (pc - rc).mean().clamp(min=0)
        rejected_kl = (pr - rr).mean().clamp(min=0)
        chosen_half = 1 - torch.sigmoid(beta * ((pc - rc) - rejected_kl))
        rejected_half = 1 - torch.sigmoid(beta * (chosen_kl - (pr - rr)))
        return 0.5 * (chosen_half + rejected_half)
    if loss_type == "sppo_hard":
        a, b = pc - rc, pr - rr
        return (a - 0.5 / beta) ** 2 + (b + 0.5 / beta) ** 2
    if loss_type == "nca_pair":
        r_c, r_r = beta * (pc - rc), beta * (pr - rr)
        return -F.logsigmoid(r_c) - 0.5 * F.logsigmoid(-r_c) - 0.5 * F.logsigmoid(-r_r)
    # "or" (ORPO odds ratio; no beta, no reference).
    return -F.logsigmoid(_log_odds(pc, pr))


def _log_odds(pc: torch.Tensor, pr: torch.Tensor) -> torch.Tensor:
    """ORPO log odds ratio ``log(odds_c / odds_r)`` from length-averaged logps (``[N]``, all < 0)."""
    return (pc - pr) - (torch.log1p(-torch.exp(pc)) - torch.log1p(-torch.exp(pr)))


@dataclass
class PairLogps:
    """Per-pair log-probability sums and token counts of one micro-batch.

    ``chosen``/``rejected``: float32 ``[N]`` sums of log p(target token) over each response's target tokens.
    ``chosen_tokens``/``rejected_tokens``: int64 ``[N]`` number of tokens summed (>= 1).
    """

    chosen: torch.Tensor
    rejected: torch.Tensor
    chosen_tokens: torch.Tensor
    rejected_tokens: torch.Tensor


class DPOCriterion(nn.Module):
    """DPO-family loss on per-pair log-probability sums, with PaddleNLP's SFT term and metric names.

    Source: PaddleNLP ``paddlenlp/transformers/dpo_criterion.py`` and ``paddlenlp/trl/dpo_trainer.py``
    (metrics), with the log-prob fixes described in this module's docstring.

    ``forward(policy, reference)`` returns ``(loss_sum, metrics)``:

    - ``loss_sum``: scalar, ``pref_loss_ratio * sum_pairs(loss) + sft_loss_ratio * N * sft``, where ``sft`` is
      the token-mean NLL of the chosen responses (PaddleNLP's ``sft_loss``). Divided by the global number of
      pairs by the trainer, the first term is the pair mean of the preference loss. The token mean is over the
      micro-batch (PaddleNLP), unless ``sft_scale`` is set: the trainer sets it to ``N_step / T_step`` (pairs and
      chosen tokens of the whole optimizer step, all micro-batches and data ranks), and the term becomes
      ``sft_loss_ratio * NLL_sum * sft_scale``, so after the trainer's division the SFT term is the token mean
      over the step, whatever its split into micro-batches (PaddleNLP's depends on the split).
    - ``metrics``: detached float32 scalars, each a **sum over pairs** (divide by the pair count to get
      PaddleNLP's mean): ``rewards/chosen``, ``rewards/rejected``, ``rewards/accuracies``, ``rewards/margins``,
      ``logps/chosen``, ``logps/rejected``, ``{loss_type}_loss``, ``sft_loss`` and for ``or``
      ``log_odds_ratio``, ``log_odds_chosen``.
    """

    def __init__(
        self,
        *,
        loss_type: str = "sigmoid",
        beta: float = 0.1,
        label_smoothing: float = 0.0,
        simpo_gamma: float = 0.5,
        dpop_lambda: float = 50.0,
        pref_loss_ratio: float = 1.0,
        sft_loss_ratio: float = 0.0,
        reference_free: bool = False,
    ):
        super().__init__()
        if loss_type == "orpo":
            raise ValueError("loss_type 'orpo' is an alias: use loss_type='or', reference_free=True, sft_loss_ratio=1.0")
        if loss_type not in LOSS_TYPES:
            raise ValueError(f"unknown loss_type {loss_type!r}; expected one of {', '.join(LOSS_TYPES)}")
        if reference_free and loss_type not in REFERENCE_FREE_LOSS_TYPES:
            raise ValueError(
                f"loss_type {loss_type!r} needs a reference model; reference_free=True works only with "
                f"{sorted(REFERENCE_FREE_LOSS_TYPES)}"
            )
        if not 0.0 <= label_smoothing < 0.5:
            raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
        self.loss_type, self.beta, self.label_smoothing = loss_type, beta, label_smoothing
        self.simpo_gamma, self.dpop_lambda = simpo_gamma, dpop_lambda
        self.pref_loss_ratio, self.sft_loss_ratio = pref_loss_ratio, sft_loss_ratio
        self.reference_free = reference_free or loss_type in NO_REFERENCE_LOSS_TYPES
        self.average_log_prob = loss_type in AVERAGE_LOGP_LOSS_TYPES
        self.sft_scale: torch.Tensor | None = None  # N_step / T_step, set per optimizer step by DPOTrainer

    def _scaled(self, logps: PairLogps) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.average_log_prob:
            return logps.chosen, logps.rejected
        return logps.chosen / logps.chosen_tokens.to(logps.chosen.dtype), logps.rejected / logps.rejected_tokens.to(
            logps.rejected.dtype
        )

    def forward(self, policy: PairLogps, reference: PairLogps | None = None) -> tuple[torch.Tensor, dict]:
        """See the class docstring. ``reference`` is ignored (zeros) when reference-free; required otherwise."""
        if reference is None and not self.reference_free:
            raise ValueError(f"loss_type {self.loss_type!r} with reference_free=False needs reference log-probs")
        pc, pr = self._scaled(policy)
        if self.reference_free:
            rc, rr = torch.zeros_like(pc), torch.zeros_like(pr)
        else:
            rc, rr = (t.to(pc.dtype) for t in self._scaled(reference))
        losses = preference_loss(
            pc, pr, rc, rr, loss_type=self.loss_type, beta=self.beta, label_smoothing=self.label_smoothing,
            simpo_gamma=self.simpo_gamma, dpop_lambda=self.dpop_lambda,
        )  # [N]
        num_pairs = pc.shape[0]
        pref_sum = losses.sum() * self.pref_loss_ratio
        # PaddleNLP's sft_loss: token-mean NLL over the chosen tokens, here as N * mean (a sum over pairs, like the
        # other terms): over the micro-batch, or over the whole step when the trainer set sft_scale = N / T
        nll = -policy.chosen.sum()
        if self.sft_scale is not None:
            sft_sum = nll * self.sft_scale.to(nll.dtype)
        else:
            sft_sum = nll / policy.chosen_tokens.sum().clamp(min=1).to(nll.dtype) * num_pairs
        loss_sum = pref_sum
        if self.sft_loss_ratio != 0.0:
            loss_sum = loss_sum + self.sft_loss_ratio * sft_sum

        with torch.no_grad():
            r_c, r_r = self.beta * (pc - rc).detach().float(), self.beta * (pr - rr).detach().float()
            metrics = {
                "rewards/chosen": r_c.sum(),
                "rewards/rejected": r_r.sum(),
                "rewards/accuracies": (r_c > r_r).float().sum(),
                "rewards/margins": (r_c - r_r).sum(),
                "logps/chosen": pc.detach().float().sum(),
                "logps/rejected": pr.detach().float().sum(),
                f"{self.loss_type}_loss": pref_sum.detach().float(),
                "sft_loss": sft_sum.detach().float(),
            }
            if self.loss_type == "or":
                log_odds = _log_odds(pc.detach().float(), pr.detach().float())
                metrics["log_odds_ratio"] = F.logsigmoid(log_odds).sum()
                metrics["log_odds_chosen"] = log_odds.sum()
        return loss_sum, metrics
