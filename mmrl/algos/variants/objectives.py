"""Objectives that replace the clipped surrogate (docs/algorithms.md, "Paper variants").

- ``rw_sft`` (policy loss): reward-weighted SFT on the policy's own samples with RIFT's bounded loss for
  negative weights ("RIFT: Repurposing Negative Samples via Reward-Informed Fine-Tuning", arXiv 2601.09253).
- ``pacs`` (loss term, per sequence): RLVR as supervised classification of the verifier outcome
  (PACS, "Implicit Actor Critic Coupling via a Supervised Learning Framework for RLVR", arXiv 2509.02522;
  code ritzz-ai/PACS ``pacs_core_algos.py``).
- ``frpo`` (loss term, per sequence): the max-min robust GRPO objective (FRPO, "Robust Policy Optimization
  to Prevent Catastrophic Forgetting", arXiv 2602.08813; code Helloworld10011/FRPO ``frpo_trainer.py``).

``pacs`` and ``frpo`` are whole objectives: select them with ``algo.policy_loss: none`` and
``algo.loss_terms: [pacs]`` (or ``[frpo]``). Each compares a row with the other rows of its group *with
gradient*, so a micro-batch must hold whole groups (the ``whole_groups`` need; checked at recipe load and
on every micro-batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from mmrl.algos.config import AlgoConfig
from mmrl.algos.losses import POLICY_LOSSES, _ratio_metrics, bounded_log_ratio
from mmrl.algos.masked import masked_mean
from mmrl.algos.variants.loss_terms import LOSS_TERMS, LossTermInputs, whole_groups
from mmrl.algos.variants.params import declare_variant, variant_params

# -- RIFT: reward-weighted SFT ----------------------------------------------------------------------------

declare_variant("rw_sft")


def reward_weighted_sft(logp: Tensor, weight: Tensor, mask: Tensor) -> Tensor:
    """RIFT's stabilised reward-weighted NLL per token ([N, T] each → [N, T]):

        w ≥ 0:  ℓ_t = −w · log π_θ(y_t)        (reward-weighted maximum likelihood)
        w < 0:  ℓ_t = −w · π_θ(y_t) = |w|·π_θ   (bounded in [0, |w|]; gradient |w|·π·∇log π → 0 as π → 0)

    The naive −w·log π is unbounded below for w < 0 (pushing π → 0 drives it to −∞, the collapse the paper
    describes); the linear branch is the first-order expansion of log π around π = 1, up to a constant
    (INFERRED: the paper's exact negative branch was not readable; per token, as the SFT loss it generalises).
    """
    positive = -weight * logp
    negative = -weight * logp.exp()  # a log-prob is ≤ 0: exp cannot overflow
    return torch.where(weight >= 0, positive, negative) * mask


@POLICY_LOSSES.register("rw_sft")
def rw_sft_loss(logp: Tensor, logp_old: Tensor, adv: Tensor, mask: Tensor, cfg: AlgoConfig):
    """Reward-weighted SFT (RIFT, arXiv 2601.09253): :func:`reward_weighted_sft` with the estimator's value as
    the scalar weight, no ratio and no clip. With ``advantage: w_reinforce`` and ``positive_weight: 1`` the
    weight is the signed reward 2r − 1 (+1 correct, −1 wrong); with ``psr`` it is r (no negatives: RFT with
    soft weights)."""
    log_ratio = ((logp - logp_old) * mask).detach()
    metrics = _ratio_metrics(log_ratio, torch.zeros_like(mask, dtype=torch.bool), mask)
    metrics["policy/rw_sft_negative_frac"] = masked_mean((adv < 0).float(), mask)
    return reward_weighted_sft(logp, adv.detach(), mask), metrics


# -- PACS ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PacsParams:
    beta: float = 1.0
    """β of the score ψ_i = β Σ_t (log π_θ − log π_old) (PACS scripts: 1.0 and 2.0)."""
    centre: str = "rloo"
    """How ψ is centred within the group before the sigmoid: rloo (ψ_i − mean_{j≠i} ψ_j; the PACS scripts'
    choice) | grpo ((ψ_i − mean) / (std + ε)) | none."""
    balance_classes: bool = True
    """Weight each row by its group's class balance n / (n_classes · n_class) (PACS ``use_weight``,
    ``weight_mode: question``; groups with one label get weight 1)."""


declare_variant("pacs", PacsParams, needs=("whole_groups",))


def group_centred_scores(psi: Tensor, group: Tensor, num_groups: int, centre: str, eps: float) -> Tensor:
    """ψ [n] centred within its group (``group`` [n] in 0..num_groups−1), keeping the gradient through every
    row: rloo: ψ_i − mean_{j≠i} ψ_j (a group of one keeps ψ_i); grpo: (ψ_i − mean_g) / (std_g + ε); none: ψ."""
    if centre == "none":
        return psi
    ones = torch.ones_like(psi)
    count = torch.zeros(num_groups, dtype=psi.dtype, device=psi.device).index_add(0, group, ones)[group]
    total = torch.zeros(num_groups, dtype=psi.dtype, device=psi.device).index_add(0, group, psi)[group]
    if centre == "rloo":
        return torch.where(count > 1, psi - (total - psi) / (count - 1).clamp(min=1), psi)
    if centre == "grpo":
        mean = total / count
        var = torch.zeros(num_groups, dtype=psi.dtype, device=psi.device).index_add(0, group, (psi - mean) ** 2)[group]
        std = (var / (count - 1).clamp(min=1)).sqrt()
        return torch.where(count > 1, (psi - mean) / (std + eps), psi)
    raise ValueError(f"algo.extra.pacs.centre must be rloo, grpo or none, got {centre!r}")


def class_balance_weights(labels: Tensor, group: Tensor) -> Tensor:
    """n_g / (k_g · n_{g,c}) per row, n_g the group's rows, k_g its distinct labels, n_{g,c} the rows sharing
    this row's label; 1 in groups with a single label ([n] → [n]; sklearn's "balanced" weights per group)."""
    weights = torch.ones_like(labels, dtype=torch.float64)
    for g in torch.unique(group).tolist():
        rows = (group == g).nonzero().squeeze(1)
        values, inverse, counts = torch.unique(labels[rows], return_inverse=True, return_counts=True)
        if len(values) > 1:
            weights[rows] = len(rows) / (len(values) * counts[inverse].double())
    return weights.to(labels.dtype)


def pacs_loss(logp: Tensor, logp_old: Tensor, mask: Tensor, outcome: Tensor, group: Tensor, num_groups: int,
              params: PacsParams, eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """PACS per-row loss (arXiv 2509.02522; ``compute_pacs_loss``) and the centred scores, [n] each:

        ψ_i = β Σ_t m_{i,t} (log π_θ − log π_old),   ψ̂_i = centre_g(ψ)_i,
        ℓ_i = w_i · BCE(σ(ψ̂_i), y_i) = w_i · (softplus(ψ̂_i) − y_i ψ̂_i),   y_i the verifier outcome in [0, 1].

    The mean of ℓ over the minibatch's rows is PACS's loss. ψ̂ is the implicit advantage (the actor's score);
    σ(ψ̂) the implicit critic's predicted success."""
    psi = params.beta * ((logp - logp_old) * mask).sum(1)  # [n]
    logit = group_centred_scores(psi, group, num_groups, params.centre, eps)
    labels = outcome.to(logit)
    bce = F.binary_cross_entropy_with_logits(logit, labels, reduction="none")
    weights = class_balance_weights(labels, group) if params.balance_classes else torch.ones_like(labels)
    return weights * bce, logit


@LOSS_TERMS.register("pacs")
def pacs_loss_term(inputs: LossTermInputs, cfg: AlgoConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """:func:`pacs_loss` on the micro-batch's rows (whole groups), per sequence."""
    p = variant_params(cfg, "pacs")
    rows = inputs.rows
    outcome = rows.outcome.to(inputs.logp.device)
    if outcome.numel() and (outcome.min() < 0 or outcome.max() > 1):
        raise ValueError(f"pacs uses the verifier outcome as a label in [0, 1], got [{float(outcome.min()):.3g}, "
                         f"{float(outcome.max()):.3g}]")
    group, num_groups = whole_groups(rows, "pacs")
    loss, logit = pacs_loss(inputs.logp, inputs.logp_old, inputs.mask, outcome, group.to(inputs.logp.device),
                            num_groups, p, cfg.adv_eps)
    # |ψ̂|: how far the implicit critic has moved from "undecided" (ψ̂ = 0, σ = 0.5 at the start of a step)
    return loss, {"policy/pacs_score_abs": logit.detach().abs().mean()}


# -- FRPO ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FrpoParams:
    lam: float = 1.0
    """λ, the KL-ball multiplier: small λ = a more adversarial neighbourhood (FRPO code default 1.0; the math
    runs sweep 0.1–10)."""
    jackknife: bool = True
    """Bias-correct log of the group mean with the jackknife (FRPO code ``--jackknife``, used in its runs)."""
    offset: bool = True
    """Subtract the group mean of min(ρ, clip ρ) (FRPO code ``do_offset``; its on-policy gradient is the
    baseline that makes the update zero-mean within a group)."""


declare_variant("frpo", FrpoParams, needs=("whole_groups",))


def frpo_group_objective(seq_weighted: Tensor, seq_ratio: Tensor, group: Tensor, num_groups: int,
                         params: FrpoParams) -> Tensor:
    """Per-row copy of its group's FRPO loss term ([n] each → [n]), u_g = mean_{i∈g} seq_weighted_i:

        jackknife:  n_g·log u_g − (n_g − 1)·mean_i log u_{g,−i}    (u_{g,−i}: leave-one-out mean)
        else:       log u_g
        offset:     − mean_{i∈g} seq_ratio_i
    scaled by max(λ, 1) as in the FRPO code. Averaging the rows' copies over a minibatch of equal-size groups
    gives the mean over groups (the code's 1/G)."""
    dtype, device = seq_weighted.dtype, seq_weighted.device
    count = torch.zeros(num_groups, dtype=dtype, device=device).index_add(0, group, torch.ones_like(seq_weighted))
    total = torch.zeros(num_groups, dtype=dtype, device=device).index_add(0, group, seq_weighted)
    log_u = torch.log((total / count).clamp(min=1e-12))  # [g]
    if params.jackknife:
        loo = (total[group] - seq_weighted) / (count[group] - 1).clamp(min=1)  # [n]
        loo_log_mean = torch.zeros(num_groups, dtype=dtype, device=device).index_add(
            0, group, torch.log(loo.clamp(min=1e-12))) / count
        term = torch.where(count > 1, count * log_u - (count - 1) * loo_log_mean, log_u)
    else:
        term = log_u
    if params.offset:
        term = term - torch.zeros(num_groups, dtype=dtype, device=device).index_add(0, group, seq_ratio) / count
    return max(params.lam, 1.0) * term[group]


def frpo_loss(logp: Tensor, logp_old: Tensor, adv: Tensor, mask: Tensor, group: Tensor, num_groups: int,
              params: FrpoParams, cfg: AlgoConfig) -> tuple[Tensor, Tensor]:
    """FRPO (arXiv 2602.08813): the max-min objective min_{π' ∈ KL-ball(π_θ)} E_{π'}[r] in its dual form
    −λ log E_{π_θ}[exp(−A/λ)], estimated per group with PPO's ratio (FRPO code, ``loss_type: frpo``):

        w_i = exp(−A_i/λ),  c_{i,t} = min(ρ_{i,t}, clip(ρ_{i,t}, 1−ε_low, 1+ε_high)),
        L_i = mean_t c_{i,t}·w_i,  aux_i = mean_t c_{i,t},  loss = mean_g [log mean_{i∈g} L_i − mean_{i∈g} aux_i]

    A_i is the row's sequence advantage (the mean of the estimator's A over its tokens; GRPO in the paper).
    On-policy the gradient is Σ_i (w_i / mean_g w − 1)·∇log π_i: rows the adversary would up-weight (low A)
    are pushed down hardest; λ → ∞ recovers A − mean_g A. Returns (per-row loss [n], w [n])."""
    if params.lam <= 0:
        raise ValueError(f"algo.extra.frpo.lam must be > 0, got {params.lam}")
    length = mask.sum(1).clamp(min=1)
    seq_adv = (adv * mask).sum(1) / length  # [n]
    weight = torch.exp(-seq_adv.detach() / params.lam)
    ratio = bounded_log_ratio((logp - logp_old) * mask).exp()
    capped = torch.minimum(ratio, ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high))  # [n, T]
    seq_ratio = (capped * mask).sum(1) / length
    return frpo_group_objective(seq_ratio * weight, seq_ratio, group, num_groups, params), weight


@LOSS_TERMS.register("frpo")
def frpo_loss_term(inputs: LossTermInputs, cfg: AlgoConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """:func:`frpo_loss` on the micro-batch's rows (whole groups), per sequence."""
    p = variant_params(cfg, "frpo")
    group, num_groups = whole_groups(inputs.rows, "frpo")
    loss, weight = frpo_loss(inputs.logp, inputs.logp_old, inputs.advantages, inputs.mask,
                             group.to(inputs.logp.device), num_groups, p, cfg)
    return loss, {"policy/frpo_weight_mean": weight.mean(), "policy/frpo_weight_max": weight.max()}
