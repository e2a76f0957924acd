"""BEV GIFs of LaViPlan plans: each held-out scene played out along two plans side by side.

Each panel follows the ego (heading-up, :func:`mmrl.envs.driving.render.render_bev`) as it drives
through its planned waypoints with the traffic reacting (:func:`mmrl.envs.driving.world.simulate_traffic`),
the same simulation the reward's collision / off-road check runs. Overlays: the expert's
waypoints (green dots) and the panel's plan (white dots); the panel's border turns red from the
first step that collides or leaves the road; an unusable plan (no valid waypoints) shows the still
scene with a grey border and its reason's first words.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from mmrl.envs.driving.geometry import world_to_ego
from mmrl.envs.driving.render import render_bev
from mmrl.envs.driving.world import SIM_DT, check_trajectory, ego_poses_from_waypoints, simulate_traffic
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


def plan_frames(example, plan: ParsedPlan, size: int = 128, metres_per_px: float = 0.5,
                stride: int = 2) -> list[np.ndarray]:
    """RGB frames [size, size, 3] of ``example`` (a :class:`~mmrl.tasks.driving.laviplan.PlanExample`)
    played along ``plan`` every ``stride`` simulation steps (SIM_DT each)."""
    scenario = example.scenario
    expert_world = scenario.to_world(example.expert)
    n_steps = int(round(example.horizon * example.dt / SIM_DT))
    if plan.waypoints is None:
        frame = render_bev(scenario, size=size, metres_per_px=metres_per_px)
        img = Image.fromarray(frame)
        draw = ImageDraw.Draw(img)
        _dots(draw, expert_world, scenario.ego, size, metres_per_px, EXPERT_DOT)
        draw.rectangle([0, 0, size - 1, size - 1], outline=INVALID, width=BORDER)
        draw.text((BORDER + 1, size - 12), plan.reason[:22], fill=INVALID)
        return [np.asarray(img)] * (n_steps // stride + 1)
    ego = ego_poses_from_waypoints(scenario, plan.waypoints, example.dt)[None]  # [1, S+1, 4]
    agents = simulate_traffic(scenario, ego)  # [1, S+1, N, 4]
    check = check_trajectory(scenario, plan.waypoints, example.dt)  # the reward's own verdict and times
    times = [t for t in (check.collision_time, check.offroad_time) if t is not None]
    first_failure = min(times) if times else float("inf")
    plan_world = scenario.to_world(plan.waypoints)
    frames = []
    for t in range(0, ego.shape[1], stride):
        frame = render_bev(scenario, ego[0, t], agents[0, t], size=size, metres_per_px=metres_per_px)
        img = Image.fromarray(frame)
        draw = ImageDraw.Draw(img)
        _dots(draw, expert_world, ego[0, t], size, metres_per_px, EXPERT_DOT)
        _dots(draw, plan_world, ego[0, t], size, metres_per_px, PLAN_DOT)
        if t * SIM_DT >= first_failure - 1e-9:
            draw.rectangle([0, 0, size - 1, size - 1], outline=FAIL, width=BORDER)
        draw.text((BORDER + 1, size - 12), f"t={t * SIM_DT:.1f}s", fill=(255, 255, 255))
        frames.append(np.asarray(img))
    return frames


def write_plans_gif(path: str | Path, examples: Sequence, plans: dict[str, Sequence[ParsedPlan]],
                    size: int = 128, fps: int = 5) -> Path:
    """One GIF: for each example in turn, one panel per entry of ``plans`` (e.g. {"SFT": …, "GRPO": …}),
    labelled, side by side. Returns the path."""
    names = list(plans)
    if not names or any(len(plans[n]) != len(examples) for n in names):
        raise ValueError(f"need one plan per example for every entry; got {len(examples)} examples and "
                         f"{ {n: len(p) for n, p in plans.items()} }")
    frames: list[Image.Image] = []
    for i, example in enumerate(examples):
        panels = [plan_frames(example, plans[n][i], size) for n in names]
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
