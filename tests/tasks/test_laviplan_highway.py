"""driving/laviplan-highway-v0: LaViPlan planning on highway-env scenes (seeding, reward, bad input, rendering)."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

pytest.importorskip("highway_env")

from mmrl.core.config import load_config  # noqa: E402
from mmrl.core.registry import make_task  # noqa: E402
from mmrl.envs.driving import highway  # noqa: E402
from mmrl.tasks.driving import laviplan_highway  # noqa: E402
from mmrl.tasks.driving.laviplan_gif import write_plans_gif  # noqa: E402
from mmrl.tasks.driving.laviplan_highway import KNOWN_SCENES, SEED_BLOCK, HighwayPlanExample  # noqa: E402

TASK = "driving/laviplan-highway-v0"
ARGS = {"collision_penalty": 1.0, "invalid_penalty": 1.5, "progress_weight": 0.1}
RAMMED = ("test", 245015959)
"""A highway-fast-v0 test scene with a vehicle ahead in the ego's lane (found once by search; seeds are stable)."""


@pytest.fixture(scope="module")
def task():
    return make_task(TASK, ARGS)


@pytest.fixture(scope="module")
def one_per_scene() -> dict[str, HighwayPlanExample]:
    """One example of each scene type, each from a task that draws only that type."""
    examples = {}
    for scene in KNOWN_SCENES:
        ood = next(s for s in KNOWN_SCENES if s != scene)
        task = make_task(TASK, ARGS | {"scenes": [scene], "ood_scene": ood})
        examples[scene] = task.sample_batch("train", 1, np.random.default_rng(7))[0]
    return examples


def answer(waypoints: np.ndarray) -> str:
    return "<think>go</think><answer>[" + ",".join(f"({x:.0f},{y:.0f})" for x, y in waypoints) + "]</answer>"


def ramming_answer(example: HighwayPlanExample) -> str:
    """Waypoints where the nearest other vehicle will be at t = 1, 2, 3 s at its current velocity."""
    s = example.scenario
    agent = min(s.agents, key=lambda a: np.hypot(a.x - s.ego[0], a.y - s.ego[1]))
    t = np.arange(1, example.horizon + 1)[:, None] * example.dt
    world = np.array([agent.x, agent.y]) + agent.speed * t * [np.cos(agent.heading), np.sin(agent.heading)]
    return answer(s.to_ego(world))


def test_same_seed_same_image_expert_and_reward_whatever_was_built_before(task):
    first = task.sample_batch("test", 2, np.random.default_rng(3))
    other = make_task(TASK, ARGS | {"scenes": ["intersection-v0"], "ood_scene": "merge-v0"})
    other.sample_batch("train", 1, np.random.default_rng(0))  # mutates highway-env's IDM class constants
    again = make_task(TASK, ARGS).sample_batch("test", 2, np.random.default_rng(3))
    for a, b in zip(first, again):
        assert a.scene.seed == b.scene.seed and a.scene.scene_id == b.scene.scene_id
        assert np.array_equal(np.asarray(a.image), np.asarray(b.image)) and np.array_equal(a.expert, b.expert)
        plan = answer(a.expert * [0.8, 1.0])
        assert task.reward(a, plan) == make_task(TASK, ARGS).reward(b, plan)
        assert a.prompt == b.prompt and "Ego speed" in a.prompt and a.scenario.instruction in a.prompt


def test_splits_use_disjoint_seeds_and_hold_out_the_ood_scene(task):
    for seed in range(300):
        assert task.scene_type("train", seed) != "roundabout-v0" and task.scene_type("test", seed) != "roundabout-v0"
        assert task.scene_type("ood", seed) == "roundabout-v0"
    (example,) = task.sample_batch("ood", 1, np.random.default_rng(0))
    assert example.scene.scene_id == "roundabout-v0" and 2 * SEED_BLOCK <= example.scene.seed < 3 * SEED_BLOCK
    (example,) = task.sample_batch("train", 1, np.random.default_rng(0))
    assert example.scene.seed < SEED_BLOCK


def test_expert_answer_beats_a_colliding_answer(task):
    example = task.build(*RAMMED)
    rammed = task.reward(example, ramming_answer(example))
    expert = task.reward(example, task.reference_output(example))
    assert rammed.components["collision"] == 1.0 and "collision" in rammed.info
    assert expert.components["collision"] == 0.0 and expert.components["offroad"] == 0.0
    assert expert.score > 0.8 > rammed.score + 1.0


def test_reference_answers_are_safe_and_score_high(one_per_scene, task):
    for scene, example in one_per_scene.items():
        result = task.reward(example, task.reference_output(example))
        assert result.components["collision"] == 0.0 and result.components["offroad"] == 0.0, (scene, result)
        assert result.score > 0.8 and result.components["format"] == 1.0, (scene, result)


@pytest.mark.parametrize("output", [
    "", "no tags at all", None, 42, "<think>a</think><answer>[(1,0),(2,0)]</answer>",
    "<think>a</think><answer>[(nan,0),(2,0),(3,0)]</answer>", "<think>a</think><answer>[(inf,0),(2,0),(3,0)]</answer>",
    "<think>a</think><answer>[(1e9,0),(2,0),(3,0)]</answer>", "<think>a</think><answer>[(1,0),(2,zero),(3,0)]</answer>",
    "<answer>[(1,0),(2,0),(3,0)]</answer><answer>[(1,0),(2,0),(3,0)]</answer>", "x" * 100_000,
])
def test_malformed_answers_score_the_invalid_penalty_with_a_reason(task, one_per_scene, output):
    result = task.reward(one_per_scene["merge-v0"], output)
    assert result.score == -ARGS["invalid_penalty"] and result.components["invalid"] == 1.0 and result.info


def test_extreme_plans_are_simulated_for_exactly_the_horizon(task, one_per_scene):
    example = one_per_scene["intersection-v0"]
    for plan in (np.array([[150.0, 0.0], [-150.0, 150.0], [0.0, -150.0]]), np.zeros((3, 2))):
        outcome = highway.execute_plan(example.scene, plan, task.cfg.dt, record=True)
        steps = int(round(task.cfg.horizon * task.cfg.dt * task.cfg.sim_hz))
        assert outcome.ego_poses.shape == (steps + 1, 4) and np.isfinite(outcome.ego_poses).all()
        assert outcome.agent_poses.shape == (steps + 1, len(example.scenario.agents), 4)
        result = task.reward(example, answer(plan))  # a usable plan: scored, never raised
        assert result.components["invalid"] == 0.0 and task.reward_range[0] <= result.score <= task.reward_range[1]
    v = float(example.scenario.ego[3])  # a stop plan: the car brakes as hard as allowed, and stays stopped
    stop = highway.execute_plan(example.scene, np.zeros((3, 2)), task.cfg.dt, record=True)
    assert stop.progress_m < v * v / (2 * -highway.ACCEL_RANGE[0]) + 1.0 and stop.ego_poses[-1, 3] < 0.1


@pytest.mark.parametrize("args, named", [
    ({"scenes": ["intersection-v0", "parking-v0"]}, "parking-v0"),
    ({"ood_scene": "racetrack-v0"}, "racetrack-v0"),
    ({"scenes": ["merge-v0"], "ood_scene": "merge-v0"}, "nothing left"),
    ({"dt": 0.25, "sim_hz": 10}, "sim_hz"),
    ({"horizon": 30}, "horizon"),
])
def test_bad_settings_fail_at_task_creation(args, named):
    with pytest.raises(ValueError, match=named):
        make_task(TASK, ARGS | args)


def test_unknown_split_is_an_error(task):
    with pytest.raises(ValueError, match="ood_layout"):
        task.sample_batch("ood_layout", 1, np.random.default_rng(0))


def test_each_scene_type_renders_in_the_worlds_raster_conventions(one_per_scene, task):
    size = task.cfg.image_size
    for scene, example in one_per_scene.items():
        image = np.asarray(example.image)
        assert image.shape == (size, size, 3) and image.dtype == np.uint8, scene
        assert tuple(image[int(0.75 * size), size // 2]) == (230, 50, 50), scene  # the ego, red, at its spot
        road = (image == (90, 90, 90)).all(-1).mean()
        assert 0.02 < road < 0.9, (scene, road)  # road and off-road both in view
        assert (image == (40, 190, 40)).all(-1).any(), scene  # the ego's route, green
        assert example.scenario.instruction in example.prompt


def test_highway_envs_own_renderer_works_headless():
    """Our import chose a headless SDL driver highway-env draws with (with "dummy" its frames are black)."""
    import gymnasium

    env = gymnasium.make("highway-fast-v0", render_mode="rgb_array", disable_env_checker=True)
    env.reset(seed=0)
    frame = env.render()
    env.close()
    assert frame.shape[2] == 3 and frame.std() > 0


def test_a_gif_plays_the_executed_plans(tmp_path, one_per_scene, task):
    example = one_per_scene["roundabout-v0"]
    plans = {"expert": [task.parse(task.reference_output(example))], "bad": [task.parse("garbage")]}
    path = write_plans_gif(tmp_path / "plans.gif", [example], plans, size=64, playback=task.playback)
    assert path.stat().st_size > 0


def test_the_recipe_builds_its_task():
    cfg = load_config("configs/laviplan/highway_tiny_cpu.yaml")
    task = make_task(cfg.task.name, cfg.task.args)
    assert task.id == TASK and task.reward_range[0] == -task.cfg.invalid_penalty


def test_doctests():
    assert doctest.testmod(laviplan_highway).failed == 0


def test_plans_gif_of_a_folder_without_a_run_is_a_one_line_error(tmp_path, capsys):
    from mmrl.cli import main

    assert main(["plans-gif", str(tmp_path), "--scenes", "1"]) == 2
    assert "config.yaml" in capsys.readouterr().err
