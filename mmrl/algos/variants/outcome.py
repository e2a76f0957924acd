"""Outcome advantage estimators from the seed papers: ``(AdvantageInputs, AlgoConfig) -> (A [N,T], None)``.

- ``psr`` / ``nsr`` / ``w_reinforce``: positive / negative sample reinforcement (Zhu et al. 2025,
  "The Surprising Effectiveness of Negative Reinforcement", arXiv 2506.01347, RLVR-Decomposed
  ``compute_psr_nsr_outcome_advantage``).
- ``noisy_backward`` / ``noisy_forward``: verifier-noise correction ("RLVR with Verifiable yet
  Noisy Rewards under Imperfect Verifiers", arXiv 2510.00915).
- ``beta_posterior``: a Beta-posterior baseline for Bernoulli rewards, so that uniform groups
  keep a signal (AERO, arXiv 2602.14338, and MSSR, arXiv 2512.18215; exact forms INFERRED).

Rewards are read as success probabilities in [0, 1] (binary verifiers give {0, 1}; a fractional
score such as the sanity task's position accuracy is treated as a soft success); a reward outside
[0, 1] raises, because these formulas are only defined there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from mmrl.algos.advantages import ADVANTAGE_ESTIMATORS, AdvantageInputs
from mmrl.algos.config import AlgoConfig
from mmrl.algos.masked import group_mean_std
from mmrl.algos.variants.params import declare_variant, variant_params


def unit_rewards(rewards: Tensor, estimator: str) -> Tensor:
    """The rewards, checked to lie in [0, 1] ([N] → [N])."""
    if rewards.numel() and (rewards.min() < 0 or rewards.max() > 1):
        raise ValueError(f"{estimator} needs rewards in [0, 1] (success probabilities), got "
                         f"[{float(rewards.min()):.3g}, {float(rewards.max()):.3g}]; use a task whose score is in "
                         f"[0, 1] and no reward shaping that leaves it (e.g. algo.overlong_max_len)")
    return rewards


# -- PSR / NSR / W-REINFORCE ------------------------------------------------------------------------


@dataclass(frozen=True)
class WReinforceParams:
    positive_weight: float = 0.1
    """λ: advantage of a correct sample; incorrect samples get −1 (W-REINFORCE, arXiv 2506.01347
    §5, λ = 0.1)."""


declare_variant("psr")
declare_variant("nsr")
declare_variant("w_reinforce", WReinforceParams)


@ADVANTAGE_ESTIMATORS.register("psr")
def psr_advantage(inp: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, None]:
    """Positive sample reinforcement (arXiv 2506.01347 eq. 4): A_i = r_i (1 correct, 0 wrong); no baseline."""
    r = unit_rewards(inp.rewards, "psr")
    return r[:, None] * inp.mask, None


@ADVANTAGE_ESTIMATORS.register("nsr")
def nsr_advantage(inp: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, None]:
    """Negative sample reinforcement (arXiv 2506.01347 eq. 5): A_i = r_i − 1 (−1 wrong, 0 correct)."""
    r = unit_rewards(inp.rewards, "nsr")
    return (r - 1.0)[:, None] * inp.mask, None


@ADVANTAGE_ESTIMATORS.register("w_reinforce")
def w_reinforce_advantage(inp: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, None]:
    """W-REINFORCE (arXiv 2506.01347 eq. 7): λ·PSR + NSR, i.e. A_i = λ·r_i + (r_i − 1):
    λ for a correct sample, −1 for a wrong one (linear in between for a soft score)."""
    lam = variant_params(cfg, "w_reinforce").positive_weight
    r = unit_rewards(inp.rewards, "w_reinforce")
    return (lam * r + r - 1.0)[:, None] * inp.mask, None


# -- verifier-noise correction ------------------------------------------------------------------------


@dataclass(frozen=True)
class NoisyVerifierParams:
    false_positive_rate: float = 0.0
    """ρ_0 = P(verifier says 1 | truly wrong). Given, not estimated (arXiv 2510.00915 §3)."""
    false_negative_rate: float = 0.0
    """ρ_1 = P(verifier says 0 | truly correct). ρ_0 + ρ_1 < 1 is required."""
    base: str = "grpo"
    """noisy_backward: the estimator run on the corrected rewards, which leave [0, 1] (so not psr /
    nsr / w_reinforce / beta_posterior: grpo, rloo, returns, reinforce_pp). Note that GRPO with std
    normalisation is invariant to the affine correction for groups of two or more: use
    ``algo.norm_adv_by_std: false`` (Dr. GRPO), ``rloo`` or ``returns`` to feel it."""


declare_variant("noisy_backward", NoisyVerifierParams)
declare_variant("noisy_forward", NoisyVerifierParams)


def _noise_rates(params: NoisyVerifierParams) -> tuple[float, float]:
    rho0, rho1 = params.false_positive_rate, params.false_negative_rate
    if not (0 <= rho0 < 1 and 0 <= rho1 < 1 and rho0 + rho1 < 1):
        raise ValueError(f"verifier noise rates need 0 <= rho_0, rho_1 and rho_0 + rho_1 < 1, got {rho0}, {rho1}")
    return rho0, rho1


def backward_corrected_rewards(rewards: Tensor, rho0: float, rho1: float) -> Tensor:
    """Unbiased surrogate r̂ = (r̃ − ρ_0) / (1 − ρ_0 − ρ_1) (arXiv 2510.00915, backward correction):
    E[r̂ | r*] = r* for r* ∈ {0, 1} ([N] → [N])."""
    return (rewards - rho0) / (1.0 - rho0 - rho1)


@ADVANTAGE_ESTIMATORS.register("noisy_backward")
def noisy_backward_advantage(inp: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, Tensor | None]:
    """Backward correction: the ``base`` estimator on r̂ = (r̃ − ρ_0)/(1 − ρ_0 − ρ_1)."""
    params = variant_params(cfg, "noisy_backward")
    if params.base in ("noisy_backward", "noisy_forward"):
        raise ValueError("algo.extra.noisy_backward.base must be a plain estimator (grpo, rloo, psr, ...)")
    rho0, rho1 = _noise_rates(params)
    rewards = backward_corrected_rewards(unit_rewards(inp.rewards, "noisy_backward"), rho0, rho1)
    return ADVANTAGE_ESTIMATORS.get(params.base)(dataclasses.replace(inp, rewards=rewards), cfg)


@ADVANTAGE_ESTIMATORS.register("noisy_forward")
def noisy_forward_advantage(inp: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, None]:
    """Forward correction (PGFC, arXiv 2510.00915): the score function weighted by w_{r̃},
    w_1 = ρ_1, w_0 = ρ_1 − 1, i.e. A_i = r̃_i − 1 + ρ_1 (needs only ρ_1).

    E[w | r* = 1] = (1−ρ_1)ρ_1 + ρ_1(ρ_1 − 1) = 0 and E[w | r* = 0] = ρ_0 + ρ_1 − 1, so the expected
    update is (1 − ρ_0 − ρ_1)·∇E[r*] up to the sign convention of minimising −A·log π.
    """
    _, rho1 = _noise_rates(variant_params(cfg, "noisy_forward"))
    r = unit_rewards(inp.rewards, "noisy_forward")
    return (r - 1.0 + rho1)[:, None] * inp.mask, None


# -- Beta-posterior baseline (AERO, MSSR) ---------------------------------------------------------------


@dataclass(frozen=True)
class BetaPosteriorParams:
    prior_alpha: float = 1.0
    """α_0 of the Beta prior on the prompt's success rate (uniform prior; INFERRED)."""
    prior_beta: float = 1.0
    """β_0 of the Beta prior (INFERRED)."""
    count_group: bool = True
    """Add the current group's successes Σ r_i and failures Σ (1 − r_i) to the posterior (AERO)."""
    count_history: bool = False
    """Add the prompt's pseudo-counts from earlier steps (MSSR's per-prompt posterior; needs the
    trainer's prompt history)."""
    normalize_std: bool = True
    """Divide by the posterior Bernoulli std √(p̃(1 − p̃)) (AERO INFERRED form); False: A = r − p̃ (MSSR)."""


declare_variant("beta_posterior", BetaPosteriorParams,
                needs=lambda p: ("prompt_history",) if p.count_history else ())


def beta_posterior_mean(successes: Tensor, failures: Tensor, alpha0: float, beta0: float) -> Tensor:
    """E[p] under Beta(α_0 + s, β_0 + f) ([N] → [N])."""
    return (alpha0 + successes) / (alpha0 + beta0 + successes + failures)


@ADVANTAGE_ESTIMATORS.register("beta_posterior")
def beta_posterior_advantage(inp: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, None]:
    """A_i = (r_i − p̃_g) / (√(p̃_g(1 − p̃_g)) + ε) with p̃_g the Beta posterior mean of the group's
    prompt (AERO §3 "Bayesian posterior to avoid zero-advantage dead zones"; MSSR's baseline with
    ``count_history`` and no std). All-correct / all-wrong groups keep a small, correctly signed
    advantage instead of 0. [INFERRED: neither paper's exact form was retrievable.]
    """
    p = variant_params(cfg, "beta_posterior")
    if p.prior_alpha <= 0 or p.prior_beta <= 0:
        raise ValueError(f"beta_posterior needs prior_alpha, prior_beta > 0, got {p.prior_alpha}, {p.prior_beta}")
    r = unit_rewards(inp.rewards, "beta_posterior").double()  # float64: exact group counts
    successes = torch.zeros_like(r)
    failures = torch.zeros_like(r)
    if p.count_group:
        mean, _, count = group_mean_std(r, inp.group_id)
        successes, failures = successes + mean * count, failures + (1.0 - mean) * count
    if p.count_history:
        if inp.prompt_successes is None or inp.prompt_failures is None:
            raise ValueError("beta_posterior with count_history needs the trainer's per-prompt history "
                             "(AdvantageInputs.prompt_successes / prompt_failures)")
        successes, failures = successes + inp.prompt_successes, failures + inp.prompt_failures
    posterior = beta_posterior_mean(successes, failures, p.prior_alpha, p.prior_beta)
    adv = r - posterior
    if p.normalize_std:
        adv = adv / ((posterior * (1.0 - posterior)).sqrt() + cfg.adv_eps)
    return adv.to(inp.rewards.dtype)[:, None] * inp.mask, None
