"""highway-env scenes in the driving world's conventions: seeded snapshots, plan execution, an expert.

`highway-env <https://github.com/Farama-Foundation/HighwayEnv>`_ (``pip install 'mmrl[highway]'``)
simulates the traffic: its road networks (``intersection-v0``, ``merge-v0``, ``roundabout-v0``,
``highway-fast-v0``), its IDM/MOBIL vehicles (Treiber 2000; Kesting 2007) and the intersection's
right-of-way rules, its collision test (``vehicle.crashed``) and on-lane test (``vehicle.on_road``).
This module adds what the LaViPlan task needs around it:

- :func:`make_scene`: a scene type reset with a seed, an instruction drawn for the ego (a route or a
  lane change), then a seeded warm-up of 0 … ``warmup_s`` seconds in which the ego drives as
  highway-env's own IDM vehicle, so that planning starts anywhere along the approach. The snapshot is
  never mutated: every simulation runs on a deep copy of its road.
- :func:`to_scenario`: the snapshot as a :class:`mmrl.envs.driving.world.Scenario` (our frame, lanes,
  drivable polygon, ego route), so our BEV rasteriser (:func:`mmrl.envs.driving.render.render_bev`) and
  the LaViPlan perception label read it unchanged.
- :func:`execute_plan`: the ego becomes a plain kinematic highway-env ``Vehicle`` tracking ego-frame
  waypoints (pure pursuit for steering, a PD law on the timed reference for acceleration) for the
  plan's horizon, the other vehicles reacting as highway-env drives them; returns highway-env's crash
  and on-road verdicts and the route progress.
- :func:`expert_plan`: highway-env's IDM vehicle as the ego, with lane changes off, following the
  instructed route or target lane, at 100 % / 50 % / 0 % of its desired speed (and, for a lane change,
  also staying in lane); each candidate's waypoints are executed like an answer and the cheapest verdict
  wins (collision ≫ off-road ≫ ignoring the instruction ≫ speed lost).
- :class:`TrackedVehicle`, :func:`follow_track`, :func:`drive_as_is` (``driving/rift-highway-v0``): a background
  vehicle that follows given poses exactly while the traffic reacts (RIFT's track propagation), with highway-env's
  per-step crash and on-road verdicts; and the same road driven entirely by highway-env (the log).

Frames: highway-env's world has its y axis pointing *down* the screen (headings clockwise). Our world
frame (:mod:`mmrl.envs.driving.geometry`) is x east, y north, headings counter-clockwise, so
``(x, y, h) → (x, −y, −h)``; lane lateral offsets to the right in highway-env are to the right in ours.
Importing this module sets ``SDL_VIDEODRIVER=offscreen`` (unless set) before highway-env imports pygame,
so that highway-env's own renderer also works headless. Not ``dummy``: highway-env 1.12's ``EnvViewer``
turns its drawing off when ``SDL_VIDEODRIVER`` is ``dummy`` (its frames come back black); SDL's
``offscreen`` driver needs no display either. The task's images never use pygame (our rasteriser).
"""

from __future__ import annotations

import os

os.environ.setdefault("SDL_VIDEODRIVER", "offscreen")  # headless pygame (not "dummy": see the docstring)
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")

import contextlib  # noqa: E402 (after the environment variables pygame reads at import)
import copy  # noqa: E402
import functools  # noqa: E402
import logging  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import gymnasium  # noqa: E402
import highway_env  # noqa: E402
import numpy as np  # noqa: E402
from highway_env.road.lane import AbstractLane, LineType, StraightLane  # noqa: E402
from highway_env.road.road import Road  # noqa: E402
from highway_env.vehicle.behavior import IDMVehicle  # noqa: E402
from highway_env.vehicle.controller import ControlledVehicle  # noqa: E402
from highway_env.vehicle.kinematics import Vehicle  # noqa: E402

from mmrl.envs.driving.geometry import (ego_to_world, offset_polyline, point_at_arclength,  # noqa: E402
                                        polyline_arclength, project_to_polyline, resample_polyline, smoothstep,
                                        world_to_ego, wrap_angle)
from mmrl.envs.driving.maps import Lane, RoadMap, lane_area, road_map  # noqa: E402
from mmrl.envs.driving.world import Agent, Scenario  # noqa: E402

gymnasium.register_envs(highway_env)

HIGHWAY_ENV_VERSION = "1.12.1"
"""The highway-env release these scenes were built and measured with (pyproject's ``highway`` extra)."""

INSTRUCTIONS = {
    "keep_lane": "keep lane", "change_left": "change lane to the left", "change_right": "change lane to the right",
    "turn_left": "turn left at the intersection", "turn_right": "turn right at the intersection",
    "go_straight": "go straight through the intersection",
    "exit_first": "take the first exit at the roundabout", "exit_second": "take the second exit at the roundabout",
    "exit_third": "take the third exit at the roundabout",
}
IDM_CONSTANTS = ("DISTANCE_WANTED", "COMFORT_ACC_MAX", "COMFORT_ACC_MIN")
LIBRARY_IDM = {name: getattr(IDMVehicle, name) for name in IDM_CONSTANTS}
"""highway-env's IDM constants as imported (before any intersection reset changes them, see SceneSpec.idm)."""
INTERSECTION_IDM = {"DISTANCE_WANTED": 7.0, "COMFORT_ACC_MAX": 6.0, "COMFORT_ACC_MIN": -3.0}
"""What ``IntersectionEnv._make_vehicles`` assigns to the IDM *class* on every reset (highway-env 1.12)."""
ROUTE_BEHIND, ROUTE_AHEAD = 15.0, 120.0
"""Metres of the ego's route kept behind and ahead of it (the green line of the raster)."""
EXPERT_SPEED_FRACTIONS = (1.0, 0.5, 0.0)
MAX_STEER = np.pi / 4  # rad: highway-env's ContinuousAction steering range
ACCEL_RANGE = (-7.0, 5.0)  # m/s²: hard braking to highway-env's ContinuousAction +5


@dataclass(frozen=True)
class SceneSpec:
    """How one highway-env scene type is set up here.

    ``warmup_s``: the longest seeded warm-up (s) before planning. ``exits``: destinations the ego's route
    may lead to, with their maneuver (roads with a route), or none: a road where the instruction is a
    lane choice. ``idm``: the IDM class constants in force while this scene is simulated. highway-env's
    intersection writes its own values into the ``IDMVehicle`` *class* at reset and nothing restores
    them, so without pinning, a merge scene would drive differently after an intersection was built."""

    warmup_s: float
    exits: tuple[tuple[str, str], ...] = ()
    idm: tuple[tuple[str, float], ...] = tuple(LIBRARY_IDM.items())


SCENES: dict[str, SceneSpec] = {
    "intersection-v0": SceneSpec(4.0, (("o1", ""), ("o2", ""), ("o3", "")), tuple(INTERSECTION_IDM.items())),
    "merge-v0": SceneSpec(8.0),
    "roundabout-v0": SceneSpec(6.0, (("exr", "exit_first"), ("nxr", "exit_second"), ("wxr", "exit_third"))),
    "highway-fast-v0": SceneSpec(4.0),
}


@contextlib.contextmanager
def pinned_idm(scene_id: str) -> Iterator[None]:
    """IDM class constants of ``scene_id`` while the block runs (restored after): results do not depend on
    which scenes this process built before."""
    saved = {name: getattr(IDMVehicle, name) for name in IDM_CONSTANTS}
    for name, value in SCENES[scene_id].idm:
        setattr(IDMVehicle, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(IDMVehicle, name, value)


def to_ours(xy: np.ndarray) -> np.ndarray:
    """highway-env world points [..., 2] → our world frame (y up)."""
    p = np.array(xy, dtype=float)
    p[..., 1] = -p[..., 1]
    return p


def pose_of(vehicle: Vehicle) -> np.ndarray:
    """(x, y, heading, speed) [4] of a highway-env vehicle in our world frame."""
    x, y = vehicle.position
    return np.array([x, -y, float(wrap_angle(-vehicle.heading)), vehicle.speed], dtype=float)


@dataclass(frozen=True, eq=False)
class HighwayScene:
    """A snapshot at planning time. ``road`` is highway-env's (never stepped: simulations copy it);
    ``road.vehicles[ego_index]`` is the ego, an IDM vehicle on its ``route`` (lane indices);
    ``target_lane`` is the instructed lane (a lane index), ``route_xy`` the ego's path [K, 2] in our frame
    (1 m spacing, from ``ROUTE_BEHIND`` m behind it)."""

    scene_id: str
    seed: int
    road: Road
    ego_index: int
    maneuver: str
    target_lane: tuple
    desired_speed: float
    route_xy: np.ndarray
    sim_hz: int

    @property
    def ego(self) -> Vehicle:
        return self.road.vehicles[self.ego_index]

    @property
    def instruction(self) -> str:
        return INSTRUCTIONS[self.maneuver]


def make_scene(scene_id: str, seed: int, sim_hz: int = 10) -> HighwayScene | None:
    """The scene ``scene_id`` reset with ``seed``, an instruction and a warm-up drawn from ``seed``; None when
    the ego crashed during the warm-up (the caller draws another seed). Same arguments → same scene."""
    spec = SCENES[scene_id]
    rng = np.random.default_rng([int(seed), 0x41A7])  # our own draws; highway-env's come from reset(seed)
    with pinned_idm(scene_id), warnings.catch_warnings():
        # The issue names the v0 ids; gymnasium warns that newer versions exist (v1 changes only how
        # neighbours are found across connected lanes, highway-env PR 667).
        warnings.simplefilter("ignore", DeprecationWarning)
        env = gymnasium.make(scene_id, config={"simulation_frequency": sim_hz}, disable_env_checker=True).unwrapped
        env.reset(seed=int(seed))
        road = env.road
        env.close()
        start = env.vehicle
        desired = float(start.target_speed)  # kept: the intersection's right-of-way rules may zero it
        ego = IDMVehicle.create_from(start)
        ego.enable_lane_change = False  # the instruction decides the lane, not MOBIL
        maneuver = ""
        if spec.exits:
            destination, maneuver = spec.exits[int(rng.integers(len(spec.exits)))]
            ego.plan_route_to(destination)
        index = road.vehicles.index(start)
        road.vehicles[index] = ego
        for _ in range(int(rng.integers(0, int(spec.warmup_s * sim_hz) + 1))):
            road.act()
            road.step(1.0 / sim_hz)
        if ego.crashed or not ego.on_road:
            return None
        target = ego.target_lane_index  # on a route: the lane the route follows now
        if not spec.exits:
            maneuver, target = _lane_choice(road, ego.lane_index, rng)
        elif not maneuver:  # intersection: the turn's direction, from the route's geometry
            maneuver = _turn_of(road, ego)
        route_xy = route_polyline(road, ego, maneuver, target)
    return HighwayScene(scene_id, int(seed), road, index, maneuver, target, desired, route_xy, sim_hz)


def _lane_choice(road: Road, lane_index: tuple, rng: np.random.Generator) -> tuple[str, tuple]:
    """keep lane, or change to a neighbour lane that exists (lane ids grow to the right in highway-env)."""
    _from, _to, k = lane_index
    count = len(road.network.graph[_from][_to])
    options = [("keep_lane", lane_index)] + ([("change_left", (_from, _to, k - 1))] if k > 0 else []) \
        + ([("change_right", (_from, _to, k + 1))] if k + 1 < count else [])
    return options[int(rng.integers(len(options)))]


def _lanes_ahead(road: Road, vehicle: ControlledVehicle, lane_index: tuple) -> list[tuple]:
    """The lane indices ``vehicle`` follows from ``lane_index`` on: its route's roads up to the route's end (the
    network loops back from an exit), or, without a route, the next lane highway-env picks (seeded)."""
    route = list(vehicle.route) if vehicle.route else None  # next_lane pops from the route
    on_route = {lane_index[:2]} | {step[:2] for step in route or ()}
    rng = np.random.RandomState(0)  # only used where a road forks without a route
    lanes, index = [lane_index], lane_index
    with _quiet_routing():  # a vehicle off its route's lane: highway-env warns, then takes the closest next lane
        for _ in range(8):
            if index[1] not in road.network.graph:
                break
            nxt = road.network.next_lane(index, route=route, position=vehicle.position, np_random=rng)
            if nxt[:2] == index[:2] or (route is not None and nxt[:2] not in on_route):
                break
            lanes.append(nxt)
            index = nxt
    return lanes


@contextlib.contextmanager
def _quiet_routing() -> Iterator[None]:
    """highway-env's road module logs a warning when a route does not continue the current lane; silenced here."""
    log = logging.getLogger("highway_env.road.road")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _sample_lane(lane: AbstractLane, s_from: float, s_to: float, lateral: float = 0.0) -> np.ndarray:
    """Centre points [K, 2] of ``lane`` (highway-env frame) from ``s_from`` to ``s_to`` every metre."""
    s = np.arange(s_from, s_to, 1.0) if s_to > s_from else np.array([s_from])
    return np.array([lane.position(float(v), lateral) for v in s])


def route_polyline(road: Road, ego: Vehicle, maneuver: str = "keep_lane", target: tuple | None = None) -> np.ndarray:
    """A vehicle's (the ego's) path [K, 2] in our frame: its lanes from ``ROUTE_BEHIND`` m behind to ``ROUTE_AHEAD`` m ahead;
    a lane change ramps to the target lane's centre over 30 m, 8 m ahead (like the world's own routes)."""
    s0 = float(ego.lane.local_coordinates(ego.position)[0])
    start = max(0.0, s0 - ROUTE_BEHIND)
    back = ROUTE_BEHIND - (s0 - start)  # the part before this lane's start: straight back along its first heading
    heading = ego.lane.heading_at(0.0)
    behind = ego.lane.position(0.0, 0.0) - np.arange(back, 0.0, -1.0)[:, None] * [np.cos(heading), np.sin(heading)]
    points, budget = [behind.reshape(-1, 2)], ROUTE_AHEAD + ROUTE_BEHIND - back
    for index in _lanes_ahead(road, ego, ego.lane_index):
        lane = road.network.get_lane(index)
        end = min(lane.length, start + budget)
        points.append(_sample_lane(lane, start, end))
        budget -= end - start
        start = 0.0
        if budget <= 0:
            break
    path = resample_polyline(to_ours(np.concatenate(points)))
    if maneuver in ("change_left", "change_right"):
        sign = 1.0 if maneuver == "change_left" else -1.0
        width = road.network.get_lane(target).width_at(s0)
        s_ego = float(project_to_polyline(to_ours(ego.position)[None], path)[0][0])
        s = polyline_arclength(path)
        path = offset_polyline(path, sign * width * smoothstep((s - s_ego - 8.0) / 30.0))
    return path


def _turn_of(road: Road, ego: Vehicle) -> str:
    """turn_left / go_straight / turn_right from the heading change between the ego's first and last lane."""
    lanes = _lanes_ahead(road, ego, ego.lane_index)
    first, last = road.network.get_lane(lanes[0]), road.network.get_lane(lanes[-1])
    turn = float(wrap_angle(-(last.heading_at(last.length) - first.heading_at(0.0))))  # our frame: CCW > 0
    return "turn_left" if turn > np.pi / 4 else "turn_right" if turn < -np.pi / 4 else "go_straight"


# ------------------------------------------------------------------------------------------------
# Our frame: lanes, drivable area, agents


@functools.cache
def scene_road_map(scene_id: str) -> RoadMap:
    """The lanes and drivable polygon of ``scene_id`` in our frame (a scene type's network never changes).

    All lanes make the drivable area; only lanes with a painted side (not ``LineType.NONE`` on both)
    are drawn as lanes, so the lanes inside a junction show as plain road, as in highway-env's view. Every
    lane's centre line, painted or not, is a route (``routes``, named ``from-to-k``): the reference lines
    RIFT's lane-alignment terms measure against (``driving/rift-highway-v0``)."""
    with pinned_idm(scene_id), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        env = gymnasium.make(scene_id, disable_env_checker=True).unwrapped
        env.reset(seed=0)
        network = env.road.network
        env.close()
    painted, unpainted, centres = [], [], {}
    for _from, to_ids in network.graph.items():
        for _to, lane_list in to_ids.items():
            for k, lane in enumerate(lane_list):
                if isinstance(lane, StraightLane):
                    centre = to_ours(np.array([lane.position(0.0, 0.0), lane.position(lane.length, 0.0)]))
                else:
                    centre = to_ours(_sample_lane(lane, 0.0, lane.length + 1e-6))
                item = Lane(f"{_from}-{_to}-{k}", centre, float(lane.width_at(0.0)))
                centres[item.name] = centre
                if any(t != LineType.NONE for t in lane.line_types):
                    painted.append(item)
                else:
                    unpainted.append(lane_area(item.centre, item.width))
    return road_map(scene_id, painted, unpainted, centres)


def to_scenario(scene: HighwayScene, split: str) -> Scenario:
    """The snapshot in our conventions (for the raster, the perception label and the prompt)."""
    ego = scene.ego
    agents = []
    for k, vehicle in enumerate(scene.road.vehicles):
        if k == scene.ego_index:
            continue
        x, y, h, v = pose_of(vehicle)
        ahead = np.array([[x, y], [x + 10.0 * np.cos(h), y + 10.0 * np.sin(h)]])
        desired = float(vehicle.target_speed) if isinstance(vehicle, ControlledVehicle) else v
        agents.append(Agent(x, y, h, v, float(vehicle.LENGTH), float(vehicle.WIDTH), ahead, desired))
    pose = pose_of(ego)
    s_ego = float(project_to_polyline(pose[None, :2], scene.route_xy)[0][0])
    goal = point_at_arclength(scene.route_xy, np.array(s_ego + 40.0))
    return Scenario(scene.seed, split, scene_road_map(scene.scene_id), pose, scene.desired_speed, tuple(agents),
                    scene.route_xy, goal, scene.maneuver, scene.instruction)


# ------------------------------------------------------------------------------------------------
# Executing a plan


@dataclass(frozen=True)
class PlanOutcome:
    """What highway-env made of a plan: ``crashed`` (``vehicle.crashed`` at any step), ``offroad``
    (``not vehicle.on_road`` at any step), their first times (s), ``progress_m`` along the ego's route,
    and (when recorded) the poses in our frame: ego [S+1, 4], others [S+1, N, 4]."""

    crashed: bool
    offroad: bool
    crash_time: float | None
    offroad_time: float | None
    progress_m: float
    ego_poses: np.ndarray | None = None
    agent_poses: np.ndarray | None = None


def _reference(waypoints_world: np.ndarray, start: np.ndarray, dt: float) -> tuple[np.ndarray, np.ndarray]:
    """Timed reference: points [T+1, 2] (start first) at times [T+1] = k·dt."""
    points = np.concatenate([start[None, :2], waypoints_world])
    return points, dt * np.arange(len(points))


def _controls(pose: np.ndarray, t: float, points: np.ndarray, times: np.ndarray, dt_sim: float) -> tuple[float, float]:
    """(steering, acceleration) in our frame for pose (x, y, h, v) at time t tracking the timed reference.

    Steering: pure pursuit on the reference polyline (look-ahead clip(0.3·v + 2, 3, 12) m; beyond its end
    the last segment continues), for highway-env's bicycle model (yaw rate ≈ v·tan δ / LENGTH, so
    δ = atan(2·LENGTH·sin α / look-ahead)). Acceleration: 1.5·(v_ref − v) + 0.8·(along-track error) on
    the linear interpolation of the timed points; never below what stops the car (no reversing)."""
    x, y, h, v = pose
    t_ref = min(t + dt_sim, float(times[-1]))
    ref = np.array([np.interp(t_ref, times, points[:, 0]), np.interp(t_ref, times, points[:, 1])])
    k = min(int(np.searchsorted(times, t_ref, side="right")) - 1, len(points) - 2)
    seg = points[k + 1] - points[k]
    v_ref = float(np.linalg.norm(seg)) / float(times[k + 1] - times[k])
    along = float(np.dot(ref - pose[:2], [np.cos(h), np.sin(h)]))
    accel = float(np.clip(1.5 * (v_ref - v) + 0.8 * along, ACCEL_RANGE[0], ACCEL_RANGE[1]))
    accel = max(accel, -v / dt_sim)
    steps = np.linalg.norm(np.diff(points, axis=0), axis=1)
    moving = np.nonzero(steps > 1e-3)[0]
    if len(moving) == 0 or (v < 0.1 and v_ref < 0.1):
        return 0.0, accel
    last = points[moving[-1] + 1] - points[moving[-1]]
    path = np.concatenate([points, points[-1:] + 60.0 * last / np.linalg.norm(last)])
    look = float(np.clip(0.3 * v + 2.0, 3.0, 12.0))  # shorter cuts the roundabout's ring less (docs/tasks.md)
    s, _, _ = project_to_polyline(pose[None, :2], path)
    target = point_at_arclength(path, s + look)[0]
    alpha = float(wrap_angle(np.arctan2(target[1] - y, target[0] - x) - h))
    steer = float(np.arctan(2.0 * Vehicle.LENGTH * np.sin(alpha) / look))
    return float(np.clip(steer, -MAX_STEER, MAX_STEER)), accel


def execute_plan(scene: HighwayScene, waypoints_ego: np.ndarray, dt: float, record: bool = False) -> PlanOutcome:
    """Drive the ego through ``waypoints_ego`` [T, 2] (ego frame at t = 0: x forward, y left, metres; the
    k-th at k·dt) for T·dt seconds: exactly round(T·dt·sim_hz) highway-env steps, whatever the plan."""
    road = copy.deepcopy(scene.road)
    old = road.vehicles[scene.ego_index]
    ego = Vehicle(road, np.array(old.position, dtype=float), old.heading, old.speed)
    road.vehicles[scene.ego_index] = ego
    start = pose_of(ego)
    points, times = _reference(ego_to_world(np.asarray(waypoints_ego, float), start[:2], float(start[2])), start, dt)
    n_steps, dt_sim = int(round(len(waypoints_ego) * dt * scene.sim_hz)), 1.0 / scene.sim_hz
    crash_time = offroad_time = None
    ego_poses, agent_poses = [start], [_others(road, scene.ego_index)] if record else []
    with pinned_idm(scene.scene_id):
        for step in range(n_steps):
            steer, accel = _controls(pose_of(ego), step * dt_sim, points, times, dt_sim)
            ego.act({"steering": -steer, "acceleration": accel})  # highway-env's headings turn the other way
            road.act()
            road.step(dt_sim)
            t = (step + 1) * dt_sim
            if ego.crashed and crash_time is None:
                crash_time = t
            if not ego.on_road and offroad_time is None:
                offroad_time = t
            ego_poses.append(pose_of(ego))
            if record:
                agent_poses.append(_others(road, scene.ego_index))
    s = project_to_polyline(np.array([start[:2], ego_poses[-1][:2]]), scene.route_xy)[0]
    return PlanOutcome(crash_time is not None, offroad_time is not None, crash_time, offroad_time,
                       float(s[1] - s[0]), np.array(ego_poses) if record else None,
                       np.array(agent_poses) if record else None)


def _others(road: Road, ego_index: int) -> np.ndarray:
    """Poses [N, 4] (our frame) of every vehicle but the ego, in road order."""
    poses = [pose_of(v) for k, v in enumerate(road.vehicles) if k != ego_index]
    return np.array(poses, dtype=float).reshape(-1, 4)


# ------------------------------------------------------------------------------------------------
# Expert


@dataclass(frozen=True)
class ExpertPlan:
    """The expert's waypoints [T, 2] (ego frame), the candidate it came from and its executed outcome."""

    waypoints: np.ndarray
    speed_fraction: float
    follows_instruction: bool
    outcome: PlanOutcome


def idm_waypoints(scene: HighwayScene, horizon: int, dt: float, speed_fraction: float, target_lane: tuple) -> np.ndarray:
    """Where highway-env's IDM vehicle, as the ego (lane changes off, route kept, steering to ``target_lane``,
    desired speed × ``speed_fraction``), is at t = k·dt, k = 1..T: ego-frame waypoints [T, 2]."""
    road = copy.deepcopy(scene.road)
    ego = road.vehicles[scene.ego_index]
    ego.target_lane_index = target_lane
    ego.target_speed = speed_fraction * scene.desired_speed
    per_waypoint = int(round(dt * scene.sim_hz))
    start = pose_of(ego)
    points = []
    with pinned_idm(scene.scene_id):
        for _ in range(horizon):
            for _ in range(per_waypoint):
                road.act()
                road.step(1.0 / scene.sim_hz)
            points.append(pose_of(ego)[:2])
    return world_to_ego(np.array(points), start[:2], float(start[2]))


def expert_plan(scene: HighwayScene, horizon: int, dt: float, decimals: int) -> ExpertPlan:
    """The cheapest candidate by its executed outcome (``execute_plan`` on the waypoints rounded to
    ``decimals``, i.e. the reference answer itself): cost 100·crash + 50·off-road + 5·(instruction not
    followed) + 3·(1 − speed fraction). Candidates are tried in order of that last part, so the first
    without a crash or leaving the road is the cheapest and ends the search; ties → the earlier."""
    lanes = [(scene.target_lane, True)]
    if scene.maneuver in ("change_left", "change_right"):  # a lane change may be unsafe now: staying is a candidate
        lanes.append((scene.ego.lane_index, False))
    best, best_cost = None, np.inf
    for lane, follows in lanes:
        for fraction in EXPERT_SPEED_FRACTIONS:
            waypoints = idm_waypoints(scene, horizon, dt, fraction, lane)
            outcome = execute_plan(scene, np.round(waypoints, decimals), dt)
            cost = 100.0 * outcome.crashed + 50.0 * outcome.offroad + 5.0 * (not follows) + 3.0 * (1.0 - fraction)
            if cost < best_cost:
                best, best_cost = ExpertPlan(waypoints, fraction, follows, outcome), cost
            if not (outcome.crashed or outcome.offroad):
                return best
    return best


# ------------------------------------------------------------------------------------------------
# A background vehicle under outside control (driving/rift-highway-v0)


class TrackedVehicle(Vehicle):
    """A highway-env vehicle that follows given poses exactly, one per simulation step (RIFT's *track
    propagation* of the controlled background vehicle), while highway-env's IDM / MOBIL vehicles react to it
    as to any car and ``Road.step`` checks its collisions. ``crashed`` is highway-env's (sticky) verdict and
    ``on_road`` its on-lane test, as for the planner's ego; the poses are ours (x, y up, heading CCW, speed)."""

    def __init__(self, road: Road, pose: np.ndarray, length: float, width: float, route: list | None = None,
                 target_speed: float = 0.0):
        x, y, h, v = (float(a) for a in pose)
        super().__init__(road, np.array([x, -y]), -h, v)
        self.LENGTH, self.WIDTH = float(length), float(width)
        self.diagonal = float(np.hypot(length, width))  # Vehicle.__init__ took the class's size
        self.track, self.tick = np.asarray(pose, float)[None], 0
        self.route = list(route or [])  # the lanes it was routed along (route_polyline reads them)
        self.target_speed = float(target_speed)

    def follow(self, poses: np.ndarray) -> None:
        """Follow poses [S+1, 4] (the first is where the vehicle is now) from the next step on."""
        self.track, self.tick = np.asarray(poses, float), 0

    def act(self, action: dict | str | None = None) -> None:
        """Actions are the track's: nothing to decide."""

    def step(self, dt: float) -> None:
        self.tick = min(self.tick + 1, len(self.track) - 1)
        x, y, h, v = self.track[self.tick]
        self.position = np.array([x, -y], dtype=float)
        self.heading, self.speed, self.impact = float(-h), float(v), None
        self.on_state_update()
        passed = [k for k, lane in enumerate(self.route) if lane[:2] == self.lane_index[:2]]
        if passed:  # drop the route's lanes behind the current one (as ControlledVehicle.follow_road does)
            del self.route[:passed[0]]


def control(road: Road, index: int) -> TrackedVehicle:
    """Put ``road.vehicles[index]`` under outside control (a :class:`TrackedVehicle` where it stands), once."""
    vehicle = road.vehicles[index]
    if not isinstance(vehicle, TrackedVehicle):
        vehicle = TrackedVehicle(road, pose_of(vehicle), vehicle.LENGTH, vehicle.WIDTH, getattr(vehicle, "route", None),
                                 float(getattr(vehicle, "target_speed", vehicle.speed)))
        road.vehicles[index] = vehicle
    return vehicle


@dataclass(frozen=True)
class TrackRollout:
    """One simulation of the controlled vehicle on its track: per-step ``crashed`` / ``offroad`` flags
    [S+1] (highway-env's verdicts; step 0 is the start) and the other vehicles' poses [S+1, N, 4]."""

    crashed: np.ndarray
    offroad: np.ndarray
    others: np.ndarray


def follow_track(road: Road, index: int, poses: np.ndarray, scene_id: str, sim_hz: int = 10) -> TrackRollout:
    """Step ``road`` (mutated: pass a copy to keep the snapshot) len(poses) − 1 steps with ``road.vehicles[index]``
    following ``poses`` [S+1, 4] (our frame) and everyone else driven by highway-env."""
    vehicle = control(road, index)
    vehicle.follow(poses)
    crashed, offroad, others = [vehicle.crashed], [not vehicle.on_road], [_others(road, index)]
    with pinned_idm(scene_id):
        for _ in range(len(poses) - 1):
            road.act()
            road.step(1.0 / sim_hz)
            crashed.append(vehicle.crashed)
            offroad.append(not vehicle.on_road)
            others.append(_others(road, index))
    return TrackRollout(np.array(crashed), np.array(offroad), np.stack(others))


def drive_as_is(road: Road, index: int, n_steps: int, scene_id: str, sim_hz: int = 10) -> tuple[np.ndarray, TrackRollout]:
    """Step ``road`` (mutated) ``n_steps`` with every vehicle as highway-env drives it: the poses [S+1, 4] of
    ``road.vehicles[index]`` (the log of a rule-based vehicle) and its rollout (its flags, the others' poses)."""
    vehicle = road.vehicles[index]
    poses, crashed, offroad, others = [pose_of(vehicle)], [vehicle.crashed], [not vehicle.on_road], [_others(road, index)]
    with pinned_idm(scene_id):
        for _ in range(n_steps):
            road.act()
            road.step(1.0 / sim_hz)
            poses.append(pose_of(vehicle))
            crashed.append(vehicle.crashed)
            offroad.append(not vehicle.on_road)
            others.append(_others(road, index))
    return np.array(poses), TrackRollout(np.array(crashed), np.array(offroad), np.stack(others))
