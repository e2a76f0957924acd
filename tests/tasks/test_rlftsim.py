"""Realism metrics (W1 of speed / acceleration / jerk against the log) and RLFTSim's realism reward."""

import dataclasses
import doctest
import math
from pathlib import Path

import numpy as np
import pytest

from mmrl.core.config import load_config
from mmrl.core.registry import make_task
from mmrl.core.typed import ConfigError
from mmrl.tasks.driving import realism
from mmrl.tasks.driving.realism import RlftsimWeights, kinematic_w1, realism_metrics, rlftsim_reward, wasserstein_1d
from mmrl.tasks.driving.rift_sim import HORIZON_STEPS, SIM_DT

ROOT = Path(__file__).resolve().parents[2]


def speed_track(speeds) -> np.ndarray:
    """Poses [S+1, 4] of a vehicle on the x axis with the given speeds (positions integrate them)."""
    v = np.asarray(speeds, float)
    x = np.concatenate([[0.0], np.cumsum(0.5 * (v[1:] + v[:-1]) * SIM_DT)])
    return np.stack([x, np.zeros_like(v), np.zeros_like(v), v], axis=1)


def test_wasserstein_golden_on_hand_made_samples():
    # {0, 1} vs {1, 2}: every unit of mass moves by 1
    assert wasserstein_1d(np.array([0.0, 1.0]), np.array([1.0, 2.0])) == pytest.approx(1.0)
    # {0, 0, 3} vs {0, 3, 3}: a third of the mass moves by 3
    assert wasserstein_1d(np.array([0.0, 0.0, 3.0]), np.array([0.0, 3.0, 3.0])) == pytest.approx(1.0)
    # unequal sizes: {0} vs {0, 2}: half the mass moves by 2
    assert wasserstein_1d(np.array([0.0]), np.array([0.0, 2.0])) == pytest.approx(1.0)
    assert math.isnan(wasserstein_1d(np.array([]), np.array([1.0])))
    assert doctest.testmod(realism).failed == 0


def test_realism_metrics_golden():
    """Two agents: one matches its log exactly; the other drives 2 m/s faster at constant speed."""
    log_a, log_b = speed_track([5.0, 6.0, 7.0, 8.0]), speed_track([4.0, 4.0, 4.0, 4.0])
    roll_a, roll_b = log_a.copy(), speed_track([6.0, 6.0, 6.0, 6.0])
    m = realism_metrics([roll_a, roll_b], [log_a, log_b], [False, True], [False, False], SIM_DT)
    # per agent: speed W1 0 and 2 → mean 1; accel: a's 10,10,10 vs 10,10,10 (0), b's 0,0,0 vs 0,0,0 (0)
    assert m["realism_w1_speed_per_agent"] == pytest.approx(1.0)
    assert m["realism_w1_accel_per_agent"] == pytest.approx(0.0)
    assert m["realism_w1_jerk_per_agent"] == pytest.approx(0.0)
    # pooled speeds: {5,6,7,8,6,6,6,6} vs {5,6,7,8,4,4,4,4}: sorted, 4 of 8 values move by 2 → 1.0
    assert m["realism_w1_speed"] == pytest.approx(1.0)
    # pooled accelerations: {10,10,10,0,0,0} on both sides → 0
    assert m["realism_w1_accel"] == pytest.approx(0.0)
    assert m["realism_collision_rate"] == 0.5 and m["realism_offroad_rate"] == 0.0
    with pytest.raises(ValueError, match="one log"):
        realism_metrics([roll_a], [log_a, log_b], [False], [False], SIM_DT)


def test_kinematic_w1_of_a_braking_profile():
    log = speed_track([8.0] * 5)
    brake = speed_track([8.0, 7.6, 7.2, 6.8, 6.4])  # −4 m/s² from the first step
    w1 = kinematic_w1(brake, log, SIM_DT)
    assert w1["speed"] == pytest.approx((0 + 0.4 + 0.8 + 1.2 + 1.6) / 5)
    assert w1["accel"] == pytest.approx(4.0) and w1["jerk"] == pytest.approx(0.0)


def test_rlftsim_reward_golden():
    w = RlftsimWeights()
    log = speed_track(np.full(HORIZON_STEPS + 1, 8.0))
    score, parts = rlftsim_reward(log, log, False, False, SIM_DT, w)
    assert score == pytest.approx(1.0) and parts["goal_dist"] == 0.0
    # 1 m/s faster throughout: W1 speed 1 → exp(−1); the end point is 4 m further → goal exp(−4/5)
    fast = speed_track(np.full(HORIZON_STEPS + 1, 9.0))
    score, parts = rlftsim_reward(fast, log, False, False, SIM_DT, w)
    fidelity = 0.2 * math.exp(-1.0) + 0.15 + 0.15 + 0.3 + 0.2
    assert parts["fidelity"] == pytest.approx(fidelity)
    assert parts["goal_dist"] == pytest.approx(4.0)
    assert score == pytest.approx(0.8 * fidelity + 0.2 * math.exp(-0.8))
    crash, _ = rlftsim_reward(log, log, True, True, SIM_DT, w)
    assert crash == pytest.approx(1.0 - 0.8 * (0.3 + 0.2))


@pytest.mark.parametrize("kwargs, message", [
    ({"speed": 0.5}, "sum to 1"), ({"collision": -0.1, "offroad": 0.6}, ">= 0"), ({"goal_weight": 1.5}, "goal_weight"),
    ({"jerk_scale": 0.0}, "scales"), ({"speed_scale": float("nan")}, "finite"),
])
def test_bad_weights_are_refused_with_the_field_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RlftsimWeights(**kwargs)


@pytest.fixture(scope="module")
def task():
    return make_task("driving/rift-v0", {"train_pool": 8, "reward": "rlftsim"})


def test_the_task_scores_the_log_closest_candidate_best_in_most_states(task):
    """The reward ranks candidates by closeness to the log: its best candidate is mostly the imitation target."""
    examples = task.sample_batch("test", 6, np.random.default_rng(0))
    agree = 0
    for ex in examples:
        results = [task.reward(ex, k) for k in range(len(ex.candidates))]
        scores = np.array([r.score for r in results])
        assert task.reward_range == (0.0, 1.0) and (scores >= 0).all() and (scores <= 1).all()
        assert {"w1_speed", "w1_accel", "w1_jerk", "fidelity", "goal", "collision", "offroad", "progress"} \
            <= set(results[0].components)
        agree += int(scores.argmax()) == task.reference_output(ex)
        assert scores.max() - scores.min() > 0.1  # the group has signal
    assert agree >= 4, agree


@pytest.mark.parametrize("output, reason", [
    (15, "out of range"), (True, "not a candidate index"), (np.full((HORIZON_STEPS, 2), np.nan), "NaN"),
    (np.zeros((3, 2)), "shape"), (None, "not a candidate index"),
])
def test_bad_outputs_score_zero_with_a_reason(task, output, reason):
    ex = task.sample_batch("test", 1, np.random.default_rng(1))[0]
    result = task.reward(ex, output)
    assert result.score == 0.0 and reason in result.info


def test_eval_metrics_carry_realism_and_the_log_itself_scores_zero_w1(task):
    examples = task.sample_batch("test", 4, np.random.default_rng(2))
    outputs = [task.reference_output(e) for e in examples]
    results = [task.reward(e, o) for e, o in zip(examples, outputs)]
    m = task.metrics(examples, outputs, results)
    for name in ("speed", "accel", "jerk"):
        assert np.isfinite(m[f"realism_w1_{name}"]) and m[f"realism_w1_{name}"] >= 0
    assert {"collision_rate", "offroad_rate", "progress_mean", "realism_collision_rate"} <= set(m)
    # the log's own points (a trajectory output) match the log: W1 speed ≈ 0 (finite differences of the points)
    ex = examples[0]
    log_points = task.log(ex)[1:, :2].copy()
    r = task.reward(ex, log_points)
    assert r.components["w1_speed"] < 0.05 and r.components["goal_dist"] < 1e-9
    bad = task.metrics([ex, ex], [log_points, 99], [r, task.reward(ex, 99)])
    assert bad["realism_w1_speed"] < 0.05  # the unusable output is left out of realism


def test_unknown_reward_name_is_refused():
    with pytest.raises(ConfigError, match="reward"):
        make_task("driving/rift-v0", {"reward": "rlftsm"})


def test_recipe_loads_with_rifts_start():
    rl, rift = load_config(str(ROOT / "configs/rlftsim/tiny_cpu.yaml")), load_config(str(ROOT / "configs/rift/tiny_cpu.yaml"))
    assert rl.task.args.reward == "rlftsim" and rl.task.args.rlftsim == RlftsimWeights()
    assert dataclasses.replace(rl.task.args, reward="rift") == rift.task.args  # the same states and traffic
    assert rl.policy == rift.policy and rl.warm_start == rift.warm_start
    assert rl.algo == rift.algo and rl.trainer == rift.trainer and rl.eval == rift.eval


def test_meta_metric_and_mloo_golden():
    """Two rollouts of one state: the log itself and one 4 m/s faster (hand-computed values in the comments)."""
    log, fast = speed_track([8.0] * 41), speed_track([12.0] * 41)
    w = RlftsimWeights()
    # M({fast}): W1 speed 4 → 0.2·e^−4; accel, jerk match; no collision, on road: fidelity 0.80366;
    # goal: ends 16 m beyond the log's end → e^(−16/5); M = 0.8·fidelity + 0.2·goal
    alone = 0.8 * (0.2 * math.exp(-4) + 0.15 + 0.15 + 0.3 + 0.2) + 0.2 * math.exp(-16 / 5)
    assert realism.meta_metric([fast], log, [False], [False], SIM_DT, w) == pytest.approx(alone)
    assert realism.meta_metric([fast], log, [False], [False], SIM_DT, w) == pytest.approx(
        rlftsim_reward(fast, log, False, False, SIM_DT, w)[0])  # a set of one is the per-rollout reward
    # M({log, fast}): pooled speeds half 8, half 12 → W1 2; goal mean of 1 and e^(−16/5)
    both = 0.8 * (0.2 * math.exp(-2) + 0.8) + 0.2 * (1 + math.exp(-16 / 5)) / 2
    credit = realism.mloo_rewards([log, fast], log, [False, False], [False, False], SIM_DT, w)
    assert credit == pytest.approx([both - alone, both - 1.0])
    assert realism.meta_metric([], log, [], [], SIM_DT, w) == 0.0
    # a collision in the set: the rollout that avoids it earns the collision weight's share
    c = realism.mloo_rewards([log, log], log, [False, True], [False, False], SIM_DT, w)
    assert c[0] - c[1] == pytest.approx(0.8 * 0.3)


def test_mloo_scores_a_states_sampled_rows_together():
    """reward_batch: rows of one state form a set (leave-one-out credit), unusable rows score −1 and stay out;
    a row scored alone gets the rlftsim score (greedy evaluation)."""
    mloo = make_task("driving/rift-v0", {"train_pool": 8, "reward": "rlftsim_mloo"})
    plain = make_task("driving/rift-v0", {"train_pool": 8, "reward": "rlftsim"})
    a, b = mloo.sample_batch("test", 2, np.random.default_rng(3))
    rows, outputs = [a, a, a, b, b], [0, 7, 99, 3, 3]
    results = mloo.reward_batch(rows, outputs)
    assert mloo.reward_range == (-1.0, 1.0)
    assert results[2].score == -1.0 and "out of range" in results[2].info
    log = mloo.log(a)
    want = realism.mloo_rewards([a.candidates[0], a.candidates[7]], log,
                                [results[0].components["collision"] > 0, results[1].components["collision"] > 0],
                                [results[0].components["offroad"] > 0, results[1].components["offroad"] > 0],
                                SIM_DT, RlftsimWeights())
    assert [results[0].score, results[1].score] == pytest.approx(want)
    assert results[3].score == pytest.approx(results[4].score)  # identical rollouts earn the same credit
    assert all(-1.0 <= r.score <= 1.0 and r.components["mloo"] == r.score for r in results)
    assert mloo.reward(a, 7).score == pytest.approx(plain.reward(a, 7).score)
    assert plain.reward_batch(rows, outputs)[1].score == plain.reward(a, 7).score  # other rewards: row by row


def test_closed_loop_evaluation_finds_the_warm_start_of_an_rlftsim_run(tmp_path, monkeypatch):
    """rift_eval reads the run's config validated (typed task args), so it looks for the warm start under the key the
    trainer cached it (the rlftsim weights at their defaults are left out of that key)."""
    from mmrl.core.trainer import train
    from mmrl.tasks.driving.rift_eval import load_policies

    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
    cfg = load_config(str(ROOT / "configs/rlftsim/mloo_tiny_cpu.yaml"), [
        "log.progress=false", "log.tensorboard=false", "task.args.train_pool=4", "warm_start.sft_steps=3",
        "warm_start.batch_size=4", "rollout.prompts_per_step=2", "trainer.steps=1", "trainer.ppo_epochs=1",
        "trainer.minibatches=1", "eval.every=1", "eval.num_examples=2", "checkpoint.every=1"])
    run = train(cfg, tmp_path / "run")
    before, after, task = load_policies(run)
    assert task.cfg.reward == "rlftsim_mloo"
    state = task.sample_batch("test", 1, np.random.default_rng(0))[0]
    assert 0 <= before.choose(state.features, state.context) < len(state.candidates)
