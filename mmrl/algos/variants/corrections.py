"""CIPO: the policy's own failed samples as correction prompts (docs/algorithms.md, "Paper variants").

Correction-Oriented Policy Optimization (seed #95, "Learning from Failures: Correction-Oriented Policy
Optimization with Verifiable Rewards", arXiv 2605.14539): failed on-policy trajectories become correction
samples — the prompt, the failed answer, and a request to correct it — which the policy answers and which are
optimised with the verifier's reward *together with* the ordinary RLVR groups, with no external signal (no
teacher, no feedback text beyond a fixed request). Registered as the ``cipo`` rollout hook (``algo.cipo``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mmrl.algos.hooks import ROLLOUT_HOOKS, HookContext, HookSpec, Round, RolloutHook
from mmrl.algos.variants.distillation import encodable
from mmrl.algos.variants.params import declare_variant, variant_params
from mmrl.core.contracts import FollowUp
from mmrl.core.rollout import Rollout, derive_seed
from mmrl.core.scored import Scored
from mmrl.core.typed import ConfigError


@dataclass(frozen=True)
class CipoParams:
    success_threshold: float = 1.0
    """A sample fails when its verifier score is below this (binary verifiers: 1)."""
    max_corrections: int = 4
    """Failed samples turned into correction prompts per round and process; each is sampled as a group of
    ``rollout.samples_per_group`` (INFERRED budget)."""
    instruction: str = "\nThe answer above is wrong. Find the mistake and give the correct answer.\n"
    """The user turn after the failed answer; its text must be in the policy's vocabulary (INFERRED wording)."""


declare_variant("cipo", CipoParams)


def correction_candidates(outcome: Tensor, example_index: Tensor, num_groups: int, threshold: float,
                          limit: int) -> list[int]:
    """Rows (positions in the round) whose failure becomes a correction prompt, at most ``limit``: one failed row
    per group, groups with the highest success rate first (ties: group order), each group's first failure.
    Failures of prompts the policy sometimes solves are the most correctable (the paper's difficulty-aware
    preference by sampling accuracy; the ordering is INFERRED)."""
    failed = outcome < threshold  # [N]
    rate = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, example_index, (~failed).double())
    size = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, example_index, torch.ones_like(outcome).double())
    rate = rate / size.clamp(min=1)
    first_failure: dict[int, int] = {}
    for row, (g, bad) in enumerate(zip(example_index.tolist(), failed.tolist())):
        if bad and g not in first_failure:
            first_failure[g] = row
    order = sorted(first_failure, key=lambda g: (-float(rate[g]), g))
    return [first_failure[g] for g in order[:limit]]


def with_new_groups(part: Scored, bases: list[Any], more: Scored) -> Scored:
    """``part``'s rows followed by ``more``'s, which answer ``bases`` appended as new examples (new groups)."""
    return Scored(Rollout.concat([part.rollout, more.rollout]), part.examples + bases, part.results + more.results,
                  torch.cat([part.outcome, more.outcome]), torch.cat([part.rewards, more.rewards]))


class Cipo(RolloutHook):
    """CIPO (seed #95): after scoring, up to ``max_corrections`` failed rows of the round
    (:func:`correction_candidates`) each give a correction prompt, a :class:`FollowUp` of the example with the
    failed answer as the assistant's turn and ``instruction`` as the user's; the policy samples a group of
    ``rollout.samples_per_group`` corrections for each, scored by the example's own verifier. Each correction
    prompt is a new group (its own baseline) trained with the round's groups by the same objective, so the
    policy learns to answer and to correct itself at once; only the correction's tokens are decisions.

    INFERRED (the abstract names the mechanism only): the correction request text, the budget and which failures
    are chosen; the paper's adaptive replay and risk-averse reward shaping are not built."""

    def __init__(self, ctx: HookContext):
        self.ctx, self.params = ctx, variant_params(ctx.cfg.algo, "cipo")
        if self.params.max_corrections < 1:
            raise ConfigError(f"algo.extra.cipo.max_corrections must be >= 1, got {self.params.max_corrections}")
        probe = ctx.task.sample_batch("train", 1, np.random.default_rng(0))[0]
        answer = ctx.task.reference_output(probe)
        encodable(ctx.policy, FollowUp(probe, (("assistant", str(answer)), ("user", self.params.instruction))),
                  answer, "algo.extra.cipo.instruction")
        self.prompts = self.samples = self.fixed = 0

    def refine(self, part: Scored, round_: Round) -> Scored:
        p, rollout = self.params, part.rollout
        rows = correction_candidates(part.outcome, rollout.example_index, len(part.examples), p.success_threshold,
                                     p.max_corrections)
        if not rows:
            return part
        bases = [part.examples[int(rollout.example_index[i])] for i in rows]
        prompts = [FollowUp(base, (("assistant", str(rollout.outputs[i])), ("user", p.instruction)))
                   for base, i in zip(bases, rows)]
        drawn = round_.draw(prompts, self.ctx.cfg.rollout.samples_per_group, round_.sampling,
                            derive_seed(round_.seed, 95))
        index = drawn.example_index + len(part.examples)
        examples = part.examples + bases
        corrections = self.ctx.score(drawn.replace(example_index=index, group_id=index.clone()), examples)
        self.prompts += len(rows)
        self.samples += corrections.rollout.num_rows
        self.fixed += int((corrections.outcome >= p.success_threshold).sum())
        return with_new_groups(part, bases, corrections)

    def metrics(self) -> dict[str, float]:
        engine = self.ctx.engine
        samples = engine.sum(self.samples)
        metrics = {"rollout/cipo_prompts": engine.sum(self.prompts),
                   "rollout/cipo_fixed_frac": engine.sum(self.fixed) / max(samples, 1.0)}
        self.prompts = self.samples = self.fixed = 0
        return metrics


ROLLOUT_HOOKS.register("cipo", HookSpec(lambda cfg: cfg.algo.cipo, Cipo))
