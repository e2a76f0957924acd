"""``mmrl/Driving-v0``: the driving world as a gymnasium env (one ego, rule-based traffic).

    env = gymnasium.make("mmrl/Driving-v0", split="ood_dense", image_size=64, action_mode="continuous")
    obs, info = env.reset(seed=3)                       # scenario = make_scenario(3, "ood_dense")
    obs, info = env.reset(seed=3, options={"split": "ood_layout"})   # the split per episode

- **Scenario**: :func:`mmrl.envs.driving.world.make_scenario` (``seed``, ``split``); the split is a
  make kwarg and can be overridden per episode with ``options={"split": ...}``; without a seed the
  scenario seed is drawn from the env's ``np_random``.
- **Actions** (``action_mode``): ``continuous``: Box [−1, 1]² = (acceleration / 4 m/s², steering /
  0.5 rad), clipped to the box; ``candidates``: Discrete(15), a (reference line × speed) lattice
  choice: reference line = the route shifted by 0 / +3.5 / −3.5 m, target speed = (0, 0.35, 0.7, 1.0,
  1.3) × the ego's desired speed, tracked by pure pursuit and a proportional speed controller. A NaN
  or infinite action raises ``ValueError`` (the simulator never sees it).
- **Observation**: ``{"image": BEV RGB uint8 [S, S, 3] (ego-centred, heading up, see
  render.render_bev), "state": float32 [6]}`` with state = (speed / 10 m/s, lateral offset from the
  route / 3.5 m, heading error to the route (rad), distance to the goal along the route / 50 m,
  desired speed / 10 m/s, distance to the nearest vehicle / 60 m (capped at 1)), clipped to ±50.
- **Step**: ``control_dt`` = 0.2 s (two 0.1-s simulator steps); the traffic (IDM + pure pursuit)
  reacts to the ego. Reward = 0.1 × metres gained along the route − 10·collision − 5·off-road +
  10·goal. Terminates on collision, off-road or goal (the ego passes the goal point on its route);
  truncates after ``max_steps``. ``info``: collision, offroad, goal_reached, progress_m, split, seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from mmrl.envs.driving.geometry import offset_polyline, polyline_arclength, project_to_polyline, wrap_angle
from mmrl.envs.driving.render import render_bev
from mmrl.envs.driving.world import (CAR_LENGTH, CAR_WIDTH, SIM_DT, SPLITS, WHEELBASE, _collisions_offroad,
                                     _leader_gaps, agent_arrays, bicycle_step, idm_acceleration, make_scenario,
                                     pure_pursuit_steer)

CANDIDATE_OFFSETS = (0.0, 3.5, -3.5)
CANDIDATE_SPEEDS = (0.0, 0.35, 0.7, 1.0, 1.3)
MAX_ACCEL, MAX_STEER = 4.0, 0.5
STATE_BOUND = 50.0  # every state entry is clipped to ±this


@dataclass(frozen=True, eq=False)
class RouteSet:
    """N route polylines padded to one length (the last point repeated) for batched projection."""

    points: np.ndarray  # [N, K, 2]
    s_cum: np.ndarray  # [N, K] cumulative arclength
    total: np.ndarray  # [N] route lengths

    @classmethod
    def of(cls, routes) -> RouteSet:
        k = max(len(r) for r in routes) if len(routes) else 2
        points = np.stack([np.concatenate([r, np.repeat(r[-1:], k - len(r), 0)]) for r in routes]) if len(routes) \
            else np.zeros((0, k, 2))
        seg = np.linalg.norm(np.diff(points, axis=1), axis=-1)
        s_cum = np.concatenate([np.zeros((len(points), 1)), np.cumsum(seg, axis=1)], axis=1)
        return cls(points, s_cum, s_cum[:, -1] if len(points) else np.zeros(0))

    def project(self, xy: np.ndarray) -> np.ndarray:
        """Arclength [C, N] of the closest point of route n to ``xy`` [C, N, 2] (as ``project_to_polyline``)."""
        a, ab = self.points[:, :-1], np.diff(self.points, axis=1)  # [N, K-1, 2]
        seg_len2 = np.maximum((ab ** 2).sum(-1), 1e-12)
        ap = xy[:, :, None, :] - a[None]  # [C, N, K-1, 2]
        t = np.clip((ap * ab[None]).sum(-1) / seg_len2[None], 0.0, 1.0)
        d2 = ((ap - t[..., None] * ab[None]) ** 2).sum(-1)
        k = d2.argmin(-1)[..., None]  # [C, N, 1]
        s0 = np.take_along_axis(np.broadcast_to(self.s_cum[None, :, :-1], d2.shape), k, -1)[..., 0]
        tk = np.take_along_axis(t, k, -1)[..., 0]
        return s0 + tk * np.take_along_axis(np.broadcast_to(np.sqrt(seg_len2)[None], d2.shape), k, -1)[..., 0]

    def point_at(self, s: np.ndarray) -> np.ndarray:
        """Points [C, N, 2] at arclengths ``s`` [C, N] along each route (clamped to its ends)."""
        s = np.clip(s, 0.0, self.total[None])
        s_cum = self.s_cum[None]  # [1, N, K]
        k = np.clip((s_cum <= s[..., None]).sum(-1) - 1, 0, self.s_cum.shape[1] - 2)[..., None]  # [C, N, 1]
        s_lo = np.take_along_axis(np.broadcast_to(s_cum, s.shape + (s_cum.shape[-1],)), k, -1)[..., 0]
        s_hi = np.take_along_axis(np.broadcast_to(s_cum, s.shape + (s_cum.shape[-1],)), k + 1, -1)[..., 0]
        pts = np.broadcast_to(self.points[None], s.shape + self.points.shape[1:])
        p_lo = np.take_along_axis(pts, k[..., None], -2)[..., 0, :]
        p_hi = np.take_along_axis(pts, (k + 1)[..., None], -2)[..., 0, :]
        u = np.where(s_hi > s_lo, (s - s_lo) / np.maximum(s_hi - s_lo, 1e-12), 0.0)
        return p_lo + u[..., None] * (p_hi - p_lo)


def batched_pure_pursuit(pose: np.ndarray, routes: RouteSet) -> np.ndarray:
    """``pure_pursuit_steer`` for N agents at once: poses [C, N, 4], agent n on route n → steer [C, N]."""
    s = routes.project(pose[..., :2])
    look = np.clip(0.8 * pose[..., 3] + 3.0, 4.0, 20.0)
    target = routes.point_at(s + look)
    alpha = wrap_angle(np.arctan2(target[..., 1] - pose[..., 1], target[..., 0] - pose[..., 0]) - pose[..., 2])
    steer = np.arctan(2 * WHEELBASE * np.sin(alpha) / look)
    return np.where(s >= routes.total[None] - 1.0, 0.0, steer)


def traffic_step(pose: np.ndarray, extra: np.ndarray, length: np.ndarray, width: np.ndarray, desired: np.ndarray,
                 static: np.ndarray, routes: RouteSet, dt: float = SIM_DT) -> np.ndarray:
    """One rule-based step of N agents in C copies of a world: poses [C, N, 4] → [C, N, 4].

    ``extra`` [C, 4] is one more vehicle per copy (the ego, or a policy-driven vehicle) that the
    agents react to; ``length`` / ``width`` [N+1] include it last; ``routes``: the agents' routes.
    Same dynamics as :func:`mmrl.envs.driving.world.simulate_traffic` (IDM + pure pursuit), batched.
    """
    n = pose.shape[1]
    if n == 0:
        return pose
    everyone = np.concatenate([pose, extra[:, None, :]], axis=1)
    gap, dv = _leader_gaps(everyone, length, width, n)
    accel = idm_acceleration(pose[..., 3], desired[None], gap, dv)
    steer = batched_pure_pursuit(pose, routes)
    return np.where(static[None, :, None], pose, bicycle_step(pose, accel, steer, dt))


class DrivingEnv(gymnasium.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 5}

    def __init__(self, split: str = "train", image_size: int = 64, action_mode: str = "continuous",
                 n_agents: int | None = None, max_steps: int = 75, control_dt: float = 0.2,
                 render_mode: str | None = None):
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        if action_mode not in ("continuous", "candidates"):
            raise ValueError(f"action_mode must be 'continuous' or 'candidates', got {action_mode!r}")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        substeps = control_dt / SIM_DT
        if not (substeps >= 1 and abs(substeps - round(substeps)) < 1e-9):
            raise ValueError(f"control_dt must be a positive multiple of {SIM_DT} s, got {control_dt}")
        self.split, self.image_size, self.action_mode = split, int(image_size), action_mode
        self.n_agents, self.max_steps, self.substeps = n_agents, int(max_steps), int(round(substeps))
        self.render_mode = render_mode
        self.observation_space = spaces.Dict({
            "image": spaces.Box(0, 255, (self.image_size, self.image_size, 3), np.uint8),
            "state": spaces.Box(-STATE_BOUND, STATE_BOUND, (6,), np.float32)})
        self.action_space = (spaces.Box(-1.0, 1.0, (2,), np.float32) if action_mode == "continuous"
                             else spaces.Discrete(len(CANDIDATE_OFFSETS) * len(CANDIDATE_SPEEDS)))
        self.scenario = None

    # -- gymnasium API ---------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        options = dict(options or {})
        split = options.pop("split", self.split)
        if options:
            raise ValueError(f"unknown reset options {sorted(options)}; only 'split' is accepted")
        scenario_seed = int(seed) if seed is not None else int(self.np_random.integers(0, 2 ** 31 - 1))
        self.scenario = make_scenario(scenario_seed, split, self.n_agents)
        pose, length, width, desired, static = agent_arrays(self.scenario)
        self._agents = pose  # [N, 4]
        self._length, self._width = np.append(length, CAR_LENGTH), np.append(width, CAR_WIDTH)
        self._desired, self._static = desired, static
        self._routes = RouteSet.of([a.route for a in self.scenario.agents])
        self._ego = self.scenario.ego.astype(float).copy()
        self._route_len = float(polyline_arclength(self.scenario.route)[-1])
        self._s = self._route_s(self._ego)
        self._s_goal = float(project_to_polyline(self.scenario.goal[None], self.scenario.route)[0][0])
        self._t = 0
        self._seed, self._split = scenario_seed, split
        return self._obs(), self._info(False, False, False, 0.0)

    def step(self, action):
        if self.scenario is None:
            raise RuntimeError("call reset() before step()")
        accel, steer_fn = self._controls(action)
        collided = offroad = False
        s_start = self._s
        for _ in range(self.substeps):
            steer = steer_fn()
            new_agents = traffic_step(self._agents[None], self._ego[None], self._length, self._width, self._desired,
                                      self._static, self._routes)[0]
            a = accel() if callable(accel) else accel
            self._ego = bicycle_step(self._ego, np.asarray(a), np.asarray(steer), SIM_DT)
            self._agents = new_agents
            c, o = _collisions_offroad(self.scenario, self._ego[None, None], self._agents[None, None], 0.0)
            collided, offroad = collided or bool(c.any()), offroad or bool(o.any())
            if collided or offroad:
                break
        self._t += 1
        self._s = self._route_s(self._ego)
        progress = self._s - s_start
        goal = (not collided) and self._s >= self._s_goal
        reward = 0.1 * progress - 10.0 * collided - 5.0 * offroad + 10.0 * goal
        terminated = collided or offroad or goal
        truncated = (not terminated) and self._t >= self.max_steps
        return self._obs(), float(reward), terminated, truncated, self._info(collided, offroad, goal, progress)

    def render(self):
        if self.render_mode != "rgb_array":
            return None
        return render_bev(self.scenario, self._ego, self._agents, size=4 * self.image_size,
                          metres_per_px=0.25 * 64 / self.image_size)

    # -- internals -------------------------------------------------------------------------------
    def _controls(self, action):
        """(acceleration or a callable giving it, steering callable) for the current action."""
        if self.action_mode == "continuous":
            a = np.asarray(action, dtype=float).reshape(-1)
            if a.shape != (2,):
                raise ValueError(f"continuous action must have shape (2,), got {np.shape(action)}")
            if not np.isfinite(a).all():
                raise ValueError(f"action contains NaN or inf: {a.tolist()}")
            a = np.clip(a, -1.0, 1.0)
            return MAX_ACCEL * a[0], lambda: MAX_STEER * a[1]
        if isinstance(action, (float, np.floating)) and not np.isfinite(action):
            raise ValueError(f"action contains NaN or inf: {action}")
        k = int(np.asarray(action).reshape(()))
        if not self.action_space.contains(np.int64(k)):
            raise ValueError(f"candidate action must be in [0, {self.action_space.n}), got {action}")
        offset = CANDIDATE_OFFSETS[k // len(CANDIDATE_SPEEDS)]
        target = CANDIDATE_SPEEDS[k % len(CANDIDATE_SPEEDS)] * self.scenario.ego_desired_speed
        reference = offset_polyline(self.scenario.route, offset) if offset else self.scenario.route
        accel = lambda: float(np.clip(1.5 * (target - self._ego[3]), -MAX_ACCEL, 2.0))
        steer = lambda: float(np.clip(pure_pursuit_steer(self._ego[None], reference)[0], -MAX_STEER, MAX_STEER))
        return accel, steer

    def _route_s(self, ego: np.ndarray) -> float:
        return float(project_to_polyline(ego[None, :2], self.scenario.route)[0][0])

    def _obs(self) -> dict[str, np.ndarray]:
        s, lateral, tangent = project_to_polyline(self._ego[None, :2], self.scenario.route)
        nearest = (np.linalg.norm(self._agents[:, :2] - self._ego[:2], axis=1).min() if len(self._agents) else 60.0)
        state = np.array([self._ego[3] / 10.0, lateral[0] / 3.5, wrap_angle(self._ego[2] - tangent[0]),
                          (self._s_goal - s[0]) / 50.0, self.scenario.ego_desired_speed / 10.0,
                          min(nearest, 60.0) / 60.0], dtype=np.float32).clip(-STATE_BOUND, STATE_BOUND)
        image = render_bev(self.scenario, self._ego, self._agents, size=self.image_size,
                           metres_per_px=64.0 / self.image_size)
        return {"image": image, "state": state}

    def _info(self, collided: bool, offroad: bool, goal: bool, progress: float) -> dict[str, Any]:
        return {"collision": collided, "offroad": offroad, "goal_reached": goal, "progress_m": float(progress),
                "split": self._split, "seed": self._seed}

__all__ = ["CANDIDATE_OFFSETS", "CANDIDATE_SPEEDS", "DrivingEnv", "RouteSet", "batched_pure_pursuit", "traffic_step"]
