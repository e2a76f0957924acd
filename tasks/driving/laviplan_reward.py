"""LaViPlan-style waypoint answers: parsing, the bounded reward and the planning metrics.

Pure functions on strings and arrays (no world): :mod:`mmrl.tasks.driving.laviplan` joins them
with the driving world's expert planner and trajectory checker.

Answer format (LaViPlan, arXiv 2507.12911, Fig. 1(c): "format-based reasoning verification and
trajectory alignment"; the exact form is NOT FOUND in the paper, chosen here and documented in
docs/tasks.md)::

    <think>left turn at the intersection; slow for the agent ahead</think><answer>[(x1,y1),…,(xT,yT)]</answer>

``(x_t, y_t)`` is the ego position ``t·Δt`` seconds from now, in metres, in the ego frame at
time 0 (x forward, y left). Exactly ``T`` pairs, finite, within ``max_abs_coord`` metres.

Reward (INFERRED, seed_tasks.md §4.3; every term is a logged component)::

    score = w_fmt·format + (1 − w_fmt)·alignment − c_col·collision − c_off·offroad − c_inv·invalid
    (with w_per > 0: + w_per·perception; with w_prog > 0: + w_prog·progress; alignment weighted
    1 − w_fmt − w_per − w_prog)
    alignment = (1 − λ)·exp(−ADE/σ_ADE) + λ·exp(−FDE/σ_FDE)

``format`` is 1 when the whole output is one think block followed by one answer block holding a
valid plan. ``collision`` / ``offroad`` come from simulating a valid plan in the world. A plan
that cannot be used (no or several answer blocks, unparseable, wrong length, NaN/inf, kilometres
away) gets ``alignment = 0`` with the reason in ``info`` and ``invalid = 1``. The weights must
satisfy ``c_inv ≥ c_col + c_off`` (:meth:`RewardWeights.validate`; the defaults are equal): an unusable
answer then scores no better than a plan that both collides and leaves the road, so emitting
garbage never pays better than trying.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mmrl.core.contracts import RewardResult
from mmrl.tasks.parsing import tag_blocks, text_problem

WELL_FORMED = re.compile(r"\s*<think>(?:(?!</?think>|</?answer>).)*</think>\s*<answer>(?:(?!</?answer>|</?think>).)*"
                         r"</answer>\s*", re.DOTALL)
PAIR = re.compile(r"\(\s*([^(),\s]+)\s*,\s*([^(),\s]+)\s*\)")
NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?:nan|inf|infinity)", re.IGNORECASE)
COMPONENTS = ("format", "alignment", "collision", "offroad", "invalid")


@dataclass(frozen=True)
class ParsedPlan:
    """What an output says: ``waypoints`` [T, 2] when it holds a usable plan, else None and ``reason``."""

    waypoints: np.ndarray | None
    well_formed: bool  # exactly <think>…</think><answer>…</answer> (and the plan is usable)
    reason: str = ""


@dataclass(frozen=True)
class RewardWeights:
    """The reward's weights (see the module docstring); defaults are documented in docs/tasks.md."""

    format_weight: float = 0.1  # w_fmt
    sigma_ade: float = 2.0  # σ_ADE, metres
    sigma_fde: float = 3.0  # σ_FDE, metres
    fde_weight: float = 0.5  # λ
    collision_penalty: float = 0.5  # c_col
    offroad_penalty: float = 0.5  # c_off
    invalid_penalty: float = 1.0  # c_inv
    perception_weight: float = 0.0  # w_per: reward for a think that states what is seen correctly (0 = off)
    progress_weight: float = 0.0  # w_prog: reward for route progress in [0, 1] measured by the simulator (0 = off)

    def validate(self) -> None:
        if not 0.0 <= self.format_weight < 1.0:
            raise ValueError(f"task.args.format_weight must be in [0, 1), got {self.format_weight}")
        if not (self.perception_weight >= 0.0 and self.progress_weight >= 0.0
                and self.format_weight + self.perception_weight + self.progress_weight < 1.0):
            raise ValueError(f"task.args.perception_weight and progress_weight must be >= 0 with format_weight + "
                             f"perception_weight + progress_weight < 1, got {self.perception_weight}, "
                             f"{self.progress_weight} (format_weight {self.format_weight})")
        if not (self.sigma_ade > 0 and self.sigma_fde > 0):
            raise ValueError(f"task.args.sigma_ade / sigma_fde must be > 0, got {self.sigma_ade}, {self.sigma_fde}")
        if not 0.0 <= self.fde_weight <= 1.0:
            raise ValueError(f"task.args.fde_weight must be in [0, 1], got {self.fde_weight}")
        for name in ("collision_penalty", "offroad_penalty", "invalid_penalty"):
            if not 0.0 <= getattr(self, name) <= 10.0:
                raise ValueError(f"task.args.{name} must be in [0, 10], got {getattr(self, name)}")
        if self.invalid_penalty < self.collision_penalty + self.offroad_penalty:
            raise ValueError(
                f"task.args.invalid_penalty ({self.invalid_penalty}) must be >= collision_penalty + offroad_penalty "
                f"({self.collision_penalty} + {self.offroad_penalty}): otherwise an unusable answer outscores a valid "
                f"plan that collides and leaves the road; set invalid_penalty: "
                f"{self.collision_penalty + self.offroad_penalty:g} (or more)")

    @property
    def score_range(self) -> tuple[float, float]:
        """[−c_inv, 1]: an unusable answer scores the floor (validated weights: no valid plan is lower)."""
        return (-self.invalid_penalty, 1.0)


def format_waypoints(waypoints: np.ndarray, decimals: int) -> str:
    """The answer list for ``waypoints`` [T, 2], rounded to ``decimals`` (no spaces, no ``-0``).

    >>> format_waypoints(np.array([[4.04, -0.01], [8.0, 1.26]]), 1)
    '[(4.0,0.0),(8.0,1.3)]'
    >>> format_waypoints(np.array([[3.6, -0.4]]), 0)
    '[(4,0)]'
    """
    def number(v: float) -> str:
        text = f"{round(float(v), decimals) + 0.0:.{decimals}f}"
        return text[1:] if text.startswith("-") and float(text) == 0.0 else text

    return "[" + ",".join(f"({number(x)},{number(y)})" for x, y in np.asarray(waypoints, dtype=float)) + "]"


def parse_plan_list(text: str, horizon: int, max_abs_coord: float) -> tuple[np.ndarray | None, str]:
    """``[(x1,y1),…,(xT,yT)]`` → ([T, 2] array, "") or (None, reason). Total for any string.

    >>> parse_plan_list(" [(1, 2), (3.5,-4)] ", 2, 100.0)[0].tolist()
    [[1.0, 2.0], [3.5, -4.0]]
    >>> parse_plan_list("[(1,2)]", 2, 100.0)
    (None, 'wrong length: 1 waypoints, expected 2')
    """
    body = text.strip()
    if not (body.startswith("[") and body.endswith("]")):
        return None, "answer is not a [(x,y),…] list"
    body = body[1:-1]
    pairs = PAIR.findall(body)
    residue = PAIR.sub("", body).replace(",", "").strip()
    if residue:
        return None, f"unparseable text in the waypoint list: {residue[:40]!r}"
    if len(pairs) != horizon:
        return None, f"wrong length: {len(pairs)} waypoints, expected {horizon}"
    for x, y in pairs:
        for token in (x, y):
            if NUMBER.fullmatch(token) is None:
                return None, f"not a number: {token[:20]!r}"
    points = np.array([[float(x), float(y)] for x, y in pairs], dtype=np.float64)
    if not np.all(np.isfinite(points)):
        return None, "non-finite coordinate (NaN or inf)"
    far = float(np.max(np.abs(points)))
    if far > max_abs_coord:
        return None, f"waypoint {far:.4g} m away, beyond the {max_abs_coord:g} m bound"
    return points, ""


def parse_plan(output: object, horizon: int, max_abs_coord: float) -> ParsedPlan:
    """Read the plan from a model output; never raises.

    >>> parse_plan("<think>keep lane</think><answer>[(4,0),(8,0)]</answer>", 2, 100.0).well_formed
    True
    >>> parse_plan("<answer>[(4,0)]</answer><answer>[(8,0)]</answer>", 1, 100.0).reason
    'expected one <answer> block, found 2'
    """
    if problem := text_problem(output):  # bounds the parser's work (MAX_OUTPUT_CHARS)
        return ParsedPlan(None, False, problem)
    blocks = tag_blocks(output, "answer")
    if len(blocks) != 1:
        return ParsedPlan(None, False, f"expected one <answer> block, found {len(blocks)}")
    waypoints, reason = parse_plan_list(blocks[0], horizon, max_abs_coord)
    if waypoints is None:
        return ParsedPlan(None, False, reason)
    well_formed = WELL_FORMED.fullmatch(output) is not None
    return ParsedPlan(waypoints, well_formed, "" if well_formed else "plan read, but not exactly "
                      "<think>…</think><answer>…</answer>")


def displacement_errors(predicted: np.ndarray, expert: np.ndarray) -> tuple[float, float]:
    """(ADE, FDE) in metres: mean and final Euclidean distance between [T, 2] trajectories.

    >>> displacement_errors(np.array([[0., 0.], [3., 4.]]), np.zeros((2, 2)))
    (2.5, 5.0)
    """
    distances = np.linalg.norm(np.asarray(predicted, float) - np.asarray(expert, float), axis=1)  # [T]
    return float(distances.mean()), float(distances[-1])


def alignment_score(ade: float, fde: float, weights: RewardWeights) -> float:
    """(1 − λ)·exp(−ADE/σ_ADE) + λ·exp(−FDE/σ_FDE) ∈ (0, 1]; 1 for the expert's own plan.

    >>> alignment_score(0.0, 0.0, RewardWeights())
    1.0
    >>> round(alignment_score(2.0, 3.0, RewardWeights()), 6)  # e^-1
    0.367879
    """
    return (1.0 - weights.fde_weight) * math.exp(-ade / weights.sigma_ade) + \
        weights.fde_weight * math.exp(-fde / weights.sigma_fde)


def plan_reward(plan: ParsedPlan, expert: np.ndarray, collision: bool, offroad: bool,
                weights: RewardWeights, perceived: bool = False, progress: float = 0.0) -> RewardResult:
    """The score of a parsed plan, given the world's verdict on it (ignored when the plan is invalid).

    With ``perception_weight`` w_per > 0, ``perceived`` (the think states what the scene shows, checked
    by the task) earns w_per; with ``progress_weight`` w_prog > 0, ``progress`` ∈ [0, 1] (the task's
    measure of how far the executed plan got) earns w_prog·progress; alignment's weight is what is left,
    1 − w_fmt − w_per − w_prog. The ``perception`` / ``progress`` components are logged when their
    weight is on. Both are off by default."""
    per, prog = weights.perception_weight, weights.progress_weight
    extra = ({"perception": 0.0} if per else {}) | ({"progress": 0.0} if prog else {})
    if plan.waypoints is None:
        components = {"format": 0.0, "alignment": 0.0, "collision": 0.0, "offroad": 0.0, "invalid": 1.0}
        return RewardResult(-weights.invalid_penalty, components | extra, plan.reason)
    ade, fde = displacement_errors(plan.waypoints, expert)
    alignment = alignment_score(ade, fde, weights)
    fmt = float(plan.well_formed)
    progress = min(max(float(progress), 0.0), 1.0)
    score = weights.format_weight * fmt + per * float(perceived) + prog * progress \
        + (1.0 - weights.format_weight - per - prog) * alignment \
        - weights.collision_penalty * float(collision) - weights.offroad_penalty * float(offroad)
    components = {"format": fmt, "alignment": alignment, "collision": float(collision),
                  "offroad": float(offroad), "invalid": 0.0} | ({"perception": float(perceived)} if per else {}) \
        | ({"progress": progress} if prog else {})
    reasons = [r for r, flag in ((plan.reason, True), ("collision", collision), ("off-road", offroad)) if flag and r]
    return RewardResult(float(score), components, "; ".join(reasons) or f"ADE {ade:.2f} m, FDE {fde:.2f} m")


def planning_metrics(plans: Sequence[ParsedPlan], experts: Sequence[np.ndarray],
                     results: Sequence[RewardResult], success_fde: float) -> dict[str, float]:
    """ADE/FDE (m, over valid plans), valid/format rates, collision/off-road rates (over valid
    plans), success rate (over all: valid, no collision, no off-road, FDE < ``success_fde``)."""
    valid = [i for i, p in enumerate(plans) if p.waypoints is not None]
    errors = [displacement_errors(plans[i].waypoints, experts[i]) for i in valid]
    success = [float(results[i].components["collision"] == 0 and results[i].components["offroad"] == 0
                     and fde < success_fde) for i, (_, fde) in zip(valid, errors)]

    def mean(values: Sequence[float]) -> float:
        return float(np.mean(values)) if len(values) else float("nan")

    n = max(len(plans), 1)
    return {"ade": mean([e[0] for e in errors]), "fde": mean([e[1] for e in errors]),
            "valid_rate": len(valid) / n, "format_rate": mean([r.components["format"] for r in results]),
            "collision_rate": mean([results[i].components["collision"] for i in valid]),
            "offroad_rate": mean([results[i].components["offroad"] for i in valid]),
            "success_rate": float(sum(success)) / n,
            "alignment_mean": mean([r.components["alignment"] for r in results])}
