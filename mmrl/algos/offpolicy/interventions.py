"""Scripted interventions: the env's scripted expert standing in for the human who takes over online episodes
(HIL-SERL: Luo et al. 2024, "Precise and Dexterous Robotic Manipulation via Human-in-the-Loop Reinforcement
Learning"; the online stages of EXPO-FT, seed #89, and ConRFT, seed #90), shared by the off-policy learners that
have them (:mod:`mmrl.algos.offpolicy.expo_ft`, :mod:`mmrl.algos.offpolicy.conrft`).

With ``interventions`` p > 0, in each training rollout every episode is taken over with probability p after the
policy's first ``intervention_after`` decisions: from then on the env's ``expert_action()`` acts closed loop
(:class:`Interventions` is installed as the policy's ``takeover``, :class:`mmrl.core.contracts.TakeoverPlan`;
``GymRunner.run``'s ``takeover_after``); greedy evaluations (τ = 0) are never taken over. The payload stores the
expert's decisions there, flagged (``VLAPayload.intervened``, ``Episode.intervened``), so the learner's online
buffer holds the episodes as they were executed; :meth:`Interventions.record` counts the taken-over decisions (a
suffix of the episode) and adds them to the learner's demonstration BC data, as the corrections of a human join
the demonstrations (HIL-SERL). When the expert steps in: at decision k (``intervention_trigger: after``), or
failure-triggered (``stall``): at the first decision from k on that follows ``stall_window`` decisions without
reward gained, so an episode that keeps progressing is left to the policy. INFERRED: both triggers stand in for a
human's judgement; the expert never hands control back.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import torch

from mmrl.algos.offpolicy.buffer import TransitionBuffer
from mmrl.algos.offpolicy.episodes import Episode
from mmrl.core.contracts import TakeoverPlan, Takeovers


@dataclass(frozen=True)
class InterventionParams:
    """The interventions' keys of a learner's ``algo.extra`` section (validated by its ``__post_init__`` with
    :meth:`intervention_problems`)."""

    interventions: float = 0.0
    """p: the probability that the env's scripted expert takes over a training episode (the stand-in for the
    paper's human interventions); 0: off."""
    intervention_after: int = 3
    """k: a taken-over episode's expert acts from its (k+1)-th decision on (after the policy's first k); with
    ``intervention_trigger: stall``, the earliest decision it may."""
    intervention_trigger: Literal["after", "stall"] = "after"
    """When the expert steps into a chosen episode: ``after``: at decision k; ``stall``: at the first decision
    >= k after ``stall_window`` decisions that gained no reward (failure-triggered, as a human steps in on a
    stalling robot; :class:`mmrl.core.contracts.Takeovers`). A chosen episode that keeps progressing is never
    taken over."""
    stall_window: int = 5
    """w: decisions without reward gained that count as a stall (``intervention_trigger: stall``)."""

    def intervention_problems(self) -> list[str]:
        problems = []
        if not 0 <= self.interventions <= 1:
            problems.append(f"interventions is a probability per episode, in [0, 1], got {self.interventions}")
        if self.intervention_after < 0:
            problems.append(f"intervention_after must be >= 0, got {self.intervention_after}")
        if self.stall_window < 1:
            problems.append(f"stall_window must be >= 1 decisions, got {self.stall_window}")
        return problems

    def correction_room(self, online_capacity: int) -> int:
        """Slots a demonstration BC buffer keeps for the corrections: the online buffer's capacity when
        interventions are on (the corrections are part of the online decisions), else none."""
        return online_capacity if self.interventions > 0 else 0


@runtime_checkable
class TakeoverPolicy(Protocol):
    """A policy whose rollouts a :class:`~mmrl.core.contracts.TakeoverPlan` can hand to the env's expert
    (``VLAPolicy``)."""

    takeover: TakeoverPlan | None


class Interventions:
    """The plan, counts and corrections of one learner's scripted interventions. ``stream``: the tag of the draws'
    seed (apart from the policy's own draws and other learners'); ``prefix``: the metrics' namespace."""

    def __init__(self, params: InterventionParams, stream: int, prefix: str):
        self.probability, self.after = params.interventions, params.intervention_after
        self.stall_window = params.stall_window if params.intervention_trigger == "stall" else None
        self.stream, self.prefix = stream, prefix
        self.decisions = 0  # decisions the scripted expert took in the run's training episodes
        self.step_episodes = [0, 0]  # this step's episodes: [taken over, all]

    @property
    def on(self) -> bool:
        return self.probability > 0

    def install(self, policy: Any, learner: str) -> None:
        """Make :meth:`plan` the policy's ``takeover`` when interventions are on."""
        if not self.on:
            return
        if not isinstance(policy, TakeoverPolicy):
            raise ValueError(f"algo.extra.{learner}.interventions > 0 needs a policy whose rollouts an expert can take "
                             f"over (the vla policy's takeover); got {type(policy).__name__}")
        policy.takeover = self.plan

    def plan(self, episodes: int, temperature: float, seed: int) -> Takeovers | None:
        """The :class:`~mmrl.core.contracts.TakeoverPlan`: in training rollouts (τ > 0) each episode is chosen
        with probability p (draws seeded by the rollout's seed and ``stream``) and taken over after k decisions of
        the policy, or with the stall trigger at its first stall from then on; evaluations (τ = 0) never."""
        if temperature == 0:
            return None
        draws = np.random.default_rng([seed, self.stream]).random(episodes) < self.probability
        return Takeovers([self.after if taken else -1 for taken in draws], self.stall_window)

    def begin_step(self) -> None:
        """Start counting a trainer step's episodes."""
        self.step_episodes = [0, 0]

    def record(self, episode: Episode, bc_data: TransitionBuffer | None) -> None:
        """Count one stored episode; its taken-over decisions (a suffix) join ``bc_data`` (None: no BC data)."""
        self.step_episodes[1] += 1
        if episode.intervened is None or not episode.intervened.any():
            return
        self.step_episodes[0] += 1
        start = int(np.argmax(episode.intervened))
        self.decisions += episode.length - start
        if bc_data is not None:
            bc_data.add(corrections(episode, start))

    def metrics(self) -> dict[str, float]:
        """``<prefix>/intervened_episode_frac`` (the step's) and ``<prefix>/intervened_decisions`` (the run's)."""
        if not self.on:
            return {}
        return {f"{self.prefix}/intervened_episode_frac": self.step_episodes[0] / max(self.step_episodes[1], 1),
                f"{self.prefix}/intervened_decisions": float(self.decisions)}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"intervened_decisions": torch.tensor(self.decisions)} if self.on else {}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        if self.on:
            self.decisions = int(saved["intervened_decisions"])


def corrections(episode: Episode, start: int) -> Episode:
    """The episode's decisions from ``start`` on (the expert's, in a taken-over episode), as an episode."""
    def tail(x: np.ndarray | None) -> np.ndarray | None:
        return None if x is None else x[start:]

    return replace(episode, images=episode.images[start:], proprio=episode.proprio[start:],
                   actions=episode.actions[start:], rewards=episode.rewards[start:],
                   chunk_rewards=tail(episode.chunk_rewards), intervened=tail(episode.intervened))
