"""Parameter-space noise for rollouts (PSN-RLVR, arXiv 2602.02555; Plappert et al. 2018 for the idea).

Rollouts are drawn from θ̃ = θ + ε, ε ~ N(0, σ² I) (one draw per step, so the exploration is
consistent along a trajectory), and π_θ is trained on them with truncated importance sampling
w_t = min(π_θ(y_t) / π_θ̃(y_t), C): the trainer's ``recompute_logp_old`` gives log π_θ, the rollout
carries log π_θ̃, and ``algo.tis_cap`` is C (``truncated_is_weights``). Enabled by
``rollout.param_noise_std`` = σ > 0. PSN's adaptive σ scheduler (semantic diversity + self-certainty)
is not implemented: σ is fixed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


@contextlib.contextmanager
@torch.no_grad()
def perturbed_parameters(module: nn.Module, std: float, seed: int) -> Iterator[None]:
    """Within the context, every trainable parameter p of ``module`` is p + σ·z, z ~ N(0, I) drawn from
    ``seed`` (on the CPU, so the draw does not depend on the device); on exit the exact original
    values are restored (bitwise). σ = 0 leaves the module untouched."""
    if std < 0:
        raise ValueError(f"rollout.param_noise_std must be >= 0, got {std}")
    if std == 0:
        yield
        return
    generator = torch.Generator().manual_seed(seed)
    params = [p for p in module.parameters() if p.requires_grad]
    saved = [p.detach().clone() for p in params]
    for p in params:
        noise = torch.randn(p.shape, generator=generator, dtype=torch.float32)
        p.add_(noise.to(device=p.device, dtype=p.dtype), alpha=std)
    try:
        yield
    finally:
        for p, original in zip(params, saved):
            p.copy_(original)
