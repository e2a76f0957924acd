"""A conditional flow-matching action head (Lipman et al. 2023, "Flow Matching for Generative Modeling"; Liu et
al. 2023, "Flow Straight and Fast: rectified flow"; as a VLA action expert: π0, Black et al. 2024, §IV).

A velocity network v_θ(x, τ, h) is conditioned on the observation features h and transports Gaussian noise
(τ = 0) to actions (τ = 1) along straight paths. Behaviour cloning regresses it onto the path's constant velocity:

    x_τ = (1 − τ) z + τ a,    L_FM = E_{a, z ~ N(0, I), τ ~ U(0, 1)}[ ‖v_θ(x_τ, τ, h) − (a − z)‖² / D ]

(a: the demonstrated decision in [−1, 1], D numbers; the squared norm is averaged over the D numbers, as the
other heads' BC losses are per dimension). Sampling integrates dx/dτ = v_θ(x, τ, h) from x_0 = z with K Euler
steps of size 1/K (π0 integrates with 10):

    x_{k+1} = x_k + (1/K) · v_θ(x_k, k/K, h),   k = 0 .. K − 1,   a = g_θ(h, z) = x_K

so an action is a deterministic, differentiable function g_θ(h, z) of the features and the noise: the gradient of
a critic reaches θ (and z) through it, and an actor may choose z itself (DSRL, :mod:`mmrl.algos.offpolicy.dsrl`).
The head has no tractable density (no log π). τ here is the flow's time; a rollout's *temperature* scales z.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn import functional as F


def flow_matching_loss(velocity: Tensor, noise: Tensor, actions: Tensor) -> Tensor:
    """The conditional flow-matching loss per row: mean_d (v − (a − z))² ([B, D] × 3 → [B]).

    >>> flow_matching_loss(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.5, -0.5]]), torch.tensor([[1.0, 0.5]]))
    tensor([0.6250])
    """
    return F.mse_loss(velocity, actions - noise, reduction="none").mean(-1)


def interpolate(noise: Tensor, actions: Tensor, tau: Tensor) -> Tensor:
    """The straight path's point x_τ = (1 − τ) z + τ a ([B, D], [B, D], [B] → [B, D]).

    >>> interpolate(torch.tensor([[0.0, 2.0]]), torch.tensor([[1.0, 0.0]]), torch.tensor([0.25]))
    tensor([[0.2500, 1.5000]])
    """
    return (1 - tau[:, None]) * noise + tau[:, None] * actions


def euler_integrate(velocity: Callable[[Tensor, Tensor], Tensor], x0: Tensor, steps: int) -> Tensor:
    """x_K of dx/dτ = velocity(x, τ) from x_0 = ``x0`` [B, D] at τ = 0 to τ = 1 in ``steps`` Euler steps
    (velocity(x [B, D], τ [B]) → [B, D]); differentiable in whatever ``velocity`` and ``x0`` depend on.

    dx/dτ = −x from 1 in two steps: 1 → 1 − ½ = ½ → ½ − ¼ = ¼ (the exact e^{−1} ≈ 0.368):

    >>> euler_integrate(lambda x, t: -x, torch.tensor([[1.0]]), 2)
    tensor([[0.2500]])
    """
    x, b = x0, x0.shape[0]
    for k in range(steps):
        x = x + velocity(x, torch.full((b,), k / steps, device=x0.device)) / steps
    return x


def time_embedding(tau: Tensor, width: int) -> Tensor:
    """Sinusoidal features of the flow time τ ∈ [0, 1] ([B] → [B, width]; width even; frequencies 1 .. 1000^{−1}
    of 1000 τ, the scale of π0's time embedding)."""
    half = width // 2
    freqs = torch.exp(-math.log(1000.0) * torch.arange(half, dtype=torch.float32, device=tau.device) / half)
    angle = (1000.0 * tau.float())[:, None] * freqs[None]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)


class FlowHead(nn.Module):
    """v_θ(x, τ, h) for decisions of ``decision_size`` numbers: MLP [h, x, emb(τ)] → W → GELU → W → GELU → D
    (the network size is INFERRED for the tiny VLA; π0's action expert is a 300 M-parameter transformer)."""

    TIME_FEATURES = 16

    def __init__(self, features: int, decision_size: int, width: int):
        super().__init__()
        self.decision_size = decision_size
        self.net = nn.Sequential(nn.Linear(features + decision_size + self.TIME_FEATURES, width), nn.GELU(),
                                 nn.Linear(width, width), nn.GELU(), nn.Linear(width, decision_size))

    def forward(self, x: Tensor, tau: Tensor, h: Tensor) -> Tensor:
        """v_θ(x [B, D], τ [B], h [B, F]) → [B, D] (float32)."""
        return self.net(torch.cat([h.float(), x.float(), time_embedding(tau, self.TIME_FEATURES)], dim=-1))

    def sample(self, h: Tensor, noise: Tensor, steps: int) -> Tensor:
        """g_θ(h, z): the Euler integral of v_θ(·, ·, h) from x_0 = ``noise`` [B, D] in ``steps`` steps → [B, D].
        Deterministic given (h, z), differentiable in θ, h and z."""
        return euler_integrate(lambda x, tau: self(x, tau, h), noise.to(h.device).float(), steps)

    def bc_loss(self, h: Tensor, actions: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """L_FM (module docstring) of demonstrated ``actions`` [B, D] under features ``h`` [B, F], with z ~ N(0, I)
        and τ ~ U(0, 1) from ``generator``: per-row loss [B] and the τ drawn [B]."""
        b = actions.shape[0]
        tau = torch.rand((b,), generator=generator).to(h.device)
        noise = torch.randn(actions.shape, generator=generator).to(h.device)
        target = actions.to(h.device).float()
        velocity = self(interpolate(noise, target, tau), tau, h)
        return flow_matching_loss(velocity, noise, target), tau
