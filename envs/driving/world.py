"""The 2-D multi-agent driving world: seeded scenarios, rule-based traffic, trajectory checks, expert.

Frames and units (see also :mod:`mmrl.envs.driving.geometry`): world frame metres, x east, y north;
the **ego frame** is centred on the ego's centre at t = 0, **x forward, y left**, metres. Time in
seconds. Vehicles are oriented boxes (length along the heading) moving by a kinematic bicycle
model (wheelbase 2.7 m). Background agents follow their route by pure pursuit with IDM
longitudinal control (Treiber et al. 2000), reacting to every other box, the ego included.

Splits: ``train`` / ``test`` (same distribution; the generator's stream is keyed by (split, seed),
so the two never share a scenario), ``ood_layout`` (unseen layouts: s-curve, T-junction),
``ood_obstacles`` (construction-zone cones and a stopped car in the ego's lane), ``ood_dense``
(3x the traffic), ``ood_weather`` (train layouts; the BEV raster is perturbed: fog, noise, tint).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import shapely

from mmrl.envs.driving.geometry import (box_corners, boxes_overlap, ego_to_world, offset_polyline,
                                        point_at_arclength, polyline_arclength, polyline_tangents,
                                        project_to_polyline, smoothstep, world_to_ego, wrap_angle)
from mmrl.envs.driving.maps import LAYOUT_BUILDERS, OOD_LAYOUTS, TRAIN_LAYOUTS, RoadMap

SPLITS = ("train", "test", "ood_layout", "ood_obstacles", "ood_dense", "ood_weather")
WHEELBASE = 2.7
CAR_LENGTH, CAR_WIDTH = 4.5, 1.9
SIM_DT = 0.1
MAX_ABS_COORD = 500.0  # metres: ego-frame waypoints beyond this are rejected as garbage
MAX_SPEED = 40.0  # m/s: a waypoint list implying a faster ego is flagged infeasible

INSTRUCTIONS = {
    "keep_lane": "keep lane", "change_left": "change lane to the left", "change_right": "change lane to the right",
    "turn_left": "turn left at the intersection", "turn_right": "turn right at the intersection",
    "go_straight": "go straight through the intersection", "merge_left": "merge left onto the main road",
}


@dataclass(frozen=True, eq=False)
class Agent:
    """A background vehicle (or static obstacle): pose, size, route polyline [K, 2], desired speed."""

    x: float
    y: float
    heading: float
    speed: float
    length: float
    width: float
    route: np.ndarray
    desired_speed: float
    static: bool = False


@dataclass(frozen=True)
class Weather:
    """Visual perturbation of the BEV raster (``ood_weather``): fog blend, pixel noise, tint."""

    fog: float = 0.0  # 0..1 blend towards light grey
    noise_std: float = 0.0  # std of additive Gaussian pixel noise (0..255 scale)
    tint: tuple[float, float, float] = (1.0, 1.0, 1.0)  # per-channel gain


@dataclass(frozen=True, eq=False)
class Scenario:
    """One seeded driving scene. ``ego`` = (x, y, heading, speed) in the world frame."""

    seed: int
    split: str
    road: RoadMap
    ego: np.ndarray  # [4]
    ego_desired_speed: float
    agents: tuple[Agent, ...]
    route: np.ndarray  # [K, 2] the ego's route (world frame, 1 m spacing)
    goal: np.ndarray  # [2] world point on the route
    maneuver: str  # key of INSTRUCTIONS
    instruction: str
    weather: Weather | None = None

    def to_ego(self, points_world: np.ndarray) -> np.ndarray:
        return world_to_ego(points_world, self.ego[:2], float(self.ego[2]))

    def to_world(self, points_ego: np.ndarray) -> np.ndarray:
        return ego_to_world(points_ego, self.ego[:2], float(self.ego[2]))


# ------------------------------------------------------------------------------------------------
# Scenario generation

def _split_rng(seed: int, split: str) -> np.random.Generator:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return np.random.default_rng([SPLITS.index(split), int(seed)])


def _ego_route(road: RoadMap, rng: np.random.Generator, layout: str) -> tuple[str, np.ndarray, float]:
    """Pick the ego's maneuver and route; return (maneuver, route polyline, start arclength)."""
    if layout in ("intersection", "t_junction"):
        options = [(m, f"south_{t}") for m, t in (("turn_left", "left"), ("go_straight", "straight"),
                                                  ("turn_right", "right")) if f"south_{t}" in road.routes]
        maneuver, name = options[int(rng.integers(len(options)))]
        return maneuver, road.routes[name], 90.0 - 8.0 - float(rng.uniform(20, 35))
    if layout == "merge" and rng.random() < 0.5:
        return "merge_left", road.routes["ramp"], float(rng.uniform(10, 25))
    lane, left, right = road.lane_change_pairs[int(rng.integers(len(road.lane_change_pairs)))]
    choices = ["keep_lane"] + (["change_left"] if left else []) + (["change_right"] if right else [])
    maneuver = choices[int(rng.integers(len(choices)))]
    base, s0 = road.routes[lane], float(rng.uniform(20, 40))
    if maneuver == "keep_lane":
        return maneuver, base, s0
    sign = 1.0 if maneuver == "change_left" else -1.0
    s = polyline_arclength(base)
    ramp = sign * 3.5 * smoothstep((s - (s0 + 8.0)) / 30.0)
    return maneuver, offset_polyline(base, ramp), s0


def _spawn_agents(road: RoadMap, rng: np.random.Generator, ego_xy: np.ndarray, n: int) -> list[Agent]:
    names = sorted(road.routes)
    agents: list[Agent] = []
    taken = [ego_xy]
    for _ in range(n * 10):
        if len(agents) >= n:
            break
        route = road.routes[names[int(rng.integers(len(names)))]]
        length = polyline_arclength(route)[-1]
        s = float(rng.uniform(0, max(1.0, length - 40)))
        xy = point_at_arclength(route, np.array(s))
        if min(np.linalg.norm(xy - t) for t in taken) < 12.0:
            continue
        heading = float(polyline_tangents(route)[min(int(s), len(route) - 1)])
        desired = float(rng.uniform(6, 11))
        agents.append(Agent(float(xy[0]), float(xy[1]), heading, desired * float(rng.uniform(0.5, 1.0)),
                            CAR_LENGTH, CAR_WIDTH, route, desired))
        taken.append(xy)
    return agents


def _construction_zone(route: np.ndarray, s_ego: float, rng: np.random.Generator) -> list[Agent]:
    """Cones across the ego's lane and a stopped car behind them (``ood_obstacles``)."""
    s0 = s_ego + float(rng.uniform(22, 35))
    obstacles = []
    for k in range(4):
        xy = point_at_arclength(route, np.array(s0 + 2.0 * k))
        _, _, h = project_to_polyline(xy[None], route)
        lateral = -1.2 + 0.8 * k if k < 4 else 0.0
        p = offset_polyline(np.stack([xy, xy + [np.cos(h[0]), np.sin(h[0])]]), lateral)[0]
        obstacles.append(Agent(float(p[0]), float(p[1]), float(h[0]), 0.0, 0.6, 0.6, route, 0.0, True))
    xy = point_at_arclength(route, np.array(s0 + 12.0))
    _, _, h = project_to_polyline(xy[None], route)
    obstacles.append(Agent(float(xy[0]), float(xy[1]), float(h[0]), 0.0, CAR_LENGTH, CAR_WIDTH, route, 0.0, True))
    return obstacles


def make_scenario(seed: int, split: str = "train", n_agents: int | None = None) -> Scenario:
    """A seeded scenario of ``split`` (see the module docstring). Same (seed, split) → same scenario."""
    rng = _split_rng(seed, split)
    layouts = OOD_LAYOUTS if split == "ood_layout" else TRAIN_LAYOUTS
    layout = layouts[int(rng.integers(len(layouts)))]
    road = LAYOUT_BUILDERS[layout](rng)
    maneuver, route, s0 = _ego_route(road, rng, layout)
    xy = point_at_arclength(route, np.array(s0))
    heading = float(polyline_tangents(route)[min(int(round(s0)), len(route) - 1)])
    desired = float(rng.uniform(6, 10))
    ego = np.array([xy[0], xy[1], heading, desired * float(rng.uniform(0.6, 1.0))])
    if n_agents is None:
        n_agents = int(rng.integers(10, 16)) if split == "ood_dense" else int(rng.integers(2, 6))
    agents = _spawn_agents(road, rng, ego[:2], n_agents)
    if split == "ood_obstacles":
        agents = _construction_zone(route, s0, rng) + agents
    goal = point_at_arclength(route, np.array(s0 + 40.0))
    weather = None
    if split == "ood_weather":
        weather = Weather(float(rng.uniform(0.2, 0.5)), float(rng.uniform(10, 30)),
                          tuple(float(g) for g in rng.uniform(0.7, 1.2, 3)))
    return Scenario(int(seed), split, road, ego, desired, tuple(agents), route, goal, maneuver,
                    INSTRUCTIONS[maneuver], weather)


# ------------------------------------------------------------------------------------------------
# Rule-based traffic (IDM + pure pursuit), batched over C independent copies of the scene

def idm_acceleration(v: np.ndarray, v0: np.ndarray, gap: np.ndarray, dv: np.ndarray) -> np.ndarray:
    """IDM (Treiber 2000): a = a_max [1 − (v/v0)^4 − (s*/s)^2], s* = s0 + vT + v·Δv / (2√(ab))."""
    a_max, b, s_min, t_headway = 1.5, 2.0, 2.0, 1.5
    s_star = s_min + np.maximum(0.0, v * t_headway + v * dv / (2 * np.sqrt(a_max * b)))
    free = 1.0 - (v / np.maximum(v0, 0.1)) ** 4
    return np.clip(a_max * (free - (s_star / np.maximum(gap, 0.1)) ** 2), -8.0, a_max)


def _leader_gaps(pose: np.ndarray, length: np.ndarray, width: np.ndarray, n_agents: int) -> tuple[np.ndarray, np.ndarray]:
    """Gap [C, N] to the nearest box ahead in each agent's heading corridor, and the closing speed."""
    x, y, h, v = (pose[..., k] for k in range(4))  # [C, M]
    dx_w = x[:, None, :] - x[:, :n_agents, None]  # [C, N, M]
    dy_w = y[:, None, :] - y[:, :n_agents, None]
    c, s = np.cos(h[:, :n_agents, None]), np.sin(h[:, :n_agents, None])
    fwd, lat = c * dx_w + s * dy_w, -s * dx_w + c * dy_w
    half = (length[None, :n_agents, None] + length[None, None, :]) / 2
    ahead = (fwd > 0) & (np.abs(lat) < (width[None, :n_agents, None] + width[None, None, :]) / 2 + 0.5) & (fwd < 60)
    idx = np.arange(n_agents)
    ahead[:, idx, idx] = False
    gap = np.where(ahead, fwd - half, np.inf)
    j = gap.argmin(-1)  # [C, N]
    g = np.take_along_axis(gap, j[..., None], -1)[..., 0]
    v_lead = np.take_along_axis(v[:, None, :] * np.cos(h[:, None, :] - h[:, :n_agents, None]), j[..., None], -1)[..., 0]
    dv = np.where(np.isfinite(g), v[:, :n_agents] - v_lead, 0.0)
    return np.where(np.isfinite(g), g, 1e3), dv


def bicycle_step(pose: np.ndarray, accel: np.ndarray, steer: np.ndarray, dt: float) -> np.ndarray:
    """Kinematic bicycle (rear-axle-free centre form): pose [..., 4] = (x, y, heading, speed)."""
    x, y, h, v = (pose[..., k] for k in range(4))
    steer = np.clip(steer, -0.6, 0.6)
    x = x + v * np.cos(h) * dt
    y = y + v * np.sin(h) * dt
    h = wrap_angle(h + v / WHEELBASE * np.tan(steer) * dt)
    v = np.clip(v + accel * dt, 0.0, MAX_SPEED)
    return np.stack([x, y, h, v], axis=-1)


def pure_pursuit_steer(pose: np.ndarray, route: np.ndarray) -> np.ndarray:
    """Steering angle [C] to track ``route`` (pure pursuit, lookahead 0.8·v + 3 m, clipped to [4, 20])."""
    s, _, _ = project_to_polyline(pose[:, :2], route)
    look = np.clip(0.8 * pose[:, 3] + 3.0, 4.0, 20.0)
    target = point_at_arclength(route, s + look)
    dx, dy = target[:, 0] - pose[:, 0], target[:, 1] - pose[:, 1]
    alpha = wrap_angle(np.arctan2(dy, dx) - pose[:, 2])
    steer = np.arctan(2 * WHEELBASE * np.sin(alpha) / look)
    at_end = s >= polyline_arclength(route)[-1] - 1.0
    return np.where(at_end, 0.0, steer)


def agent_arrays(scenario: Scenario) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Initial agent poses [N, 4], lengths [N], widths [N], desired speeds [N], static mask [N]."""
    a = scenario.agents
    pose = np.array([[g.x, g.y, g.heading, g.speed] for g in a], dtype=float).reshape(-1, 4)
    return (pose, np.array([g.length for g in a], float), np.array([g.width for g in a], float),
            np.array([g.desired_speed for g in a], float), np.array([g.static for g in a], bool))


def simulate_traffic(scenario: Scenario, ego_poses: np.ndarray, dt: float = SIM_DT) -> np.ndarray:
    """Roll the background agents forward while the ego follows ``ego_poses`` [C, S+1, 4] (world).

    Returns agent poses [C, S+1, N, 4]; the agents react (IDM) to each other and to the ego.
    """
    n_copies, n_steps = ego_poses.shape[0], ego_poses.shape[1] - 1
    pose0, length, width, desired, static = agent_arrays(scenario)
    n = len(pose0)
    out = np.zeros((n_copies, n_steps + 1, n, 4))
    if n == 0:
        return out
    pose = np.repeat(pose0[None], n_copies, axis=0)  # [C, N, 4]
    lengths, widths = np.append(length, CAR_LENGTH), np.append(width, CAR_WIDTH)
    out[:, 0] = pose
    for t in range(n_steps):
        everyone = np.concatenate([pose, ego_poses[:, t, None, :]], axis=1)  # [C, N+1, 4]
        gap, dv = _leader_gaps(everyone, lengths, widths, n)
        accel = idm_acceleration(pose[..., 3], desired[None], gap, dv)
        steer = np.stack([pure_pursuit_steer(pose[:, i], scenario.agents[i].route) for i in range(n)], axis=1)
        new = bicycle_step(pose, accel, steer, dt)
        pose = np.where(static[None, :, None], pose, new)
        out[:, t + 1] = pose
    return out


# ------------------------------------------------------------------------------------------------
# Checking a planned trajectory

@dataclass(frozen=True)
class TrajectoryCheck:
    """Outcome of simulating the ego along planned waypoints.

    ``valid`` False means the input was unusable (``reason`` says why: shape, NaN, too far); then
    ``collision``/``offroad`` are False and nothing was simulated. ``infeasible`` flags waypoints
    implying speeds above ``MAX_SPEED`` (they are still simulated). Times are in seconds from t=0
    (None = never). ``progress_m`` = arclength gained along the ego's route.
    """

    valid: bool
    reason: str
    collision: bool = False
    offroad: bool = False
    infeasible: bool = False
    collision_time: float | None = None
    offroad_time: float | None = None
    progress_m: float = 0.0
    max_speed: float = 0.0


def _parse_waypoints(waypoints_ego) -> tuple[np.ndarray | None, str]:
    try:
        w = np.asarray(waypoints_ego, dtype=float)
    except (TypeError, ValueError) as err:
        return None, f"waypoints not numeric: {err}"
    if w.ndim != 2 or w.shape[1] != 2 or w.shape[0] < 1:
        return None, f"waypoints must have shape [T, 2] with T >= 1, got {w.shape}"
    if not np.isfinite(w).all():
        return None, "waypoints contain NaN or inf"
    if np.abs(w).max() > MAX_ABS_COORD:
        return None, f"waypoint more than {MAX_ABS_COORD:.0f} m from the ego"
    return w, ""


def ego_poses_from_waypoints(scenario: Scenario, waypoints_ego: np.ndarray, dt: float) -> np.ndarray:
    """World ego poses [S+1, 4] at SIM_DT, moving linearly between (0,0)@t=0 and waypoints @ k·dt."""
    pts = np.concatenate([[[0.0, 0.0]], waypoints_ego])  # [T+1, 2] ego frame
    times = dt * np.arange(len(pts))
    grid = np.arange(0.0, times[-1] + 1e-9, SIM_DT)
    xy = np.stack([np.interp(grid, times, pts[:, 0]), np.interp(grid, times, pts[:, 1])], axis=1)
    seg = np.diff(pts, axis=0)
    seg_speed = np.linalg.norm(seg, axis=1) / dt
    seg_heading = np.arctan2(seg[:, 1], seg[:, 0])
    for k in range(len(seg_heading)):  # a standing segment keeps the previous heading
        if seg_speed[k] < 0.05:
            seg_heading[k] = seg_heading[k - 1] if k > 0 else 0.0
    k = np.clip(np.searchsorted(times, grid, side="right") - 1, 0, len(seg) - 1)
    world_xy = scenario.to_world(xy)
    heading = wrap_angle(seg_heading[k] + scenario.ego[2])
    return np.concatenate([world_xy, heading[:, None], seg_speed[k][:, None]], axis=1)


def _collisions_offroad(scenario: Scenario, ego: np.ndarray, agents: np.ndarray, margin: float):
    """Per-step collision [C, S+1] and off-road [C, S+1] flags for ego poses [C, S+1, 4]."""
    ego_box = box_corners(ego[..., 0], ego[..., 1], ego[..., 2], CAR_LENGTH + 2 * margin, CAR_WIDTH + 2 * margin)
    _, length, width, _, _ = agent_arrays(scenario)
    if agents.shape[2]:
        boxes = box_corners(agents[..., 0], agents[..., 1], agents[..., 2], length, width)  # [C, S+1, N, 4, 2]
        collide = boxes_overlap(ego_box[:, :, None], boxes).any(-1)
    else:
        collide = np.zeros(ego.shape[:2], bool)
    # off-road: a corner of the (slightly shrunk) ego box leaves the drivable polygon
    inner = box_corners(ego[..., 0], ego[..., 1], ego[..., 2], CAR_LENGTH - 0.4, CAR_WIDTH - 0.4)
    inside = shapely.contains_xy(scenario.road.drivable, inner[..., 0].ravel(), inner[..., 1].ravel())
    offroad = ~inside.reshape(inner.shape[:-1]).all(-1)
    return collide, offroad


def check_trajectory(scenario: Scenario, waypoints_ego, dt: float = 0.5, margin: float = 0.0) -> TrajectoryCheck:
    """Simulate the ego through ``waypoints_ego`` [T, 2] (ego frame, x forward, y left, metres; the
    k-th waypoint is the ego centre at t = k·dt) with the traffic reacting, and test collision
    (oriented boxes, inflated by ``margin`` m) and off-road. Total on garbage input."""
    if not (np.isfinite(dt) and dt > 0):
        raise ValueError(f"dt must be a positive finite number of seconds, got {dt}")
    w, reason = _parse_waypoints(waypoints_ego)
    if w is None:
        return TrajectoryCheck(False, reason)
    ego = ego_poses_from_waypoints(scenario, w, dt)[None]  # [1, S+1, 4]
    agents = simulate_traffic(scenario, ego)
    collide, offroad = _collisions_offroad(scenario, ego, agents, margin)
    times = SIM_DT * np.arange(ego.shape[1])
    s, _, _ = project_to_polyline(ego[0, [0, -1], :2], scenario.route)
    max_speed = float(ego[0, :, 3].max())
    first = lambda flags: float(times[flags.argmax()]) if flags.any() else None
    return TrajectoryCheck(True, "", bool(collide.any()), bool(offroad.any()), max_speed > MAX_SPEED,
                           first(collide[0]), first(offroad[0]), float(s[1] - s[0]), max_speed)


# ------------------------------------------------------------------------------------------------
# Expert planner: lattice of (lateral offset × target speed) around the route

EXPERT_OFFSETS = (0.0, 1.75, -1.75, 3.5, -3.5)
EXPERT_SPEED_FRACTIONS = (1.0, 0.7, 0.4, 0.0)


def frenet_path(route: np.ndarray, s0: float, d0: float, d_target: float, length: float) -> np.ndarray:
    """Path [L, 2] from (s0, d0) along the route, ramping the lateral offset to ``d_target`` (smoothstep
    over 12 m); 1 m spacing; beyond the route's end it continues along the last tangent."""
    u = np.arange(0.0, length + 1.0)
    ramp_len = 12.0
    d = d0 + (d_target - d0) * smoothstep(u / ramp_len)
    s = s0 + u
    s_cum = polyline_arclength(route)
    base = point_at_arclength(route, s)
    # beyond the route's end: continue straight along the last tangent
    tang = polyline_tangents(route)
    h = np.interp(np.clip(s, 0, s_cum[-1]), s_cum, np.unwrap(tang))
    extra = np.maximum(s - s_cum[-1], 0.0)
    base = base + extra[:, None] * np.stack([np.cos(h), np.sin(h)], axis=1)
    return base + d[:, None] * np.stack([-np.sin(h), np.cos(h)], axis=1)


def _speed_profile(v0: float, v_target: float, n_steps: int, dt: float) -> np.ndarray:
    """Speeds [S+1] approaching ``v_target`` with +2 / −4 m/s² limits."""
    v = np.empty(n_steps + 1)
    v[0] = v0
    for t in range(n_steps):
        v[t + 1] = v[t] + np.clip(v_target - v[t], -4.0 * dt, 2.0 * dt)
    return v


def lattice_ego_poses(scenario: Scenario, horizon_s: float) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """Candidate ego poses [C, S+1, 4] (world, SIM_DT) for every (offset, speed) of the lattice."""
    n_steps = int(round(horizon_s / SIM_DT))
    s0, d0, _ = project_to_polyline(scenario.ego[None, :2], scenario.route)
    v0 = float(scenario.ego[3])
    poses, params = [], []
    for d in EXPERT_OFFSETS:
        path = frenet_path(scenario.route, float(s0[0]), float(d0[0]), d, 12.0 + 45.0 * horizon_s / 3.0 + 20)
        path[0] = scenario.ego[:2]
        heading = polyline_tangents(path)
        for frac in EXPERT_SPEED_FRACTIONS:
            v = _speed_profile(v0, frac * scenario.ego_desired_speed, n_steps, SIM_DT)
            dist = np.concatenate([[0.0], np.cumsum(0.5 * (v[1:] + v[:-1]) * SIM_DT)])
            xy = point_at_arclength(path, dist)
            s_cum = polyline_arclength(path)
            h = np.interp(dist, s_cum, np.unwrap(heading))
            h[0] = scenario.ego[2]
            poses.append(np.concatenate([xy, wrap_angle(h)[:, None], v[:, None]], axis=1))
            params.append((d, frac))
    return np.stack(poses), params


def expert_trajectory(scenario: Scenario, horizon_s: float = 3.0, dt: float = 0.5) -> np.ndarray:
    """Expert waypoints [T, 2], T = round(horizon_s / dt), ego frame (x forward, y left, metres), the
    k-th at t = k·dt. Picks the lattice candidate minimising collision (1 m safety margin) and
    off-road penalties, then lateral offset from the route and speed loss; ties → first."""
    if not (dt > 0 and horizon_s >= dt):
        raise ValueError(f"need 0 < dt <= horizon_s, got dt={dt}, horizon_s={horizon_s}")
    ego, params = lattice_ego_poses(scenario, horizon_s)
    agents = simulate_traffic(scenario, ego)
    collide, offroad = _collisions_offroad(scenario, ego, agents, margin=1.0)
    offsets = np.array([abs(p[0]) for p in params])
    speed_loss = np.array([1.0 - p[1] for p in params])
    cost = 100.0 * collide.any(1) + 50.0 * offroad.any(1) + 1.0 * offsets + 3.0 * speed_loss
    best = int(cost.argmin())
    n_wp = int(round(horizon_s / dt))
    idx = np.round(np.arange(1, n_wp + 1) * dt / SIM_DT).astype(int)
    idx = np.minimum(idx, ego.shape[1] - 1)
    return scenario.to_ego(ego[best, idx, :2])
