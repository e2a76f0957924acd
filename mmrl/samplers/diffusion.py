"""Denoising steps as stochastic decisions: pure tensor functions returning the next sample, the
Gaussian it was drawn from, and its log-probability.

Every step here is x_next ~ N(μ, σ² I). The per-step log-prob is **averaged** over the sample's
dimensions, as both references do (DDPO ``ddim_with_logprob.py``; Flow-GRPO
``sd3_sde_with_logprob.py``), so one step weighs the same at any resolution. All coefficients are
per row ([B]), so a batch may mix timesteps: re-scoring evaluates every step of a trajectory in one
model call instead of one call per step.

Shapes: ``sample`` / ``model_output`` / ``noise`` are [B, *D] (D = C, H, W); coefficients [B].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


@dataclass(frozen=True)
class GaussianStep:
    """One denoising step: x_next = mean + std·z, and log N(x_next; mean, std² I) averaged over D."""

    next_sample: Tensor  # [B, *D]
    mean: Tensor  # [B, *D] μ_θ (with gradients when the model output has them)
    std: Tensor  # [B] σ of the step
    logp: Tensor  # [B] mean over D of log N(x_next | μ, σ²)


def _rows(coef: Tensor, like: Tensor) -> Tensor:
    """[B] → [B, 1, 1, ...] broadcastable against ``like`` [B, *D]."""
    return coef.reshape(-1, *([1] * (like.dim() - 1))).to(like.dtype)


def gaussian_logprob(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """log N(x; μ, σ² I) per dimension, averaged over all but the first axis ([B, *D] → [B]).

    −(x − μ)²/(2σ²) − log σ − log √(2π)   (DDPO / Flow-GRPO, mean over dims). ``x`` is treated as
    data: the gradient flows through μ (and σ) only.
    """
    s = _rows(std, mean)
    per_dim = -((x.detach() - mean) ** 2) / (2 * s**2) - torch.log(s) - LOG_SQRT_2PI
    return per_dim.flatten(1).mean(1)


# ------------------------------------------------------------------------------------------------
# DDIM (Song et al. 2021) with η > 0: the step DDPO (Black et al. 2023) treats as an action.

def ddim_variance(alpha_prod_t: Tensor, alpha_prod_prev: Tensor) -> Tensor:
    """σ_t²(η=1) = (1 − ᾱ_{t−1})/(1 − ᾱ_t) · (1 − ᾱ_t/ᾱ_{t−1})   (DDIM eq. 16; [B] → [B])."""
    return (1 - alpha_prod_prev) / (1 - alpha_prod_t) * (1 - alpha_prod_t / alpha_prod_prev)


def ddim_step(eps: Tensor, sample: Tensor, alpha_prod_t: Tensor, alpha_prod_prev: Tensor, eta: float,
              noise: Tensor | None = None, next_sample: Tensor | None = None,
              clip_sample: float | None = None) -> GaussianStep:
    """One DDIM step x_t → x_{t−1} with its log-prob (DDPO ``ddim_step_with_logprob``).

    x̂_0 = (x_t − √(1−ᾱ_t) ε̂)/√ᾱ_t, clipped to ±``clip_sample`` when given (as ``DDIMScheduler``
    with ``clip_sample=True``: the mean then uses the clipped x̂_0, and ε̂ stays the model's);
    μ = √ᾱ_{t−1} x̂_0 + √(1 − ᾱ_{t−1} − σ²) ε̂, σ = η σ_t (DDIM eq. 12).
    Sampling passes ``noise`` z (x_{t−1} = μ + σ z); re-scoring passes the recorded ``next_sample``.
    σ must be > 0 (η > 0 and ᾱ_{t−1} < 1: ``DDIMScheduler(set_alpha_to_one=False)``), else the
    log-prob is undefined; that is checked here.
    """
    if (next_sample is None) == (noise is None):
        raise ValueError("ddim_step needs exactly one of noise (sampling) or next_sample (re-scoring)")
    a_t, a_prev = _rows(alpha_prod_t, sample), _rows(alpha_prod_prev, sample)
    x0 = (sample - (1 - a_t).sqrt() * eps) / a_t.sqrt()
    if clip_sample is not None:
        x0 = x0.clamp(-clip_sample, clip_sample)
    std = eta * ddim_variance(alpha_prod_t, alpha_prod_prev).sqrt()  # [B]
    if not bool((std > 0).all()):
        raise ValueError("DDIM step with σ = 0 has no log-prob: use eta > 0 and a scheduler with "
                         "set_alpha_to_one=False (steps_offset=1), or exclude that step")
    s = _rows(std, sample)
    mean = a_prev.sqrt() * x0 + (1 - a_prev - s**2).clamp(min=0).sqrt() * eps
    if next_sample is None:
        next_sample = mean + s * noise
    return GaussianStep(next_sample, mean, std, gaussian_logprob(next_sample, mean, std))


def ddim_deterministic_step(eps: Tensor, sample: Tensor, alpha_prod_t: Tensor, alpha_prod_prev: Tensor,
                            clip_sample: float | None = None) -> Tensor:
    """DDIM with η = 0 (evaluation): x_{t−1} = √ᾱ_{t−1} x̂_0 + √(1 − ᾱ_{t−1}) ε̂."""
    a_t, a_prev = _rows(alpha_prod_t, sample), _rows(alpha_prod_prev, sample)
    x0 = (sample - (1 - a_t).sqrt() * eps) / a_t.sqrt()
    if clip_sample is not None:
        x0 = x0.clamp(-clip_sample, clip_sample)
    return a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps


# ------------------------------------------------------------------------------------------------
# Flow matching (x_σ = (1 − σ) x_0 + σ ε, velocity v = ε − x_0): Flow-GRPO's ODE → SDE step.

def flow_sde_std(sigma: Tensor, sigma_max: float, noise_level: float) -> Tensor:
    """s_t = a·√(σ / (1 − σ)), with σ = 1 replaced by σ_max in the denominator (Flow-GRPO; [B])."""
    return noise_level * (sigma / (1 - torch.where(sigma == 1, torch.full_like(sigma, sigma_max), sigma))).sqrt()


def flow_sde_step(velocity: Tensor, sample: Tensor, sigma: Tensor, sigma_next: Tensor, sigma_max: float,
                  noise_level: float, noise: Tensor | None = None,
                  next_sample: Tensor | None = None) -> GaussianStep:
    """One reverse-SDE step of a flow-matching model with the same marginals as its ODE
    (Flow-GRPO, Liu et al. 2025, eq. 9; ``sd3_sde_with_logprob``):

    dt = σ_next − σ (< 0),  s = flow_sde_std(σ),
    μ = x (1 + s²/(2σ) dt) + v (1 + s²(1 − σ)/(2σ)) dt,  x_next = μ + s √(−dt) z.
    """
    if (next_sample is None) == (noise is None):
        raise ValueError("flow_sde_step needs exactly one of noise (sampling) or next_sample (re-scoring)")
    dt = sigma_next - sigma  # [B]
    s_t = flow_sde_std(sigma, sigma_max, noise_level)  # [B]
    sig, s, d = _rows(sigma, sample), _rows(s_t, sample), _rows(dt, sample)
    mean = sample * (1 + s**2 / (2 * sig) * d) + velocity * (1 + s**2 * (1 - sig) / (2 * sig)) * d
    std = s_t * (-dt).sqrt()  # [B]
    if not bool((std > 0).all()):
        raise ValueError("flow SDE step with σ = 0 has no log-prob: use noise_level > 0 and σ_next < σ")
    if next_sample is None:
        next_sample = mean + _rows(std, sample) * noise
    return GaussianStep(next_sample, mean, std, gaussian_logprob(next_sample, mean, std))


def flow_ode_step(velocity: Tensor, sample: Tensor, sigma: Tensor, sigma_next: Tensor) -> Tensor:
    """Euler step of the probability-flow ODE (evaluation): x_next = x + (σ_next − σ) v."""
    return sample + _rows(sigma_next - sigma, sample) * velocity


# ------------------------------------------------------------------------------------------------
# Guidance

def cfg_combine(uncond: Tensor, cond: Tensor, scale: float) -> Tensor:
    """Classifier-free guidance (Ho & Salimans 2022): ε̂ = ε_u + g (ε_c − ε_u)."""
    return uncond + scale * (cond - uncond)


def rlg_combine(base: Tensor, tuned: Tensor, weight: float) -> Tensor:
    """RL guidance (arXiv 2508.21016, ``sd3_pipeline_with_rlg.py``): v = v_base + w (v_RL − v_base),
    each side already CFG-combined. w = 0 is the base model, 1 the RL model; 0 < w < 1
    interpolates, w > 1 extrapolates (equivalent to dividing the KL coefficient β by w)."""
    return base + weight * (tuned - base)
