"""Which of a step's rollouts are trained on, and which earlier ones are trained again (issue 24).

Two rollout hooks (``mmrl.algos.hooks``) act in ``finish``, on the step's scored rows before advantages; both keep
rows across steps (``mmrl/algos/variants/replay.py``: stored behaviour log-probs as π_old, state pickled per
checkpoint). The rules they rest on are the pure functions below, checked against golden numbers in
``tests/algos/test_rollout_selection.py`` (docs/algorithms.md, "Rollout selection").

- ``rorecomp`` (RoRecomp, seed #71): a *priority* batch of each group's shortest correct and longest incorrect
  rows (a clear gradient toward brevity), and *compensation* batches of the remaining rows from a replay buffer
  (stability).
- ``rollout_bandit`` (the contextual-bandit rollout scheduler, seed #111): every rollout is an arm with a context
  vector; a linear UCB model chooses which rows of each group are trained (intra-group selection) and which
  stored groups of earlier steps are trained again (global reuse), rewarded by the gain in the policy's training
  reward between consecutive steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from mmrl.algos.hooks import ROLLOUT_HOOKS, HookContext, HookSpec, RolloutHook
from mmrl.algos.variants.hooks import training_sampling
from mmrl.algos.variants.params import declare_variant, variant_params
from mmrl.algos.variants.replay import (HOOK_STATE_DIR, StoredGroup, append_groups, load_state_file, replay_groups,
                                        save_state_file, store_groups)
from mmrl.core.scored import Scored
from mmrl.core.typed import ConfigError


def group_rows(example_index: Tensor) -> dict[int, list[int]]:
    """Each example's row positions, in row order."""
    rows: dict[int, list[int]] = {}
    for i, g in enumerate(example_index.tolist()):
        rows.setdefault(g, []).append(i)
    return rows


def replayable(count: int, minibatches: int) -> int:
    """How many of ``count`` available groups to replay: a multiple of ``trainer.minibatches``, as the step's
    new groups are, so that every minibatch holds as many groups and none is left out of the update."""
    return count // minibatches * minibatches


def keep_rows(batch: Scored, keep: Tensor) -> Scored:
    """``batch`` restricted to the rows ``keep`` ([N] bool); every example keeps at least one row."""
    return batch if bool(keep.all()) else batch.select(keep)


# ------------------------------------------------------------------------------------------------
# RoRecomp: priority and compensation batches

def priority_rows(outcome: Tensor, lengths: Tensor, example_index: Tensor, share: float,
                  threshold: float) -> Tensor:
    """RoRecomp's priority selection ([N] outcome, lengths, example index → [N] bool). In a group with c correct
    rows (outcome ≥ ``threshold``) and w incorrect ones, both > 0, it keeps the ⌈share·c⌉ shortest correct
    and the ⌈share·w⌉ longest incorrect rows (ties: earlier rows first). A group of one class has no
    group-relative signal to recompose and is kept whole."""
    keep = torch.ones_like(outcome, dtype=torch.bool)
    correct = outcome >= threshold
    for rows in group_rows(example_index).values():
        right = [i for i in rows if bool(correct[i])]
        wrong = [i for i in rows if not bool(correct[i])]
        if not right or not wrong:
            continue
        shortest = sorted(right, key=lambda i: int(lengths[i]))[:math.ceil(share * len(right))]
        longest = sorted(wrong, key=lambda i: -int(lengths[i]))[:math.ceil(share * len(wrong))]
        keep[rows] = False
        keep[shortest + longest] = True
    return keep


def has_both_classes(outcome: Sequence[float], threshold: float) -> bool:
    """Some rows are correct and some are not: a group-relative estimator gets signal from them."""
    return any(r >= threshold for r in outcome) and any(r < threshold for r in outcome)


@dataclass(frozen=True)
class RoRecompParams:
    priority_share: float = 0.5
    """Share of a group's correct rows (the shortest) and of its incorrect rows (the longest) in the priority
    batch (INFERRED: the abstract names the two kinds, not how many)."""
    compensation_every: int = 2
    """Every this many steps, the step also trains a compensation batch from the buffer (INFERRED)."""
    compensation_groups: int = 4
    """Stored groups per compensation batch, oldest first, each trained once (INFERRED)."""
    buffer_groups: int = 64
    """Capacity of the replay buffer of remaining rows, in groups; the oldest leave first (INFERRED)."""
    success_threshold: float = 1.0
    """A row is correct when its verifiable outcome is ≥ this."""


declare_variant("rorecomp", RoRecompParams)


class RoRecomp(RolloutHook):
    """RoRecomp (seed #71, Rollout Response Recomposition): the step trains its *priority batch*, from every
    group that has correct and incorrect rows the ⌈s·c⌉ shortest correct and ⌈s·w⌉ longest incorrect ones
    (:func:`priority_rows`), so that group-relative advantages favour short correct answers and penalise long
    wrong ones. The group's remaining rows (longer correct, shorter incorrect), when they still hold both
    classes, go to a FIFO replay buffer with their behaviour log-probs; every ``compensation_every`` steps the
    oldest ``compensation_groups`` of them are trained beside the priority batch as a *compensation batch*
    (π_old = the stored μ, PPO-clipped importance ratio), which keeps the length pressure from collapsing the
    policy. The buffer is checkpointed (pickled per process under ``<run>/hook_state/rorecomp``).

    INFERRED (the abstract names the two batch kinds only): the per-group share s, the compensation schedule and
    size, the buffer's capacity and order, remaining rows replayed as groups of their own (their advantages
    then favour the longer correct rows: the compensation), and single-class groups kept whole."""

    def __init__(self, ctx: HookContext):
        self.ctx, self.params = ctx, variant_params(ctx.cfg.algo, "rorecomp")
        p = self.params
        if not 0 < p.priority_share <= 1 or p.compensation_every < 1 or p.compensation_groups < 0 \
                or p.buffer_groups < 0:
            raise ConfigError(f"algo.extra.rorecomp: need 0 < priority_share <= 1, compensation_every >= 1, "
                              f"compensation_groups >= 0 and buffer_groups >= 0; got {p}")
        if ctx.out is None:
            raise ValueError("algo.rorecomp keeps a replay buffer in the run folder: it needs one")
        self.folder = ctx.out / HOOK_STATE_DIR / "rorecomp"
        self.buffer: list[StoredGroup] = []
        self.steps = 0
        self.counts = {"priority": 0, "dropped": 0, "compensation": 0}

    def finish(self, batch: Scored) -> Scored:
        p, cfg = self.params, self.ctx.cfg
        self.steps += 1
        rollout = batch.rollout
        keep = priority_rows(batch.outcome, rollout.lengths, rollout.example_index, p.priority_share,
                             p.success_threshold)
        leftovers = [(g, [i for i in rows if not bool(keep[i])]) for g, rows in group_rows(rollout.example_index).items()]
        leftovers = [(g, rows) for g, rows in leftovers
                     if has_both_classes([float(batch.outcome[i]) for i in rows], p.success_threshold)]
        sampling = training_sampling(cfg)
        compensation = None
        count = replayable(min(p.compensation_groups, len(self.buffer)), cfg.trainer.minibatches)
        if self.steps % p.compensation_every == 0 and count:
            taken, self.buffer = self.buffer[:count], self.buffer[count:]
            compensation = replay_groups(self.ctx.policy, self.ctx.score, taken, sampling)
        stored = store_groups(self.ctx.policy, [batch.examples[g] for g, _ in leftovers],
                              [[rollout.outputs[i] for i in rows] for _, rows in leftovers], sampling, self.steps)
        self.buffer = (self.buffer + stored)[-p.buffer_groups:] if p.buffer_groups else []
        self.counts = {"priority": int(keep.sum()), "dropped": int((~keep).sum()),
                       "compensation": 0 if compensation is None else compensation.rollout.num_rows}
        return append_groups(keep_rows(batch, keep), compensation)

    def metrics(self) -> dict[str, float]:
        engine = self.ctx.engine
        return {"rollout/rorecomp_priority_rows": engine.sum(self.counts["priority"]),
                "rollout/rorecomp_dropped_rows": engine.sum(self.counts["dropped"]),
                "rollout/rorecomp_compensation_rows": engine.sum(self.counts["compensation"]),
                "rollout/rorecomp_buffer_groups": engine.sum(len(self.buffer))}

    def state_dict(self) -> dict[str, Any]:
        return save_state_file(self.folder, self.steps, self.ctx.engine.rank, {"steps": self.steps, "buffer": self.buffer},
                               self.ctx.cfg.checkpoint.keep_last)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = load_state_file(self.folder, state, self.ctx.engine.rank, "algo.rorecomp")
        self.steps, self.buffer = saved["steps"], saved["buffer"]


# ------------------------------------------------------------------------------------------------
# The contextual-bandit rollout scheduler

FEATURES = ("bias", "advantage", "abs_advantage", "group_mean", "length", "age")
"""The context of a rollout (an arm), in this order (:func:`rollout_features`)."""


def rollout_features(outcome: Tensor, lengths: Tensor, example_index: Tensor, max_len: int,
                     age: Tensor) -> Tensor:
    """The arms' contexts [N, 6]: 1; the row's group-relative advantage a = (r − mean) / (std + 1e-6) over its
    group, clipped to [−3, 3] and divided by 3; |a|; the group's mean outcome; the length over ``max_len``;
    and age / (1 + age), age = steps since the row was drawn (0 for this step's rows)."""
    r = outcome.double()
    a = torch.zeros_like(r)
    mean = torch.zeros_like(r)
    for rows in group_rows(example_index).values():
        group = r[rows]
        mean[rows] = group.mean()
        std = group.std(unbiased=False) if len(rows) > 1 else torch.tensor(0.0, dtype=r.dtype)
        a[rows] = (group - group.mean()) / (std + 1e-6)
    a = a.clamp(-3.0, 3.0) / 3.0
    age = age.double()
    return torch.stack([torch.ones_like(r), a, a.abs(), mean, lengths.double() / max_len, age / (1 + age)], dim=1)


def ucb_scores(features: Tensor, a_matrix: Tensor, b_vector: Tensor, alpha: float) -> Tensor:
    """LinUCB: θ = A⁻¹b, score_i = θᵀx_i + α·sqrt(x_iᵀ A⁻¹ x_i) ([N, D], [D, D], [D] → [N])."""
    a_inv = torch.linalg.inv(a_matrix)
    theta = a_inv @ b_vector
    width = ((features @ a_inv) * features).sum(1).clamp(min=0).sqrt()
    return features @ theta + alpha * width


def bandit_update(a_matrix: Tensor, b_vector: Tensor, chosen: Tensor, reward: float) -> tuple[Tensor, Tensor]:
    """One step's feedback: the K arms chosen ([K, D]) share the step's reward, each with weight 1/K:
    A ← A + XᵀX / K, b ← b + reward · Σ_k x_k / K."""
    if chosen.shape[0] == 0:
        return a_matrix, b_vector
    k = chosen.shape[0]
    return a_matrix + chosen.T @ chosen / k, b_vector + reward * chosen.sum(0) / k


def top_rows_per_group(scores: Tensor, example_index: Tensor, k: int) -> Tensor:
    """[N] bool: each group's ``k`` highest-scoring rows (ties: earlier rows first)."""
    keep = torch.zeros_like(scores, dtype=torch.bool)
    for rows in group_rows(example_index).values():
        order = sorted(rows, key=lambda i: -float(scores[i]))
        keep[order[:k]] = True
    return keep


def normalised_gain(gain: float, abs_sum: float, count: int) -> float:
    """The step's gain over the mean |gain| seen so far (this one included), so rewards are O(1) whatever the
    task's reward scale (INFERRED)."""
    return gain / max(abs_sum / max(count, 1), 1e-8)


@dataclass(frozen=True)
class BanditParams:
    keep_per_group: int = 6
    """Rows of each new group trained (intra-group selection; INFERRED: 6 of the recipe's 8)."""
    replay_groups: int = 2
    """Stored groups of earlier steps trained again per step (global reuse), the highest-scoring first."""
    buffer_groups: int = 64
    """Capacity of the historical-rollout buffer, in groups (groups whose outcomes vary); oldest leave first."""
    alpha: float = 0.5
    """UCB exploration width α."""
    ridge: float = 1.0
    """λ of the linear model's prior A = λI."""


declare_variant("rollout_bandit", BanditParams)


@dataclass(frozen=True)
class StoredArm:
    """A stored group and its rows' contexts at the time it was drawn (age 0)."""

    group: StoredGroup
    features: tuple[tuple[float, ...], ...]


class RolloutBandit(RolloutHook):
    """The contextual-bandit rollout scheduler (seed #111). Every rollout is an arm whose context is
    :func:`rollout_features`; a linear UCB model (:func:`ucb_scores`) scores them. Each step

    1. the step's new rows are scored and each group keeps its ``keep_per_group`` best (noise-aware
       intra-group selection);
    2. stored groups of earlier steps are scored with their age and the ``replay_groups`` best (by their rows'
       mean score) are trained again beside the new rows, with π_old = their stored behaviour log-probs, then
       leave the buffer; this step's groups whose outcomes vary enter it;
    3. the arms chosen at the step before are rewarded with the gain in mean training reward between that step
       and this one (the performance the update in between induced), normalised by the mean |gain|, and the
       model is updated (:func:`bandit_update`).

    The model and the pending arms are gathered over processes (the same on all); the buffer is per process; all
    of it is checkpointed (pickled per process under ``<run>/hook_state/rollout_bandit``).

    INFERRED (the abstract names arms, reward and the two uses): a linear UCB model instead of the paper's neural
    scheduler, the six context features, the gain measured on the training rows rather than a held-out set,
    shared credit 1/K for the step's chosen arms, the per-group keep count and the replay count."""

    def __init__(self, ctx: HookContext):
        self.ctx, self.params = ctx, variant_params(ctx.cfg.algo, "rollout_bandit")
        p = self.params
        if p.keep_per_group < 2 or p.replay_groups < 0 or p.buffer_groups < 0 or p.alpha < 0 or p.ridge <= 0:
            raise ConfigError(f"algo.extra.rollout_bandit: need keep_per_group >= 2 (a group-relative estimator "
                              f"needs two rows), replay_groups >= 0, buffer_groups >= 0, alpha >= 0 and ridge > 0; "
                              f"got {p}")
        if ctx.out is None:
            raise ValueError("algo.rollout_bandit keeps historical rollouts in the run folder: it needs one")
        self.folder = ctx.out / HOOK_STATE_DIR / "rollout_bandit"
        d = len(FEATURES)
        self.a_matrix = p.ridge * torch.eye(d, dtype=torch.float64)
        self.b_vector = torch.zeros(d, dtype=torch.float64)
        self.pending: list[list[float]] = []  # contexts of the arms chosen at the previous step (all processes)
        self.last_reward: float | None = None
        self.gain_abs_sum, self.gain_count = 0.0, 0
        self.buffer: list[StoredArm] = []
        self.steps = 0
        self.last: dict[str, float] = {}

    def finish(self, batch: Scored) -> Scored:
        p, cfg, engine = self.params, self.ctx.cfg, self.ctx.engine
        self.steps += 1
        rollout = batch.rollout
        reward = engine.sum(batch.outcome.sum()) / max(engine.sum(rollout.num_rows), 1.0)
        gain = self.learn(reward)
        features = rollout_features(batch.outcome, rollout.lengths, rollout.example_index, cfg.rollout.max_new_tokens,
                                    torch.zeros(rollout.num_rows))
        keep = top_rows_per_group(ucb_scores(features, self.a_matrix, self.b_vector, p.alpha), rollout.example_index,
                                  p.keep_per_group)
        picked = self.pick_stored()
        sampling = training_sampling(cfg)
        replayed = replay_groups(self.ctx.policy, self.ctx.score, [arm.group for arm in picked], sampling) \
            if picked else None
        replayed_features = [self.aged(arm) for arm in picked]
        chosen = features[keep].tolist() + [x for arm in replayed_features for x in arm.tolist()]
        (self.pending,) = engine.gather_objects(chosen)
        self.store(batch, features)
        self.last = {"rollout/bandit_kept_rows": engine.sum(int(keep.sum())),
                     "rollout/bandit_replayed_rows": engine.sum(sum(len(arm.group.outputs) for arm in picked)),
                     "rollout/bandit_buffer_groups": engine.sum(len(self.buffer)),
                     "rollout/bandit_gain": gain,
                     **{f"rollout/bandit_theta_{name}": float(v)
                        for name, v in zip(FEATURES, torch.linalg.solve(self.a_matrix, self.b_vector))}}
        return append_groups(keep_rows(batch, keep), replayed)

    def learn(self, reward: float) -> float | None:
        """Reward the arms chosen at the previous step with the gain since then; returns the raw gain (None at
        the first step)."""
        gain = None
        if self.last_reward is not None and self.pending:
            gain = reward - self.last_reward
            self.gain_abs_sum += abs(gain)
            self.gain_count += 1
            self.a_matrix, self.b_vector = bandit_update(
                self.a_matrix, self.b_vector, torch.tensor(self.pending, dtype=torch.float64),
                normalised_gain(gain, self.gain_abs_sum, self.gain_count))
        self.last_reward = reward
        return gain

    def aged(self, arm: StoredArm) -> Tensor:
        """The arm's rows' contexts with their age now."""
        features = torch.tensor(arm.features, dtype=torch.float64)
        age = float(self.steps - arm.group.step)
        features[:, FEATURES.index("age")] = age / (1 + age)
        return features

    def pick_stored(self) -> list[StoredArm]:
        """The ``replay_groups`` stored groups (a multiple of ``trainer.minibatches``) with the highest mean UCB
        score (ties: older first); they leave the buffer."""
        count = replayable(min(self.params.replay_groups, len(self.buffer)), self.ctx.cfg.trainer.minibatches)
        if not count:
            return []
        scores = [float(ucb_scores(self.aged(arm), self.a_matrix, self.b_vector, self.params.alpha).mean())
                  for arm in self.buffer]
        order = sorted(range(len(self.buffer)), key=lambda i: -scores[i])[:count]
        picked = [self.buffer[i] for i in sorted(order)]
        self.buffer = [arm for i, arm in enumerate(self.buffer) if i not in set(order)]
        return picked

    def store(self, batch: Scored, features: Tensor) -> None:
        """This step's groups whose outcomes vary enter the buffer (whole groups, as drawn)."""
        if not self.params.buffer_groups:
            return
        rollout = batch.rollout
        groups = [(g, rows) for g, rows in group_rows(rollout.example_index).items()
                  if float(batch.outcome[rows].max() - batch.outcome[rows].min()) > 1e-6]
        stored = store_groups(self.ctx.policy, [batch.examples[g] for g, _ in groups],
                              [[rollout.outputs[i] for i in rows] for _, rows in groups],
                              training_sampling(self.ctx.cfg), self.steps)
        arms = [StoredArm(group, tuple(tuple(x) for x in features[rows].tolist()))
                for group, (_, rows) in zip(stored, groups)]
        self.buffer = (self.buffer + arms)[-self.params.buffer_groups:]

    def metrics(self) -> dict[str, float]:
        return self.last

    def state_dict(self) -> dict[str, Any]:
        state = {"steps": self.steps, "a_matrix": self.a_matrix, "b_vector": self.b_vector, "pending": self.pending,
                 "last_reward": self.last_reward, "gain": (self.gain_abs_sum, self.gain_count), "buffer": self.buffer}
        return save_state_file(self.folder, self.steps, self.ctx.engine.rank, state, self.ctx.cfg.checkpoint.keep_last)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = load_state_file(self.folder, state, self.ctx.engine.rank, "algo.rollout_bandit")
        self.steps, self.a_matrix, self.b_vector = saved["steps"], saved["a_matrix"], saved["b_vector"]
        self.pending, self.last_reward, self.buffer = saved["pending"], saved["last_reward"], saved["buffer"]
        self.gain_abs_sum, self.gain_count = saved["gain"]


ROLLOUT_HOOKS.register("rorecomp", HookSpec(lambda cfg: cfg.algo.rorecomp, RoRecomp))
ROLLOUT_HOOKS.register("rollout_bandit", HookSpec(lambda cfg: cfg.algo.rollout_bandit, RolloutBandit))
