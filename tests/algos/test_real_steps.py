"""Real simulator steps per evaluation (mmrl/algos/real_steps.py): in tiny runs of the PPO and WSRL reach recipes,
``eval/real_env_steps`` at every evaluation equals the steps the run's logged training episodes (and WSRL's offline
demonstrations) took, and ``eval/demo_env_steps`` equals the warm start's demonstrations replayed independently (counted once, then read
from beside the cached warm start);
text tasks log neither; an exact resume keeps the count."""

from __future__ import annotations

import json

import gymnasium
import mmrl.envs  # noqa: F401  (registers mmrl/Reach-v0)
from mmrl.envs.world_model.data import warm_start_seeds
from mmrl.tasks.robot.tabletop import EpisodeExample, demonstrate

from mmrl.algos.offpolicy import read_logged_episodes
from mmrl.core.config import load_config
from mmrl.core.registry import make_task
from mmrl.core.trainer import Trainer, train
from mmrl.core.warm_start import build_initial_policy, warm_start_path
from mmrl.samplers.gym_runner import EpisodeSummary

QUIET = ["log.progress=false", "log.tensorboard=false"]
SMALL = [*QUIET, "task.args.image_size=32", "policy.args.image_size=32", "warm_start.sft_steps=3",
         "warm_start.batch_size=4", "rollout.prompts_per_step=4", "trainer.minibatches=2", "eval.num_examples=4",
         "eval.extra_splits=[]", "eval.every=1", "checkpoint.every=1"]
PPO = [*SMALL, "trainer.steps=2"]
WSRL = [*SMALL, "rollout.log_episodes=true", "trainer.steps=2", "algo.extra.wsrl.offline_demos=4",
        "algo.extra.wsrl.offline_steps=2", "algo.extra.wsrl.offline_actor_start=1", "algo.extra.wsrl.batch_size=16",
        "algo.extra.wsrl.critic_width=16"]


def rows_of(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def replayed_warm_start_steps(batches: int, batch_size: int) -> int:
    """The real steps of the warm start's distinct demonstrations, replayed here (seed 0, DART noise 0.3)."""
    env = gymnasium.make("mmrl/Reach-v0", image_size=32, disable_env_checker=True)
    return sum(len(demonstrate(env, seed, 0.3).rewards) for seed in warm_start_seeds("reach", 32, 0.3, batches,
                                                                                        batch_size, 0))


def test_ppo_counts_every_training_episode_and_the_warm_start_apart(tmp_path):
    out, cfg = tmp_path / "ppo", load_config("vla_reach/tiny_cpu", PPO)
    train(cfg, out)
    rows = rows_of(out)
    counted = json.loads((warm_start_path(cfg) / "demonstration_steps.json").read_text())  # kept for later runs
    assert len(counted) == len(warm_start_seeds("reach", 32, 0.3, 3, 4, 0))
    assert [r["step"] for r in rows] == [0, 1, 2]
    demo, taken = replayed_warm_start_steps(3, 4), 0
    assert sum(counted.values()) == demo
    for row in rows:  # every evaluation, step 0 (no episode yet) included
        if row["step"] > 0:  # the step's 4 episodes (token head, chunk 1: a decision is an env step)
            assert row["rollout/trained_rows"] == row["rollout/generated"] == 4
            taken += round(row["rollout/trained_rows"] * row["rollout/len_mean"])
        assert row["eval/real_env_steps"] == taken
        assert row["eval/demo_env_steps"] == demo
    assert rows[0]["eval/real_env_steps"] == 0 and rows[2]["eval/real_env_steps"] > rows[1]["eval/real_env_steps"]


def test_wsrl_counts_its_offline_demonstrations_and_resumes_exactly(tmp_path):
    out = tmp_path / "wsrl"
    train(load_config("vla_reach/wsrl_tiny_cpu", WSRL), out)
    rows = rows_of(out)
    offline = rows[1]["offline/transitions"]  # the 4 demonstrations' steps (chunk 1: one transition a step)
    assert rows[0]["eval/real_env_steps"] == offline > 0  # collected before the first evaluation
    for row in rows[1:]:
        online = sum(e.length for e in read_logged_episodes(out, row["step"]))
        assert online == row["offpolicy/env_steps"]
        assert row["eval/real_env_steps"] == offline + online
        assert row["eval/demo_env_steps"] == replayed_warm_start_steps(3, 4)

    part = tmp_path / "part"
    train(load_config("vla_reach/wsrl_tiny_cpu", [*WSRL, "trainer.steps=1"]), part)
    Trainer(load_config("vla_reach/wsrl_tiny_cpu", WSRL), part, resume=True).train()
    assert rows_of(part)[-1]["eval/real_env_steps"] == rows[-1]["eval/real_env_steps"]


def test_the_warm_start_counts_its_demonstrations_as_it_runs_them(tmp_path, monkeypatch):
    monkeypatch.setenv("MMRL_CACHE", str(tmp_path))
    cfg = load_config("vla_reach/tiny_cpu", PPO)
    build_initial_policy(cfg)  # no run, no hook: the count is the warm start's own
    counted = json.loads((warm_start_path(cfg) / "demonstration_steps.json").read_text())
    assert sum(counted.values()) == replayed_warm_start_steps(3, 4)


def test_text_tasks_log_no_real_steps(tmp_path, sanity_config):
    out = tmp_path / "sanity"
    train(sanity_config("trainer.steps=1", "eval.every=1"), out)
    assert not any(key.endswith("env_steps") for row in rows_of(out) for key in row)


def test_reach_task_counts_episode_and_demonstration_steps():
    task = make_task("robot/reach-v0", {"image_size": 32})
    examples = [EpisodeExample("mmrl/Reach-v0", seed) for seed in (5, 7, 5)]
    steps = task.demonstration_steps(examples)
    assert list(steps) == [("mmrl/Reach-v0", 5), ("mmrl/Reach-v0", 7)]  # each distinct episode once
    assert task.demonstrations_run() == {}  # counting keeps nothing: no demonstration was asked for
    assert steps[("mmrl/Reach-v0", 7)] == len(task.reference_output(examples[1]).rewards)
    assert task.demonstrations_run() == {("mmrl/Reach-v0", 7): steps[("mmrl/Reach-v0", 7)]}
    summaries = [EpisodeSummary("mmrl/Reach-v0", 5, True, 1.2, 9), EpisodeSummary("mmrl/Reach-v0", 6, False, 0.1, 30)]
    assert task.real_env_steps([*summaries, "not an episode"]) == 39
    assert task.simulator_data_env_steps() == 0
