"""A consistency-model action head (Song et al. 2023, "Consistency Models"; as a policy: Ding & Jin 2024,
"Consistency Models as a Rich and Efficient Policy Class for RL"; ConRFT, seed #90).

A consistency function maps a noised action x_σ = a + σ·z at any noise level σ ∈ [σ_min, σ_max] straight back
to the clean action, conditioned on the observation features h:

    f_θ(x, σ, h) = c_skip(σ) · x + c_out(σ) · F_θ(c_in(σ) · x, c_noise(σ), h)

with the EDM scalings shifted so that f is the identity at σ = σ_min (the boundary condition; Song et al. 2023,
app. C; Karras et al. 2022, "Elucidating the Design Space of Diffusion-Based Generative Models", table 1):

    c_skip(σ) = σ_d² / ((σ − σ_min)² + σ_d²),   c_out(σ) = (σ − σ_min) σ_d / √(σ² + σ_d²),
    c_in(σ) = 1 / √(σ² + σ_d²),                  c_noise(σ) = ¼ ln σ

An action is drawn in one step from pure noise, a = f_θ(σ_max z, σ_max, h), or in a few steps by re-noising
to lower levels and mapping back (Song et al. 2023, Alg. 1). The sampler is a deterministic, differentiable
function of (h, z): the critic's actor gradient flows through it; it has no tractable density (no log π).

Training (behaviour cloning) is the denoising form ConRFT uses: σ from the Karras discretisation (ρ = 7, N
levels), a Karras-weighted squared error of f_θ(a + σz, σ, h) against the demonstrated action a:

    L_BC = E_{a, z, n}[ λ(σ_n) · mean_d (f_θ(a + σ_n z, σ_n, h) − a)² ],   λ(σ) = 1/σ² + 1/σ_d²,
    σ_n = (σ_max^{1/ρ} + n/(N−1) · (σ_min^{1/ρ} − σ_max^{1/ρ}))^ρ,   n ~ U{0, ..., N − 2}
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F


@dataclass(frozen=True)
class NoiseLevels:
    """The consistency head's noise range and discretisation (defaults: Song et al. 2023 / EDM)."""

    sigma_min: float = 0.002
    """σ_min: the boundary level, where f is the identity (Song et al. 2023: 0.002)."""
    sigma_max: float = 80.0
    """σ_max: the level a one-step draw starts from (EDM: 80; actions live in [−1, 1])."""
    sigma_data: float = 0.5
    """σ_d: the data's scale in the EDM scalings and the loss weight (EDM: 0.5)."""
    rho: float = 7.0
    """ρ of the Karras discretisation (EDM: 7)."""
    levels: int = 40
    """N, the Karras discretisation's levels (ConRFT / CPQL: 40)."""


def boundary_scalings(sigma: Tensor, sigma_min: float, sigma_data: float) -> tuple[Tensor, Tensor, Tensor]:
    """(c_skip, c_out, c_in) at noise levels ``sigma`` [...]: EDM's scalings shifted by σ_min so that
    c_skip(σ_min) = 1 and c_out(σ_min) = 0 (f is the identity there; Song et al. 2023, app. C).

    >>> [round(float(c), 6) for c in boundary_scalings(torch.tensor(1.2), 0.2, 0.5)]  # √(1.44 + 0.25) = 1.3
    [0.2, 0.384615, 0.769231]
    """
    shifted = sigma - sigma_min
    c_skip = sigma_data ** 2 / (shifted ** 2 + sigma_data ** 2)
    c_out = shifted * sigma_data / torch.sqrt(sigma ** 2 + sigma_data ** 2)
    c_in = 1.0 / torch.sqrt(sigma ** 2 + sigma_data ** 2)
    return c_skip, c_out, c_in


def karras_sigmas(levels: NoiseLevels) -> Tensor:
    """The N noise levels σ_0 = σ_max > ... > σ_{N−1} = σ_min (Karras et al. 2022, eq. 5) → [N] float64."""
    ramp = torch.linspace(0, 1, levels.levels, dtype=torch.float64)
    lo, hi = levels.sigma_min ** (1 / levels.rho), levels.sigma_max ** (1 / levels.rho)
    return (hi + ramp * (lo - hi)) ** levels.rho


def karras_weight(sigma: Tensor, sigma_data: float) -> Tensor:
    """λ(σ) = SNR(σ) + 1/σ_d² = 1/σ² + 1/σ_d² (the "karras" weighting of the consistency-models code, which
    makes λ(σ)·E‖D(a + σz) − a‖² the EDM loss weight; Karras et al. 2022, eq. 8 and table 1)."""
    return sigma ** -2 + sigma_data ** -2


def sampling_sigmas(levels: NoiseLevels, steps: int) -> list[float]:
    """The ``steps`` levels a multi-step draw visits, from σ_max down the discretisation at evenly spaced
    indices (steps = 1: [σ_max]; Song et al. 2023, Alg. 1, with the levels taken from the training grid)."""
    sigmas = karras_sigmas(levels)
    return [float(sigmas[round(i * (levels.levels - 1) / steps)]) for i in range(steps)]


def noise_embedding(sigma: Tensor, width: int) -> Tensor:
    """Sinusoidal features of c_noise(σ) = ¼ ln σ ([B] → [B, width]; width even; frequencies 1 .. 1000^{−1})."""
    half = width // 2
    freqs = torch.exp(-math.log(1000.0) * torch.arange(half, dtype=torch.float32, device=sigma.device) / half)
    angle = (0.25 * torch.log(sigma.float()))[:, None] * freqs[None] * 100.0
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)


class ConsistencyHead(nn.Module):
    """f_θ(x, σ, h) for decisions of ``decision_size`` numbers: F_θ = MLP [h, c_in·x, emb(c_noise)] → W → GELU
    → W → GELU → D (the network size is INFERRED for the tiny VLA; ConRFT's head is a 256-256 MLP)."""

    NOISE_FEATURES = 16

    def __init__(self, features: int, decision_size: int, width: int, levels: NoiseLevels):
        super().__init__()
        self.levels, self.decision_size = levels, decision_size
        self.net = nn.Sequential(nn.Linear(features + decision_size + self.NOISE_FEATURES, width), nn.GELU(),
                                 nn.Linear(width, width), nn.GELU(), nn.Linear(width, decision_size))

    def forward(self, x: Tensor, sigma: Tensor, h: Tensor) -> Tensor:
        """f_θ(x [B, D], σ [B], h [B, F]) → [B, D] (float32)."""
        c_skip, c_out, c_in = (c[:, None].float() for c in boundary_scalings(sigma, self.levels.sigma_min,
                                                                             self.levels.sigma_data))
        inner = self.net(torch.cat([h.float(), c_in * x, noise_embedding(sigma, self.NOISE_FEATURES)], dim=-1))
        return c_skip * x + c_out * inner

    def sample(self, h: Tensor, steps: int, generator: torch.Generator, temperature: float = 1.0) -> Tensor:
        """Decisions [B, D] in ``steps`` evaluations: x = τ σ_max z, a = f(x, σ_max); then per further level σ,
        x = a + τ √(σ² − σ_min²) z, a = f(x, σ). τ scales every noise draw (τ = 0: the noise's mode, a
        deterministic greedy action; INFERRED, the papers sample at τ = 1). Differentiable in θ."""
        b, d, sigma_min = h.shape[0], self.decision_size, self.levels.sigma_min
        action = None
        for k, sigma in enumerate(sampling_sigmas(self.levels, steps)):
            noise = torch.randn((b, d), generator=generator).to(h.device) * temperature
            scale = sigma if k == 0 else math.sqrt(max(sigma ** 2 - sigma_min ** 2, 0.0))
            x = noise * scale if action is None else action + noise * scale
            action = self(x, torch.full((b,), sigma, device=h.device), h)
        return action

    def bc_loss(self, h: Tensor, actions: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """ConRFT's consistency BC loss (module docstring) of demonstrated ``actions`` [B, D] under features
        ``h`` [B, F]: per-row λ(σ)·mean_d(f − a)² [B] and the σ drawn [B]."""
        sigmas = karras_sigmas(self.levels)
        index = torch.randint(self.levels.levels - 1, (actions.shape[0],), generator=generator)
        sigma = sigmas[index].to(device=h.device, dtype=torch.float32)
        noise = torch.randn(actions.shape, generator=generator).to(h.device)
        target = actions.to(h.device).float()
        denoised = self(target + noise * sigma[:, None], sigma, h)
        return consistency_bc_loss(denoised, target, sigma, self.levels.sigma_data), sigma


def consistency_bc_loss(denoised: Tensor, actions: Tensor, sigma: Tensor, sigma_data: float) -> Tensor:
    """λ(σ) · mean_d (denoised − a)², per row ([B, D], [B, D], [B] → [B]).

    >>> consistency_bc_loss(torch.tensor([[0.5, -0.5]]), torch.tensor([[0.0, 0.0]]), torch.tensor([1.0]), 0.5)
    tensor([1.2500])
    """
    return karras_weight(sigma, sigma_data) * F.mse_loss(denoised, actions, reduction="none").mean(-1)
