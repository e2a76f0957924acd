"""RIFT's closed-loop traffic world: traffic states, the candidate lattice, forward simulation and the
dense reward (Chen et al. 2025, "RIFT: Group-Relative RL Fine-Tuning for Realistic and Controllable
Traffic Simulation", arXiv 2505.03344; reward from their ``DenseRewardModel``, returns from their
``traj_evaluator``).

A :class:`TrafficState` is a moment of a :mod:`mmrl.envs.driving` scenario in which one background
vehicle, the *controlled background vehicle* (CBV, the moving agent nearest the scenario's ego), is
driven by the traffic policy and every other vehicle (the scenario's ego included) by the
rule-based driver (IDM + pure pursuit, reacting to everyone). At a state the policy scores
``G = R·M`` candidate trajectories of the CBV: R reference lines (the CBV's route shifted by
``REFERENCE_OFFSETS``) × M speed modes (``SPEED_MODES`` × desired speed), each 4 s at 0.1 s.

Each candidate's *verifiable return* (:func:`candidate_returns`): the CBV follows the candidate
exactly (track propagation) for 40 steps while the others react; per-step dense reward r_j;
G = Σ_j γ^j r_j with γ = 0.98, stopping after the first collision. Collision uses the CBV box
inflated ×1.1; off-road: a corner of the (slightly shrunk) box outside the drivable polygon.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import shapely

from mmrl.envs.driving.geometry import (box_corners, boxes_overlap, point_at_arclength, polyline_arclength,
                                        polyline_tangents, project_to_polyline, wrap_angle)
from mmrl.envs.driving.maps import LANE_WIDTH
from mmrl.envs.driving.env import RouteSet, traffic_step
from mmrl.envs.driving.world import (CAR_LENGTH, CAR_WIDTH, SIM_DT, Agent, Scenario, _leader_gaps, frenet_path,
                                     make_scenario)
from mmrl.tasks.driving.realism import kinematics as realism_kinematics

HORIZON_STEPS = 40  # 4 s at SIM_DT = 0.1 s (RIFT: 40 frames)
GAMMA = 0.98  # RIFT get_rollout_return
REFERENCE_OFFSETS = (0.0, LANE_WIDTH, -LANE_WIDTH)  # R = 3 reference lines: own lane, left, right
SPEED_MODES = (0.0, 0.35, 0.7, 1.0, 1.3)  # M = 5 target speeds, × the CBV's desired speed
NUM_CANDIDATES = len(REFERENCE_OFFSETS) * len(SPEED_MODES)
ACCEL_LIMITS = (-4.0, 2.0)  # m/s² of the candidates' speed profiles
BOX_INFLATION = 1.1  # RIFT: collision matrix with boxes inflated ×1.1
REPLAN_STEPS = 10  # closed loop: a new choice every 1 s; the first second of the chosen candidate is executed


@dataclass(frozen=True, eq=False)
class TrafficState:
    """One decision point: the scenario, the CBV and every other vehicle at time ``time`` (s)."""

    scenario: Scenario
    cbv: Agent  # current pose, its route and desired speed
    others: tuple[Agent, ...]  # everyone else at the same time (the scenario's ego included)
    time: float
    key: tuple[str, int, float]  # (split, seed, warm-up time): what made this state

    @property
    def cbv_pose(self) -> np.ndarray:
        return np.array([self.cbv.x, self.cbv.y, self.cbv.heading, self.cbv.speed])


def _with_pose(agent: Agent, pose: np.ndarray) -> Agent:
    return Agent(float(pose[0]), float(pose[1]), float(pose[2]), float(pose[3]), agent.length, agent.width,
                 agent.route, agent.desired_speed, agent.static)


def scenario_vehicles(scenario: Scenario) -> list[Agent]:
    """The scenario's ego as a rule-based agent (its route, its desired speed), then its agents."""
    x, y, h, v = (float(a) for a in scenario.ego)
    ego = Agent(x, y, h, v, CAR_LENGTH, CAR_WIDTH, scenario.route, scenario.ego_desired_speed)
    return [ego, *scenario.agents]


def simulate(agents: list[Agent] | tuple[Agent, ...], n_steps: int, tracked: np.ndarray | None = None,
             dt: float = SIM_DT) -> np.ndarray:
    """Rule-based rollout of ``agents`` for ``n_steps``: poses [C, S+1, N, 4].

    ``tracked`` [C, S+1, 4]: C copies of the world, in each of which one extra vehicle (the CBV, a
    CAR_LENGTH × CAR_WIDTH box) moves along the given poses and the agents react to it. Without it,
    one copy and no extra vehicle.
    """
    n = len(agents)
    copies = 1 if tracked is None else tracked.shape[0]
    out = np.zeros((copies, n_steps + 1, n, 4))
    if n == 0:
        return out
    pose = np.repeat(np.array([[a.x, a.y, a.heading, a.speed] for a in agents])[None], copies, axis=0)
    length = np.array([a.length for a in agents] + [CAR_LENGTH])
    width = np.array([a.width for a in agents] + [CAR_WIDTH])
    desired = np.array([a.desired_speed for a in agents])
    static = np.array([a.static for a in agents])
    far = np.array([1e5, 1e5, 0.0, 0.0])  # without a tracked vehicle: a stand-in nobody can see
    routes = RouteSet.of([a.route for a in agents])
    out[:, 0] = pose
    for t in range(n_steps):
        extra = np.broadcast_to(far, (copies, 4)) if tracked is None else tracked[:, t]
        pose = traffic_step(pose, extra, length, width, desired, static, routes, dt)
        out[:, t + 1] = pose
    return out


def make_state(seed: int, split: str = "train", warmup_s: float | None = None,
               traffic: tuple[int, int] | None = (5, 9), explore_s: float = 0.0,
               explore_lateral: bool = False) -> TrafficState:
    """A seeded traffic state: the scenario's traffic (``traffic`` = (min, max) background agents, drawn
    by the seed; None: the split's own density) runs rule-based for ``warmup_s`` seconds (default: drawn
    from [0, 3] s by the seed); then the moving agent nearest the scenario's ego becomes the CBV.

    ``explore_s`` > 0: then the CBV drives up to that many seconds (whole seconds, drawn by the seed)
    along random own-lane candidates (``explore_lateral``: random candidates of any reference line),
    others reacting: states off the rule-based driver's path (DART-style coverage for fine-tuning,
    Laskey et al. 2017), so the policy also learns to recover.
    """
    rng = np.random.default_rng([seed, 77])
    n_agents = None if traffic is None or split == "ood_dense" else int(rng.integers(traffic[0], traffic[1] + 1))
    scenario = make_scenario(seed, split, n_agents)
    if warmup_s is None:
        warmup_s = float(np.round(rng.uniform(0.0, 3.0), 1))
    vehicles = scenario_vehicles(scenario)
    steps = int(round(warmup_s / SIM_DT))
    poses = simulate(vehicles, steps)[0, -1]  # [N, 4]
    vehicles = [_with_pose(a, p) for a, p in zip(vehicles, poses)]
    ego_xy = poses[0, :2]
    moving = [i for i, a in enumerate(vehicles) if i > 0 and not a.static]
    if not moving:  # no background agent: the ego itself becomes the CBV
        moving = [0]
    cbv = min(moving, key=lambda i: float(np.linalg.norm(poses[i, :2] - ego_xy)) if i > 0 else np.inf)
    others = tuple(a for i, a in enumerate(vehicles) if i != cbv)
    state = TrafficState(scenario, vehicles[cbv], others, warmup_s, (split, int(seed), warmup_s))
    for _ in range(int(rng.integers(0, int(explore_s) + 1))):
        cand, _ = candidate_lattice(state, REPLAN_STEPS)
        piece = cand[int(rng.integers(len(cand) if explore_lateral else len(SPEED_MODES)))]  # own line first
        other_poses = simulate(state.others, REPLAN_STEPS, tracked=piece[None])[0]
        collide, _ = collisions_offroad(state, piece[None], other_poses[None])
        if collide.any():
            break
        state = advance(state, piece, other_poses, REPLAN_STEPS)
    return state


def advance(state: TrafficState, cbv_poses: np.ndarray, other_poses: np.ndarray, steps: int) -> TrafficState:
    """The state ``steps`` sim steps later, given the CBV poses [S+1, 4] and the others' [S+1, N, 4]."""
    others = tuple(_with_pose(a, p) for a, p in zip(state.others, other_poses[steps]))
    return TrafficState(state.scenario, _with_pose(state.cbv, cbv_poses[steps]), others,
                        state.time + steps * SIM_DT, state.key)


# ------------------------------------------------------------------------------------------------
# Candidates

def speed_profile(v0: float, v_target: float, n_steps: int, dt: float = SIM_DT) -> np.ndarray:
    """Speeds [S+1] approaching ``v_target`` within ``ACCEL_LIMITS``."""
    v = np.empty(n_steps + 1)
    v[0] = v0
    low, high = ACCEL_LIMITS
    for t in range(n_steps):
        v[t + 1] = v[t] + np.clip(v_target - v[t], low * dt, high * dt)
    return v


def candidate_lattice(state: TrafficState, n_steps: int = HORIZON_STEPS,
                      offsets: tuple[float, ...] = REFERENCE_OFFSETS) -> tuple[np.ndarray, np.ndarray]:
    """CBV candidate poses [G, S+1, 4] (world, SIM_DT) and their parameters [G, 2] = (lateral offset of
    the reference line in m, target speed as a fraction of the desired speed); reference-line major.
    ``offsets``: the reference lines' shifts from the CBV's route (own lane, one lane left, one right)."""
    pose, route = state.cbv_pose, state.cbv.route
    s0, d0, _ = project_to_polyline(pose[None, :2], route)
    v_max = max(SPEED_MODES) * state.cbv.desired_speed
    path_len = pose[3] * n_steps * SIM_DT + 0.5 * ACCEL_LIMITS[1] * (n_steps * SIM_DT) ** 2 + 10.0
    poses, params = [], []
    for offset in offsets:
        path = frenet_path(route, float(s0[0]), float(d0[0]), offset, max(path_len, v_max * 4.0 + 10.0))
        path[0] = pose[:2]
        s_path = polyline_arclength(path)
        heading = np.unwrap(polyline_tangents(path))
        for mode in SPEED_MODES:
            v = speed_profile(float(pose[3]), mode * state.cbv.desired_speed, n_steps)
            dist = np.concatenate([[0.0], np.cumsum(0.5 * (v[1:] + v[:-1]) * SIM_DT)])
            xy = point_at_arclength(path, dist)
            h = np.interp(dist, s_path, heading)
            h[0] = pose[2]
            poses.append(np.concatenate([xy, wrap_angle(h)[:, None], v[:, None]], axis=1))
            params.append((offset, mode))
    return np.stack(poses), np.array(params)


def poses_from_xy(start_pose: np.ndarray, xy: np.ndarray, dt: float = SIM_DT) -> np.ndarray:
    """Poses [S+1, 4] of a vehicle at ``start_pose`` [4] moving through world points ``xy`` [S, 2] (one per
    ``dt``): heading and speed by finite differences (a standing step keeps the previous heading)."""
    pts = np.concatenate([start_pose[None, :2], xy])
    seg = np.diff(pts, axis=0)
    speed = np.linalg.norm(seg, axis=1) / dt
    heading = np.arctan2(seg[:, 1], seg[:, 0])
    for k in range(len(heading)):
        if speed[k] < 0.05:
            heading[k] = heading[k - 1] if k > 0 else start_pose[2]
    return np.concatenate([pts, np.concatenate([[start_pose[2]], heading])[:, None],
                           np.concatenate([[start_pose[3]], speed])[:, None]], axis=1)


# ------------------------------------------------------------------------------------------------
# Checks and the dense reward

def collisions_offroad(state: TrafficState, cbv: np.ndarray, others: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-step collision and off-road flags [C, S+1] of CBV poses [C, S+1, 4] among others [C, S+1, N, 4]."""
    box = box_corners(cbv[..., 0], cbv[..., 1], cbv[..., 2], state.cbv.length * BOX_INFLATION,
                      state.cbv.width * BOX_INFLATION)
    if others.shape[2]:
        length = np.array([a.length for a in state.others])
        width = np.array([a.width for a in state.others])
        boxes = box_corners(others[..., 0], others[..., 1], others[..., 2], length, width)
        collide = boxes_overlap(box[:, :, None], boxes).any(-1)
    else:
        collide = np.zeros(cbv.shape[:2], bool)
    inner = box_corners(cbv[..., 0], cbv[..., 1], cbv[..., 2], state.cbv.length - 0.4, state.cbv.width - 0.4)
    inside = shapely.contains_xy(state.scenario.road.drivable, inner[..., 0].ravel(), inner[..., 1].ravel())
    return collide, ~inside.reshape(inner.shape[:-1]).all(-1)


def reference_errors(state: TrafficState, cbv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Signed lateral offset Δd and heading error Δθ [C, S+1] to the closest point of the closest route
    of the road (RIFT: the closest reference line)."""
    pts = cbv[..., :2].reshape(-1, 2)
    best_d = np.full(len(pts), np.inf)
    best_h = np.zeros(len(pts))
    for line in state.scenario.road.routes.values():
        _, d, h = project_to_polyline(pts, line)
        better = np.abs(d) < np.abs(best_d)
        best_d, best_h = np.where(better, d, best_d), np.where(better, h, best_h)
    dtheta = wrap_angle(cbv[..., 2].reshape(-1) - best_h)
    return best_d.reshape(cbv.shape[:2]), dtheta.reshape(cbv.shape[:2])


REWARD_TERMS = ("collision", "offroad", "comfort", "l_align", "l_center", "velocity", "timestep")


def dense_rewards(state: TrafficState, cbv: np.ndarray, others: np.ndarray,
                  dt: float = SIM_DT) -> dict[str, np.ndarray]:
    """RIFT's ``DenseRewardModel`` terms [C, S] for steps 1..S of CBV poses [C, S+1, 4]:

    R_collision = −(20 + |v|)·collision; R_offroad = −5·offroad; R_comfort = −0.8·(1[|a|>4] + 1[|α̇|>4])
    (a: longitudinal acceleration, α̇: yaw acceleration, rad/s²); R_l_align = 0.5·(min(cos Δθ, 0) +
    0.05·min(cos Δθ·v, 0) + 0.25·(1 − |Δθ|/(π/2))); R_l_center = −0.6·1[cos Δθ > 0.5]·(|Δd| −
    0.05/exp(|Δd| − 0.5)); R_velocity = 0.1·max(cos Δθ, 0)·1[3 < |v| < 20]·|v|; R_timestep =
    −0.1·1[|v| > 0 or |a| > 0].
    """
    collide, offroad = collisions_offroad(state, cbv, others)
    dd, dtheta = reference_errors(state, cbv)
    return dense_terms(cbv, collide, offroad, dd, dtheta, dt) | {"_collide": collide, "_offroad": offroad}


def dense_terms(cbv: np.ndarray, collide: np.ndarray, offroad: np.ndarray, dd: np.ndarray, dtheta: np.ndarray,
                dt: float = SIM_DT) -> dict[str, np.ndarray]:
    """The terms of :func:`dense_rewards` [C, S] from CBV poses [C, S+1, 4], the per-step collision and
    off-road flags [C, S+1] and the reference errors Δd, Δθ [C, S+1], whichever simulator produced them."""
    v = cbv[..., 3]
    accel = np.diff(v, axis=1) / dt  # [C, S]
    yaw_rate = np.diff(np.unwrap(cbv[..., 2], axis=1), axis=1) / dt
    yaw_acc = np.diff(np.concatenate([yaw_rate[:, :1], yaw_rate], axis=1), axis=1) / dt
    v, dd, dtheta = np.abs(v[:, 1:]), dd[:, 1:], dtheta[:, 1:]
    cos = np.cos(dtheta)
    return {
        "collision": -(20.0 + v) * collide[:, 1:],
        "offroad": -5.0 * offroad[:, 1:],
        "comfort": -0.8 * ((np.abs(accel) > 4.0).astype(float) + (np.abs(yaw_acc) > 4.0)),
        "l_align": 0.5 * (np.minimum(cos, 0.0) + 0.05 * np.minimum(cos * v, 0.0)
                          + 0.25 * (1.0 - np.abs(dtheta) / (np.pi / 2))),
        "l_center": -0.6 * (cos > 0.5) * (np.abs(dd) - 0.05 / np.exp(np.abs(dd) - 0.5)),
        "velocity": 0.1 * np.maximum(cos, 0.0) * ((v > 3.0) & (v < 20.0)) * v,
        "timestep": -0.1 * ((v > 0) | (np.abs(accel) > 0)),
    }


@dataclass(frozen=True)
class CandidateReturns:
    """Verifiable outcome of forward-simulating C CBV trajectories from one state (all arrays [C])."""

    total: np.ndarray  # Σ_j γ^j r_j, stopping after the first collision
    terms: dict[str, np.ndarray]  # the discounted sum of each reward term (same truncation)
    collision: np.ndarray  # bool: any collision within the horizon
    offroad: np.ndarray  # bool: any off-road step within the horizon
    progress: np.ndarray  # metres gained along the CBV's route


def candidate_returns(state: TrafficState, cbv: np.ndarray, gamma: float = GAMMA) -> CandidateReturns:
    """Forward-simulate CBV trajectories [C, S+1, 4] (others react) and score them (RIFT returns)."""
    others = simulate(state.others, cbv.shape[1] - 1, tracked=cbv)
    r = dense_rewards(state, cbv, others)
    collide, offroad = r.pop("_collide"), r.pop("_offroad")
    return discounted_returns(r, collide, offroad, cbv, state.cbv.route, gamma)


def discounted_returns(terms: dict[str, np.ndarray], collide: np.ndarray, offroad: np.ndarray, cbv: np.ndarray,
                       route: np.ndarray, gamma: float = GAMMA) -> CandidateReturns:
    """RIFT's returns of C rollouts from their dense terms [C, S] (:func:`dense_terms`), per-step collision /
    off-road flags [C, S+1] and CBV poses [C, S+1, 4]: Σ_j γ^j r_j up to and including the first collision;
    progress along ``route``."""
    r = terms
    collide, offroad = collide[:, 1:], offroad[:, 1:]
    n_steps = collide.shape[1]
    # steps up to and including the first collision count (RIFT breaks after it)
    hit = np.where(collide.any(1), collide.argmax(1), n_steps)
    alive = np.arange(n_steps)[None] <= hit[:, None]
    discount = gamma ** np.arange(n_steps)[None] * alive
    terms = {k: (v * discount).sum(1) for k, v in r.items()}
    s, _, _ = project_to_polyline(cbv[:, [0, -1], :2].reshape(-1, 2), route)
    s = s.reshape(-1, 2)
    return CandidateReturns(sum(terms.values()), terms, collide.any(1), (offroad & alive).any(1), s[:, 1] - s[:, 0])


# ------------------------------------------------------------------------------------------------
# Policy inputs: candidate features and agent context (perception only, never the verifier's result)

CANDIDATE_FEATURES = ("offset", "speed_mode", "final_speed", "progress", "offroad_frac", "min_gap",
                      "min_gap_time", "close_frac", "d_lane", "ahead_gap", "predicted_hit", "predicted_hit_time")
CONTEXT_FEATURES = ("speed", "desired_speed", "leader_gap", "neighbours", "nearest")


def features(state: TrafficState, candidates: np.ndarray, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Candidate features [G, F] and agent context [X] (float32), both roughly unit scale.

    Others are predicted at constant velocity (a perception model, not the reactive simulator).
    """
    n_steps = candidates.shape[1] - 1
    t = SIM_DT * np.arange(n_steps + 1)
    if state.others:
        o = np.array([[a.x, a.y, a.heading, 0.0 if a.static else a.speed] for a in state.others])  # [N, 4]
        pred = o[None, :, :2] + t[:, None, None] * (o[None, :, 3:4] * np.stack([np.cos(o[:, 2]), np.sin(o[:, 2])], 1))
        dist = np.linalg.norm(candidates[:, :, None, :2] - pred[None], axis=-1).min(-1)  # [G, S+1]
        # gap to the nearest other whose predicted centre lies in a 3 m corridor ahead of the candidate
        rel = pred[None] - candidates[:, :, None, :2]  # [G, S+1, N, 2]
        c, s = np.cos(candidates[..., 2])[..., None], np.sin(candidates[..., 2])[..., None]
        fwd, lat = c * rel[..., 0] + s * rel[..., 1], -s * rel[..., 0] + c * rel[..., 1]
        ahead = np.where((fwd > 0) & (np.abs(lat) < 2.5), fwd, 60.0).min(-1).min(-1)  # [G]
        # oriented-box overlap with the constant-velocity prediction (boxes inflated ×1.1, as the verifier's)
        mine = box_corners(candidates[..., 0], candidates[..., 1], candidates[..., 2], state.cbv.length * BOX_INFLATION,
                           state.cbv.width * BOX_INFLATION)  # [G, S+1, 4, 2]
        heading = np.broadcast_to(o[:, 2], pred.shape[:2])
        theirs = box_corners(pred[..., 0], pred[..., 1], heading, np.array([a.length for a in state.others]),
                             np.array([a.width for a in state.others]))  # [S+1, N, 4, 2]
        hit = boxes_overlap(mine[:, :, None], theirs[None]).any(-1)  # [G, S+1]
    else:
        dist = np.full(candidates.shape[:2], 60.0)
        ahead = np.full(len(candidates), 60.0)
        hit = np.zeros(candidates.shape[:2], bool)
    dist = np.minimum(dist, 60.0)
    hit_time = np.where(hit.any(1), t[hit.argmax(1)], t[-1] + 1.0) / (n_steps * SIM_DT)
    inside = shapely.contains_xy(state.scenario.road.drivable, candidates[..., 0].ravel(), candidates[..., 1].ravel())
    offroad_frac = 1.0 - inside.reshape(candidates.shape[:2]).mean(1)
    dd, _ = reference_errors(state, candidates[:, -1:])
    s, _, _ = project_to_polyline(candidates[:, [0, -1], :2].reshape(-1, 2), state.cbv.route)
    progress = s.reshape(-1, 2) @ np.array([-1.0, 1.0])
    feats = np.stack([params[:, 0] / LANE_WIDTH, params[:, 1], candidates[:, -1, 3] / 10.0, progress / 40.0,
                      offroad_frac, dist.min(1) / 20.0, t[dist.argmin(1)] / (n_steps * SIM_DT),
                      (dist < 6.0).mean(1), np.abs(dd[:, 0]) / LANE_WIDTH, ahead / 60.0, hit.any(1), hit_time],
                     axis=1)
    pose = state.cbv_pose
    if state.others:
        everyone = np.concatenate([pose[None], o], axis=0)[None]
        lengths = np.array([state.cbv.length] + [a.length for a in state.others])
        widths = np.array([state.cbv.width] + [a.width for a in state.others])
        gap, _ = _leader_gaps(everyone, lengths, widths, 1)
        near = np.linalg.norm(o[:, :2] - pose[:2], axis=1)
        leader, neighbours = min(float(gap[0, 0]), 60.0), float((near < 20.0).sum())
        nearest = float(min(near.min(), 60.0))
    else:
        leader, neighbours, nearest = 60.0, 0.0, 60.0
    context = np.array([pose[3] / 10.0, state.cbv.desired_speed / 10.0, leader / 60.0, neighbours / 5.0,
                        nearest / 60.0])
    return feats.astype(np.float32), context.astype(np.float32)


def rule_based_choice(state: TrafficState, candidates: np.ndarray) -> int:
    """The candidate closest (mean displacement over the horizon) to what the rule-based driver
    (IDM + pure pursuit, others reacting) does from this state: the imitation target."""
    everyone = [state.cbv, *state.others]
    log = simulate(everyone, candidates.shape[1] - 1)[0, :, 0]  # [S+1, 4] the CBV under IDM
    ade = np.linalg.norm(candidates[:, :, :2] - log[None, :, :2], axis=-1).mean(1)
    return int(ade.argmin())


# ------------------------------------------------------------------------------------------------
# Closed loop: the CBV driven by a chooser for a whole episode, or by the rule-based driver (the log)

EPISODE_STEPS = 80  # 8 s
GOAL_DISTANCE = 45.0  # m along the route within the episode: "goal reached" (controllability)


@dataclass(frozen=True)
class Episode:
    """One closed-loop episode of the CBV: its poses [S+1, 4], the others' [S+1, N, 4], outcomes."""

    cbv: np.ndarray
    others: np.ndarray
    collision: bool
    offroad: bool
    progress: float
    goal_reached: bool
    choices: tuple[int, ...]  # candidate index at each replan (empty for the rule-based log)


def _finish_episode(state: TrafficState, cbv: np.ndarray, others: np.ndarray, choices: tuple[int, ...]) -> Episode:
    collide, offroad = collisions_offroad(state, cbv[None], others[None])
    s, _, _ = project_to_polyline(cbv[[0, -1], :2], state.cbv.route)
    progress = float(s[1] - s[0])
    return Episode(cbv, others, bool(collide[0, 1:].any()), bool(offroad[0, 1:].any()), progress,
                   progress >= GOAL_DISTANCE and not collide[0, 1:].any(), choices)


def closed_loop_episode(state: TrafficState, choose, n_steps: int = EPISODE_STEPS,
                        replan: int = REPLAN_STEPS) -> Episode:
    """Drive the CBV by ``choose(features [G, F], context [X]) -> candidate index`` every ``replan``
    steps (executing that candidate's first ``replan`` steps, others reacting) for ``n_steps``; the
    episode stops at the first collision of the CBV."""
    start = state
    cbv_path, other_path, choices = [state.cbv_pose[None]], [np.array([[a.x, a.y, a.heading, a.speed]
                                                                      for a in state.others]).reshape(1, -1, 4)], []
    for _ in range(n_steps // replan):
        cand, params = candidate_lattice(state)
        f, c = features(state, cand, params)
        k = int(choose(f, c))
        if not 0 <= k < len(cand):
            raise ValueError(f"choose returned candidate {k}; there are {len(cand)}")
        choices.append(k)
        piece = cand[k, :replan + 1]
        others = simulate(state.others, replan, tracked=piece[None])[0]
        cbv_path.append(piece[1:])
        other_path.append(others[1:])
        collide, _ = collisions_offroad(state, piece[None], others[None])
        state = advance(state, piece, others, replan)
        if collide[0, 1:].any():
            break
    return _finish_episode(start, np.concatenate(cbv_path), np.concatenate(other_path), tuple(choices))


def rule_based_episode(state: TrafficState, n_steps: int = EPISODE_STEPS) -> Episode:
    """The log: the CBV driven by the rule-based driver too (IDM + pure pursuit)."""
    poses = simulate([state.cbv, *state.others], n_steps)[0]  # [S+1, N+1, 4]
    return _finish_episode(state, poses[:, 0], poses[:, 1:], ())


def kinematics(cbv: np.ndarray, dt: float = SIM_DT) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Speed [S+1], longitudinal acceleration [S] and jerk [S−1] of poses [S+1, 4] at the world's step."""
    return realism_kinematics(cbv, dt)
