"""Rollout strategies: which rows a step samples and trains on (``algo.rollout_strategy``).

A strategy is two pure functions the trainer calls after the first ``rollout.group_size`` samples
per prompt were drawn and scored:

- ``more(outcome [N], example_index [N], num_examples, cfg) -> [E] long``: how many more samples
  each example gets now (all 0: sampling is done). The trainer samples, scores, appends and asks again.
- ``keep(outcome [N], example_index [N], cfg, generator) -> [N] bool``: the rows to train on
  (whole groups may shrink, never vanish).

``plain`` samples nothing more and keeps everything. ``aero`` is AERO ("Train Less, Learn More",
arXiv 2602.14338, §3; themoonlight summary): iterative rescue of zero-success prompts and
selective rejection of surplus failures. The trainer logs ``rollout/generated`` (every sample
drawn), so the compute saved against plain GRPO at equal updates is measured, not estimated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from mmrl.algos.config import AlgoConfig
from mmrl.algos.variants.params import declare_variant, variant_params
from mmrl.core.registry import Registry


@dataclass(frozen=True)
class RolloutStrategy:
    more: Callable[[Tensor, Tensor, int, AlgoConfig], Tensor]
    keep: Callable[[Tensor, Tensor, AlgoConfig, torch.Generator], Tensor]


ROLLOUT_STRATEGIES: Registry[RolloutStrategy] = Registry("rollout strategy")


def _nothing_more(outcome: Tensor, example_index: Tensor, num_examples: int, cfg: AlgoConfig) -> Tensor:
    return torch.zeros(num_examples, dtype=torch.long)


def _keep_all(outcome: Tensor, example_index: Tensor, cfg: AlgoConfig, generator: torch.Generator) -> Tensor:
    return torch.ones_like(outcome, dtype=torch.bool)


ROLLOUT_STRATEGIES.register("plain", RolloutStrategy(_nothing_more, _keep_all))


@dataclass(frozen=True)
class AeroParams:
    rescue_rollouts: int = 2
    """n_extra: samples added per round to a prompt without any success (AERO Strategy 1: 2)."""
    max_rollouts_per_prompt: int = 16
    """N_budget: a prompt's rescue stops at this many samples in total (INFERRED default: 2 × G = 16)."""
    rejection_ratio: float = 1.0
    """k: low-success prompts keep all c correct samples and m = max(1, round(k·c)) incorrect ones
    (AERO Strategy 3; k INFERRED)."""
    low_success_below: float = 0.5
    """Prompts with 0 < success rate < this are "low-success partial" and get selective rejection (AERO: 0.5)."""
    success_threshold: float = 1.0
    """A sample is a success when its outcome is ≥ this (1.0: fully correct)."""


declare_variant("aero", AeroParams)


def _per_example(values: Tensor, example_index: Tensor, num_examples: int) -> Tensor:
    return torch.zeros(num_examples, dtype=torch.float64).index_add_(0, example_index, values.double())


def aero_rescue(outcome: Tensor, example_index: Tensor, num_examples: int, cfg: AlgoConfig) -> Tensor:
    """Strategy 1 (iterative rescue): examples with no success yet and fewer than N_budget samples get
    min(n_extra, N_budget − count) more; others 0 ([N], [N] → [E] long)."""
    p = variant_params(cfg, "aero")
    if p.rescue_rollouts < 1 or p.max_rollouts_per_prompt < 1:
        raise ValueError("algo.extra.aero: rescue_rollouts and max_rollouts_per_prompt must be >= 1")
    count = _per_example(torch.ones_like(outcome), example_index, num_examples)
    successes = _per_example((outcome >= p.success_threshold).double(), example_index, num_examples)
    room = (p.max_rollouts_per_prompt - count).clamp(min=0)
    need = (successes == 0) & (room > 0)
    return torch.where(need, room.clamp(max=p.rescue_rollouts), torch.zeros_like(room)).long()


def aero_selective_rejection(outcome: Tensor, example_index: Tensor, cfg: AlgoConfig,
                             generator: torch.Generator) -> Tensor:
    """Strategy 3 (selective rejection): for examples with 0 < success rate < ``low_success_below``, keep
    all c successes and a uniformly drawn m = max(1, round(k·c)) of the failures (≤ their number);
    other examples keep every row ([N] → [N] bool)."""
    p = variant_params(cfg, "aero")
    if p.rejection_ratio < 0:
        raise ValueError(f"algo.extra.aero.rejection_ratio must be >= 0, got {p.rejection_ratio}")
    success = outcome >= p.success_threshold
    keep = torch.ones_like(outcome, dtype=torch.bool)
    for example in torch.unique(example_index).tolist():
        rows = (example_index == example).nonzero().squeeze(1)
        c = int(success[rows].sum())
        if not (0 < c < p.low_success_below * len(rows)):
            continue
        failures = rows[~success[rows]]
        m = min(len(failures), max(1, round(p.rejection_ratio * c)))
        chosen = failures[torch.randperm(len(failures), generator=generator)[:m]]
        keep[failures] = False
        keep[chosen] = True
    return keep


ROLLOUT_STRATEGIES.register("aero", RolloutStrategy(aero_rescue, aero_selective_rejection))
