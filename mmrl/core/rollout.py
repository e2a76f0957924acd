"""The Rollout contract: what a policy's sampler hands to the trainer.

A rollout is N sampled trajectories, each a sequence of T decisions (padded; ``mask`` marks the
real ones). What a decision is depends on the policy: a response token (VLM, planner text),
an action token or action dimension per env step (VLA), a denoising step (diffusion), a token of
a scale (VAR). The trainer only ever sees the tensors below; ``payload`` carries whatever the
policy needs to re-score the same decisions with gradients (token ids, latents, observations).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
import torch
from torch import Tensor

P = TypeVar("P", bound="Payload")


class Payload(Protocol):
    """Policy-specific batch data with leading dimension N (rows of the rollout)."""

    def select(self: P, index: Tensor) -> P:
        """Rows ``index`` ([k] long) of this payload."""

    @classmethod
    def concat(cls: type[P], parts: Sequence[P]) -> P:
        """Stack payloads of several rollouts (padding as the policy needs)."""


def derive_seed(*parts: int) -> int:
    """A 32-bit seed from integer parts (run seed, step, round, ...), independent across different parts."""
    return int(np.random.SeedSequence([p & 0xFFFFFFFF for p in parts]).generate_state(1)[0])


@dataclass(frozen=True)
class SamplingParams:
    """How decisions are drawn. ``temperature == 0`` means greedy (evaluation only)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 32


@dataclass(frozen=True)
class Rollout:
    logp: Tensor  # [N, T] behaviour log-probs log π_old(decision) (float32)
    mask: Tensor  # [N, T] float {0,1}: 1 for real decisions, 0 for padding
    group_id: Tensor  # [N] long: rows sampled from the same example share an id
    example_index: Tensor  # [N] long: index of the example (in the batch) each row answers
    outputs: list[Any]  # N decoded outputs, what ``task.reward(example, output)`` scores
    payload: Any  # a :class:`Payload` with what ``policy.forward`` needs to re-score
    policy_version: int  # optimizer steps the sampling weights had taken
    values: Tensor | None = None  # [N, T] critic values at sampling time (PPO with GAE)
    step_rewards: Tensor | None = None  # [N, T] per-decision env rewards (env tasks)
    dones: Tensor | None = None  # [N, T] 1.0 where an episode ended after the decision
    stats: dict[str, float] = field(default_factory=dict)  # sampler measurements logged with the step
    # (e.g. perf/weight_sync_s); summed when rollouts are concatenated

    def __post_init__(self) -> None:
        n, t = self.logp.shape
        if self.mask.shape != (n, t):
            raise ValueError(f"mask shape {tuple(self.mask.shape)} != logp shape {(n, t)}")
        for name in ("group_id", "example_index"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"{name} must have shape [{n}], got {tuple(getattr(self, name).shape)}")
        if len(self.outputs) != n:
            raise ValueError(f"outputs has {len(self.outputs)} items for {n} rows")
        for name in ("values", "step_rewards", "dones"):
            value = getattr(self, name)
            if value is not None and value.shape != (n, t):
                raise ValueError(f"{name} shape {tuple(value.shape)} != {(n, t)}")

    @property
    def num_rows(self) -> int:
        return self.logp.shape[0]

    @property
    def lengths(self) -> Tensor:
        """Number of real decisions per row ([N] long)."""
        return self.mask.sum(1).long()

    def select(self, index: Tensor) -> Rollout:
        """The rows ``index`` ([k] long), payload included."""
        index = index.long()

        def rows(x: Tensor | None) -> Tensor | None:
            return None if x is None else x[index]

        return Rollout(
            logp=self.logp[index], mask=self.mask[index], group_id=self.group_id[index],
            example_index=self.example_index[index], outputs=[self.outputs[i] for i in index.tolist()],
            payload=self.payload.select(index), policy_version=self.policy_version,
            values=rows(self.values), step_rewards=rows(self.step_rewards), dones=rows(self.dones),
            stats=dict(self.stats),
        )

    @staticmethod
    def concat(parts: Sequence[Rollout]) -> Rollout:
        """Stack rollouts row-wise, right-padding the decision axis to the longest T."""
        if not parts:
            raise ValueError("cannot concatenate zero rollouts")
        versions = {p.policy_version for p in parts}
        if len(versions) != 1:
            raise ValueError(f"rollouts from different policy versions {sorted(versions)} cannot be mixed")
        t_max = max(p.logp.shape[1] for p in parts)

        def cat(name: str) -> Tensor | None:
            tensors = [getattr(p, name) for p in parts]
            if all(x is None for x in tensors):
                return None
            if any(x is None for x in tensors):
                raise ValueError(f"{name} is set in some rollouts but not in others")
            return torch.cat([torch.nn.functional.pad(x, (0, t_max - x.shape[1])) for x in tensors])

        first = parts[0]
        return Rollout(
            logp=cat("logp"), mask=cat("mask"),
            group_id=torch.cat([p.group_id for p in parts]),
            example_index=torch.cat([p.example_index for p in parts]),
            outputs=[o for p in parts for o in p.outputs],
            payload=type(first.payload).concat([p.payload for p in parts]),
            policy_version=first.policy_version,
            values=cat("values"), step_rewards=cat("step_rewards"), dones=cat("dones"),
            stats={k: sum(p.stats.get(k, 0.0) for p in parts) for k in sorted({k for p in parts for k in p.stats})},
        )

    def replace(self, **changes: Any) -> Rollout:
        return dataclasses.replace(self, **changes)


def draw_per_example(draw: Callable[[Sequence[Any], int, SamplingParams, int], Rollout], examples: Sequence[Any],
                     group_size: int, sampling: SamplingParams, seeds: Sequence[int]) -> Rollout:
    """``draw(examples, group_size, sampling, seed)`` once per example with that example's seed, the rows
    renumbered to the examples' positions: what an example's group is does not depend on the others."""
    parts = []
    for i, (example, seed) in enumerate(zip(examples, seeds, strict=True)):
        part = draw([example], group_size, sampling, seed)
        parts.append(part.replace(example_index=part.example_index + i, group_id=part.group_id + i))
    return Rollout.concat(parts)
