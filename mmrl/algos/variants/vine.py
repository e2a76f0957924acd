"""Vine sampling for Polychromic PPO: sets of continuations re-rolled from states inside sampled answers.

Polychromic PPO ("Polychromic Objectives for Reinforcement Learning", arXiv 2509.25424, seed #59) scores
*sets* of trajectories by reward × diversity; its vine sampling draws the sets from a common intermediate
state of a rollout, so that a set's members differ only after that state. Here a state of a text answer is its
first t characters: the policy resumes after them (:class:`~mmrl.core.contracts.Prefixed`: the prefix is
context, not decisions) and the task scores prefix + continuation. Each state's continuations are a new group
whose advantage is the ``polychromic`` estimator's set-level one (``group_estimators.set_marginal_advantage``),
trained on the continuation tokens only. Registered as the ``polychromic_vine`` rollout hook, turned on by
``algo.extra.polychromic.vine_states`` (hyper-parameters in ``PolychromicParams``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mmrl.algos.hooks import ROLLOUT_HOOKS, HookContext, HookSpec, Round, RolloutHook
from mmrl.algos.variants.corrections import with_new_groups
from mmrl.algos.variants.params import variant_params
from mmrl.core.contracts import Prefixed
from mmrl.core.rollout import SamplingParams, derive_seed
from mmrl.core.scored import Scored
from mmrl.core.typed import ConfigError


def branch_states(outputs: list[Any], example_index: torch.Tensor, num_groups: int, limit: int,
                rng: np.random.Generator) -> list[tuple[int, int]]:
    """Up to ``limit`` branch states ``(row, t)``, at most one per group: the answer ``outputs[row]`` cut after
    its first t characters, 1 ≤ t < len(answer) (a state strictly inside the answer: not the prompt, not the
    finished answer). The groups are drawn uniformly without replacement among those with an answer of two or
    more characters, then a row of the group uniformly among those answers, then t uniformly (all INFERRED: the
    abstract does not say how states are chosen). Only ``rng`` is used; results come in group order."""
    rows_of: dict[int, list[int]] = {}
    for row, (group, output) in enumerate(zip(example_index.tolist(), outputs)):
        if len(str(output)) >= 2:
            rows_of.setdefault(group, []).append(row)
    groups = [g for g in range(num_groups) if g in rows_of]
    chosen = sorted(rng.choice(len(groups), size=min(limit, len(groups)), replace=False).tolist()) if groups else []
    states = []
    for k in chosen:
        rows = rows_of[groups[k]]
        row = rows[int(rng.integers(len(rows)))]
        states.append((row, int(rng.integers(1, len(str(outputs[row]))))))
    return states


def check_resumable(policy: Any, task: Any, what: str) -> None:
    """The task's answers must be text and the policy must continue one from a prefix (score a continuation of
    a :class:`Prefixed` example): else a ConfigError naming ``what``, before any training."""
    probe = task.sample_batch("train", 1, np.random.default_rng(0))[0]
    answer = task.reference_output(probe)
    if not isinstance(answer, str):
        raise ConfigError(f"{what}: vine sampling branches inside text answers; {task.id}'s reference_output gives "
                          f"a {type(answer).__name__}")
    cut = len(answer) // 2
    try:
        policy.rollout_from_outputs([Prefixed(probe, answer[:cut])], [answer[cut:]], SamplingParams(1.0, 1.0, 1))
    except TypeError as err:
        raise ConfigError(f"{what}: the {type(policy).__name__} policy cannot resume an answer from a prefix "
                          f"(Prefixed examples); vine sampling needs a text policy (causal_lm, vlm)") from err


class PolychromicVine(RolloutHook):
    """Vine sampling (Polychromic PPO, seed #59): after scoring, up to ``vine_states`` groups of the round each
    give one branch state (:func:`branch_states`, seeded by the round), the example with the first t characters of
    one of its answers written (``Prefixed``); the policy samples ``vine_samples`` continuations of each, scored
    by the example's own verifier on prefix + continuation. Each state is a new group, so the ``polychromic``
    estimator gives its continuations the set-level advantage over the sets of that state's continuations;
    only continuation tokens are decisions. The round's own groups keep their set advantage as before.

    INFERRED (the abstract names vine sampling only): character-level states, how they are chosen, one state
    per chosen group, the budget. Not built: the paper's mix of set and ordinary PPO advantages."""

    def __init__(self, ctx: HookContext):
        a = ctx.cfg.algo
        self.ctx, self.params = ctx, variant_params(a, "polychromic")
        p, what = self.params, "algo.extra.polychromic.vine_states"
        if p.vine_states < 0:
            raise ConfigError(f"{what} must be >= 0 (0: no vine sampling), got {p.vine_states}")
        if a.advantage != "polychromic":
            raise ConfigError(f"{what} re-rolls sets for the polychromic estimator: set algo.advantage=polychromic "
                              f"(got {a.advantage!r}) or drop vine_states")
        if p.vine_samples is not None and p.vine_samples < 2:
            raise ConfigError(f"algo.extra.polychromic.vine_samples must be >= 2 (a set needs two continuations) or "
                              f"null (rollout.samples_per_group), got {p.vine_samples}")
        if a.seele or a.answer_prefix is not None:
            raise ConfigError(f"{what}: algo.seele / algo.answer_prefix also write the start of every answer drawn; "
                              f"vine sampling cannot be combined with them")
        check_resumable(ctx.policy, ctx.task, what)
        self.samples = p.vine_samples if p.vine_samples is not None else ctx.cfg.rollout.samples_per_group
        self.groups = self.rows = 0
        self.outcome_sum = self.prefix_sum = 0.0

    def refine(self, part: Scored, round_: Round) -> Scored:
        rollout = part.rollout
        rng = np.random.default_rng(derive_seed(round_.seed, 59))
        states = branch_states(rollout.outputs, rollout.example_index, len(part.examples), self.params.vine_states, rng)
        if not states:
            return part
        bases = [part.examples[int(rollout.example_index[row])] for row, _ in states]
        prefixes = [str(rollout.outputs[row])[:t] for row, t in states]
        drawn = round_.draw([Prefixed(base, prefix) for base, prefix in zip(bases, prefixes)], self.samples,
                            round_.sampling, derive_seed(round_.seed, 59, 1))
        which = drawn.example_index.tolist()
        index = drawn.example_index + len(part.examples)
        drawn = drawn.replace(outputs=[prefixes[i] + str(o) for i, o in zip(which, drawn.outputs)],
                              example_index=index, group_id=index.clone())
        continuations = self.ctx.score(drawn, part.examples + bases)
        self.groups += len(states)
        self.rows += drawn.num_rows
        self.outcome_sum += float(continuations.outcome.sum())
        self.prefix_sum += sum(t / len(str(rollout.outputs[row])) for row, t in states)
        return with_new_groups(part, bases, continuations)

    def metrics(self) -> dict[str, float]:
        engine = self.ctx.engine
        groups = engine.sum(self.groups)
        metrics = {"rollout/vine_groups": groups,
                   "rollout/vine_success": engine.sum(self.outcome_sum) / max(engine.sum(self.rows), 1.0),
                   "rollout/vine_prefix_frac": engine.sum(self.prefix_sum) / max(groups, 1.0)}
        self.groups = self.rows = 0
        self.outcome_sum = self.prefix_sum = 0.0
        return metrics


def vine_selected(cfg: Any) -> bool:
    """On when the recipe sets ``algo.extra.polychromic.vine_states`` to anything but 0 (negative values are
    refused when the hook is built)."""
    return variant_params(cfg.algo, "polychromic").vine_states != 0


ROLLOUT_HOOKS.register("polychromic_vine", HookSpec(vine_selected, PolychromicVine))
