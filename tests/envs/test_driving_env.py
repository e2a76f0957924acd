"""``mmrl/Driving-v0``: gymnasium's contract, seeding, splits, terminations, bad actions, batched traffic."""

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import mmrl.envs  # noqa: F401  (registers mmrl/Driving-v0)
from mmrl.envs.driving.env import RouteSet, batched_pure_pursuit
from mmrl.envs.driving.world import agent_arrays, make_scenario, pure_pursuit_steer


@pytest.mark.parametrize("mode", ["continuous", "candidates"])
def test_check_env_passes(mode):
    env = gymnasium.make("mmrl/Driving-v0", action_mode=mode, disable_env_checker=True)
    check_env(env.unwrapped, skip_render_check=True)


def test_reset_is_seeded_and_split_is_an_option():
    env = gymnasium.make("mmrl/Driving-v0", disable_env_checker=True).unwrapped
    a, _ = env.reset(seed=5)
    b, _ = env.reset(seed=5)
    assert np.array_equal(a["image"], b["image"]) and np.array_equal(a["state"], b["state"])
    _, info = env.reset(seed=5, options={"split": "ood_layout"})
    assert info["split"] == "ood_layout" and env.scenario.road.layout in ("s_curve", "t_junction")
    with pytest.raises(ValueError, match="unknown split"):
        env.reset(seed=5, options={"split": "moon"})
    with pytest.raises(ValueError, match="unknown reset options"):
        env.reset(seed=5, options={"weather": 1})
    dense = gymnasium.make("mmrl/Driving-v0", split="ood_dense", disable_env_checker=True).unwrapped
    dense.reset(seed=5)
    assert len(dense.scenario.agents) >= 10


def test_keeping_the_lane_reaches_the_goal_and_driving_off_terminates():
    env = gymnasium.make("mmrl/Driving-v0", action_mode="candidates", disable_env_checker=True).unwrapped
    env.reset(seed=0)
    total = 0.0
    for _ in range(env.max_steps):
        _, reward, terminated, truncated, info = env.step(3)  # own lane, desired speed
        total += reward
        if terminated or truncated:
            break
    assert info["goal_reached"] and terminated and not info["collision"] and total > 10.0
    env = gymnasium.make("mmrl/Driving-v0", disable_env_checker=True).unwrapped
    env.reset(seed=0)
    for _ in range(env.max_steps):  # full steering: leaves the road
        _, reward, terminated, truncated, info = env.step(np.array([0.5, 1.0], np.float32))
        if terminated or truncated:
            break
    assert terminated and info["offroad"] and reward < -4.0


def test_nan_actions_raise_clearly_and_leave_the_world_untouched():
    env = gymnasium.make("mmrl/Driving-v0", disable_env_checker=True).unwrapped
    obs, _ = env.reset(seed=1)
    with pytest.raises(ValueError, match="NaN or inf"):
        env.step(np.array([np.nan, 0.0], np.float32))
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros(3, np.float32))
    after, *_ = env.step(np.zeros(2, np.float32))
    assert np.isfinite(after["state"]).all()
    cand = gymnasium.make("mmrl/Driving-v0", action_mode="candidates", disable_env_checker=True).unwrapped
    cand.reset(seed=1)
    with pytest.raises(ValueError):
        cand.step(float("nan"))
    with pytest.raises(ValueError, match="candidate action"):
        cand.step(15)


def test_batched_pure_pursuit_equals_the_per_agent_one():
    for seed in range(3):
        scenario = make_scenario(seed, "ood_dense")
        pose = agent_arrays(scenario)[0]
        rng = np.random.default_rng(seed)
        pose = pose + rng.normal(0, [1.0, 1.0, 0.2, 1.0], pose.shape)
        pose[:, 3] = np.abs(pose[:, 3])
        routes = RouteSet.of([a.route for a in scenario.agents])
        batched = batched_pure_pursuit(np.repeat(pose[None], 2, 0), routes)
        single = np.array([pure_pursuit_steer(pose[i:i + 1], a.route)[0] for i, a in enumerate(scenario.agents)])
        np.testing.assert_allclose(batched, np.broadcast_to(single, batched.shape), atol=1e-12)
