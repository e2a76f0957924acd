"""A step's scored rollouts: the rows, the examples they answer, and their verifiable outcomes.

:class:`Scored` is what the trainer's collection phase hands to the advantage estimator, and what
rollout hooks (``mmrl.algos.hooks``) receive and return when they add, drop or re-draw rows.
Its operations keep whole groups together and renumber ``example_index`` / ``group_id`` so that
row ``i`` always answers ``examples[example_index[i]]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mmrl.core.contracts import RewardResult
from mmrl.core.rollout import Rollout


@dataclass
class Scored:
    """Scored rollout rows of one process."""

    rollout: Rollout
    examples: list[Any]
    results: list[RewardResult]
    outcome: Tensor  # [N] verifiable scores
    rewards: Tensor  # [N] scores after reward shaping (e.g. the overlong penalty)
    stats: dict[str, float] = field(default_factory=dict)
    # [N] per-row estimator inputs set by rollout hooks' ``finish`` (``AdvantageInputs`` field name → tensor)
    row_inputs: dict[str, Tensor] = field(default_factory=dict)

    def select(self, rows: Tensor) -> Scored:
        """Rows ``rows`` (bool [N]) with the examples they answer, renumbered in example order."""
        index = rows.nonzero().squeeze(1)
        rollout = self.rollout.select(index)
        used = sorted(set(rollout.example_index.tolist()))
        remap = {old: new for new, old in enumerate(used)}
        example_index = torch.tensor([remap[i] for i in rollout.example_index.tolist()], dtype=torch.long)
        rollout = rollout.replace(example_index=example_index, group_id=example_index.clone())
        return Scored(rollout, [self.examples[i] for i in used], [self.results[i] for i in index.tolist()],
                      self.outcome[index], self.rewards[index])

    def extend(self, more: Scored) -> Scored:
        """These rows followed by ``more``'s, which answer the same ``examples`` (same example indices)."""
        return Scored(Rollout.concat([self.rollout, more.rollout]), self.examples, self.results + more.results,
                      torch.cat([self.outcome, more.outcome]), torch.cat([self.rewards, more.rewards]))

    @staticmethod
    def merge(parts: Sequence[Scored], num_groups: int) -> Scored:
        """Concatenate parts that answer different examples and keep the first ``num_groups`` groups."""
        parts = [p for p in parts if p.examples]
        offsets = np.cumsum([0] + [len(p.examples) for p in parts])
        rollout = Rollout.concat([p.rollout.replace(example_index=p.rollout.example_index + int(o),
                                                    group_id=p.rollout.group_id + int(o))
                                  for p, o in zip(parts, offsets)])
        merged = Scored(rollout, [e for p in parts for e in p.examples], [r for p in parts for r in p.results],
                        torch.cat([p.outcome for p in parts]), torch.cat([p.rewards for p in parts]))
        return merged.select(rollout.example_index < num_groups)


def finite_outcomes(outcome: Tensor, group_id: Tensor) -> tuple[Tensor, int]:
    """``outcome`` [N] with each non-finite score replaced by the mean of its group's finite scores
    (0 when it has none), and how many were replaced. A replaced row then carries no signal for a
    group-relative estimator, and the rest of its group keeps training; a NaN reward never reaches
    the loss."""
    bad = ~torch.isfinite(outcome)
    if not bad.any():
        return outcome, 0
    fixed = outcome.clone()
    for group in group_id[bad].unique().tolist():
        members = group_id == group
        finite = outcome[members & ~bad]
        fixed[members & bad] = finite.mean() if finite.numel() else 0.0
    return fixed, int(bad.sum())


def reward_stats(batch: Scored, engine: Any, shaped: bool) -> dict[str, float]:
    """``reward/mean``, ``reward/std`` and each component ``reward/<name>`` over all processes' rows
    (``reward/shaped_mean`` too when ``shaped``: rewards differ from the verifiable outcome)."""
    n = len(batch.results)
    total = engine.sum(n)
    mean = engine.sum(batch.outcome.sum()) / total
    stats = {"reward/mean": mean,
             "reward/std": math.sqrt(max(engine.sum(((batch.outcome - mean) ** 2).sum()) / total, 0.0))}
    for name in sorted(batch.results[0].components) if batch.results else []:
        stats[f"reward/{name}"] = engine.sum(sum(r.components.get(name, 0.0) for r in batch.results)) / total
    if shaped:
        stats["reward/shaped_mean"] = engine.sum(batch.rewards.sum()) / total
    return stats
