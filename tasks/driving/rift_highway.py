"""``driving/rift-highway-v0``: RIFT's traffic-policy fine-tuning on highway-env traffic (issue 26).

The task of ``driving/rift-v0`` (:mod:`mmrl.tasks.driving.rift`: the same candidate-scoring policy, the same
15-candidate lattice, RIFT's dense return or RLFTSim's realism reward, the same metrics) with highway-env
(``pip install 'mmrl[highway]'``) as the traffic simulator instead of our 2-D world:

- **State**: a seeded highway-env scene (:func:`mmrl.envs.driving.highway.make_scene`: ``intersection-v0``,
  ``merge-v0``, ``highway-fast-v0``; ``roundabout-v0`` held out as ``ood``) after its seeded warm-up. The
  *controlled background vehicle* (CBV) is the highway-env vehicle nearest the scene's ego; everyone else,
  the ego included, stays highway-env's rule-based traffic (IDM, MOBIL, the intersection's right of way).
  Vehicles farther than ``radius`` m from the CBV are left out of the simulation (``radius`` = 80 m: no one
  closes more than ~60 m on it in the 4-s horizon at highway-env's speeds).
- **Control** (INFERRED): highway-env's multi-agent mode hands each *controlled* vehicle an action per step;
  here the CBV alone is controlled, by a :class:`mmrl.envs.driving.highway.TrackedVehicle` that follows the
  chosen candidate's poses exactly (RIFT's track propagation), and ``Road.step`` moves everyone else and
  checks collisions. Collision = highway-env's ``crashed``; off-road = ``not on_road`` (its on-lane test).
- **Candidates and policy inputs**: :func:`mmrl.tasks.driving.rift_sim.candidate_lattice` on the CBV's route
  (its lanes ahead, :func:`mmrl.envs.driving.highway.route_polyline`) with reference lines one highway-env
  lane (4 m) left and right, and :func:`mmrl.tasks.driving.rift_sim.features` on the snapshot in our frame.
- **Reward**: RIFT's dense terms (:func:`mmrl.tasks.driving.rift_sim.dense_terms`) on highway-env's
  verdicts, the lane alignment measured to the nearest highway-env lane centre; or, with ``reward:
  rlftsim``, RLFTSim's realism reward against the log (the CBV as highway-env's own IDM vehicle from the
  same state, everyone reacting), or with ``rlftsim_mloo`` its leave-one-out credit over sampled rollouts.
- **Splits**: ``train`` (seeds 0..``train_pool``−1 of its seed block), ``test`` (fresh seeds) and ``ood``
  (``ood_scene`` only), with disjoint highway-env seed blocks as in ``driving/laviplan-highway-v0``.

Closed loop (:meth:`RiftHighwayTask.closed_loop_metrics`): 8-s episodes, a new choice every 1 s, against the
log of the same states; ``python -m mmrl.tasks.driving.rift_eval --run RUN --splits test,ood``.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from mmrl.envs.driving.geometry import point_at_arclength, project_to_polyline
from mmrl.envs.driving.world import SIM_DT, Agent, Scenario
from mmrl.tasks.driving.laviplan_highway import KNOWN_SCENES, SEED_BLOCK, SPLITS, scene_type, train_scenes
from mmrl.tasks.driving.realism import RlftsimWeights
from mmrl.tasks.driving.rift import (TRAFFIC_REWARDS, RiftConfig, RiftExample, RiftTask,
                                     summarise_closed_loop)
from mmrl.tasks.driving.rift_sim import (EPISODE_STEPS, GOAL_DISTANCE, HORIZON_STEPS, REPLAN_STEPS, CandidateReturns,
                                         Episode, TrafficState, candidate_lattice, dense_terms, discounted_returns,
                                         features, reference_errors)

if TYPE_CHECKING:  # highway-env is an optional extra: imported when the task is made
    from highway_env.road.road import Road

LANE_OFFSET = 4.0
"""Reference lines one lane left / right of the CBV's route: highway-env's lane width (``AbstractLane.DEFAULT_WIDTH``)."""
SIM_HZ = 10
"""highway-env steps per second: the candidates' 0.1-s step (``rift_sim.SIM_DT``)."""
MAX_DRAWS = 1000


@dataclass(frozen=True)
class RiftHighwayConfig:
    scenes: tuple[str, ...] = KNOWN_SCENES
    """highway-env scene types to draw from (any of :data:`KNOWN_SCENES`)."""
    ood_scene: str = "roundabout-v0"
    """The scene type held out of ``train`` / ``test``: the ``ood`` split is made of it alone."""
    train_pool: int = 128
    """Distinct training states (seeds 0..train_pool−1 of the ``train`` block; a seed whose warm-up crashed
    or that has no other vehicle is skipped), each built and simulated once and kept in memory."""
    cache: int = 2048
    """States (with their simulated candidates) kept in memory outside the train pool."""
    radius: float = 80.0
    """Vehicles farther than this (m) from the CBV at the state are left out of the simulation."""
    reward: Literal["rift", "rlftsim", "rlftsim_mloo"] = "rift"
    """``rift``: RIFT's discounted dense return; ``rlftsim``: RLFTSim's realism reward against the log;
    ``rlftsim_mloo``: its leave-one-out credit over a state's sampled rollouts (as ``driving/rift-v0``)."""
    rlftsim: RlftsimWeights = field(default_factory=RlftsimWeights)
    """Weights and scales of the RLFTSim rewards (unused by ``rift``)."""

    def __post_init__(self) -> None:
        if self.reward not in TRAFFIC_REWARDS:
            raise ValueError(f"driving/rift-highway-v0: unknown reward {self.reward!r}; choose one of "
                             f"{', '.join(TRAFFIC_REWARDS)}")
        train_scenes(self.scenes, self.ood_scene)
        if self.train_pool < 1 or self.cache < 1 or not self.radius > 0:
            raise ValueError(f"task.args: need train_pool >= 1, cache >= 1, radius > 0; got {self.train_pool}, "
                             f"{self.cache}, {self.radius}")


@dataclass(frozen=True, eq=False)
class HighwayRiftExample(RiftExample):
    """A :class:`RiftExample` whose ``state`` is highway-env's snapshot seen in our frame, with the snapshot
    itself (``road``, never stepped: simulations copy it) and the CBV's index among its vehicles."""

    scene_id: str = ""
    road: Road | None = field(default=None, repr=False)
    cbv_index: int = 0


def copy_road(road: Road) -> Road:
    """A copy of a highway-env road to simulate on: vehicles copied, the (never changing) network shared."""
    return copy.deepcopy(road, memo={id(road.network): road.network})


def traffic_view(highway: Any, road: Road, index: int, scene_id: str, split: str, seed: int,
                 time: float = 0.0) -> TrafficState:
    """``road`` (with the CBV at ``road.vehicles[index]``) as a :class:`TrafficState` of our world: the CBV on
    its route, every other vehicle in road order, the scene's lanes (centre lines as reference lines)."""
    vehicle = road.vehicles[index]
    pose = highway.pose_of(vehicle)
    route = highway.route_polyline(road, vehicle)
    cbv = Agent(*(float(v) for v in pose), float(vehicle.LENGTH), float(vehicle.WIDTH), route,
                float(getattr(vehicle, "target_speed", pose[3])))
    others = []
    for k, other in enumerate(road.vehicles):
        if k == index:
            continue
        x, y, h, v = highway.pose_of(other)
        ahead = np.array([[x, y], [x + 10.0 * np.cos(h), y + 10.0 * np.sin(h)]])
        others.append(Agent(x, y, h, v, float(other.LENGTH), float(other.WIDTH), ahead,
                            float(getattr(other, "target_speed", v))))
    s_cbv = float(project_to_polyline(pose[None, :2], route)[0][0])
    goal = point_at_arclength(route, np.array(s_cbv + GOAL_DISTANCE))
    scenario = Scenario(int(seed), split, highway.scene_road_map(scene_id), pose, cbv.desired_speed, tuple(others),
                        route, goal, "keep_lane", "")
    return TrafficState(scenario, cbv, tuple(others), float(time), (split, int(seed), float(time)))


def lattice(state: TrafficState, n_steps: int = HORIZON_STEPS) -> tuple[np.ndarray, np.ndarray]:
    """The candidate lattice on highway-env's lane width."""
    return candidate_lattice(state, n_steps, offsets=(0.0, LANE_OFFSET, -LANE_OFFSET))


class RiftHighwayTask(RiftTask):
    id = "driving/rift-highway-v0"
    seed_high = SEED_BLOCK

    def __init__(self, cfg: RiftHighwayConfig):
        try:
            from mmrl.envs.driving import highway
        except ImportError as err:
            raise ImportError(f"{self.id} needs highway-env: pip install 'mmrl[highway]' ({err})") from err
        super().__init__(RiftConfig(train_pool=cfg.train_pool, cache=cfg.cache, reward=cfg.reward, rlftsim=cfg.rlftsim))
        self.highway = highway
        self.hcfg = cfg
        self.train_scenes = train_scenes(cfg.scenes, cfg.ood_scene)
        self._outcomes: OrderedDict[tuple[str, int, int], CandidateReturns] = OrderedDict()
        self._pool: dict[tuple, Any] = {}  # the train split's states, candidates' outcomes and logs: never evicted
        self._unusable: set[tuple[str, int]] = set()

    def _keep(self, table: OrderedDict, key: tuple, value: Any) -> Any:
        """Remember ``value``: in the pool for the train split, else in the bounded ``table``."""
        if key[0] == "train":
            self._pool[(id(table), *key)] = value
            return value
        return self._remember(table, key, value)

    def _recall(self, table: OrderedDict, key: tuple) -> Any | None:
        return self._pool.get((id(table), *key)) if key[0] == "train" else table.get(key)

    # -------------------------------------------------------------------------------------------
    # States

    def scene_type(self, split: str, seed: int) -> str:
        """``ood_scene`` for ``ood``; otherwise one of the train scenes, drawn from (split, seed)."""
        return scene_type(self.train_scenes, self.hcfg.ood_scene, split, seed, salt=7)

    def build(self, split: str, seed: int) -> HighwayRiftExample | None:
        """The state of (split, seed), or None (the warm-up crashed the ego, or no other vehicle can be the CBV)."""
        scene_id = self.scene_type(split, seed)
        scene = self.highway.make_scene(scene_id, SPLITS.index(split) * SEED_BLOCK + int(seed), SIM_HZ)
        if scene is None:
            return None
        road, ego = scene.road, scene.ego
        movers = [v for k, v in enumerate(road.vehicles)
                  if k != scene.ego_index and hasattr(v, "target_speed") and not v.crashed and v.on_road]
        if not movers:
            return None
        cbv = min(movers, key=lambda v: float(np.linalg.norm(v.position - ego.position)))
        road.vehicles = [v for v in road.vehicles if np.linalg.norm(v.position - cbv.position) <= self.hcfg.radius]
        index = road.vehicles.index(cbv)
        state = traffic_view(self.highway, road, index, scene_id, split, seed)
        cand, params = lattice(state)
        f, c = features(state, cand, params)
        return HighwayRiftExample(split, int(seed), state, cand, params, f, c, scene_id, road, index)

    def example(self, split: str, seed: int) -> HighwayRiftExample | None:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; {self.id} has {', '.join(SPLITS)}")
        if not 0 <= int(seed) < self.seed_high:
            raise ValueError(f"{self.id}: seed {seed} outside [0, {self.seed_high}) (each split owns a block of "
                             f"highway-env seeds)")
        key = (split, int(seed))
        if key in self._unusable:
            return None
        known = self._recall(self._examples, key)
        if known is not None:
            return known
        built = self.build(split, seed)
        if built is None:
            self._unusable.add(key)
            return None
        return self._keep(self._examples, key, built)

    def sample_batch(self, split: str, n: int, rng: np.random.Generator) -> list[HighwayRiftExample]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; {self.id} has {', '.join(SPLITS)}")
        high = self.hcfg.train_pool if split == "train" else self.seed_high
        examples: list[HighwayRiftExample] = []
        for _ in range(MAX_DRAWS):
            for seed in rng.integers(0, high, size=n - len(examples)).tolist():
                example = self.example(split, int(seed))
                if example is not None:
                    examples.append(example)
            if len(examples) == n:
                return examples
        raise ValueError(f"{self.id}: fewer than {n} usable states of split {split!r} in {MAX_DRAWS} draws")

    # -------------------------------------------------------------------------------------------
    # Simulation

    def simulate(self, example: HighwayRiftExample, poses: np.ndarray) -> CandidateReturns:
        """RIFT's return of the CBV following ``poses`` [S+1, 4] in a copy of the snapshot (one row)."""
        rollout = self.highway.follow_track(copy_road(example.road), example.cbv_index, poses, example.scene_id, SIM_HZ)
        cbv = poses[None]
        dd, dtheta = reference_errors(example.state, cbv)
        crashed, offroad = rollout.crashed[None], rollout.offroad[None]
        terms = dense_terms(cbv, crashed, offroad, dd, dtheta, SIM_DT)
        return discounted_returns(terms, crashed, offroad, cbv, example.state.cbv.route)

    def returns(self, example: HighwayRiftExample) -> CandidateReturns:
        """Every candidate's return (each simulated once, on demand)."""
        rows = [self._candidate(example, k) for k in range(len(example.candidates))]
        return CandidateReturns(np.concatenate([r.total for r in rows]),
                                {k: np.concatenate([r.terms[k] for r in rows]) for k in rows[0].terms},
                                *(np.concatenate([getattr(r, a) for r in rows]) for a in ("collision", "offroad", "progress")))

    def _candidate(self, example: HighwayRiftExample, k: int) -> CandidateReturns:
        key = (example.split, example.seed, int(k))
        known = self._recall(self._outcomes, key)
        return known if known is not None else self._keep(self._outcomes, key,
                                                           self.simulate(example, example.candidates[int(k)]))

    def outcome(self, example: HighwayRiftExample, output: object, poses: np.ndarray) -> tuple[CandidateReturns, int]:
        if isinstance(output, np.ndarray):
            return self.simulate(example, poses), 0
        return self._candidate(example, int(output)), 0

    def log(self, example: HighwayRiftExample) -> np.ndarray:
        """The CBV driven by highway-env itself (its IDM) for the horizon from the same state: poses [41, 4]."""
        key = (example.split, example.seed)
        known = self._recall(self._logs, key)
        if known is None:
            known, _ = self.highway.drive_as_is(copy_road(example.road), example.cbv_index, HORIZON_STEPS,
                                                example.scene_id, SIM_HZ)
            self._keep(self._logs, key, known)
        return known

    # -------------------------------------------------------------------------------------------
    # Closed loop

    def closed_loop_episode(self, example: HighwayRiftExample, choose: Callable[[np.ndarray, np.ndarray], int],
                            n_steps: int = EPISODE_STEPS, replan: int = REPLAN_STEPS) -> Episode:
        """The CBV driven by ``choose(features, context) -> index`` for ``n_steps``, a new choice every ``replan``
        steps (that candidate's first ``replan`` steps executed, everyone else reacting); stops at its first
        collision. Progress is the length of the path driven."""
        road, index = copy_road(example.road), example.cbv_index
        state, time = example.state, 0.0
        cbv_path, other_path, choices = [state.cbv_pose[None]], [], []
        crashed = offroad = False
        for _ in range(n_steps // replan):
            cand, params = lattice(state)
            k = int(choose(*features(state, cand, params)))
            if not 0 <= k < len(cand):
                raise ValueError(f"choose returned candidate {k}; there are {len(cand)}")
            choices.append(k)
            piece = cand[k, :replan + 1]
            rollout = self.highway.follow_track(road, index, piece, example.scene_id, SIM_HZ)
            other_path.append(rollout.others if not other_path else rollout.others[1:])
            cbv_path.append(piece[1:])
            offroad |= bool(rollout.offroad[1:].any())
            time += replan * SIM_DT
            if rollout.crashed.any():
                crashed = True
                break
            state = traffic_view(self.highway, road, index, example.scene_id, example.split, example.seed, time)
        return _episode(np.concatenate(cbv_path), np.concatenate(other_path), crashed, offroad, tuple(choices))

    def log_episode(self, example: HighwayRiftExample, n_steps: int = EPISODE_STEPS) -> Episode:
        """The log: the CBV driven by highway-env (its IDM) from the same state."""
        poses, rollout = self.highway.drive_as_is(copy_road(example.road), example.cbv_index, n_steps,
                                                  example.scene_id, SIM_HZ)
        return _episode(poses, rollout.others, bool(rollout.crashed[1:].any()), bool(rollout.offroad[1:].any()), ())

    def closed_loop_metrics(self, choose: Callable[[np.ndarray, np.ndarray], int], split: str, seeds: Sequence[int],
                            episodes_out: list | None = None) -> dict[str, float]:
        """:func:`mmrl.tasks.driving.rift.closed_loop_metrics` on highway-env: the states of ``seeds`` (unusable
        seeds skipped; ``episodes`` says how many ran), the policy's episodes against the logs."""
        runs = []
        for seed in seeds:
            example = self.example(split, int(seed))
            if example is not None:
                runs.append((example.state, self.closed_loop_episode(example, choose), self.log_episode(example)))
        if episodes_out is not None:
            episodes_out.extend(runs)
        return summarise_closed_loop(runs)


def _episode(cbv: np.ndarray, others: np.ndarray, crashed: bool, offroad: bool, choices: tuple[int, ...]) -> Episode:
    progress = float(np.linalg.norm(np.diff(cbv[:, :2], axis=0), axis=1).sum())
    return Episode(cbv, others, crashed, offroad, progress, progress >= GOAL_DISTANCE and not crashed, choices)


__all__ = ["HighwayRiftExample", "RiftHighwayConfig", "RiftHighwayTask", "traffic_view"]
