"""Bird's-eye-view raster of a driving scene, ego-centred and heading-up (PIL drawing)."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from mmrl.envs.driving.geometry import box_corners, offset_polyline, world_to_ego

ROAD, LANE_LINE, OFFROAD = (90, 90, 90), (210, 210, 210), (25, 50, 25)
EGO, AGENT, OBSTACLE, ROUTE, GOAL = (230, 50, 50), (60, 120, 255), (255, 150, 0), (40, 190, 40), (120, 255, 120)


def render_bev(scenario, ego_pose: np.ndarray | None = None, agent_poses: np.ndarray | None = None,
               size: int = 64, metres_per_px: float = 1.0, show_route: bool = True,
               apply_weather: bool = True) -> np.ndarray:
    """RGB uint8 [size, size, 3]. The ego sits at column size/2, row 0.75·size, facing up; one pixel is
    ``metres_per_px`` metres (default: 48 m ahead, 16 m behind, ±32 m sideways).

    ``ego_pose`` [4] / ``agent_poses`` [N, 4] (world x, y, heading, speed) override the scenario's
    initial state (closed-loop rendering). ``ood_weather`` scenarios get fog/noise/tint, seeded.
    """
    ego = scenario.ego if ego_pose is None else np.asarray(ego_pose, float)
    if agent_poses is None:
        agent_poses = np.array([[a.x, a.y, a.heading, a.speed] for a in scenario.agents]).reshape(-1, 4)
    origin, heading = ego[:2], float(ego[2])

    def px(points_world: np.ndarray) -> list[tuple[float, float]]:
        e = world_to_ego(points_world, origin, heading)
        cols = size / 2 - e[..., 1] / metres_per_px
        rows = 0.75 * size - e[..., 0] / metres_per_px
        return list(zip(cols.ravel().tolist(), rows.ravel().tolist()))

    img = Image.new("RGB", (size, size), OFFROAD)
    draw = ImageDraw.Draw(img)
    area = scenario.road.drivable
    draw.polygon(px(np.asarray(area.exterior.coords)), fill=ROAD)
    for hole in area.interiors:
        draw.polygon(px(np.asarray(hole.coords)), fill=OFFROAD)
    for lane in scenario.road.lanes:
        for side in (-1, 1):
            draw.line(px(offset_polyline(lane.centre, side * lane.width / 2)), fill=LANE_LINE, width=1)
    if show_route:
        draw.line(px(scenario.route), fill=ROUTE, width=max(1, size // 64))
        g = px(scenario.goal[None])[0]
        r = max(1.0, size / 64)
        draw.ellipse([g[0] - r, g[1] - r, g[0] + r, g[1] + r], fill=GOAL)
    for agent, pose in zip(scenario.agents, agent_poses):
        corners = box_corners(pose[0], pose[1], pose[2], agent.length, agent.width)
        draw.polygon(px(corners), fill=OBSTACLE if agent.static else AGENT)
    draw.polygon(px(box_corners(ego[0], ego[1], ego[2], 4.5, 1.9)), fill=EGO)
    out = np.asarray(img, dtype=np.uint8).copy()
    if apply_weather and scenario.weather is not None:
        out = perturb_weather(out, scenario.weather, np.random.default_rng(scenario.seed))
    return out


def perturb_weather(image: np.ndarray, weather, rng: np.random.Generator) -> np.ndarray:
    """Fog (blend to light grey), per-channel tint and Gaussian pixel noise; uint8 out."""
    x = image.astype(np.float32)
    x = (1 - weather.fog) * x + weather.fog * 200.0
    x = x * np.asarray(weather.tint, np.float32)
    x = x + rng.normal(0.0, weather.noise_std, x.shape).astype(np.float32)
    return np.clip(x, 0, 255).astype(np.uint8)
