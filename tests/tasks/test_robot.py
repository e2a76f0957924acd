"""Robot task adapters: splits and seeds, total rewards, metrics, expert demonstrations, and a short
real learning check through the shared trainer (BC warm start → PPO)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mmrl.config import load_config
from mmrl.registry import make_task
from mmrl.samplers.gym_runner import EpisodeSummary
from mmrl.tasks.robot import EpisodeExample, episode_reward
from mmrl.tasks.robot.tabletop import TEST_SEED_OFFSET
from mmrl.trainer import train

TASKS = ["robot/reach-v0", "robot/push-v0", "robot/pick_place-v0"]


@pytest.mark.parametrize("task_id", TASKS)
def test_splits_use_their_env_ids_and_disjoint_seeds(task_id):
    task = make_task(task_id)
    rng = np.random.default_rng(0)
    train_ex = task.sample_batch("train", 50, rng)
    test_ex = task.sample_batch("test", 50, rng)
    assert all(e.seed < TEST_SEED_OFFSET for e in train_ex) and all(e.seed >= TEST_SEED_OFFSET for e in test_ex)
    assert {e.env_id for e in train_ex} == {e.env_id for e in test_ex} and train_ex[0].env_id.endswith("-v0")
    for split, suffix in (("ood_color", "OODColor"), ("ood_position", "OODPosition"),
                          ("ood_instruction", "OODInstruction"), ("ood_distractor", "OODDistractor")):
        assert task.sample_batch(split, 1, rng)[0].env_id.endswith(f"-{suffix}-v0")
    assert task.sample_batch("test", 5, np.random.default_rng(3)) == task.sample_batch("test", 5, np.random.default_rng(3))
    with pytest.raises(ValueError, match="ood_color"):
        task.sample_batch("ood_colour", 1, rng)


def test_reward_is_total_and_scores_the_episode():
    ex = EpisodeExample("mmrl/Push-v0", 7)
    ok = episode_reward(ex, EpisodeSummary("mmrl/Push-v0", 7, True, 1.62, 20))
    assert ok.score == pytest.approx(1.62) and ok.components == {"success": 1.0, "return": pytest.approx(1.62)}
    fail = episode_reward(ex, EpisodeSummary("mmrl/Push-v0", 7, False, 0.3, 50))
    assert fail.score == pytest.approx(0.3) and fail.components["success"] == 0 and "no success" in fail.info
    for bad, reason in ((None, "not an episode summary"), ("done", "not an episode summary"),
                        (EpisodeSummary("mmrl/Push-v0", 8, True, 1.0, 3), "scored for"),
                        (EpisodeSummary("mmrl/Push-v0", 7, True, float("nan"), 3), "non-finite")):
        r = episode_reward(ex, bad)
        assert r.score == 0.0 and reason in r.info


def test_metrics():
    task = make_task("robot/reach-v0")
    ex = [EpisodeExample("mmrl/Reach-v0", i) for i in range(4)]
    outs = [EpisodeSummary("mmrl/Reach-v0", i, i % 2 == 0, 1.2 if i % 2 == 0 else 0.1, 10 + i) for i in range(4)]
    m = task.metrics(ex, outs, [task.reward(e, o) for e, o in zip(ex, outs)])
    assert m == {"success_rate": 0.5, "return_mean": pytest.approx(0.65), "length_mean": 11.5}


@pytest.mark.parametrize("task_id", TASKS)
def test_demonstrations_are_successful_labelled_and_cached(task_id):
    task = make_task(task_id)
    ex = task.sample_batch("train", 4, np.random.default_rng(0))
    demos = [task.reference_output(e) for e in ex]
    assert sum(d.success for d in demos) >= 3  # noisy execution, clean labels
    for d in demos:
        t = len(d.actions)
        assert d.images.shape == (t, 64, 64, 3) and d.proprio.shape == (t, 4) and d.instruction
        assert np.abs(d.actions).max() <= 1.0
    assert task.reference_output(ex[0]) is demos[0]


def test_short_learning_check_bc_then_ppo(tmp_path):
    """A short warm start, then PPO through the shared trainer raises the greedy held-out success
    on reach (full-size runs: docs/results.md and the slow test below)."""
    cfg = load_config("vla_reach/tiny_cpu", [
        "log.tensorboard=false", "task.args.image_size=32", "policy.args.image_size=32",
        "warm_start.sft_steps=120", "trainer.steps=12", "eval.every=0", "eval.num_examples=48",
        "eval.extra_splits=[]", "checkpoint.every=0", "rollout.prompts_per_step=16", "trainer.lr=1e-3"])
    train(cfg, tmp_path / "run")
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval/success_rate"] for r in rows if "eval/success_rate" in r]
    assert evals[-1] >= evals[0] + 0.1, evals


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["vla_reach/tiny_cpu", "vla_reach/grpo_tiny_cpu", "vla_push/tiny_cpu"])
def test_full_recipes_raise_held_out_success(tmp_path, recipe):
    cfg = load_config(recipe, ["log.tensorboard=false", "eval.extra_splits=[]", "checkpoint.every=0"])
    train(cfg, tmp_path / "run")
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval/success_rate"] for r in rows if "eval/success_rate" in r]
    assert evals[-1] >= evals[0] + 0.1, evals
