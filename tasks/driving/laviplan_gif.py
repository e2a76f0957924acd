"""BEV GIFs of LaViPlan plans: each held-out scene played out along two plans side by side.

Each panel follows the ego (heading-up, :func:`mmrl.envs.driving.render.render_bev`) as it drives
through its planned waypoints with the traffic reacting, the same simulation the reward's collision /
off-road check runs (:func:`world_playback` for the driving world, a task's own ``playback`` otherwise,
e.g. highway-env's for ``driving/laviplan-highway-v0``). :func:`write_run_plans_gif` writes a run's GIF. Overlays: the expert's
waypoints (green dots) and the panel's plan (white dots); the panel's border turns red from the
first step that collides or leaves the road; an unusable plan (no valid waypoints) shows the still
scene with a grey border and its reason's first words.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from mmrl.core.checkpoint import latest_checkpoint
from mmrl.core.config import TrainConfig, load_config
from mmrl.core.registry import make_policy, make_task
from mmrl.core.rollout import SamplingParams
from mmrl.core.warm_start import warm_start_path
from mmrl.envs.driving.geometry import world_to_ego
from mmrl.envs.driving.render import render_bev
from mmrl.envs.driving.world import SIM_DT, check_trajectory, ego_poses_from_waypoints, simulate_traffic
from mmrl.tasks.driving.laviplan import LaviPlanTask
from mmrl.tasks.driving.laviplan_highway import LaviPlanHighwayTask
from mmrl.tasks.driving.laviplan_reward import ParsedPlan

EXPERT_DOT, PLAN_DOT, FAIL, INVALID = (40, 230, 40), (255, 255, 255), (255, 40, 40), (128, 128, 128)
BORDER = 3
LABEL_ROWS = 12


def _dots(draw: ImageDraw.ImageDraw, points_world: np.ndarray, pose: np.ndarray, size: int, mpp: float,
          colour: tuple[int, int, int]) -> None:
    e = world_to_ego(points_world, pose[:2], float(pose[2]))  # [K, 2] in the current ego frame
    for x, y in e:
        col, row = size / 2 - y / mpp, 0.75 * size - x / mpp
        draw.ellipse([col - 1.5, row - 1.5, col + 1.5, row + 1.5], fill=colour)


Playback = Callable[[object, ParsedPlan], tuple[np.ndarray, np.ndarray, float, float]]
"""(example, usable plan) → (ego poses [S+1, 4], other vehicles' poses [S+1, N, 4] in the order of
``example.scenario.agents`` (world frame), the first collision / off-road time in s (inf: none), the
step in s). :func:`world_playback` for the driving world; ``LaviPlanHighwayTask.playback`` for highway-env."""


def world_playback(example, plan: ParsedPlan) -> tuple[np.ndarray, np.ndarray, float, float]:
    """A :data:`Playback` in the driving world: the ego along the plan, traffic reacting (the reward's own check)."""
    scenario = example.scenario
    ego = ego_poses_from_waypoints(scenario, plan.waypoints, example.dt)[None]  # [1, S+1, 4]
    agents = simulate_traffic(scenario, ego)  # [1, S+1, N, 4]
    check = check_trajectory(scenario, plan.waypoints, example.dt)  # the reward's own verdict and times
    times = [t for t in (check.collision_time, check.offroad_time) if t is not None]
    return ego[0], agents[0], min(times, default=float("inf")), SIM_DT


def plan_frames(example, plan: ParsedPlan, size: int = 128, metres_per_px: float = 0.5,
                stride: int = 2, playback: Playback = world_playback) -> list[np.ndarray]:
    """RGB frames [size, size, 3] of ``example`` (a :class:`~mmrl.tasks.driving.laviplan.PlanExample`)
    played along ``plan`` every ``stride`` simulation steps of ``playback``."""
    scenario = example.scenario
    expert_world = scenario.to_world(example.expert)
    if plan.waypoints is None:
        n_steps = int(round(example.horizon * example.dt / SIM_DT))
        frame = render_bev(scenario, size=size, metres_per_px=metres_per_px)
        img = Image.fromarray(frame)
        draw = ImageDraw.Draw(img)
        _dots(draw, expert_world, scenario.ego, size, metres_per_px, EXPERT_DOT)
        draw.rectangle([0, 0, size - 1, size - 1], outline=INVALID, width=BORDER)
        draw.text((BORDER + 1, size - 12), plan.reason[:22], fill=INVALID)
        return [np.asarray(img)] * (n_steps // stride + 1)
    ego, agents, first_failure, step = playback(example, plan)
    plan_world = scenario.to_world(plan.waypoints)
    frames = []
    for t in range(0, ego.shape[0], stride):
        frame = render_bev(scenario, ego[t], agents[t], size=size, metres_per_px=metres_per_px)
        img = Image.fromarray(frame)
        draw = ImageDraw.Draw(img)
        _dots(draw, expert_world, ego[t], size, metres_per_px, EXPERT_DOT)
        _dots(draw, plan_world, ego[t], size, metres_per_px, PLAN_DOT)
        if t * step >= first_failure - 1e-9:
            draw.rectangle([0, 0, size - 1, size - 1], outline=FAIL, width=BORDER)
        draw.text((BORDER + 1, size - 12), f"t={t * step:.1f}s", fill=(255, 255, 255))
        frames.append(np.asarray(img))
    return frames


def write_plans_gif(path: str | Path, examples: Sequence, plans: dict[str, Sequence[ParsedPlan]],
                    size: int = 128, fps: int = 5, playback: Playback = world_playback,
                    metres_per_px: float = 0.5) -> Path:
    """One GIF: for each example in turn, one panel per entry of ``plans`` (e.g. {"SFT": …, "GRPO": …}),
    labelled, side by side, played by ``playback``. Returns the path."""
    names = list(plans)
    if not names or any(len(plans[n]) != len(examples) for n in names):
        raise ValueError(f"need one plan per example for every entry; got {len(examples)} examples and "
                         f"{ {n: len(p) for n, p in plans.items()} }")
    frames: list[Image.Image] = []
    for i, example in enumerate(examples):
        panels = [plan_frames(example, plans[n][i], size, metres_per_px, playback=playback) for n in names]
        for t in range(max(len(p) for p in panels)):
            canvas = Image.new("RGB", (size * len(names) + 2 * (len(names) - 1), size + LABEL_ROWS), (0, 0, 0))
            draw = ImageDraw.Draw(canvas)
            for k, (name, panel) in enumerate(zip(names, panels)):
                x0 = k * (size + 2)
                canvas.paste(Image.fromarray(panel[min(t, len(panel) - 1)]), (x0, LABEL_ROWS))
                draw.text((x0 + 2, 0), f"{name}: {example.scenario.instruction}"[:size // 6], fill=(255, 255, 255))
            frames.append(canvas)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=int(1000 / fps), loop=0, optimize=True)
    return path


def greedy_plans(cfg: TrainConfig, task, policy_dir: Path, examples: list) -> list[ParsedPlan]:
    """The parsed greedy plans of the policy saved in ``policy_dir`` for ``examples``."""
    policy = make_policy(cfg.policy.name, cfg.policy.args)
    policy.load_weights(str(policy_dir))
    policy.eval()
    with torch.no_grad():
        rollout = policy.rollout(examples, 1, SamplingParams(0.0, 1.0, cfg.rollout.max_new_tokens), cfg.eval.seed)
    return [task.parse(output) for output in rollout.outputs]  # rows follow the examples (group size 1)


def write_run_plans_gif(out: str | Path, num_scenes: int, split: str | None = None) -> Path | None:
    """OUT/plans.gif of a LaViPlan run (``driving/laviplan-v0`` or ``driving/laviplan-highway-v0``):
    ``num_scenes`` scenes of ``split`` (default: the run's ``eval.split``, drawn with its ``eval.seed``)
    played along the warm start's greedy plan (when the run had one) and the last checkpoint's, side by
    side, with the expert's waypoints. None for a task that is not a waypoint planner."""
    out = Path(out)
    cfg = load_config(str(out / "config.yaml"))
    task = make_task(cfg.task.name, cfg.task.args)
    if isinstance(task, LaviPlanHighwayTask):
        playback, size = task.playback, 128
        mpp = task.cfg.image_size * task.cfg.metres_per_px / size  # the model's field of view
    elif isinstance(task, LaviPlanTask):
        playback, size, mpp = world_playback, 128, 0.5
    else:
        return None  # the traffic policy writes its own closed-loop GIFs (tasks/driving/rift*)
    examples = task.sample_batch(split or cfg.eval.split, num_scenes, np.random.default_rng(cfg.eval.seed))
    plans = {}
    start = warm_start_path(cfg)
    if cfg.warm_start.sft_steps and start.is_dir():
        plans["SFT"] = greedy_plans(cfg, task, start, examples)
    plans["GRPO"] = greedy_plans(cfg, task, latest_checkpoint(out) / "policy", examples)
    return write_plans_gif(out / "plans.gif", examples, plans, size, playback=playback, metres_per_px=mpp)
