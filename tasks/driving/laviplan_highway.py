"""``driving/laviplan-highway-v0``: LaViPlan waypoint planning on highway-env scenes (issue 26).

The same task as ``driving/laviplan-v0`` (:mod:`mmrl.tasks.driving.laviplan`: prompt, answer format and
parser, reward terms, metrics, perception label) on traffic simulated by highway-env
(:mod:`mmrl.envs.driving.highway`; ``pip install 'mmrl[highway]'``): scenes of ``intersection-v0``,
``merge-v0``, ``roundabout-v0`` and ``highway-fast-v0``, each seeded per example, rasterised by our BEV
renderer in the world's conventions (ego at column size/2, row 0.75·size, heading up; the ego's route in
green). An answer's waypoints are tracked by a pure-pursuit / PD controller on a highway-env vehicle for
the plan's horizon while the other vehicles drive as highway-env drives them (IDM, MOBIL, right of way);
the reward takes highway-env's crash and on-road verdicts, the route progress, and the alignment with the
expert (highway-env's IDM vehicle as the ego, :func:`mmrl.envs.driving.highway.expert_plan`).

Splits: ``train`` and ``test`` draw from the scene types in ``scenes`` except ``ood_scene``, with disjoint
highway-env seeds (train [0, 2²⁸), test [2²⁸, 2²⁹)); ``ood`` draws only ``ood_scene`` (seeds [2²⁹, 2³⁰)).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from mmrl.core.contracts import RewardResult
from mmrl.envs.driving.render import render_bev
from mmrl.tasks.driving.laviplan import GAP_BINS, GAP_WORDS, PlanExample, check_think, lead_gap, think_states
from mmrl.tasks.driving.laviplan_reward import (ParsedPlan, RewardWeights, format_waypoints, parse_plan,
                                                plan_reward, planning_metrics)

if TYPE_CHECKING:  # highway-env is an optional extra: imported when the task is made
    from mmrl.envs.driving.highway import HighwayScene, PlanOutcome

SPLITS = ("train", "test", "ood")
SEED_BLOCK = 2**28
"""Each split owns a block of highway-env seeds: split k draws reset seeds in [k·SEED_BLOCK, (k+1)·SEED_BLOCK)."""
KNOWN_SCENES = ("intersection-v0", "merge-v0", "roundabout-v0", "highway-fast-v0")
"""The scene types (highway-env ids) this task sets up (:data:`mmrl.envs.driving.highway.SCENES`)."""
OUTCOME_CACHE = 16384
"""Executed plans kept per task (sampled groups repeat plans): (split, seed, waypoints) → outcome."""
EXAMPLE_CACHE = 2048
"""Built examples kept per task outside the train pool (evaluation redraws the same seeds)."""
MAX_DRAWS = 1000


@dataclass(frozen=True)
class LaviPlanHighwayConfig(RewardWeights):
    scenes: tuple[str, ...] = KNOWN_SCENES
    """highway-env scene types to draw from (any of :data:`KNOWN_SCENES`)."""
    ood_scene: str = "roundabout-v0"
    """The scene type held out of ``train`` / ``test``: the ``ood`` split is made of it alone."""
    horizon: int = 3
    """Waypoints per answer (T)."""
    dt: float = 1.0
    """Seconds between waypoints (Δt); Δt·sim_hz must be a whole number of simulation steps."""
    sim_hz: int = 10
    """highway-env simulation steps per second (its own default is 15; ``highway-fast`` uses 5)."""
    decimals: int = 0
    """Decimals of the reference answers."""
    image_size: int = 84
    """Side of the BEV raster in pixels."""
    metres_per_px: float = 1.0
    """Raster scale: 0.75·image_size·metres_per_px metres ahead are in view (63 m by default: highway
    speeds reach 30 m/s, 90 m in 3 s)."""
    speed_in_prompt: bool = True
    """Say the ego's speed in the prompt: ego speeds range from ~5 (intersection) to 30 m/s (merge)."""
    think: str = "{instruction}"
    """Reference think template; fields ``{instruction}``, ``{maneuver}``, ``{speed}``, ``{lead}`` (as in
    ``driving/laviplan-v0``: the gap to the vehicle ahead on the ego's route, binned)."""
    success_fde: float = 2.0
    """A plan succeeds when it is usable, crash- and off-road-free, and FDE < this (metres)."""
    max_abs_coord: float = 150.0
    """Waypoints farther than this (metres) make the answer unusable."""
    train_pool: int = 0
    """0: every ``train`` draw is a fresh seed. N > 0: ``train`` scenes are seeds 0..N−1, each built once
    (the expert's simulations are the slow part) and kept in memory."""


@dataclass(frozen=True)
class HighwayPlanExample(PlanExample):
    """A :class:`PlanExample` (same prompt and fields; ``scenario`` is the snapshot in our frame) with
    highway-env's snapshot (``scene``) and the expert's route progress (metres)."""

    scene: HighwayScene | None = field(default=None, compare=False, repr=False)
    expert_progress: float = 0.0


def progress_score(progress_m: float, expert_progress_m: float) -> float:
    """Route progress relative to the expert's, in [0, 1]: (p + 1) / (p_expert + 1) clipped (the +1 m
    makes a stop where the expert stops score 1; going farther than the expert earns nothing more).

    >>> progress_score(9.0, 19.0), progress_score(0.0, 0.0), progress_score(30.0, 19.0)
    (0.5, 1.0, 1.0)
    """
    return float(np.clip((progress_m + 1.0) / (max(expert_progress_m, 0.0) + 1.0), 0.0, 1.0))


def train_scenes(scenes: Sequence[str], ood_scene: str) -> tuple[str, ...]:
    """The scene types of ``train`` / ``test``: ``scenes`` without ``ood_scene``; unknown types, or nothing left,
    are an error naming the task args."""
    unknown = [name for name in (*scenes, ood_scene) if name not in KNOWN_SCENES]
    if unknown:
        raise ValueError(f"task.args.scenes / ood_scene: unknown scene type(s) {unknown}; known: {list(KNOWN_SCENES)}")
    kept = tuple(name for name in scenes if name != ood_scene)
    if not kept:
        raise ValueError(f"task.args.scenes {list(scenes)}: nothing left for train/test once ood_scene {ood_scene!r} "
                         f"is held out")
    return kept


def scene_type(scenes: tuple[str, ...], ood_scene: str, split: str, seed: int, salt: int = 0) -> str:
    """The scene type of (split, seed): ``ood_scene`` for ``ood``, else one of ``scenes`` drawn from (split, seed[, salt])."""
    if split == "ood":
        return ood_scene
    key = [SPLITS.index(split), seed] + ([salt] if salt else [])
    return scenes[int(np.random.default_rng(key).integers(len(scenes)))]


class LaviPlanHighwayTask:
    id = "driving/laviplan-highway-v0"
    vision_classes = len(GAP_BINS) + 1

    def __init__(self, cfg: LaviPlanHighwayConfig):
        cfg.validate()
        self.train_scenes = train_scenes(cfg.scenes, cfg.ood_scene)
        if cfg.horizon < 1 or not cfg.dt > 0 or cfg.decimals < 0 or cfg.image_size < 16 or not cfg.metres_per_px > 0:
            raise ValueError(f"task.args: need horizon >= 1, dt > 0, decimals >= 0, image_size >= 16, metres_per_px > 0; "
                             f"got {cfg.horizon}, {cfg.dt}, {cfg.decimals}, {cfg.image_size}, {cfg.metres_per_px}")
        if not 1 <= cfg.sim_hz <= 100 or abs(cfg.dt * cfg.sim_hz - round(cfg.dt * cfg.sim_hz)) > 1e-9:
            raise ValueError(f"task.args: sim_hz must be in [1, 100] with dt·sim_hz whole steps; got sim_hz "
                             f"{cfg.sim_hz}, dt {cfg.dt}")
        if cfg.horizon * cfg.dt > 10.0:
            raise ValueError(f"task.args: horizon·dt must be at most 10 s (each answer is simulated that long), "
                             f"got {cfg.horizon * cfg.dt:g}")
        if cfg.train_pool < 0:
            raise ValueError(f"task.args.train_pool must be >= 0, got {cfg.train_pool}")
        check_think(cfg.think)
        try:
            from mmrl.envs.driving import highway
        except ImportError as err:
            raise ImportError(f"{self.id} needs highway-env: pip install 'mmrl[highway]' ({err})") from err
        self.highway = highway
        self.cfg = cfg
        self.reward_range = cfg.score_range
        self._pool: dict[int, HighwayPlanExample | None] = {}
        self._built: OrderedDict[tuple[str, int], HighwayPlanExample | None] = OrderedDict()
        self._outcomes: OrderedDict[tuple, PlanOutcome] = OrderedDict()

    # -------------------------------------------------------------------------------------------
    # Examples

    def sample_batch(self, split: str, n: int, rng: np.random.Generator) -> list[HighwayPlanExample]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; {self.id} has {SPLITS}")
        pooled = split == "train" and self.cfg.train_pool > 0
        examples: list[HighwayPlanExample] = []
        for _ in range(MAX_DRAWS):
            high = self.cfg.train_pool if pooled else SEED_BLOCK
            for seed in rng.integers(0, high, size=n - len(examples)).tolist():
                example = self._example(split, int(seed), pooled)
                if example is not None:
                    examples.append(example)
            if len(examples) == n:
                return examples
        raise ValueError(f"{self.id}: fewer than {n} usable scenes of split {split!r} in {MAX_DRAWS} draws "
                         f"(train_pool {self.cfg.train_pool} too small?)")

    def _example(self, split: str, seed: int, pooled: bool) -> HighwayPlanExample | None:
        """The example of (split, seed), built once (kept in the train pool, or in a bounded cache)."""
        key = (split, seed)
        if pooled:
            if seed not in self._pool:
                self._pool[seed] = self.build(split, seed)
            return self._pool[seed]
        if key in self._built:
            self._built.move_to_end(key)
            return self._built[key]
        example = self._built[key] = self.build(split, seed)
        if len(self._built) > EXAMPLE_CACHE:
            self._built.popitem(last=False)
        return example

    def scene_type(self, split: str, seed: int) -> str:
        """The scene type of (split, seed): ``ood_scene`` for ``ood``, else one of the train scenes, seeded."""
        return scene_type(self.train_scenes, self.cfg.ood_scene, split, seed)

    def build(self, split: str, seed: int) -> HighwayPlanExample | None:
        """The example of (split, seed) (None when its warm-up crashed: the sampler draws another seed)."""
        cfg = self.cfg
        env_seed = SPLITS.index(split) * SEED_BLOCK + seed
        scene = self.highway.make_scene(self.scene_type(split, seed), env_seed, cfg.sim_hz)
        if scene is None:
            return None
        scenario = self.highway.to_scenario(scene, split)
        expert = self.highway.expert_plan(scene, cfg.horizon, cfg.dt, cfg.decimals)
        image = Image.fromarray(render_bev(scenario, size=cfg.image_size, metres_per_px=cfg.metres_per_px))
        return HighwayPlanExample(scenario, split, expert.waypoints, image, cfg.horizon, cfg.dt, cfg.speed_in_prompt,
                                  False, scene, expert.outcome.progress_m)

    def vision_label(self, example: HighwayPlanExample) -> int:
        """The perception label of ``driving/laviplan-v0``: the bumper gap to the vehicle ahead on the ego's
        route, binned (0: < 12 m, 1: 12–25 m, 2: 25–40 m, 3: none within 40 m)."""
        return int(np.searchsorted(GAP_BINS, lead_gap(example.scenario), side="right"))

    def reference_output(self, example: HighwayPlanExample) -> str:
        think = self.cfg.think.format(instruction=example.scenario.instruction, maneuver=example.scenario.maneuver,
                                      speed=example.speed, lead=GAP_WORDS[self.vision_label(example)])
        return f"<think>{think}</think><answer>{format_waypoints(example.expert, self.cfg.decimals)}</answer>"

    # -------------------------------------------------------------------------------------------
    # Reward

    def parse(self, output: object) -> ParsedPlan:
        """The plan an output states (waypoints [T, 2] or None with the reason); never raises."""
        return parse_plan(output, self.cfg.horizon, self.cfg.max_abs_coord)

    def outcome(self, example: HighwayPlanExample, waypoints: np.ndarray) -> PlanOutcome:
        """highway-env's verdict on ``waypoints`` [T, 2] (memoised: a scene is a pure function of (split,
        seed), so equal plans of equal scenes get equal verdicts)."""
        key = (example.split, example.scene.seed, np.asarray(waypoints, np.float64).tobytes())
        if key in self._outcomes:
            self._outcomes.move_to_end(key)
            return self._outcomes[key]
        verdict = self._outcomes[key] = self.highway.execute_plan(example.scene, waypoints, self.cfg.dt)
        if len(self._outcomes) > OUTCOME_CACHE:
            self._outcomes.popitem(last=False)
        return verdict

    def reward(self, example: HighwayPlanExample, output: str) -> RewardResult:
        plan = self.parse(output)
        if plan.waypoints is None:  # unusable (no answer, wrong length, NaN, too far): the invalid penalty and why
            return plan_reward(plan, example.expert, False, False, self.cfg)
        perceived = self.cfg.perception_weight > 0 and plan.well_formed and \
            think_states(output, GAP_WORDS[self.vision_label(example)])
        verdict = self.outcome(example, plan.waypoints)
        return plan_reward(plan, example.expert, verdict.crashed, verdict.offroad, self.cfg, perceived,
                           progress_score(verdict.progress_m, example.expert_progress))

    def metrics(self, examples: Sequence[HighwayPlanExample], outputs: Sequence[str],
                results: Sequence[RewardResult]) -> dict[str, float]:
        plans = [self.parse(o) for o in outputs]
        metrics = planning_metrics(plans, [e.expert for e in examples], results, self.cfg.success_fde)
        if "{lead}" in self.cfg.think:
            metrics["perception_accuracy"] = float(np.mean([
                p.well_formed and think_states(o, GAP_WORDS[self.vision_label(e)])
                for e, o, p in zip(examples, outputs, plans)]))
        return metrics

    # -------------------------------------------------------------------------------------------
    # Playback (GIFs)

    def playback(self, example: HighwayPlanExample, plan: ParsedPlan) -> tuple[np.ndarray, np.ndarray, float, float]:
        """The executed plan for a GIF: ego poses [S+1, 4], other vehicles' poses [S+1, N, 4] (our frame, in
        ``example.scenario.agents`` order), the first crash / off-road time (inf: none) and the step (s)."""
        verdict = self.highway.execute_plan(example.scene, plan.waypoints, self.cfg.dt, record=True)
        times = [t for t in (verdict.crash_time, verdict.offroad_time) if t is not None]
        return verdict.ego_poses, verdict.agent_poses, min(times, default=float("inf")), 1.0 / self.cfg.sim_hz
