"""DPH-RL mass-covering divergences to the initial policy on a rehearsal set ("The Choice of Divergence",
arXiv 2509.07430; code seamoke/DPH-RL ``dp_actor.py`` / ``core_algos.py``).

Before RL, the initial policy π_0 samples ``samples_per_prompt`` answers to ``rehearsal_prompts``
training prompts; prompts it always solves form the rehearsal set, stored with π_0's log-probs (no
online reference model). Every update adds ``coef`` × the token-mean of a per-token f-divergence
term on a minibatch of those rows, with u = π_θ/π_0 evaluated on π_0's own samples:

- ``forward_kl``: u − log u − 1 (clamped like ``low_var_kl``): E_{π_0}[·] = KL(π_0 ‖ π_θ), the
  mass-covering direction (DPH code: ``kl_penalty(logprob=log π_0, ref=log π_θ, "low_var_kl")``);
- ``js``: f(u) = u log u − (u + 1) log((u + 1)/2) (the Jensen–Shannon generator, ``js_low_var``);
- ``alpha``: f(u) = (u^{1−α} − (1−α) u − α) / (α(α − 1)) (α-divergence, α = 0.2 default).

Each is 0 with zero gradient at u = 1 and ≥ 0. Selected by ``algo.rehearsal_divergence``;
hyper-parameters in ``algo.extra.dph_rl``. The functions: ``(logp [N,T], logp_init [N,T], params) -> [N,T]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from mmrl.algos.variants.params import declare_variant
from mmrl.core.registry import Registry


@dataclass(frozen=True)
class RehearsalParams:
    coef: float = 0.05
    """Weight of the divergence term (DPH-RL: 0.01–0.05 forward KL, 0.05–0.2 JS)."""
    alpha: float = 0.2
    """α of the ``alpha`` divergence (DPH-RL default 0.2)."""
    rehearsal_prompts: int = 64
    """Training prompts π_0 is asked before RL (INFERRED for a procedural task: DPH pre-samples the whole
    training set)."""
    samples_per_prompt: int = 8
    """k answers per prompt; a prompt is kept when all k succeed (DPH-RL: k = 8)."""
    success_threshold: float = 1.0
    """A sample succeeds when its outcome is ≥ this."""
    rows_per_update: int = 16
    """Rehearsal rows drawn (seeded) for each optimizer step."""


declare_variant("dph_rl", RehearsalParams)

RehearsalDivergence = Callable[[Tensor, Tensor, RehearsalParams], Tensor]
REHEARSAL_DIVERGENCES: Registry[RehearsalDivergence] = Registry("rehearsal divergence")


@REHEARSAL_DIVERGENCES.register("forward_kl")
def forward_kl_term(logp: Tensor, logp_init: Tensor, params: RehearsalParams) -> Tensor:
    """u − log u − 1 with log u = log π_θ − log π_0 clamped to [−20, 20], the result to [−10, 10]."""
    log_u = (logp - logp_init).clamp(-20.0, 20.0)
    return (torch.expm1(log_u) - log_u).clamp(-10.0, 10.0)


@REHEARSAL_DIVERGENCES.register("js")
def js_term(logp: Tensor, logp_init: Tensor, params: RehearsalParams) -> Tensor:
    """u log u − (u + 1) log((u + 1)/2)."""
    log_u = (logp - logp_init).clamp(-20.0, 20.0)
    u = log_u.exp()
    return u * log_u - (u + 1.0) * torch.log((u + 1.0) / 2.0)


@REHEARSAL_DIVERGENCES.register("alpha")
def alpha_term(logp: Tensor, logp_init: Tensor, params: RehearsalParams) -> Tensor:
    """(u^{1−α} − (1−α) u − α) / (α(α − 1)), 0 < α < 1."""
    a = params.alpha
    if not 0 < a < 1:
        raise ValueError(f"algo.extra.dph_rl.alpha must be in (0, 1), got {a}")
    log_u = (logp - logp_init).clamp(-20.0, 20.0)
    return (torch.exp((1.0 - a) * log_u) - (1.0 - a) * log_u.exp() - a) / (a * (a - 1.0))
