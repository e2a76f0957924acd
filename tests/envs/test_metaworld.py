"""The Meta-World envs and tasks: gymnasium's contract for every id, seeding, disjoint splits, the
scripted expert through our wrapper, frames from our renderer, and bad input that never moves the
simulator."""

from __future__ import annotations

import os
import subprocess
import sys

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import mmrl.envs  # noqa: E402,F401  (before metaworld: it picks MUJOCO_GL before mujoco is first imported)

pytest.importorskip("metaworld")

from mmrl.core.registry import make_policy, make_task  # noqa: E402
from mmrl.core.rollout import SamplingParams  # noqa: E402
from mmrl.envs.metaworld import (ENV_IDS, ML10_TEST_TASKS, ML10_TRAIN_TASKS, MT10_TASKS, TEMPLATES,  # noqa: E402
                                 metaworld_env_id)
from mmrl.envs.metaworld import TASKS as WRAPPED_TASKS  # noqa: E402
from mmrl.envs.metaworld.env import MatrixQuaternion, MetaWorldEnv  # noqa: E402
from mmrl.samplers.gym_runner import EpisodeSummary  # noqa: E402
from mmrl.tasks.robot import EpisodeExample, MetaWorldTaskConfig  # noqa: E402
from mmrl.tasks.robot.tabletop import TEST_SEED_OFFSET, VAL_SEED_OFFSET  # noqa: E402


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_every_registered_env_passes_check_env(env_id):
    check_env(gymnasium.make(env_id).unwrapped, skip_render_check=True)


def test_ids_cover_mt10_suites_and_held_out_instructions():
    for task in MT10_TASKS:
        assert metaworld_env_id(task) in ENV_IDS and metaworld_env_id(task, "OODInstruction") in ENV_IDS
        train, held_out = TEMPLATES[task]
        assert not set(train) & set(held_out)
    assert metaworld_env_id("pick-place") == "mmrl/MetaWorld-PickPlace-v0"
    for suite in ("mmrl/MetaWorld-MT10-v0", "mmrl/MetaWorld-MT10-OODInstruction-v0", "mmrl/MetaWorld-ML10-v0",
                  "mmrl/MetaWorld-ML10-OODTask-v0"):
        assert suite in ENV_IDS
    assert not set(ML10_TRAIN_TASKS) & set(ML10_TEST_TASKS)


def episode(env, seed: int, actions: np.ndarray):
    obs, _ = env.reset(seed=seed)
    images, rewards = [obs["image"]], []
    for a in actions:
        obs, r, term, trunc, _ = env.step(a)
        images.append(obs["image"])
        rewards.append(r)
        if term or trunc:
            break
    return obs["instruction"], np.stack(images), np.array(rewards), env.unwrapped.sim._last_rand_vec.copy()


def test_seeded_episodes_reproduce_and_seeds_move_the_layout():
    env = gymnasium.make("mmrl/MetaWorld-Push-v0")
    actions = np.random.default_rng(0).uniform(-1, 1, size=(10, 4)).astype(np.float32)
    a, b = episode(env, 5, actions), episode(env, 5, actions)
    assert a[0] == b[0] and np.array_equal(a[1], b[1]) and np.array_equal(a[2], b[2]) and np.array_equal(a[3], b[3])
    other = episode(env, 6, actions)
    assert not np.array_equal(a[3], other[3]) and not np.array_equal(a[1][0], other[1][0])


def test_multi_task_id_draws_tasks_per_seed():
    env = gymnasium.make("mmrl/MetaWorld-MT10-v0").unwrapped
    drawn = set()
    for seed in range(30):
        _, info = env.reset(seed=seed)
        drawn.add(info["task"])
        assert env.instruction in TEMPLATES[info["task"]][0]
    assert drawn <= set(MT10_TASKS) and len(drawn) >= 6
    env.reset(seed=3)
    first = env.task
    env.reset(seed=3)
    assert env.task == first


def test_splits_are_disjoint():
    task = make_task("robot/metaworld-reach-v0", MetaWorldTaskConfig(train_seeds=50))
    rng = np.random.default_rng(0)
    train = task.sample_batch("train", 200, rng)
    test = task.sample_batch("test", 200, rng)
    ood = task.sample_batch("ood_instruction", 20, rng)
    val = task.sample_batch("val", 200, rng)
    assert max(e.seed for e in train) < 50 and min(e.seed for e in test + ood) >= TEST_SEED_OFFSET
    assert max(e.seed for e in test + ood) < VAL_SEED_OFFSET <= min(e.seed for e in val)  # val: neither train nor test
    assert {e.env_id for e in val} == {train[0].env_id}  # training instructions
    env = gymnasium.make("mmrl/MetaWorld-Reach-v0").unwrapped
    layouts = {}
    for e in train[:10] + test[:10]:
        env.reset(seed=e.seed)
        layouts[e.seed] = tuple(np.round(env.sim._last_rand_vec, 6))
    assert not {layouts[e.seed] for e in train[:10]} & {layouts[e.seed] for e in test[:10]}
    ood_env = gymnasium.make(ood[0].env_id).unwrapped
    for e in ood[:5]:
        ood_env.reset(seed=e.seed)
        assert ood_env.instruction in TEMPLATES["reach"][1]
    ml10 = make_task("robot/metaworld-ml10-v0", MetaWorldTaskConfig())
    held_out = gymnasium.make(ml10.sample_batch("ood_task", 1, rng)[0].env_id).unwrapped
    assert set(held_out.tasks) == set(ML10_TEST_TASKS)
    with pytest.raises(ValueError, match="ood_task"):
        ml10.sample_batch("ood_color", 1, rng)


@pytest.mark.parametrize("bad", [np.array([np.nan, 0, 0, 0], dtype=np.float32), np.array([np.inf, 0, 0, 0]),
                                 np.zeros(3, dtype=np.float32), np.zeros((1, 4)), [0.1]])
def test_bad_action_raises_before_the_simulator_moves(bad):
    env = gymnasium.make("mmrl/MetaWorld-Reach-v0", disable_env_checker=True).unwrapped
    env.reset(seed=3)
    for _ in range(2):
        env.step(env.expert_action())
    before = env.sim_state()
    with pytest.raises(ValueError, match="simulation state is unchanged"):
        env.step(bad)
    for x, y in zip(before, env.sim_state()):
        assert np.array_equal(x, y)
    env.step(env.expert_action())  # and the env still works


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown Meta-World task 'reech'.*valid tasks: reach, push"):
        MetaWorldEnv("reech")
    with pytest.raises(ValueError, match=r"did you mean 'pick-place'"):
        MetaWorldEnv("pick_place")
    with pytest.raises(ValueError, match="cameras: corner"):
        MetaWorldEnv("reach", camera="front")
    with pytest.raises(ValueError, match="valid tasks"):
        metaworld_env_id("stack-blocks")
    with pytest.raises(gymnasium.error.NameNotFound):
        gymnasium.make("mmrl/MetaWorld-Stack-v0")


def test_missing_metaworld_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "metaworld", None)  # what `import metaworld` sees when it is not installed
    with pytest.raises(ImportError, match=r"mmrl\[metaworld\]"):
        MetaWorldEnv("reach")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scripted_expert_succeeds_on_reach_and_return_is_the_potential_difference(seed):
    env = gymnasium.make("mmrl/MetaWorld-Reach-v0").unwrapped
    _, info = env.reset(seed=seed)
    start, total = info["potential"], 0.0
    for _ in range(env._max_steps):
        _, r, term, trunc, info = env.step(env.expert_action())
        total += r
        if term or trunc:
            break
    assert term and info["success"]
    assert total == pytest.approx(info["potential"] - start, abs=1e-9) and 1.0 <= total <= 1.5


def test_frames_come_from_our_renderer_at_the_requested_size_and_camera():
    corner = gymnasium.make("mmrl/MetaWorld-DrawerOpen-v0", image_size=96)
    obs, _ = corner.reset(seed=0)
    assert obs["image"].shape == (96, 96, 3) and obs["image"].dtype == np.uint8 and obs["image"].std() > 5
    assert obs["proprio"].shape == (4,) and obs["proprio"].dtype == np.float32
    top, _ = gymnasium.make("mmrl/MetaWorld-DrawerOpen-v0", image_size=96, camera="topview").reset(seed=0)
    assert not np.array_equal(obs["image"], top["image"])
    sim = corner.unwrapped.sim
    assert sim.model.vis.quality.shadowsize == 0 and sim.model.vis.quality.offsamples == 0


def test_fast_quaternions_are_scipys_and_leave_the_observation_unchanged(monkeypatch):
    from scipy.spatial.transform import Rotation

    matrices = [*Rotation.random(500, random_state=0).as_matrix(), np.eye(3), np.diag([1.0, -1, -1]),
                np.diag([-1.0, 1, -1]), np.diag([-1.0, -1, 1]), np.array([[0.0, 1, 0], [1, 0, 0], [0, 0, -1]])]
    for m in matrices:  # the sign too: scipy's branch picks which component is non-negative
        np.testing.assert_allclose(MatrixQuaternion.from_matrix(m).as_quat(), Rotation.from_matrix(m).as_quat(),
                                   rtol=0, atol=1e-12)
    with pytest.raises(AttributeError):
        MatrixQuaternion.from_euler("xyz", [0.0, 0.0, 0.0])

    env = MetaWorldEnv("door-open")  # its observation holds the handle's quaternion, from Rotation
    module = sys.modules[type(env.sim).__module__]
    assert module.Rotation is MatrixQuaternion
    expert_obs = []
    for rotation in (MatrixQuaternion, Rotation):
        monkeypatch.setattr(module, "Rotation", rotation)
        env.reset(seed=3)
        observed = [env._flat_obs.copy()]
        for _ in range(40):
            env.step(env.expert_action())
            observed.append(env._flat_obs.copy())
        expert_obs.append(np.array(observed))
    fast, scipy_obs = expert_obs
    assert np.abs(fast[:, 7:11]).sum() > 0  # the quaternion slots are filled
    np.testing.assert_allclose(fast, scipy_obs, rtol=0, atol=1e-12)


def test_demonstrations_and_a_token_vla_episode_through_the_task():
    task = make_task("robot/metaworld-reach-v0", MetaWorldTaskConfig(train_seeds=4))
    example = task.sample_batch("train", 1, np.random.default_rng(0))[0]
    demo = task.reference_output(example)
    steps = len(demo.actions)
    assert demo.images.shape == (steps, 64, 64, 3) and demo.actions.shape == (steps, 4) and demo.success
    assert np.abs(demo.actions).max() <= 1.0 and demo.instruction in TEMPLATES["reach"][0]
    policy = make_policy("vla", {"action_dims": 4, "image_size": 64, "max_decisions": 5, "num_envs": 2})
    rollout = policy.rollout([example, EpisodeExample(example.env_id, TEST_SEED_OFFSET)], 1,
                             SamplingParams(temperature=1.0, max_new_tokens=5), seed=0)
    assert rollout.mask.shape == (2, 5) and all(isinstance(o, EpisodeSummary) for o in rollout.outputs)
    result = task.reward(example, rollout.outputs[0])
    assert -1.0 <= result.score <= 2.0 and result.components["success"] in (0.0, 1.0)


def test_a_suite_reports_success_per_task():
    """MT10 episodes carry the task their reset drew, and the task's metrics break success down by it."""
    task = make_task("robot/metaworld-mt10-v0", MetaWorldTaskConfig(train_seeds=50))
    examples = task.sample_batch("test", 6, np.random.default_rng(0))
    policy = make_policy("vla", {"action_dims": 4, "image_size": 64, "max_decisions": 2, "num_envs": 3})
    rollout = policy.rollout(examples, 1, SamplingParams(temperature=1.0, max_new_tokens=2), seed=0)
    drawn = []
    for example in examples:
        env = gymnasium.make(example.env_id)
        drawn.append(env.reset(seed=example.seed)[1]["task"])
        env.close()
    assert [o.task for o in rollout.outputs] == drawn and len(set(drawn)) > 1
    results = [task.reward(e, o) for e, o in zip(examples, rollout.outputs)]
    solved = rollout.outputs[0]
    outputs = [EpisodeSummary(solved.env_id, solved.seed, True, 1.5, 3, solved.task), *rollout.outputs[1:]]
    results = [task.reward(examples[0], outputs[0]), *results[1:]]
    metrics = task.metrics(examples, outputs, results)
    per_task = {k.removeprefix("success_rate/"): v for k, v in metrics.items() if k.startswith("success_rate/")}
    assert set(per_task) == set(drawn)
    assert per_task[solved.task] == pytest.approx(1 / drawn.count(solved.task))
    assert metrics["success_rate"] == pytest.approx(1 / 6)
    one_task = [i for i, t in enumerate(drawn) if t == drawn[0]]  # episodes of a single task: no breakdown
    assert not [k for k in task.metrics([examples[i] for i in one_task], [outputs[i] for i in one_task],
                                        [results[i] for i in one_task]) if "/" in k]


def test_every_wrapped_task_and_suite_is_a_training_task():
    from mmrl.core.registry import TASKS as TASK_REGISTRY
    wrapped = {f"robot/metaworld-{name.lower()}-v0" for name in (*WRAPPED_TASKS, "MT10", "ML10")}
    assert wrapped <= set(TASK_REGISTRY.names())
    door_close = make_task("robot/metaworld-door-close-v0", MetaWorldTaskConfig(train_seeds=2))
    assert door_close.sample_batch("train", 1, np.random.default_rng(0))[0].env_id == "mmrl/MetaWorld-DoorClose-v0"


def test_unavailable_renderer_names_mujoco_gl():
    code = ("import gymnasium, mmrl.envs\n"
            "try:\n    gymnasium.make('mmrl/MetaWorld-Reach-v0').reset(seed=0)\n"
            "except Exception as err:\n    print(type(err).__name__, err)\n")
    env = {**os.environ, "MUJOCO_GL": "bogus", "PYOPENGL_PLATFORM": "bogus"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    text = out.stdout + out.stderr
    assert "RendererUnavailableError" in text and "MUJOCO_GL=egl" in text, text
