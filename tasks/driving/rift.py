"""``driving/rift-v0``: RIFT's group-relative fine-tuning of a traffic policy over candidate trajectories.

An example is a :class:`RiftExample`: a traffic state (:mod:`.rift_sim`) and its G = 15 CBV
candidates with the policy's inputs (candidate features [G, F], agent context [X]). The policy
answers with a candidate index (an ``int``); ``reward`` forward-simulates that candidate for 4 s with
the other vehicles reacting and returns RIFT's discounted dense return (γ = 0.98, cut after the
first collision). A group is the G candidates of one state (``policy.args.group: all_candidates``,
``rollout.group_size: 15``), so ``algo.advantage: grpo`` gives RIFT's A_i = (G_i − mean)/(std + ε).

- ``sample_batch(split, n, rng)``: ``train`` states come from a pool of ``train_pool`` seeds
  (cached, so the imitation warm start and RL revisit them), each followed by up to ``explore_s``
  seconds of random-candidate driving of the CBV; other splits (``test`` and the world's OOD
  splits) draw fresh seeds and take the state right after the rule-based warm-up.
- ``reward(example, output)``: score = the return, clipped to ``reward_range`` = [−250, 61];
  components = each reward term's discounted sum (unclipped), ``collision``, ``offroad``,
  ``progress`` (m). The top, :data:`RETURN_MAX`, is the most any 40 steps can earn (no clipping there);
  the lattice candidates' returns measured over 300 states of every split lie in [−188, 38.6], and
  only trajectories given as points (any speed: a zigzag reaches −1322) reach the floor. A candidate
  index out of range, or a trajectory (world points [40, 2]) with NaN/inf, of the wrong shape or more
  than 200 m away, scores the floor −250 with the reason in ``info`` (never better than a candidate);
  nothing is simulated then.
- ``reward: rlftsim`` (task arg): RLFTSim's realism reward instead (:func:`mmrl.tasks.driving.realism.rlftsim_reward`,
  INFERRED): the chosen 4-s trajectory against the log (the rule-based driver's own 4 s from the same state):
  a likelihood-like kinematic match (speed, acceleration, jerk W1), no collision / off-road, and reaching the
  log's end point; score in [0, 1], unusable outputs score 0 with the reason.
- ``reward: rlftsim_mloo``: RLFTSim's MLOO credit (:func:`mmrl.tasks.driving.realism.mloo_rewards`, INFERRED): the
  rows answering one state form a set S (a group sampled from the policy, ``policy.args.group: sample``; two groups
  of the same state in one batch share theirs), and row i scores M(S) − M(S ∖ {i}) ∈ [−1, 1], M the set's realism
  meta-metric against the log (``reward_batch``). Scored alone (``reward``, greedy evaluation) a row scores M of
  itself, the ``rlftsim`` score; unusable outputs score −1 with the reason and stay out of the sets.
- ``metrics``: open-loop (one 4-s decision) ``collision_rate``, ``offroad_rate``, ``progress_mean``, and the
  realism of the chosen trajectories against the logs (``realism_w1_speed`` / ``_accel`` / ``_jerk``, pooled and
  ``_per_agent``; :func:`mmrl.tasks.driving.realism.realism_metrics`), whatever the reward.
  Closed-loop episode metrics (8 s, replanning every 1 s) are :func:`closed_loop_metrics`.
- ``reference_output``: the candidate closest to the rule-based driver's own 4 s (imitation target).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from mmrl.core.contracts import RewardResult
from mmrl.envs.driving.world import SIM_DT, SPLITS
from mmrl.tasks.driving.realism import (KINEMATIC_FEATURES, RlftsimWeights, mloo_rewards, realism_metrics,
                                       rlftsim_reward)
from mmrl.tasks.driving.rift_sim import (GAMMA, HORIZON_STEPS, REWARD_TERMS, CandidateReturns, Episode,
                                         TrafficState, candidate_lattice, candidate_returns, closed_loop_episode,
                                         features, make_state, poses_from_xy, rule_based_episode, simulate)

TRAFFIC_REWARDS = ("rift", "rlftsim", "rlftsim_mloo")
"""The rewards of ``driving/rift-v0`` (task arg ``reward``): RIFT's dense return, RLFTSim's realism reward of one
rollout, and RLFTSim's leave-one-out (MLOO) credit over a state's sampled rollouts."""


@dataclass(frozen=True)
class RiftConfig:
    train_pool: int = 256
    """Distinct training states (seeds 0..train_pool−1 of the ``train`` split), cached in memory."""
    cache: int = 2048
    """States (with their candidates' returns) kept in memory."""
    traffic: tuple[int, int] = (5, 9)
    """(min, max) background agents per scenario (``ood_dense`` keeps its own 10–16)."""
    explore_s: float = 3.0
    """``train`` states only: up to this many seconds of random own-lane driving of the CBV before the
    state (off-log coverage, see ``rift_sim.make_state``); 0 gives rule-based states only."""
    explore_lateral: bool = True
    """Exploration also picks candidates of the other reference lines (lane shifts), not only speeds."""
    reward: Literal["rift", "rlftsim", "rlftsim_mloo"] = "rift"
    """``rift``: RIFT's discounted dense return (Chen et al. 2025); ``rlftsim``: RLFTSim's realism reward against
    the rule-based log (Ahmadi et al. 2026, INFERRED; :func:`mmrl.tasks.driving.realism.rlftsim_reward`);
    ``rlftsim_mloo``: its leave-one-out credit over a state's sampled rollouts (:func:`~mmrl.tasks.driving.realism.mloo_rewards`)."""
    rlftsim: RlftsimWeights = field(default_factory=RlftsimWeights)
    """Weights and scales of the ``rlftsim`` / ``rlftsim_mloo`` rewards (unused by ``rift``)."""

    def __post_init__(self) -> None:
        if self.reward not in TRAFFIC_REWARDS:
            raise ValueError(f"driving/rift-v0: unknown reward {self.reward!r}; choose one of {', '.join(TRAFFIC_REWARDS)}")


@dataclass(frozen=True, eq=False)
class RiftExample:
    """A traffic state and its candidates: poses [G, 41, 4], lattice parameters [G, 2], policy inputs."""

    split: str
    seed: int
    state: TrafficState
    candidates: np.ndarray
    params: np.ndarray
    features: np.ndarray  # [G, F] float32
    context: np.ndarray  # [X] float32


def build_example(split: str, seed: int, traffic: tuple[int, int] | None = (5, 9),
                  explore_s: float = 0.0, explore_lateral: bool = False) -> RiftExample:
    state = make_state(seed, split, traffic=traffic, explore_s=explore_s, explore_lateral=explore_lateral)
    cand, params = candidate_lattice(state)
    f, c = features(state, cand, params)
    return RiftExample(split, int(seed), state, cand, params, f, c)


RETURN_MAX = (0.1 * 20.0 + 0.5 * 0.25 + 0.6 * 0.05 * math.exp(0.5)) * (1 - GAMMA ** HORIZON_STEPS) / (1 - GAMMA)
"""Upper bound of a return (≈ 60.3): the per-step maxima of the velocity (0.1·20), l_align (0.5·0.25) and
l_center (0.6·0.05·e^0.5) terms, the others ≤ 0, discounted over the 40 steps (:func:`dense_rewards`)."""
RETURN_FLOOR = -250.0
"""Returns are clipped here, and unusable outputs score it: below every lattice candidate measured
(−188 over 300 states), so in practice only off-lattice point trajectories are clipped."""


def _floor(reason: str) -> RewardResult:
    return RewardResult(RETURN_FLOOR, {k: 0.0 for k in (*REWARD_TERMS, "collision", "offroad", "progress")}, reason)


RLFTSIM_COMPONENTS = ("w1_speed", "w1_accel", "w1_jerk", "fidelity", "goal", "goal_dist")


def _rlftsim_zero(reason: str, floor: float = 0.0) -> RewardResult:
    """An unusable output under ``rlftsim`` (scores 0) or ``rlftsim_mloo`` (scores −1, with an ``mloo`` component)."""
    names = (*RLFTSIM_COMPONENTS, "collision", "offroad", "progress") + (("mloo",) if floor < 0 else ())
    return RewardResult(floor, {k: floor if k == "mloo" else 0.0 for k in names}, reason)


class RiftTask:
    id = "driving/rift-v0"
    seed_high = 2 ** 31 - 1
    """Held-out seeds are drawn in [0, seed_high) (``sample_batch``, the closed-loop evaluation)."""

    def __init__(self, cfg: RiftConfig):
        if cfg.train_pool < 1:
            raise ValueError(f"train_pool must be >= 1, got {cfg.train_pool}")
        self.cfg = cfg
        self.reward_range = {"rift": (RETURN_FLOOR, float(math.ceil(RETURN_MAX))), "rlftsim": (0.0, 1.0),
                             "rlftsim_mloo": (-1.0, 1.0)}[cfg.reward]
        self._examples: OrderedDict[tuple[str, int], RiftExample] = OrderedDict()
        self._returns: OrderedDict[tuple[str, int], CandidateReturns] = OrderedDict()
        self._logs: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()
        self._reference: dict[tuple[str, int], int] = {}

    def _remember(self, table: OrderedDict, key, value):
        table[key] = value
        if len(table) > self.cfg.cache:
            table.popitem(last=False)
        return value

    def example(self, split: str, seed: int) -> RiftExample:
        key = (split, int(seed))
        if key in self._examples:
            return self._examples[key]
        explore = self.cfg.explore_s if split == "train" else 0.0
        return self._remember(self._examples, key, build_example(split, seed, tuple(self.cfg.traffic), explore,
                                                                 self.cfg.explore_lateral))

    def sample_batch(self, split: str, n: int, rng: np.random.Generator) -> list[RiftExample]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; {self.id} has {', '.join(SPLITS)}")
        high = self.cfg.train_pool if split == "train" else self.seed_high
        return [self.example(split, int(s)) for s in rng.integers(0, high, size=n)]

    def returns(self, example: RiftExample) -> CandidateReturns:
        """Every candidate's verifiable return, simulated once per state (batched over candidates)."""
        key = (example.split, example.seed)
        if key not in self._returns:
            self._remember(self._returns, key, candidate_returns(example.state, example.candidates))
        return self._returns[key]

    def log(self, example: RiftExample) -> np.ndarray:
        """The logged behaviour of the state's CBV: the rule-based driver's own 4 s (everyone rule-based,
        reacting to each other), poses [41, 4]; simulated once per state."""
        key = (example.split, example.seed)
        if key not in self._logs:
            everyone = [example.state.cbv, *example.state.others]
            self._remember(self._logs, key, simulate(everyone, HORIZON_STEPS)[0, :, 0])
        return self._logs[key]

    def trajectory(self, example: RiftExample, output: object) -> tuple[np.ndarray | None, str]:
        """The CBV poses [41, 4] an output stands for (a candidate index, or world points [40, 2]), or None
        and the reason it is unusable."""
        if isinstance(output, (int, np.integer)) and not isinstance(output, (bool, np.bool_)):
            if not 0 <= output < len(example.candidates):
                shown = output if abs(output) < 10 ** 18 else "beyond ±1e18"  # str() refuses > 4300 digits
                return None, f"candidate {shown} out of range [0, {len(example.candidates)})"
            return example.candidates[int(output)], ""
        if isinstance(output, np.ndarray):
            if output.shape != (HORIZON_STEPS, 2):
                return None, f"trajectory must be world points of shape ({HORIZON_STEPS}, 2), got {output.shape}"
            if not (np.issubdtype(output.dtype, np.floating) or np.issubdtype(output.dtype, np.integer)):
                return None, f"trajectory must hold real numbers, got dtype {output.dtype}"
            if not np.isfinite(output).all():
                return None, "trajectory contains NaN or inf"
            if np.abs(output - example.state.cbv_pose[:2]).max() > 200.0:
                return None, "trajectory point more than 200 m from the vehicle"
            return poses_from_xy(example.state.cbv_pose, output), ""
        return None, f"not a candidate index or a trajectory: {type(output).__name__}"

    def outcome(self, example: RiftExample, output: object, poses: np.ndarray) -> tuple[CandidateReturns, int]:
        """The simulated outcome of ``poses`` (``output``'s trajectory) and its row: cached for candidates."""
        if isinstance(output, np.ndarray):
            return candidate_returns(example.state, poses[None]), 0
        return self.returns(example), int(output)

    def reward(self, example: RiftExample, output: object) -> RewardResult:
        poses, reason = self.trajectory(example, output)
        if poses is None:
            return _floor(reason) if self.cfg.reward == "rift" else _rlftsim_zero(reason, self.reward_range[0])
        r, i = self.outcome(example, output, poses)
        outcomes = {"collision": float(r.collision[i]), "offroad": float(r.offroad[i]),
                    "progress": float(r.progress[i])}
        info = "collision" if r.collision[i] else "off-road" if r.offroad[i] else ""
        if self.cfg.reward in ("rlftsim", "rlftsim_mloo"):
            score, parts = rlftsim_reward(poses, self.log(example), bool(r.collision[i]), bool(r.offroad[i]), SIM_DT,
                                          self.cfg.rlftsim)
            mloo = {"mloo": score} if self.cfg.reward == "rlftsim_mloo" else {}  # a set of one: M of the rollout
            return RewardResult(score, parts | outcomes | mloo, info)
        components = {k: float(v[i]) for k, v in r.terms.items()} | outcomes
        return RewardResult(float(np.clip(r.total[i], *self.reward_range)), components, info)

    def reward_batch(self, examples: Sequence[RiftExample], outputs: Sequence[object]) -> list[RewardResult]:
        """Every row's reward; with ``rlftsim_mloo`` the usable rows of one state are scored together (MLOO)."""
        results = [self.reward(e, o) for e, o in zip(examples, outputs)]
        if self.cfg.reward != "rlftsim_mloo":
            return results
        sets: dict[int, list[tuple[int, np.ndarray]]] = {}
        for row, (example, output) in enumerate(zip(examples, outputs)):
            poses, _ = self.trajectory(example, output)
            if poses is not None:  # unusable rows keep their floor and stay out of the set
                sets.setdefault(id(example), []).append((row, poses))
        for members in sets.values():
            example, rows = examples[members[0][0]], [row for row, _ in members]
            credit = mloo_rewards([poses for _, poses in members], self.log(example),
                                  [results[r].components["collision"] > 0 for r in rows],
                                  [results[r].components["offroad"] > 0 for r in rows], SIM_DT, self.cfg.rlftsim)
            for r, c in zip(rows, credit):
                results[r] = RewardResult(float(c), results[r].components | {"mloo": float(c)}, results[r].info)
        return results

    def metrics(self, examples: Sequence[RiftExample], outputs: Sequence[object],
                results: Sequence[RewardResult]) -> dict[str, float]:
        out = {"collision_rate": float(np.mean([r.components["collision"] for r in results])),
               "offroad_rate": float(np.mean([r.components["offroad"] for r in results])),
               "progress_mean": float(np.mean([r.components["progress"] for r in results]))}
        rows = [(self.trajectory(e, o)[0], e, r) for e, o, r in zip(examples, outputs, results)]
        usable = [(poses, e, r) for poses, e, r in rows if poses is not None]
        if usable:  # realism of the usable outputs only (an unusable one has no trajectory)
            out |= realism_metrics([p for p, _, _ in usable], [self.log(e) for _, e, _ in usable],
                                   [r.components["collision"] > 0 for _, _, r in usable],
                                   [r.components["offroad"] > 0 for _, _, r in usable], SIM_DT)
        return out

    def closed_loop_metrics(self, choose: Callable[[np.ndarray, np.ndarray], int], split: str, seeds: Sequence[int],
                            episodes_out: list | None = None) -> dict[str, float]:
        """8-s closed-loop episodes from the states of ``seeds`` (:func:`closed_loop_metrics`, this task's traffic)."""
        return closed_loop_metrics(choose, split, seeds, episodes_out, tuple(self.cfg.traffic))

    def reference_output(self, example: RiftExample) -> int:
        """The candidate closest (mean displacement over the horizon) to the log: the imitation target."""
        key = (example.split, example.seed)
        if key not in self._reference:
            ade = np.linalg.norm(example.candidates[:, :, :2] - self.log(example)[None, :, :2], axis=-1).mean(1)
            self._reference[key] = int(ade.argmin())
        return self._reference[key]


# ------------------------------------------------------------------------------------------------
# Closed-loop evaluation

def closed_loop_metrics(choose: Callable[[np.ndarray, np.ndarray], int], split: str, seeds: Sequence[int],
                        episodes_out: list | None = None, traffic: tuple[int, int] | None = (5, 9)) -> dict[str, float]:
    """8-s closed-loop episodes of the CBV driven by ``choose(features, context) -> index`` from the
    states of ``seeds`` in ``split``, against the rule-based log from the same states.

    Returns ``collision_rate``, ``offroad_rate``, ``progress_mean`` (m), ``goal_rate`` (≥ 45 m along the
    route without a collision), realism ``w1_speed`` / ``w1_accel`` / ``w1_jerk`` (Wasserstein-1 between the
    pooled per-step distributions of the policy's and the log's CBV) and their ``_per_agent`` means
    (:func:`mmrl.tasks.driving.realism.realism_metrics`), and the log's own
    ``log_collision_rate`` / ``log_offroad_rate`` / ``log_progress_mean``. ``episodes_out`` collects
    (state, policy episode, log episode) when given.
    """
    runs: list[tuple[TrafficState, Episode, Episode]] = []
    for seed in seeds:
        state = make_state(int(seed), split, traffic=traffic)
        runs.append((state, closed_loop_episode(state, choose), rule_based_episode(state)))
    if episodes_out is not None:
        episodes_out.extend(runs)
    return summarise_closed_loop(runs)


def summarise_closed_loop(runs: Sequence[tuple[TrafficState, Episode, Episode]]) -> dict[str, float]:
    """Rates and realism of (state, policy episode, log episode) triples: ``episodes``, ``collision_rate``,
    ``offroad_rate``, ``progress_mean``, ``goal_rate`` (and ``log_`` ones), ``w1_<feature>`` (pooled) and
    ``w1_<feature>_per_agent``."""
    out: dict[str, float] = {"episodes": float(len(runs))}
    for prefix, k in (("", 1), ("log_", 2)):
        eps = [r[k] for r in runs]
        out[f"{prefix}collision_rate"] = float(np.mean([e.collision for e in eps]))
        out[f"{prefix}offroad_rate"] = float(np.mean([e.offroad for e in eps]))
        out[f"{prefix}progress_mean"] = float(np.mean([e.progress for e in eps]))
        out[f"{prefix}goal_rate"] = float(np.mean([e.goal_reached for e in eps]))
    realism = realism_metrics([r[1].cbv for r in runs], [r[2].cbv for r in runs], [r[1].collision for r in runs],
                              [r[1].offroad for r in runs], SIM_DT)
    for name in KINEMATIC_FEATURES:
        out[f"w1_{name}"] = realism[f"realism_w1_{name}"]
        out[f"w1_{name}_per_agent"] = realism[f"realism_w1_{name}_per_agent"]
    return out
