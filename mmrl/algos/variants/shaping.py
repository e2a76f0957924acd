"""Advantage-shaping hooks from the seed papers: ``(A [N,T], ShapingContext, AlgoConfig) -> A' [N,T]``.

- ``f_grpo``: focal difficulty scaling (F-GRPO, arXiv 2602.06717).
- ``ace``: confidence-aware error penalty (ACE, arXiv 2602.21420).
- ``rl_zvp``: entropy-modulated advantages for zero-variance prompts (RL-ZVP, arXiv 2509.21880).
- ``divergence_weighted``: token advantages weighted by a per-token divergence to the reference
  (the token-level distributional-shift study of RLVR, seed abstract 1).
- ``entropy_bonus``: bounded entropy-based advantage shaping (Cheng et al. 2025, "Reasoning with
  exploration: an entropy perspective"; used by the MSSR single-rollout recipe, arXiv 2512.18215).

Outcomes are read as success probabilities in [0, 1] (as in ``outcome.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from mmrl.algos.config import AlgoConfig
from mmrl.algos.masked import group_mean_std, masked_mean
from mmrl.algos.regularizers import KL_ESTIMATORS
from mmrl.algos.shaping import SHAPING_HOOKS, ShapingContext
from mmrl.algos.variants.outcome import unit_rewards
from mmrl.algos.variants.params import declare_variant, variant_params

# -- F-GRPO -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FocalParams:
    gamma: float = 1.0
    """Focal exponent γ of g(x) = (1 − p̂(x))^γ (arXiv 2602.06717; value NOT FOUND, 1–2 suggested)."""


declare_variant("f_grpo", FocalParams)


def focal_weight(outcome: Tensor, group_id: Tensor, gamma: float) -> Tensor:
    """g = (1 − p̂_g)^γ per row, p̂_g the group's empirical success rate ([N] → [N])."""
    success_rate, _, _ = group_mean_std(outcome, group_id)  # float64
    return ((1.0 - success_rate).clamp(min=0.0) ** gamma).to(outcome.dtype)


@SHAPING_HOOKS.register("f_grpo")
def focal_scaling(adv: Tensor, ctx: ShapingContext, cfg: AlgoConfig) -> Tensor:
    """F-GRPO (arXiv 2602.06717, focal scaling): A'_{i,t} = (1 − p̂_g(i))^γ · A_{i,t}.

    Down-weights prompts the policy already solves often (p̂ → 1), focal-loss style.
    """
    gamma = variant_params(cfg, "f_grpo").gamma
    if gamma < 0:
        raise ValueError(f"algo.extra.f_grpo.gamma must be >= 0, got {gamma}")
    g = focal_weight(unit_rewards(ctx.outcome, "f_grpo"), ctx.group_id, gamma)
    return adv * g[:, None] * ctx.mask


# -- ACE ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AceParams:
    alpha: float = 1.0
    """α of the penalty scale 1 + α·softplus(c_i) (arXiv 2602.21420; value NOT FOUND, INFERRED)."""
    length_normalize: bool = False
    """Use the per-token mean of the log-ratio instead of the sequence sum (False: the paper's
    sequence-level log π_θ(y|x) − log π_ref(y|x))."""


declare_variant("ace", AceParams, needs=("ref_logp",))


def confidence_shift(logp: Tensor, ref_logp: Tensor, mask: Tensor, length_normalize: bool) -> Tensor:
    """c_i = Σ_t m (log π − log π_ref) (or its token mean) ([N, T] → [N])."""
    total = ((logp - ref_logp) * mask).sum(1)
    return total / mask.sum(1).clamp(min=1) if length_normalize else total


@SHAPING_HOOKS.register("ace")
def confidence_aware_error_penalty(adv: Tensor, ctx: ShapingContext, cfg: AlgoConfig) -> Tensor:
    """ACE (arXiv 2602.21420, [RECONSTRUCTED] form): for negative advantages,
    A'_{i,t} = A_{i,t} · (1 + α·softplus(c_i)),  c_i = log π_old(y_i|x) − log π_ref(y_i|x);
    positive advantages are unchanged. Errors the policy has grown confident in are pushed down harder.
    """
    p = variant_params(cfg, "ace")
    if ctx.ref_logp is None:
        raise ValueError("the ace hook needs reference log-probs: trainer.ref_model: copy (or adapter_disabled)")
    c = confidence_shift(ctx.logp_old, ctx.ref_logp, ctx.mask, p.length_normalize)  # [N]
    scale = 1.0 + p.alpha * F.softplus(c)
    return torch.where(adv < 0, adv * scale[:, None], adv) * ctx.mask


# -- RL-ZVP -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ZeroVarianceParams:
    alpha: float = 0.1
    """α scaling the entropy-modulated advantage of zero-variance groups (arXiv 2509.21880; INFERRED)."""
    atol: float = 1e-6
    """A group is zero-variance when its outcome std ≤ atol; all-correct when every outcome ≥ 1 − atol,
    all-wrong when every outcome ≤ atol (constant intermediate scores are left unchanged)."""


declare_variant("rl_zvp", ZeroVarianceParams, needs=("entropy",))


@SHAPING_HOOKS.register("rl_zvp")
def zero_variance_prompt_advantage(adv: Tensor, ctx: ShapingContext, cfg: AlgoConfig) -> Tensor:
    """RL-ZVP (arXiv 2509.21880, [RECALLED] form): groups with signal keep their advantages;
    zero-variance groups get
      all-correct: A_{i,t} = +α·H_{i,t}
      all-wrong:   A_{i,t} = −α·(max_{t'} H_{i,t'} − H_{i,t})   (confident tokens are penalised most)
    with H the detached behaviour entropy of each token.
    """
    p = variant_params(cfg, "rl_zvp")
    if ctx.entropy is None:
        raise ValueError("the rl_zvp hook needs the behaviour entropy (ShapingContext.entropy)")
    outcome = unit_rewards(ctx.outcome, "rl_zvp")
    mean, std, _ = group_mean_std(outcome, ctx.group_id)
    zero_var = std <= p.atol
    all_correct = zero_var & (mean >= 1.0 - p.atol)  # [N]
    all_wrong = zero_var & (mean <= p.atol)
    entropy = ctx.entropy.detach() * ctx.mask  # [N, T]
    max_entropy = entropy.max(dim=1, keepdim=True).values
    positive = p.alpha * entropy
    negative = -p.alpha * (max_entropy - entropy)
    adv = torch.where(all_correct[:, None], positive, adv)
    adv = torch.where(all_wrong[:, None], negative, adv)
    return adv * ctx.mask


# -- divergence-weighted advantages -----------------------------------------------------------------------


@dataclass(frozen=True)
class DivergenceWeightParams:
    coef: float = 1.0
    """β of the weight w_{i,t} = 1 + β·d_{i,t} (INFERRED; the paper reports a diagnostic intervention)."""
    estimator: str = "k3"
    """Registered KL estimator giving the per-token divergence d of π_old from π_ref on the sampled token."""
    normalize: bool = True
    """Divide d by its mean over the batch's valid tokens, so β does not depend on the divergence's scale
    (all-zero d, e.g. on the first step, gives w = 1)."""


declare_variant("divergence_weighted", DivergenceWeightParams, needs=("ref_logp",))


@SHAPING_HOOKS.register("divergence_weighted")
def divergence_weighted_advantage(adv: Tensor, ctx: ShapingContext, cfg: AlgoConfig) -> Tensor:
    """A'_{i,t} = A_{i,t} · (1 + β·d_{i,t}), d = KL estimator of π_old vs π_ref per token (the sparse
    tokens where RL moved the policy get more credit; seed abstract 1, "divergence-weighted variants
    of the advantage signal")."""
    p = variant_params(cfg, "divergence_weighted")
    if ctx.ref_logp is None:
        raise ValueError("the divergence_weighted hook needs reference log-probs: trainer.ref_model: copy")
    d = KL_ESTIMATORS.get(p.estimator)(ctx.logp_old, ctx.ref_logp).abs() * ctx.mask  # [N, T]
    if p.normalize:
        mean = masked_mean(d, ctx.mask)
        d = torch.where(mean > 0, d / mean.clamp(min=1e-12), torch.zeros_like(d))
    return adv * (1.0 + p.coef * d) * ctx.mask


# -- bounded entropy bonus --------------------------------------------------------------------------------


@dataclass(frozen=True)
class EntropyBonusParams:
    alpha: float = 0.4
    """α of ψ = min(α·H, |A|/κ) (Cheng et al. 2025, eq. 5; INFERRED for MSSR, whose formula was NOT FOUND)."""
    kappa: float = 2.0
    """κ > 1 bounding the bonus by |A|/κ, so it never flips the sign of A."""


declare_variant("entropy_bonus", EntropyBonusParams, needs=("entropy",))


@SHAPING_HOOKS.register("entropy_bonus")
def bounded_entropy_bonus(adv: Tensor, ctx: ShapingContext, cfg: AlgoConfig) -> Tensor:
    """A'_{i,t} = A_{i,t} + min(α·H_{i,t}, |A_{i,t}|/κ) with H the detached behaviour entropy
    (Cheng et al. 2025 eq. 5; MSSR's "entropy-based advantage shaping", INFERRED)."""
    p = variant_params(cfg, "entropy_bonus")
    if p.kappa <= 1 or p.alpha < 0:
        raise ValueError(f"entropy_bonus needs kappa > 1 and alpha >= 0, got kappa={p.kappa}, alpha={p.alpha}")
    if ctx.entropy is None:
        raise ValueError("the entropy_bonus hook needs the behaviour entropy (ShapingContext.entropy)")
    bonus = torch.minimum(p.alpha * ctx.entropy.detach(), adv.abs() / p.kappa)
    return (adv + bonus) * ctx.mask
