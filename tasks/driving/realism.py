"""Realism of a traffic policy against logged behaviour, and RLFTSim's realism reward.

Realism metrics (:func:`realism_metrics`): the speed, longitudinal acceleration and jerk of every
per-step sample of the policy's trajectories are compared with those of the logged trajectories of the
same scenes (in our world the log is the rule-based driver, IDM + pure pursuit, from the same state) by
the 1-D Wasserstein-1 distance (``scipy.stats.wasserstein_distance``), pooled over all agents and steps
(``realism_w1_<feature>``) and per agent (``realism_w1_<feature>_per_agent``: the mean over agents of each
agent's own W1 to its log), beside the collision and off-road rates. Lower W1 is more realistic.

RLFTSim's reward (Ahmadi et al. 2026, "RLFTSim: Realistic and Controllable Multi-Agent Traffic Simulation
via Reinforcement Learning Fine-Tuning", CVPR 2026, arXiv 2605.19033): fine-tune the simulator closed loop
so that rollouts match the real-world distribution of kinematic, interactive and map-based features, with a
reward that balances fidelity and (goal) controllability. Their per-rollout reward, MLOO, is a
leave-one-out construction over the realism meta-metric of K rollouts per scene; no code is public and we
read only the abstract and the project page. :func:`rlftsim_reward` is INFERRED from them, for one rollout
against one logged trajectory:

    fidelity = w_v·exp(−W1_v/s_v) + w_a·exp(−W1_a/s_a) + w_j·exp(−W1_j/s_j) + w_c·(1 − collision) + w_o·(1 − offroad)
    goal     = exp(−‖p_T − g‖ / s_g),   g = the logged position at the horizon's end (RLFTSim's goals are logged
               end points; our policy has no goal input, so this term rewards reaching where the log went)
    score    = (1 − λ)·fidelity + λ·goal ∈ [0, 1]

Each exp(−W1/s) is a likelihood-like score in (0, 1] (1 when the rollout's kinematics match the log's), so the
fidelity term is a weighted meta-metric like the Waymo Sim Agents one (kinematic, interactive and map-based
parts, weights summing to 1). It is dense (every step's kinematics count) and deterministic (no histogram of
few rollouts), which is what RLFTSim asks of a low-variance reward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
from scipy.stats import wasserstein_distance

KINEMATIC_FEATURES = ("speed", "accel", "jerk")


def kinematics(poses: np.ndarray, dt: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Speed [S+1], longitudinal acceleration [S] and jerk [S−1] of poses [S+1, 4] = (x, y, heading, speed)."""
    v = poses[:, 3]
    a = np.diff(v) / dt
    return v, a, np.diff(a) / dt


def wasserstein_1d(x: np.ndarray, y: np.ndarray) -> float:
    """W1 between two empirical 1-D distributions (``scipy.stats.wasserstein_distance``); NaN if one is empty.

    >>> wasserstein_1d(np.array([0.0, 1.0]), np.array([1.0, 2.0]))
    1.0
    """
    x, y = np.asarray(x, float).ravel(), np.asarray(y, float).ravel()
    if len(x) == 0 or len(y) == 0:
        return float("nan")
    return float(wasserstein_distance(x, y))


def kinematic_w1(poses: np.ndarray, log: np.ndarray, dt: float) -> dict[str, float]:
    """One agent's W1 of speed / acceleration / jerk between its poses [S+1, 4] and its log's [S'+1, 4]."""
    mine, theirs = kinematics(poses, dt), kinematics(log, dt)
    return {name: wasserstein_1d(m, t) for name, m, t in zip(KINEMATIC_FEATURES, mine, theirs)}


def realism_metrics(rollouts: Sequence[np.ndarray], logs: Sequence[np.ndarray], collision: Sequence[bool],
                    offroad: Sequence[bool], dt: float) -> dict[str, float]:
    """Realism of rollouts against the logs of the same scenes (``rollouts[i]`` and ``logs[i]``: one agent's
    poses [S+1, 4], lengths may differ, e.g. an episode cut at a collision).

    Returns ``realism_w1_<f>`` (W1 of the pooled per-step values of all rollouts vs all logs),
    ``realism_w1_<f>_per_agent`` (mean over agents of each one's W1 to its own log) for f in speed, accel,
    jerk, and ``realism_collision_rate`` / ``realism_offroad_rate`` (share of rollouts with one).
    """
    if len(rollouts) != len(logs) or len(rollouts) != len(collision) or len(rollouts) != len(offroad):
        raise ValueError(f"realism_metrics needs one log, collision and off-road flag per rollout, got "
                         f"{len(rollouts)} rollouts, {len(logs)} logs, {len(collision)} / {len(offroad)} flags")
    if not rollouts:
        raise ValueError("realism_metrics needs at least one rollout")
    mine = [kinematics(r, dt) for r in rollouts]
    theirs = [kinematics(g, dt) for g in logs]
    out: dict[str, float] = {}
    for j, name in enumerate(KINEMATIC_FEATURES):
        out[f"realism_w1_{name}"] = wasserstein_1d(np.concatenate([m[j] for m in mine]),
                                                   np.concatenate([t[j] for t in theirs]))
        per_agent = [wasserstein_1d(m[j], t[j]) for m, t in zip(mine, theirs)]
        out[f"realism_w1_{name}_per_agent"] = float(np.nanmean(per_agent)) if not np.isnan(per_agent).all() \
            else float("nan")
    out["realism_collision_rate"] = float(np.mean(np.asarray(collision, float)))
    out["realism_offroad_rate"] = float(np.mean(np.asarray(offroad, float)))
    return out


@dataclass(frozen=True)
class RlftsimWeights:
    """Weights and scales of :func:`rlftsim_reward` (INFERRED: chosen here, the paper's are not public).

    The fidelity weights sum to 1. Collision and off-road carry most of it, as in the Waymo Sim Agents
    meta-metric that RLFTSim's MLOO is built on (there each is 0.25 of the total); the kinematic scales are
    about the spread of the rule-based log's own values over 4 s (speed a few m/s, IDM accelerations ≤ 2 m/s²,
    candidate speed-profile jerks up to 60 m/s³).
    """

    speed: float = 0.2
    accel: float = 0.15
    jerk: float = 0.15
    collision: float = 0.3
    offroad: float = 0.2
    speed_scale: float = 1.0
    """s_v (m/s)."""
    accel_scale: float = 1.0
    """s_a (m/s²)."""
    jerk_scale: float = 10.0
    """s_j (m/s³)."""
    goal_weight: float = 0.2
    """λ: share of the controllability (goal) term in the score."""
    goal_scale: float = 5.0
    """s_g (m): distance to the logged end point at which the goal term is e^−1."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"rlftsim weight {f.name} must be finite and >= 0, got {value}")
        total = self.speed + self.accel + self.jerk + self.collision + self.offroad
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"rlftsim fidelity weights (speed, accel, jerk, collision, offroad) must sum to 1, "
                             f"got {total:g}")
        if self.goal_weight > 1:
            raise ValueError(f"rlftsim goal_weight must be in [0, 1], got {self.goal_weight}")
        if min(self.speed_scale, self.accel_scale, self.jerk_scale, self.goal_scale) <= 0:
            raise ValueError("rlftsim scales (speed_scale, accel_scale, jerk_scale, goal_scale) must be > 0")


def rlftsim_reward(poses: np.ndarray, log: np.ndarray, collision: bool, offroad: bool, dt: float,
                   w: RlftsimWeights) -> tuple[float, dict[str, float]]:
    """RLFTSim's per-rollout realism reward (INFERRED, see the module docstring) of one agent's poses
    [S+1, 4] against its logged poses [S+1, 4] from the same state: (score in [0, 1], components).

    >>> t = np.arange(41) * 0.1
    >>> log = np.stack([8 * t, 0 * t, 0 * t, 8 + 0 * t], axis=1)
    >>> rlftsim_reward(log, log, False, False, 0.1, RlftsimWeights())[0]
    1.0
    """
    w1 = kinematic_w1(poses, log, dt)
    likelihood = {name: math.exp(-w1[name] / getattr(w, f"{name}_scale")) for name in KINEMATIC_FEATURES}
    fidelity = (sum(getattr(w, name) * likelihood[name] for name in KINEMATIC_FEATURES)
                + w.collision * (1.0 - float(collision)) + w.offroad * (1.0 - float(offroad)))
    goal_dist = float(np.linalg.norm(poses[-1, :2] - log[-1, :2]))
    goal = math.exp(-goal_dist / w.goal_scale)
    score = (1.0 - w.goal_weight) * fidelity + w.goal_weight * goal
    components = {f"w1_{name}": w1[name] for name in KINEMATIC_FEATURES}
    components |= {"fidelity": fidelity, "goal": goal, "goal_dist": goal_dist}
    return float(min(max(score, 0.0), 1.0)), components


def meta_metric(rollouts: Sequence[np.ndarray], log: np.ndarray, collision: Sequence[bool], offroad: Sequence[bool],
                dt: float, w: RlftsimWeights) -> float:
    """The realism meta-metric M(S) ∈ [0, 1] of a set S of rollouts of one agent from one state against the
    state's log (INFERRED, the set form of :func:`rlftsim_reward`): the likelihood-like match exp(−W1/s) of the
    *pooled* per-step speed / acceleration / jerk of all rollouts to the log's, the set's no-collision and
    on-road rates, and its mean goal term; M(∅) = 0. For one rollout it equals :func:`rlftsim_reward`'s score.

    >>> t = np.arange(41) * 0.1
    >>> log = np.stack([8 * t, 0 * t, 0 * t, 8 + 0 * t], axis=1)
    >>> round(meta_metric([log, log], log, [False, True], [False, False], 0.1, RlftsimWeights()), 6)  # 0.8·(0.5 + 0.3·½ + 0.2) + 0.2
    0.88
    """
    if not rollouts:
        return 0.0
    mine, theirs = [kinematics(r, dt) for r in rollouts], kinematics(log, dt)
    fidelity = sum(getattr(w, name) * math.exp(-wasserstein_1d(np.concatenate([m[j] for m in mine]), theirs[j])
                                               / getattr(w, f"{name}_scale"))
                   for j, name in enumerate(KINEMATIC_FEATURES))
    fidelity += w.collision * (1.0 - float(np.mean(collision))) + w.offroad * (1.0 - float(np.mean(offroad)))
    goal = float(np.mean([math.exp(-float(np.linalg.norm(r[-1, :2] - log[-1, :2])) / w.goal_scale) for r in rollouts]))
    return float(min(max((1.0 - w.goal_weight) * fidelity + w.goal_weight * goal, 0.0), 1.0))


def mloo_rewards(rollouts: Sequence[np.ndarray], log: np.ndarray, collision: Sequence[bool], offroad: Sequence[bool],
                 dt: float, w: RlftsimWeights) -> list[float]:
    """RLFTSim's MLOO credit (INFERRED from the abstract: "a leave-one-out construction over the realism
    meta-metric"): r_i = M(S) − M(S ∖ {i}) for each rollout i of the set S of K rollouts of one state
    (:func:`meta_metric`), in [−1, 1]. A rollout earns what the set's realism gains by including it: one that
    brings the set's pooled kinematics closer to the log's, or avoids the collision the others make, scores
    above one that duplicates what the set already has. With K = 1 it is M of the rollout alone.

    >>> t = np.arange(41) * 0.1
    >>> log = np.stack([8 * t, 0 * t, 0 * t, 8 + 0 * t], axis=1)
    >>> fast = np.stack([12 * t, 0 * t, 0 * t, 12 + 0 * t], axis=1)
    >>> [round(r, 3) for r in mloo_rewards([log, fast], log, [False, False], [False, False], 0.1, RlftsimWeights())]
    [0.115, -0.234]
    """
    whole = meta_metric(rollouts, log, collision, offroad, dt, w)
    out = []
    for i in range(len(rollouts)):
        keep = [k for k in range(len(rollouts)) if k != i]
        out.append(whole - meta_metric([rollouts[k] for k in keep], log, [collision[k] for k in keep],
                                       [offroad[k] for k in keep], dt, w))
    return out
