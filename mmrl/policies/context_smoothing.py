"""Context-Smoothed Pre-training (CSP) and Timestep-Modulated RL (TMRL) for the tiny VLA (seed #98).

CSP noises the policy's *inputs* (its context: the image and / or the proprioception), not its actions, with
one forward-diffusion step at a level t ∈ {0, ..., K − 1} and conditions the policy on t:

    x_t = √ᾱ_t · x + √(1 − ᾱ_t) · ε,   ε ~ N(0, I),   ᾱ_0 = 1 (t = 0: the exact context)

Behaviour cloning draws t ~ U{0, ..., K − 1} per sample, so one network holds a continuum from precise imitation
(t = 0) to a broad action distribution (large t: the policy cannot see where the object is). TMRL then lets
the agent choose t per decision, a categorical π(t | x) on the clean context, so that the policy gradient trains
its own exploration level: log π(decision) = log π(a | x_t, t) + log π(t | x).

Schedules over the K levels (level k sits at the fraction u_k = k / K of the diffusion's horizon):

- ``linear``: the schedule of the paper's code (β linear from 1e-4 to 0.02 over 100 diffusion steps, DDPM's
  form, Ho et al. 2020), ᾱ(k) = Π_{i=1}^{n_k} (1 − β_i) with n_k = round(100 · k / K): mild at the top
  (ᾱ ≈ 0.44 at n = 90), so even the noisiest level keeps most of the signal.
- ``cosine``: Nichol & Dhariwal 2021 (eq. 17), ᾱ(u) = f(u) / f(0), f(u) = cos²((u + s)/(1 + s) · π/2), s = 0.008:
  reaches ᾱ ≈ 0.02 at u = 0.9 (almost pure noise at the top level).

Images are noised in [−1, 1] (the diffusion's data scale): the encoder reads x/2 = image/255 − 0.5, so
x_t/2 = √ᾱ_t · (x/2) + ½ √(1 − ᾱ_t) · ε; proprioception (already in [−1, 1]) is noised as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from mmrl.core.typed import ConfigError

LINEAR_BETAS = (1e-4, 0.02)
"""β_1 and β_T of the linear schedule (DDPM, Ho et al. 2020; the TMRL code's context schedule)."""
LINEAR_HORIZON = 100
"""Diffusion steps the linear schedule spans (the TMRL code's ``num_train_steps``)."""
COSINE_OFFSET = 0.008
"""s of the cosine schedule (Nichol & Dhariwal 2021, §3.2)."""
CONTEXT_INPUTS = ("image", "proprio")


@dataclass(frozen=True)
class ContextSmoothing:
    """``policy.args.context_smoothing``: which inputs CSP noises, over how many levels, on which schedule."""

    levels: int = 10
    """K: timesteps t ∈ {0, ..., K − 1}; t = 0 is the exact context (K = 1: CSP off in all but the embedding)."""
    schedule: Literal["linear", "cosine"] = "linear"
    """ᾱ over the levels: the TMRL code's linear β schedule (mild) or the cosine schedule (to almost pure noise)."""
    inputs: tuple[Literal["image", "proprio"], ...] = ("image", "proprio")
    """The context that is noised (the instruction is never noised: INFERRED, the paper noises states,
    goals or point clouds)."""

    def __post_init__(self) -> None:
        if self.levels < 1:
            raise ConfigError(f"policy.args.context_smoothing.levels must be >= 1, got {self.levels}")
        if not self.inputs or len(set(self.inputs)) != len(self.inputs):
            raise ConfigError(f"policy.args.context_smoothing.inputs must name each of {list(CONTEXT_INPUTS)} at "
                              f"most once and at least one, got {list(self.inputs)}")


def alpha_bars(levels: int, schedule: str) -> Tensor:
    """ᾱ_k for k = 0 .. levels − 1 ([K] float32, ᾱ_0 = 1 exactly, decreasing); see the module docstring."""
    if schedule == "linear":
        betas = torch.linspace(*LINEAR_BETAS, LINEAR_HORIZON, dtype=torch.float64)
        cumulative = torch.cat([torch.ones(1, dtype=torch.float64), torch.cumprod(1 - betas, 0)])  # [T + 1]
        steps = [round(LINEAR_HORIZON * k / levels) for k in range(levels)]
        return cumulative[steps].float()
    if schedule == "cosine":
        def f(u: float) -> float:
            return math.cos((u + COSINE_OFFSET) / (1 + COSINE_OFFSET) * math.pi / 2) ** 2
        return torch.tensor([f(k / levels) / f(0.0) for k in range(levels)], dtype=torch.float32)
    raise ConfigError(f"policy.args.context_smoothing.schedule must be 'linear' or 'cosine', got {schedule!r}")


def noise_context(x: Tensor, alpha_bar: Tensor, noise: Tensor, scale: float = 1.0) -> Tensor:
    """x_t = √ᾱ · x + scale · √(1 − ᾱ) · ε for ``x`` [B, ...], ``alpha_bar`` [B], ``noise`` like ``x``; ``scale``
    is the data's half-range relative to the diffusion's [−1, 1] (½ for images stored as image/255 − 0.5).
    ᾱ = 1 returns ``x`` exactly (√0 · ε = 0)."""
    view = (-1,) + (1,) * (x.dim() - 1)
    return alpha_bar.sqrt().view(view) * x + scale * (1 - alpha_bar).sqrt().view(view) * noise


def context_noise(seeds: Tensor, shape: tuple[int, ...], device: torch.device) -> Tensor:
    """ε [B, *shape] with row b drawn from a generator seeded by ``seeds[b]``: a decision's noise is
    regenerated exactly from the one seed the rollout stores (re-scoring sees the same x_t as sampling)."""
    rows = [torch.randn(shape, generator=torch.Generator().manual_seed(int(s))) for s in seeds.tolist()]
    return (torch.stack(rows) if rows else torch.zeros(0, *shape)).to(device)
