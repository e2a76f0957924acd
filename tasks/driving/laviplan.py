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

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from mmrl.contracts import IMAGE_PLACEHOLDER, RewardResult
from mmrl.envs.driving.render import render_bev
from mmrl.envs.driving.world import SPLITS, Scenario, check_trajectory, expert_trajectory, make_scenario
from mmrl.tasks.driving.laviplan_reward import (ParsedPlan, RewardWeights, format_waypoints, parse_plan,
                                                planning_metrics, plan_reward)

SEED_SPACE = 2**31 - 1


@dataclass(frozen=True)
class LaviPlanConfig(RewardWeights):
    horizon: int = 4
    """Waypoints per answer (T)."""
    dt: float = 0.5
    """Seconds between waypoints (Δt): T·Δt = 2 s ahead by default."""
    decimals: int = 0
    """Decimals of the reference answers (0: whole metres, short for tiny models; 1 for real VLMs)."""
    image_size: int = 64
    """Side of the BEV raster (1 m per pixel)."""
    success_fde: float = 2.0
    """A plan succeeds when it is usable, collision- and off-road-free, and FDE < this (metres)."""
    max_abs_coord: float = 100.0
    """Waypoints farther than this (metres) make the answer unusable."""


@dataclass(frozen=True)
class PlanExample:
    """Satisfies :class:`mmrl.contracts.VisualPrompt`."""

    scenario: Scenario = field(compare=False, repr=False)
    split: str
    expert: np.ndarray = field(compare=False, repr=False)  # [T, 2] ego frame
    image: Image.Image = field(compare=False, repr=False)
    horizon: int = 4
    dt: float = 0.5

    @property
    def prompt(self) -> str:
        return (f"{IMAGE_PLACEHOLDER}Instruction: {self.scenario.instruction}. Plan {self.horizon} waypoints "
                f"(x forward, y left, metres), one every {self.dt} s. Answer <think>...</think>"
                f"<answer>[(x1,y1),...]</answer>.")

    @property
    def images(self) -> tuple[Image.Image, ...]:
        return (self.image,)

    @property
    def system(self) -> None:
        return None


class LaviPlanTask:
    id = "driving/laviplan-v0"

    def __init__(self, cfg: LaviPlanConfig):
        cfg.validate()
        if cfg.horizon < 1 or not cfg.dt > 0 or cfg.decimals < 0 or cfg.image_size < 16:
            raise ValueError(f"task.args: need horizon >= 1, dt > 0, decimals >= 0, image_size >= 16; got "
                             f"{cfg.horizon}, {cfg.dt}, {cfg.decimals}, {cfg.image_size}")
        self.cfg = cfg
        self.reward_range = cfg.score_range

    def sample_batch(self, split: str, n: int, rng: np.random.Generator) -> list[PlanExample]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; {self.id} has {SPLITS}")
        cfg, examples = self.cfg, []
        for seed in rng.integers(0, SEED_SPACE, size=n).tolist():
            scenario = make_scenario(int(seed), split)  # the world keys its stream by (split, seed)
            expert = expert_trajectory(scenario, cfg.horizon * cfg.dt, cfg.dt)
            image = Image.fromarray(render_bev(scenario, size=cfg.image_size))
            examples.append(PlanExample(scenario, split, expert, image, cfg.horizon, cfg.dt))
        return examples

    def _parse(self, output: object) -> ParsedPlan:
        return parse_plan(output, self.cfg.horizon, self.cfg.max_abs_coord)

    def _score(self, example: PlanExample, plan: ParsedPlan) -> RewardResult:
        if plan.waypoints is None:
            return plan_reward(plan, example.expert, False, False, self.cfg)
        check = check_trajectory(example.scenario, plan.waypoints, self.cfg.dt)
        if not check.valid:  # the world refused the plan (shape, NaN, too far): unusable, with its reason
            return plan_reward(ParsedPlan(None, False, check.reason), example.expert, False, False, self.cfg)
        return plan_reward(plan, example.expert, check.collision, check.offroad, self.cfg)

    def reward(self, example: PlanExample, output: str) -> RewardResult:
        return self._score(example, self._parse(output))

    def reference_output(self, example: PlanExample) -> str:
        think = example.scenario.instruction
        return f"<think>{think}</think><answer>{format_waypoints(example.expert, self.cfg.decimals)}</answer>"

    def metrics(self, examples: Sequence[PlanExample], outputs: Sequence[str],
                results: Sequence[RewardResult]) -> dict[str, float]:
        plans = [self._parse(o) for o in outputs]
        return planning_metrics(plans, [e.expert for e in examples], results, self.cfg.success_fde)
