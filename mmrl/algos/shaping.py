"""Advantage-shaping hooks: ``(A [N,T], ShapingContext, AlgoConfig) -> A' [N,T]``.

Hooks run in the order the recipe lists them (``algo.shaping``), after the advantage estimator
and before the update. Variants from the literature (focal scaling, NSR, ACE, RL-ZVP, ...) are
new registered functions here, never new trainers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from mmrl.algos.config import AlgoConfig
from mmrl.core.registry import Registry


@dataclass(frozen=True)
class ShapingContext:
    outcome: Tensor  # [N] verifiable outcome score (before reward shaping)
    rewards: Tensor  # [N] shaped reward the estimator used
    group_id: Tensor  # [N]
    mask: Tensor  # [N, T]
    logp_old: Tensor  # [N, T] behaviour log-probs
    ref_logp: Tensor | None  # [N, T] reference log-probs when a reference model is kept
    entropy: Tensor | None  # [N, T] behaviour-policy entropy when the policy reports it


ShapingFn = Callable[[Tensor, ShapingContext, AlgoConfig], Tensor]
SHAPING_HOOKS: Registry[ShapingFn] = Registry("advantage shaping hook")


@SHAPING_HOOKS.register("adv_clip")
def clip_advantages(adv: Tensor, ctx: ShapingContext, cfg: AlgoConfig) -> Tensor:
    """Clamp advantages to [−c, c] with c = ``adv_clip`` (DDPO, Black et al. 2023: c = 5)."""
    if cfg.adv_clip is None or cfg.adv_clip <= 0:
        raise ValueError("the adv_clip hook needs algo.adv_clip > 0")
    return adv.clamp(-cfg.adv_clip, cfg.adv_clip) * ctx.mask
