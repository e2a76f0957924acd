"""``driving/rift-v0``: RIFT's dense reward (golden numbers), returns, candidates, bad outputs, closed loop."""

from pathlib import Path

import numpy as np
import pytest
import torch

from mmrl.algos import ADVANTAGE_ESTIMATORS, AdvantageInputs
from mmrl.core.config import TrainConfig, build, load_yaml
from mmrl.envs.driving.maps import LANE_WIDTH
from mmrl.envs.driving.world import Agent, make_scenario
from mmrl.core.registry import make_task
from mmrl.tasks.driving.rift import RETURN_MAX, RiftTask, RiftConfig, build_example, closed_loop_metrics
from mmrl.tasks.driving.rift_sim import (GAMMA, HORIZON_STEPS, NUM_CANDIDATES, REWARD_TERMS, TrafficState,
                                         candidate_lattice, candidate_returns, closed_loop_episode, dense_rewards,
                                         kinematics, make_state, rule_based_choice, simulate)
from mmrl.tasks.driving.realism import wasserstein_1d

ROOT = Path(__file__).resolve().parents[2]


def straight_state(others=()) -> TrafficState:
    """A CBV on lane0 of a straight road (centre line y = 0, heading +x) at 8 m/s."""
    scenario = make_scenario(next(s for s in range(50) if make_scenario(s).road.layout == "straight"))
    route = scenario.road.routes["lane0"]
    cbv = Agent(10.0, 0.0, 0.0, 8.0, 4.5, 1.9, route, 8.0)
    return TrafficState(scenario, cbv, tuple(others), 0.0, ("train", 0, 0.0))


def constant_speed(v: float, steps: int = HORIZON_STEPS, x0: float = 10.0) -> np.ndarray:
    t = 0.1 * np.arange(steps + 1)
    return np.stack([x0 + v * t, np.zeros_like(t), np.zeros_like(t), np.full_like(t, v)], axis=1)[None]


def test_dense_reward_terms_golden_on_a_centred_aligned_drive():
    state = straight_state()
    r = dense_rewards(state, constant_speed(8.0), np.zeros((1, HORIZON_STEPS + 1, 0, 4)))
    np.testing.assert_allclose(r["l_align"], 0.5 * 0.25)  # Δθ = 0: 0.5·(0 + 0 + 0.25·1)
    np.testing.assert_allclose(r["l_center"], 0.6 * 0.05 / np.exp(-0.5))  # Δd = 0: −0.6·(0 − 0.05/e^{−0.5})
    np.testing.assert_allclose(r["velocity"], 0.8)  # 0.1·1·8
    np.testing.assert_allclose(r["timestep"], -0.1)
    np.testing.assert_allclose(r["collision"], 0.0)
    np.testing.assert_allclose(r["comfort"], 0.0)
    assert not r["_offroad"].any()
    out = candidate_returns(state, constant_speed(8.0))
    per_step = 0.125 + 0.6 * 0.05 / np.exp(-0.5) + 0.8 - 0.1
    np.testing.assert_allclose(out.total, per_step * (GAMMA ** np.arange(HORIZON_STEPS)).sum(), rtol=1e-9)
    np.testing.assert_allclose(out.progress, 32.0, atol=1e-6)


def test_velocity_window_comfort_and_offset_terms():
    state = straight_state()
    fast = dense_rewards(state, constant_speed(25.0), np.zeros((1, HORIZON_STEPS + 1, 0, 4)))
    np.testing.assert_allclose(fast["velocity"], 0.0)  # outside 3 < |v| < 20
    brake = constant_speed(8.0)
    brake[0, 5:, 3] = 2.0  # −60 m/s² for one step
    r = dense_rewards(state, brake, np.zeros((1, HORIZON_STEPS + 1, 0, 4)))
    assert r["comfort"][0, 4] == pytest.approx(-0.8) and r["comfort"][0, 6] == 0.0
    shifted = constant_speed(8.0)
    shifted[..., 1] = 1.0  # 1 m left of the lane centre (lane1 is 3.5 m away: lane0 is the closest)
    r = dense_rewards(state, shifted, np.zeros((1, HORIZON_STEPS + 1, 0, 4)))
    np.testing.assert_allclose(r["l_center"], -0.6 * (1.0 - 0.05 / np.exp(0.5)))


def test_a_collision_costs_20_plus_speed_and_ends_the_return():
    blocker = Agent(40.0, 0.0, 0.0, 0.0, 4.5, 1.9, np.array([[40.0, 0.0], [41.0, 0.0]]), 0.0, True)
    state = straight_state([blocker])
    traj = constant_speed(10.0)  # reaches the parked box (front at 10 + 2.475 + 10 t ≥ 37.75) at t ≈ 2.6 s
    out = candidate_returns(state, traj)
    assert out.collision[0]
    others = simulate(state.others, HORIZON_STEPS, tracked=traj)
    r = dense_rewards(state, traj, others)
    hit = int(r["_collide"][0, 1:].argmax())
    assert r["collision"][0, hit] == pytest.approx(-(20.0 + 10.0))
    keep = {k: v for k, v in r.items() if not k.startswith("_")}
    expected = sum((v[0, :hit + 1] * GAMMA ** np.arange(hit + 1)).sum() for v in keep.values())
    assert out.total[0] == pytest.approx(expected)
    assert out.terms["collision"][0] == pytest.approx(-30.0 * GAMMA ** hit)


def test_candidate_lattice_shape_order_and_limits():
    state = make_state(3, "train")
    cand, params = candidate_lattice(state)
    assert cand.shape == (NUM_CANDIDATES, HORIZON_STEPS + 1, 4) and params.shape == (NUM_CANDIDATES, 2)
    np.testing.assert_allclose(cand[:, 0], np.broadcast_to(state.cbv_pose, (NUM_CANDIDATES, 4)))
    assert set(params[:, 0]) == {0.0, LANE_WIDTH, -LANE_WIDTH}
    accel = np.diff(cand[..., 3], axis=1) / 0.1
    assert accel.min() >= -4.0 - 1e-9 and accel.max() <= 2.0 + 1e-9
    assert np.isfinite(cand).all()


def test_group_relative_advantage_is_rifts_formula():
    returns = torch.tensor([3.0, -1.0, 5.0, 2.0, 2.0, 2.5])
    group = torch.tensor([0, 0, 0, 1, 1, 1])
    cfg = build(TrainConfig, load_yaml(ROOT / "configs/rift/tiny_cpu.yaml")).algo
    adv, _ = ADVANTAGE_ESTIMATORS.get(cfg.advantage)(AdvantageInputs(returns, torch.ones(6, 1), group), cfg)
    for g in (0, 1):
        x = returns[group == g]
        torch.testing.assert_close(adv[group == g, 0], (x - x.mean()) / (x.std() + 1e-5))
    assert (cfg.clip_low, cfg.clip_high, cfg.dual_clip_c, cfg.kl_coef) == (0.2, 0.2, 3.0, 0.0)


@pytest.fixture(scope="module")
def task() -> RiftTask:
    return make_task("driving/rift-v0", {"train_pool": 8})


def test_a_candidates_points_score_like_its_index(task):
    """A trajectory given as points is the same path; only speed / heading come from finite differences."""
    ex = task.sample_batch("test", 1, np.random.default_rng(0))[0]
    for k in (0, 8, 13):
        by_index = task.reward(ex, k)
        by_points = task.reward(ex, ex.candidates[k, 1:, :2].copy())
        for name in ("collision", "offroad", "progress"):
            assert by_index.components[name] == pytest.approx(by_points.components[name], abs=1e-6)
        assert set(by_index.components) >= {"collision", "offroad", "progress", "velocity", "l_align", "comfort"}


@pytest.mark.parametrize("output, reason", [
    (15, "out of range"), (-1, "out of range"), (True, "not a candidate index"), ("3", "not a candidate index"),
    (np.full((HORIZON_STEPS, 2), np.nan), "NaN"), (np.zeros((3, 2)), "shape"),
])
def test_bad_outputs_score_the_floor_with_a_reason(task, output, reason):
    """An unusable choice scores the range's floor (it used to score 0, above half the candidates)."""
    ex = task.sample_batch("test", 1, np.random.default_rng(1))[0]
    result = task.reward(ex, output)
    assert result.score == task.reward_range[0] == -250.0 and reason in result.info
    assert result.score <= min(task.reward(ex, k).score for k in range(len(ex.candidates)))


def test_returns_hold_the_declared_range(task):
    """Candidates measured down to −188 (the old declaration said −150); a zigzag of points reaches −1322."""
    ex = task.sample_batch("test", 1, np.random.default_rng(3))[0]
    zigzag = ex.candidates[0, 1:, :2] + np.where(np.arange(HORIZON_STEPS) % 2, 150.0, -150.0)[:, None]
    result = task.reward(ex, zigzag)
    assert result.score == -250.0 and sum(result.components[k] for k in REWARD_TERMS) < -1000
    assert task.reward_range == (-250.0, 61.0) and RETURN_MAX == pytest.approx(60.265, abs=1e-3)
    assert task.reward(ex, 10 ** 5000).score == -250.0


def test_a_trajectory_kilometres_away_scores_the_floor_without_simulating(task):
    ex = task.sample_batch("test", 1, np.random.default_rng(1))[0]
    far = ex.candidates[0, 1:, :2] + 5000.0
    assert task.reward(ex, far).info.startswith("trajectory point more than")


def test_sampling_is_seeded_and_train_uses_the_pool(task):
    a = task.sample_batch("train", 20, np.random.default_rng(4))
    b = task.sample_batch("train", 20, np.random.default_rng(4))
    assert [e.seed for e in a] == [e.seed for e in b] and max(e.seed for e in a) < 8
    with pytest.raises(ValueError, match="unknown split"):
        task.sample_batch("nowhere", 1, np.random.default_rng(0))
    ex = a[0]
    assert ex.features.shape == (NUM_CANDIDATES, 12) and ex.context.shape == (5,)
    assert ex.features.dtype == np.float32 and np.isfinite(ex.features).all()


def test_reference_output_is_the_candidate_closest_to_the_rule_based_driver(task):
    ex = task.sample_batch("test", 1, np.random.default_rng(2))[0]
    k = task.reference_output(ex)
    log = simulate([ex.state.cbv, *ex.state.others], HORIZON_STEPS)[0, :, 0]
    ade = np.linalg.norm(ex.candidates[..., :2] - log[None, :, :2], axis=-1).mean(1)
    assert k == int(ade.argmin()) == rule_based_choice(ex.state, ex.candidates)


def test_closed_loop_episode_braking_versus_driving():
    state = make_state(11, "test")
    stop = closed_loop_episode(state, lambda f, c: 0)  # own lane, target speed 0
    drive = closed_loop_episode(state, lambda f, c: 3)  # own lane, desired speed
    assert stop.progress < drive.progress and not stop.goal_reached
    assert len(stop.choices) >= 1 and all(k == 0 for k in stop.choices)
    with pytest.raises(ValueError, match="candidate 99"):
        closed_loop_episode(state, lambda f, c: 99)


def test_closed_loop_metrics_keys_and_log_comparison():
    m = closed_loop_metrics(lambda f, c: 3, "test", [1, 2], traffic=(2, 3))
    assert {"collision_rate", "offroad_rate", "progress_mean", "goal_rate", "w1_speed", "w1_accel", "w1_jerk",
            "log_collision_rate", "log_progress_mean"} <= set(m)
    assert all(np.isfinite(v) for v in m.values())


def test_wasserstein_and_kinematics_golden():
    assert wasserstein_1d(np.array([0.0, 1.0]), np.array([1.0, 2.0])) == pytest.approx(1.0)
    assert wasserstein_1d(np.array([0.0, 0.0, 3.0]), np.array([0.0, 3.0, 3.0])) == pytest.approx(1.0)
    v, a, j = kinematics(np.stack([np.zeros(4), np.zeros(4), np.zeros(4), np.array([0.0, 1.0, 3.0, 6.0])], 1))
    np.testing.assert_allclose(a, [10.0, 20.0, 30.0])
    np.testing.assert_allclose(j, [100.0, 100.0])


def test_build_example_is_deterministic():
    a, b = build_example("test", 9), build_example("test", 9)
    np.testing.assert_array_equal(a.features, b.features)
    np.testing.assert_array_equal(a.candidates, b.candidates)
    assert RiftConfig().traffic == (5, 9)
