"""``driving/laviplan-v0``: LaViPlan-style language-guided waypoint planning (arXiv 2507.12911).

Prompt = an ego-centred bird's-eye-view raster of a seeded scene of :mod:`mmrl.envs.driving` and its
instruction ("turn left at the intersection"); answer = ``<think>…</think><answer>[(x1,y1),…,(xT,yT)]
</answer>``, T waypoints every Δt seconds in the ego frame (x forward, y left, metres). The reward
(:mod:`mmrl.tasks.driving.laviplan_reward`) aligns the plan with the world's expert planner (bounded
ADE/FDE terms) and subtracts collision and off-road penalties found by simulating the plan in the
world with its traffic reacting. The paper's exact reward is NOT FOUND (seed_tasks.md §4.2); the
choices are INFERRED and documented there.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from PIL import Image

from mmrl.core.contracts import IMAGE_PLACEHOLDER, RewardResult
from mmrl.envs.driving.geometry import point_at_arclength, polyline_arclength, polyline_tangents, project_to_polyline
from mmrl.envs.driving.maps import LAYOUT_BUILDERS, OOD_LAYOUTS, TRAIN_LAYOUTS
from mmrl.envs.driving.render import render_bev
from mmrl.envs.driving.world import (CAR_LENGTH, CAR_WIDTH, SPLITS, Agent, Scenario, TrajectoryCheck, check_trajectory,
                                     expert_trajectory, make_scenario)
from mmrl.tasks.driving.laviplan_reward import (ParsedPlan, RewardWeights, format_waypoints,
                                                parse_plan, planning_metrics, plan_reward)
from mmrl.tasks.parsing import tag_blocks, text_problem

SEED_SPACE = 2**31 - 1
CHECK_CACHE = 16384
LEAD_STREAM = 0x1EAD
"""Third key of the lead-vehicle generator's stream (split index, seed, LEAD_STREAM): independent of the
world's own (split, seed) stream, so scenes without a leader are the world's scenes unchanged."""
GAP_BINS = (12.0, 25.0, 40.0)
"""Bumper-gap bins (metres) of the perception label (:meth:`LaviPlanTask.vision_label`)."""
GAP_WORDS = ("lead near", "lead mid", "lead far", "clear")
"""The ``{lead}`` think field per perception label (what is seen ahead, not what to do); one or two
words, so the whole answer fits in 48 new tokens of the tiny tokenizer."""
CORRIDOR = 2.0
"""A vehicle whose centre is within this many metres of the ego's route is in the ego's path."""
BRAKE = 4.0
"""m/s²: the expert lattice's hardest braking (world._speed_profile), used to keep a stop possible."""
"""World verdicts kept per task (sampled groups repeat plans): (split, seed, waypoints) → check."""


@dataclass(frozen=True)
class LaviPlanConfig(RewardWeights):
    horizon: int = 4
    """Waypoints per answer (T)."""
    dt: float = 0.5
    """Seconds between waypoints (Δt): T·Δt = 2 s ahead by default."""
    decimals: int = 0
    """Decimals of the reference answers (0: whole metres, short for tiny models; 1 for real VLMs)."""
    image_size: int = 64
    """Side of the BEV raster in pixels."""
    metres_per_px: float = 1.0
    """Raster scale. The ego sits at 0.75·image_size rows from the top, so 0.75·image_size·metres_per_px
    metres ahead are in view (84 px at 0.5 m/px: 31.5 m ahead, ±21 m sideways, 3×3 image tokens of
    the tiny VLM, the ego's lane in the middle column)."""
    lead_share: float = 0.0
    """Share of ``train`` / ``test`` scenes with a slow or stopped lead vehicle on the ego's route ahead
    (a queue / crawling car: the scenes where collisions come from, docs/results.md). Drawn per scene
    from its own seeded stream; the gap lets the expert stop (≥ v²/(2·4 m/s²) + 2 m bumper to bumper)
    and varies up to 20 m beyond, so how much to slow must be read from the image. OOD splits unchanged."""
    success_fde: float = 2.0
    """A plan succeeds when it is usable, collision- and off-road-free, and FDE < this (metres)."""
    max_abs_coord: float = 100.0
    """Waypoints farther than this (metres) make the answer unusable."""
    speed_in_prompt: bool = False
    """Say the ego's current speed in the prompt ("Ego speed 7 m/s."): the BEV raster is a still
    frame, so without it how far the ego moves in T·Δt is not in the input (a real planner knows
    its own speed; nuScenes-style VLM planners put the ego state in the prompt)."""
    think: str = "{instruction}"
    """Template of the reference answers' think block; fields ``{instruction}``, ``{maneuver}``,
    ``{speed}`` (the ego speed in whole m/s), ``{lead}`` (the perception label in words: "lead near" / "lead mid" /
    "lead far" for a vehicle in the ego's path < 12 / 12–25 / 25–40 m ahead, "clear"; :data:`GAP_WORDS`). Short templates keep a tiny model's answers short. The think is
    only a supervised target: the model writes it from the image and prompt, the reward ignores it."""
    layouts: tuple[str, ...] = ()
    """Training layouts to keep (e.g. ``[straight, merge]``); empty: all. Scenes of other layouts are
    skipped by drawing further seeds (an easy setting for tiny models); the ``ood_layout`` split
    keeps its unseen layouts (s-curve, T-junction) unless some are named here."""
    agents: tuple[int, ...] = ()
    """``[low, high]``: background vehicles in each ``train`` / ``test`` scene, ``low + seed % (high −
    low + 1)`` (denser in-domain traffic: more scenes where the plan must yield); empty: the world's
    default (2–5). The OOD splits keep their own definitions (``ood_dense``: 10–15)."""
    train_pool: int = 0
    """0: every ``train`` draw is a fresh seed. N > 0: ``train`` scenes are seeds 0..N−1, each built
    once (expert planning is the slow part) and kept in memory; other splits always draw fresh seeds
    from the whole seed space (the world keys scenes by (split, seed): no overlap either way)."""


@dataclass(frozen=True)
class PlanExample:
    """Satisfies :class:`mmrl.core.contracts.VisualPrompt`."""

    scenario: Scenario = field(compare=False, repr=False)
    split: str
    expert: np.ndarray = field(compare=False, repr=False)  # [T, 2] ego frame
    image: Image.Image = field(compare=False, repr=False)
    horizon: int = 4
    dt: float = 0.5
    speed_in_prompt: bool = False
    has_lead: bool = False  # a lead vehicle was added (task.args.lead_share)

    @property
    def speed(self) -> int:
        """The ego's speed at t = 0 in whole m/s (what the prompt says)."""
        return int(round(float(self.scenario.ego[3])))

    @property
    def prompt(self) -> str:
        state = f" Ego speed {self.speed} m/s." if self.speed_in_prompt else ""
        return (f"{IMAGE_PLACEHOLDER}Instruction: {self.scenario.instruction}.{state} Plan {self.horizon} waypoints "
                f"(x forward, y left, metres), one every {self.dt} s. Answer <think>...</think>"
                f"<answer>[(x1,y1),...]</answer>.")

    @property
    def images(self) -> tuple[Image.Image, ...]:
        return (self.image,)

    @property
    def system(self) -> None:
        return None


def with_lead_vehicle(scenario: Scenario, share: float, rng: np.random.Generator) -> Scenario:
    """``scenario`` with, in a ``share`` of draws, a slow or stopped vehicle on the ego's route ahead.

    Speed U(0, 3) m/s and the same desired speed (IDM keeps it crawling); bumper gap v²/(2·4) + 2 +
    U(0, 20) m for ego speed v, so the lattice expert (hardest braking 4 m/s², 1 m margin) can always
    stop behind it and sometimes need not slow at all. Background vehicles within 10 m of it are
    removed (no overlapping spawn). Returns ``scenario`` unchanged otherwise."""
    if rng.random() >= share:
        return scenario
    v = float(scenario.ego[3])
    s_ego = float(project_to_polyline(scenario.ego[None, :2], scenario.route)[0][0])
    s_lead = s_ego + CAR_LENGTH + v * v / (2 * BRAKE) + 2.0 + float(rng.uniform(0.0, 20.0))
    s_lead = min(s_lead, float(polyline_arclength(scenario.route)[-1]) - 1.0)
    xy = point_at_arclength(scenario.route, np.array(s_lead))
    heading = float(polyline_tangents(scenario.route)[min(int(round(s_lead)), len(scenario.route) - 1)])
    speed = float(rng.uniform(0.0, 3.0))
    lead = Agent(float(xy[0]), float(xy[1]), heading, speed, CAR_LENGTH, CAR_WIDTH, scenario.route, speed)
    others = tuple(a for a in scenario.agents if np.hypot(a.x - lead.x, a.y - lead.y) >= 10.0)
    return replace(scenario, agents=(lead, *others))


def lead_gap(scenario: Scenario) -> float:
    """Bumper gap (m) along the ego's route to the nearest vehicle ahead in its path (centre within
    ``CORRIDOR`` m of the route, heading within 60° of the route's), inf when none."""
    if not scenario.agents:
        return float("inf")
    s_ego = float(project_to_polyline(scenario.ego[None, :2], scenario.route)[0][0])
    xy = np.array([[a.x, a.y] for a in scenario.agents])
    s, lateral, tangent = project_to_polyline(xy, scenario.route)
    heading = np.array([a.heading for a in scenario.agents])
    aligned = np.cos(heading - tangent) > 0.5
    lengths = np.array([a.length for a in scenario.agents])
    gaps = s - s_ego - (CAR_LENGTH + lengths) / 2
    ahead = (np.abs(lateral) < CORRIDOR) & aligned & (s > s_ego)
    return float(gaps[ahead].min()) if ahead.any() else float("inf")


def think_states(output: object, word: str) -> bool:
    """``output``'s one think block names exactly one of :data:`GAP_WORDS`, and it is ``word``."""
    if text_problem(output):
        return False
    thinks = tag_blocks(output, "think")
    if len(thinks) != 1 or "<think>" in thinks[0]:
        return False
    return [w for w in GAP_WORDS if w in thinks[0]] == [word]


class LaviPlanTask:
    id = "driving/laviplan-v0"

    def __init__(self, cfg: LaviPlanConfig):
        cfg.validate()
        if cfg.horizon < 1 or not cfg.dt > 0 or cfg.decimals < 0 or cfg.image_size < 16:
            raise ValueError(f"task.args: need horizon >= 1, dt > 0, decimals >= 0, image_size >= 16; got "
                             f"{cfg.horizon}, {cfg.dt}, {cfg.decimals}, {cfg.image_size}")
        unknown = [name for name in cfg.layouts if name not in LAYOUT_BUILDERS]
        if unknown:
            raise ValueError(f"task.args.layouts: unknown layout(s) {unknown}; known: {sorted(LAYOUT_BUILDERS)}")
        check_think(cfg.think)
        if cfg.agents and not (len(cfg.agents) == 2 and 0 <= cfg.agents[0] <= cfg.agents[1] <= 30):
            raise ValueError(f"task.args.agents must be [low, high] with 0 <= low <= high <= 30, "
                             f"got {list(cfg.agents)}")
        if cfg.train_pool < 0:
            raise ValueError(f"task.args.train_pool must be >= 0, got {cfg.train_pool}")
        if not 0.0 <= cfg.lead_share <= 1.0 or not cfg.metres_per_px > 0:
            raise ValueError(f"task.args: need 0 <= lead_share <= 1 and metres_per_px > 0; got {cfg.lead_share}, "
                             f"{cfg.metres_per_px}")
        self.cfg = cfg
        self.reward_range = cfg.score_range
        self._pool: dict[int, PlanExample | None] = {}  # train seed → example (None: layout filtered out)
        self._checks: OrderedDict[tuple, TrajectoryCheck] = OrderedDict()

    def sample_batch(self, split: str, n: int, rng: np.random.Generator) -> list[PlanExample]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; {self.id} has {SPLITS}")
        cfg = self.cfg
        possible = OOD_LAYOUTS if split == "ood_layout" else TRAIN_LAYOUTS
        keep = [name for name in cfg.layouts if name in possible]  # ood_layout keeps its unseen layouts
        if cfg.layouts and not keep and split != "ood_layout":
            raise ValueError(f"task.args.layouts {list(cfg.layouts)}: split {split!r} has only {possible}")
        pooled = split == "train" and cfg.train_pool > 0
        examples: list[PlanExample] = []
        for _ in range(1000):
            high = cfg.train_pool if pooled else SEED_SPACE
            for seed in rng.integers(0, high, size=n - len(examples)).tolist():
                if pooled and seed not in self._pool:
                    self._pool[seed] = self._build(split, seed, keep)
                example = self._pool[seed] if pooled else self._build(split, seed, keep)
                if example is not None:
                    examples.append(example)
            if len(examples) == n:
                return examples
        raise ValueError(f"task.args.layouts {list(cfg.layouts)}: no scene of split {split!r} in 1000 draws "
                         f"(train_pool {cfg.train_pool} too small?)")

    def _build(self, split: str, seed: int, keep: list[str]) -> PlanExample | None:
        """The example of (split, seed), or None when its layout is not kept."""
        cfg = self.cfg
        n_agents = None
        if cfg.agents and split in ("train", "test"):
            n_agents = cfg.agents[0] + int(seed) % (cfg.agents[1] - cfg.agents[0] + 1)
        scenario = make_scenario(int(seed), split, n_agents)  # the world keys its stream by (split, seed)
        if keep and scenario.road.layout not in keep:
            return None
        plain = scenario
        if cfg.lead_share > 0 and split in ("train", "test"):
            scenario = with_lead_vehicle(scenario, cfg.lead_share,
                                         np.random.default_rng([SPLITS.index(split), int(seed), LEAD_STREAM]))
        expert = expert_trajectory(scenario, cfg.horizon * cfg.dt, cfg.dt)
        image = Image.fromarray(render_bev(scenario, size=cfg.image_size, metres_per_px=cfg.metres_per_px))
        return PlanExample(scenario, split, expert, image, cfg.horizon, cfg.dt, cfg.speed_in_prompt,
                           scenario is not plain)

    vision_classes = len(GAP_BINS) + 1

    def vision_label(self, example: PlanExample) -> int:
        """Perception label for ``warm_start.vision_steps``: the bumper gap to the vehicle ahead in the
        ego's path, binned (0: < 12 m, 1: 12–25 m, 2: 25–40 m, 3: none within 40 m). A fact of the
        picture, not the answer: how much to slow also depends on the ego's and the leader's speeds
        (driving stacks pretrain perception on such labels before planning; here because a randomly
        initialised tiny vision tower reads nothing, docs/results.md)."""
        return int(np.searchsorted(GAP_BINS, lead_gap(example.scenario), side="right"))

    def check(self, example: PlanExample, waypoints: np.ndarray) -> TrajectoryCheck:
        """The world's verdict on ``waypoints`` [T, 2] for ``example`` (memoised: a scene is a pure
        function of (split, seed), so equal plans of equal scenes get equal verdicts)."""
        key = (example.split, example.scenario.seed, np.asarray(waypoints, np.float64).tobytes())
        if key in self._checks:
            self._checks.move_to_end(key)
            return self._checks[key]
        verdict = check_trajectory(example.scenario, waypoints, self.cfg.dt)
        self._checks[key] = verdict
        if len(self._checks) > CHECK_CACHE:
            self._checks.popitem(last=False)
        return verdict

    def parse(self, output: object) -> ParsedPlan:
        """The plan an output states (waypoints [T, 2] or None with the reason); never raises."""
        return parse_plan(output, self.cfg.horizon, self.cfg.max_abs_coord)

    def _score(self, example: PlanExample, plan: ParsedPlan, perceived: bool = False) -> RewardResult:
        if plan.waypoints is None:
            return plan_reward(plan, example.expert, False, False, self.cfg)
        check = self.check(example, plan.waypoints)
        if not check.valid:  # the world refused the plan (shape, NaN, too far): unusable, with its reason
            return plan_reward(ParsedPlan(None, False, check.reason), example.expert, False, False, self.cfg)
        return plan_reward(plan, example.expert, check.collision, check.offroad, self.cfg, perceived)

    def perceived(self, example: PlanExample, output: object) -> bool:
        """The output's think block names exactly one of :data:`GAP_WORDS`, and it is the scene's
        (``perception_weight``: a verifiable check of the reasoning's perception statement; naming
        several words, or the right one outside the think, does not count)."""
        return think_states(output, GAP_WORDS[self.vision_label(example)])

    def reward(self, example: PlanExample, output: str) -> RewardResult:
        plan = self.parse(output)  # the perception credit needs a well-formed output (one think, one answer)
        perceived = self.cfg.perception_weight > 0 and plan.well_formed and self.perceived(example, output)
        return self._score(example, plan, perceived)

    def reference_output(self, example: PlanExample) -> str:
        think = self.cfg.think.format(instruction=example.scenario.instruction, maneuver=example.scenario.maneuver,
                                      speed=example.speed, lead=GAP_WORDS[self.vision_label(example)])
        return f"<think>{think}</think><answer>{format_waypoints(example.expert, self.cfg.decimals)}</answer>"

    def metrics(self, examples: Sequence[PlanExample], outputs: Sequence[str],
                results: Sequence[RewardResult]) -> dict[str, float]:
        plans = [self.parse(o) for o in outputs]
        metrics = planning_metrics(plans, [e.expert for e in examples], results, self.cfg.success_fde)
        if "{lead}" in self.cfg.think:  # does the reasoning still state what the picture shows (as the reward checks)?
            metrics["perception_accuracy"] = float(np.mean([p.well_formed and self.perceived(e, o)
                                                            for e, o, p in zip(examples, outputs, plans)]))
        return metrics


def check_think(think: str) -> None:
    """``task.args.think`` may name only the fields the planner tasks fill in."""
    try:
        think.format(instruction="", maneuver="", speed=0, lead="")
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(f"task.args.think {think!r}: only {{instruction}}, {{maneuver}}, {{speed}}, {{lead}} may "
                         f"appear ({err})") from err
