"""driving/rift-highway-v0: RIFT's traffic-policy task on highway-env (states, control, verdicts, bad input)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("highway_env")

from mmrl.core.config import load_config  # noqa: E402
from mmrl.core.registry import make_task  # noqa: E402
from mmrl.envs.driving import highway  # noqa: E402
from mmrl.tasks.driving.rift import RETURN_FLOOR  # noqa: E402
from mmrl.tasks.driving.rift_highway import (SEED_BLOCK, SPLITS, HighwayRiftExample, copy_road,  # noqa: E402
                                             traffic_view)
from mmrl.tasks.driving.rift_sim import HORIZON_STEPS, NUM_CANDIDATES, poses_from_xy  # noqa: E402

TASK = "driving/rift-highway-v0"
ARGS = {"train_pool": 8}


@pytest.fixture(scope="module")
def task():
    return make_task(TASK, ARGS)


@pytest.fixture(scope="module")
def states(task) -> list[HighwayRiftExample]:
    return task.sample_batch("test", 4, np.random.default_rng(11))


def test_same_seed_same_state_candidates_and_returns_whatever_was_built_before(task, states):
    other = make_task(TASK, {"scenes": ["intersection-v0"], "ood_scene": "merge-v0", "train_pool": 2})
    other.sample_batch("train", 2, np.random.default_rng(0))  # an intersection rewrites highway-env's IDM constants
    again = make_task(TASK, ARGS).sample_batch("test", 4, np.random.default_rng(11))
    for a, b in zip(states, again):
        assert (a.seed, a.scene_id) == (b.seed, b.scene_id)
        np.testing.assert_array_equal(a.candidates, b.candidates)
        np.testing.assert_array_equal(a.features, b.features)
        assert task.reward(a, 3).score == make_task(TASK, ARGS).reward(b, 3).score


def test_splits_use_their_seed_blocks_and_hold_out_the_ood_scene(task):
    rng = np.random.default_rng(0)
    assert {e.scene_id for e in task.sample_batch("ood", 3, rng)} == {"roundabout-v0"}
    assert "roundabout-v0" not in {e.scene_id for e in task.sample_batch("test", 6, rng)}
    assert {e.seed for e in task.sample_batch("train", 12, rng)} <= set(range(8))
    with pytest.raises(ValueError, match="outside"):
        task.example("test", SEED_BLOCK)
    with pytest.raises(ValueError, match="unknown split"):
        task.sample_batch("ood_dense", 1, rng)
    assert SPLITS == ("train", "test", "ood")


def follower(example: HighwayRiftExample) -> int | None:
    """Index (among the others, road order) of a vehicle up to 40 m behind the CBV in its lane, if any."""
    cbv = example.road.vehicles[example.cbv_index]
    others = [v for k, v in enumerate(example.road.vehicles) if k != example.cbv_index]
    for k, v in enumerate(others):
        s_cbv, s_v = cbv.lane.local_coordinates(cbv.position)[0], cbv.lane.local_coordinates(v.position)[0]
        if v.lane_index == cbv.lane_index and 0 < s_cbv - s_v < 40:
            return k
    return None


def test_the_cbv_follows_its_candidate_exactly_and_the_traffic_reacts(task):
    """Track propagation: the controlled vehicle is where the candidate says at every step; when it brakes to a
    stop, the vehicle following it in its lane ends slower than in the log (highway-env's IDM reacts)."""
    checked = 0
    for example in task.sample_batch("test", 16, np.random.default_rng(5)):
        stop = example.candidates[0]  # own lane, speed mode 0: brake to a stop
        road = copy_road(example.road)
        rollout = highway.follow_track(road, example.cbv_index, stop, example.scene_id)
        np.testing.assert_allclose(highway.pose_of(road.vehicles[example.cbv_index]), stop[-1], atol=1e-9)
        assert rollout.others.shape == (HORIZON_STEPS + 1, len(example.road.vehicles) - 1, 4)
        assert isinstance(example.road.vehicles[example.cbv_index], highway.IDMVehicle)  # the snapshot is untouched
        k = follower(example)
        if k is not None:
            _, logged = highway.drive_as_is(copy_road(example.road), example.cbv_index, HORIZON_STEPS, example.scene_id)
            assert rollout.others[-1, k, 3] < logged.others[-1, k, 3] - 1.0, example.seed
            checked += 1
    assert checked >= 1


def test_verdicts_are_highway_envs(task, states):
    """Ramming the nearest vehicle crashes (highway-env's ``crashed``) and scores below the imitation target;
    driving 20 m sideways leaves the road (``on_road``)."""
    example = states[0]
    road = copy_road(example.road)
    cbv = road.vehicles[example.cbv_index]
    target = min((v for v in road.vehicles if v is not cbv), key=lambda v: np.linalg.norm(v.position - cbv.position))
    goal = highway.pose_of(target)[:2]
    start = example.state.cbv_pose[:2]
    ram = start + np.linspace(0, 1, HORIZON_STEPS + 1)[1:, None] * (goal - start) * 1.5
    rammed = task.reward(example, ram)
    assert rammed.components["collision"] == 1.0 and rammed.info == "collision"
    assert rammed.score < task.reward(example, task.reference_output(example)).score
    h = example.state.cbv.heading
    side = start + np.linspace(0, 1, HORIZON_STEPS + 1)[1:, None] * 20.0 * np.array([-np.sin(h), np.cos(h)])
    rollout = highway.follow_track(copy_road(example.road), example.cbv_index,
                                   poses_from_xy(example.state.cbv_pose, side), example.scene_id)
    assert not rollout.offroad[0] and rollout.offroad[-1]


def test_imitation_target_is_the_candidate_closest_to_the_log(task, states):
    for example in states:
        log = task.log(example)
        ade = np.linalg.norm(example.candidates[:, :, :2] - log[None, :, :2], axis=-1).mean(1)
        assert task.reference_output(example) == int(ade.argmin())
        assert example.candidates.shape == (NUM_CANDIDATES, HORIZON_STEPS + 1, 4)
    every = task.returns(states[0])  # all candidates at once: the per-candidate verdicts, stacked
    assert every.total.shape == (NUM_CANDIDATES,)
    for k in (0, 7, 14):
        assert task.reward(states[0], k).score == pytest.approx(float(np.clip(every.total[k], *task.reward_range)))
        assert task.reward(states[0], k).components["collision"] == float(every.collision[k])


@pytest.mark.parametrize("output,reason", [
    (NUM_CANDIDATES, "out of range"), (-1, "out of range"), ("3", "not a candidate"),
    (np.full((HORIZON_STEPS, 2), np.nan), "NaN"), (np.zeros((3, 2)), "shape"), (np.full((HORIZON_STEPS, 2), 1e6), "200 m"),
])
def test_unusable_outputs_score_the_floor_or_zero_with_a_reason(task, states, output, reason):
    result = task.reward(states[1], output)
    assert result.score == RETURN_FLOOR and reason in result.info
    rlftsim = make_task(TASK, ARGS | {"reward": "rlftsim"}).reward(states[1], output)
    assert rlftsim.score == 0.0 and reason in rlftsim.info


def test_rlftsim_reward_prefers_the_log_like_candidate(states):
    rlft = make_task(TASK, ARGS | {"reward": "rlftsim"})
    for example in states[:2]:
        scores = [rlft.reward(example, k).score for k in range(NUM_CANDIDATES)]
        assert all(0.0 <= s <= 1.0 for s in scores)
        assert scores[rlft.reference_output(example)] >= np.median(scores)


@pytest.mark.parametrize("args,named", [({"scenes": ["parking-v0"]}, "parking-v0"), ({"ood_scene": "racetrack-v0"}, "racetrack"),
                                        ({"scenes": ["merge-v0"], "ood_scene": "merge-v0"}, "nothing left"),
                                        ({"reward": "collisions"}, "collisions"), ({"radius": 0}, "radius")])
def test_bad_settings_fail_at_task_creation(args, named):
    with pytest.raises(ValueError, match=named):
        make_task(TASK, args)


def test_closed_loop_runs_eight_seconds_against_the_log(task):
    seeds = [0, 1, 2]
    episodes: list = []
    always_log_like = lambda f, c: 3  # own lane at the desired speed
    out = task.closed_loop_metrics(always_log_like, "test", seeds, episodes)
    assert out["episodes"] == len(episodes) >= 2
    for state, policy, log in episodes:
        assert len(log.cbv) == 81 and log.others.shape[0] == 81
        assert len(policy.cbv) == policy.others.shape[0] and (policy.collision or len(policy.cbv) == 81)
        assert policy.choices == (3,) * len(policy.choices)
    assert {"collision_rate", "log_collision_rate", "w1_speed", "w1_speed_per_agent", "goal_rate"} <= set(out)
    with pytest.raises(ValueError, match="candidate 99"):
        task.closed_loop_metrics(lambda f, c: 99, "test", seeds[:1])


def test_traffic_view_lists_everyone_but_the_cbv_in_road_order(states):
    example = states[2]
    view = traffic_view(highway, example.road, example.cbv_index, example.scene_id, "test", example.seed)
    expected = [highway.pose_of(v)[:2] for k, v in enumerate(example.road.vehicles) if k != example.cbv_index]
    np.testing.assert_allclose([[a.x, a.y] for a in view.others], expected)
    assert view.scenario.road.routes  # highway-env's lane centres: RIFT's reference lines


def test_the_recipes_build_their_tasks():
    for recipe, reward in (("configs/rift/highway_tiny_cpu.yaml", "rift"), ("configs/rlftsim/highway_tiny_cpu.yaml", "rlftsim"),
                           ("configs/rlftsim/highway_mloo_tiny_cpu.yaml", "rlftsim_mloo")):
        cfg = load_config(recipe)
        task = make_task(cfg.task.name, cfg.task.args)
        assert task.id == TASK and task.cfg.reward == reward


def test_no_video_driver_is_needed():
    """Our tasks draw their own rasters: a process whose SDL driver cannot open (no X display) builds states,
    scores them and rasterises a LaViPlan scene; importing our highway module does not override a user's choice."""
    code = ("import os, numpy as np\n"
            "from mmrl.core.registry import make_task\n"
            "t = make_task('driving/rift-highway-v0', {'train_pool': 2})\n"
            "e = t.sample_batch('test', 1, np.random.default_rng(0))[0]\n"
            "t.reward(e, 3)\n"
            "p = make_task('driving/laviplan-highway-v0', {'collision_penalty': 1.0, 'invalid_penalty': 1.5})\n"
            "x = p.sample_batch('test', 1, np.random.default_rng(0))[0]\n"
            "assert x.image.size == (84, 84) and os.environ['SDL_VIDEODRIVER'] == 'x11'\n")
    env = {k: v for k, v in os.environ.items() if k != "DISPLAY"} | {"SDL_VIDEODRIVER": "x11", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_short_run_and_its_closed_loop_evaluation_with_a_gif(tmp_path, monkeypatch):
    """The recipe trains end to end on a few states, and ``rift_eval`` drives its start and its checkpoint closed
    loop in highway-env (test and ood splits), writing the JSON and a before/after GIF."""
    import json

    from mmrl.core.trainer import train
    from mmrl.tasks.driving import rift_eval

    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
    cfg = load_config("configs/rift/highway_tiny_cpu.yaml", [
        "log.progress=false", "log.tensorboard=false", "task.args.train_pool=4", "warm_start.sft_steps=5",
        "warm_start.batch_size=4", "rollout.prompts_per_step=2", "trainer.steps=2", "trainer.ppo_epochs=1",
        "trainer.minibatches=1", "eval.every=2", "eval.num_examples=2", "checkpoint.every=2"])
    run = train(cfg, tmp_path / "run")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert "eval/ood/collision_rate" in rows[-1] and "eval/realism_w1_speed" in rows[-1]
    results = rift_eval.main(["--run", str(run), "--splits", "test,ood", "--episodes", "3", "--json",
                              str(tmp_path / "cl.json"), "--gif", str(tmp_path / "rift.gif")])
    assert set(results) == {"test", "ood"} and set(results["ood"]) == {"imitation", "rift"}
    assert results["test"]["rift"]["episodes"] >= 1
    assert json.loads((tmp_path / "cl.json").read_text())["test"]["imitation"]["log_collision_rate"] >= 0
