"""The MuJoCo table-top envs: gymnasium's contract, seeding, experts, potential-based rewards,
vectorisation, and bad input that never corrupts the simulation."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from mmrl.envs.robot import ENV_IDS, OOD_COLORS, RULES, TRAIN_COLORS, TabletopEnv, variations
from mmrl.envs.robot import tabletop

BASE_IDS = ["mmrl/Reach-v0", "mmrl/Push-v0", "mmrl/PickPlace-v0"]


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_every_registered_env_passes_check_env(env_id):
    check_env(gymnasium.make(env_id).unwrapped)


def test_ids_cover_tasks_and_ood_variants():
    for name in ("Reach", "Push", "PickPlace"):
        for variant in ("", "-OODColor", "-OODPosition", "-OODInstruction", "-OODDistractor"):
            assert f"mmrl/{name}{variant}-v0" in ENV_IDS
    v = variations("reach")
    assert set(v["OODColor"].colors) == set(OOD_COLORS) and not set(OOD_COLORS) & set(TRAIN_COLORS)
    assert v["OODPosition"].radius[0] > v[""].radius[1]
    assert not set(v["OODInstruction"].templates) & set(v[""].templates)


def rollout(env, seed, actions):
    obs, _ = env.reset(seed=seed)
    images, rewards = [obs["image"]], []
    for a in actions:
        obs, r, term, trunc, _ = env.step(a)
        images.append(obs["image"])
        rewards.append(r)
        if term or trunc:
            break
    return obs["instruction"], np.stack(images), np.array(rewards)


@pytest.mark.parametrize("env_id", BASE_IDS)
def test_seeded_episodes_reproduce(env_id):
    env = gymnasium.make(env_id)
    actions = np.random.default_rng(0).uniform(-1, 1, size=(15, env.action_space.shape[0])).astype(np.float32)
    a, b = rollout(env, 5, actions), rollout(env, 5, actions)
    assert a[0] == b[0] and np.array_equal(a[1], b[1]) and np.array_equal(a[2], b[2])
    other = rollout(env, 6, actions)
    assert not np.array_equal(a[1][0], other[1][0])  # another seed, another layout


@pytest.mark.parametrize("env_id", BASE_IDS + ["mmrl/Push-OODPosition-v0", "mmrl/PickPlace-OODDistractor-v0"])
def test_scripted_expert_succeeds_and_return_is_the_potential_difference(env_id):
    env = gymnasium.make(env_id).unwrapped
    successes = 0
    for seed in range(10):
        _, info = env.reset(seed=seed)
        start, total = info["potential"], 0.0
        for _ in range(env.rules.max_steps):
            _, r, term, trunc, info = env.step(env.expert_action())
            total += r
            if term or trunc:
                break
        assert term != trunc and term == info["success"]
        # potential-based shaping (Ng et al. 1999): Σ_t (Φ_t − Φ_{t−1}) = Φ_T − Φ_0
        assert total == pytest.approx(info["potential"] - start, abs=1e-9)
        successes += info["success"]
        if info["success"]:
            assert total >= 1.0 - 0.5 - 1e-9  # success is worth 1; progress terms at start ≤ 0.5 of it
    assert successes >= 9


def test_random_actions_rarely_succeed_on_push():
    env = gymnasium.make("mmrl/Push-v0")
    rng = np.random.default_rng(1)
    wins = 0
    for seed in range(10):
        env.reset(seed=seed)
        for _ in range(40):
            _, _, term, trunc, info = env.step(rng.uniform(-1, 1, 2).astype(np.float32))
            if term or trunc:
                break
        wins += info["success"]
    assert wins <= 2


@pytest.mark.parametrize("bad", [np.array([np.nan, 0.0], dtype=np.float32), np.array([np.inf, 0.0]),
                                 np.zeros(3, dtype=np.float32), np.zeros((1, 2)), [0.1]])
def test_bad_action_raises_and_leaves_the_simulation_untouched(bad):
    env = gymnasium.make("mmrl/Push-v0", disable_env_checker=True).unwrapped
    env.reset(seed=3)
    for _ in range(3):
        env.step(env.expert_action())
    before = env.sim_state()
    with pytest.raises(ValueError, match="simulation state is unchanged"):
        env.step(bad)
    after = env.sim_state()
    for x, y in zip(before, after):
        assert np.array_equal(x, y)
    env.step(env.expert_action())  # and the env still works


def test_out_of_range_actions_are_clipped():
    env = gymnasium.make("mmrl/Reach-v0", disable_env_checker=True).unwrapped
    env.reset(seed=0)
    a = env.sim_state()[2][env._ee_mocap].copy()
    env.step(np.array([7.0, -7.0], dtype=np.float32))
    b = env.sim_state()[2][env._ee_mocap]
    assert b[0] - a[0] == pytest.approx(RULES["reach"].max_delta, abs=1e-9)
    assert b[1] - a[1] == pytest.approx(-RULES["reach"].max_delta, abs=1e-9)


def test_missing_mjcf_names_the_path(monkeypatch):
    monkeypatch.setitem(tabletop.RULES, "broken", dataclasses.replace(RULES["reach"], name="broken",
                                                                      mjcf="no_such_file.xml"))
    with pytest.raises(FileNotFoundError, match="no_such_file.xml"):
        TabletopEnv("broken", variations("reach")[""])


def test_unknown_task_and_bad_image_size():
    with pytest.raises(ValueError, match="unknown table-top task"):
        TabletopEnv("stack", variations("reach")[""])
    with pytest.raises(ValueError, match="image_size"):
        gymnasium.make("mmrl/Reach-v0", image_size=8)


def test_image_size_is_configurable():
    obs, _ = gymnasium.make("mmrl/Reach-v0", image_size=96).reset(seed=0)
    assert obs["image"].shape == (96, 96, 3) and obs["image"].dtype == np.uint8 and obs["image"].std() > 1


def test_sync_and_async_vector_envs_agree():
    ids = ["mmrl/Push-v0", "mmrl/Push-OODColor-v0", "mmrl/Push-v0"]
    fns = [lambda spec=gymnasium.spec(i): gymnasium.make(spec, disable_env_checker=True) for i in ids]
    sync, asyn = gymnasium.vector.SyncVectorEnv(fns), gymnasium.vector.AsyncVectorEnv(
        fns, context="spawn", shared_memory=False)
    try:
        a, _ = sync.reset(seed=[1, 2, 3])
        b, _ = asyn.reset(seed=[1, 2, 3])
        assert np.array_equal(a["image"], b["image"]) and tuple(a["instruction"]) == tuple(b["instruction"])
        actions = np.random.default_rng(0).uniform(-1, 1, (3, 2)).astype(np.float32)
        for _ in range(5):
            a, ra, *_ = sync.step(actions)
            b, rb, *_ = asyn.step(actions)
        assert np.array_equal(a["image"], b["image"]) and np.array_equal(ra, rb)
    finally:
        sync.close()
        asyn.close()


def test_unavailable_renderer_names_mujoco_gl():
    """A backend whose library is missing (or an invalid MUJOCO_GL) gives an error naming the options."""
    import ctypes.util

    backend = "osmesa" if ctypes.util.find_library("OSMesa") is None else "bogus"
    code = ("import gymnasium, mmrl.envs\n"
            "try:\n    gymnasium.make('mmrl/Reach-v0').reset(seed=0)\n"
            "except Exception as err:\n    print(type(err).__name__, err)\n")
    env = {**os.environ, "MUJOCO_GL": backend, "PYOPENGL_PLATFORM": backend}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    text = out.stdout + out.stderr
    assert "RendererUnavailableError" in text and "MUJOCO_GL=egl" in text, text
