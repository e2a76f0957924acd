"""The RIFT recipe through the shared trainer: a short real learning run (fast) and the full recipe (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mmrl.core.config import load_config
from mmrl.core.trainer import train

ROOT = Path(__file__).resolve().parents[2]
RECIPE = str(ROOT / "configs" / "rift" / "tiny_cpu.yaml")
QUIET = ["log.progress=false", "log.tensorboard=false"]


def read_rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_recipe_loads_with_rifts_hyper_parameters():
    cfg = load_config(RECIPE)
    a = cfg.algo
    assert (a.advantage, a.policy_loss, a.clip_low, a.clip_high, a.dual_clip_c, a.kl_coef, a.adv_eps) == \
        ("grpo", "ppo_clip", 0.2, 0.2, 3.0, 0.0, 1e-5)
    assert cfg.rollout.group_size == 15 and cfg.policy.args.group == "all_candidates"
    assert cfg.trainer.ref_model == "none"


def test_rift_raises_the_greedy_return_from_a_random_scorer(tmp_path, monkeypatch):
    """No warm start: 16 training states, evaluated on those states; the RIFT update (all 15 candidates
    of a state, group-relative advantage, dual-clip PPO) must raise the greedy candidate's 4-s return."""
    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
    cfg = load_config(RECIPE, QUIET + [
        "task.args.train_pool=16", "task.args.traffic=[2,4]", "task.args.explore_s=0", "warm_start.sft_steps=0",
        "rollout.prompts_per_step=16", "trainer.steps=25", "trainer.ppo_epochs=4", "trainer.minibatches=2",
        "trainer.lr=3e-3", "eval.split=train", "eval.num_examples=16", "eval.every=0", "checkpoint.every=0"])
    rows = read_rows(train(cfg, tmp_path / "run"))
    first, last = rows[0], rows[-1]
    assert last["eval/reward_mean"] > first["eval/reward_mean"] + 2.0, (first, last)
    assert np.isfinite([r["loss/policy"] for r in rows[1:]]).all()


@pytest.mark.slow
def test_full_recipe_cuts_closed_loop_collisions_and_keeps_progress(tmp_path, monkeypatch):
    """The recipe as shipped (~6 min on 2 shared cores with the closed-loop episodes): IL warm start,
    then 150 RIFT steps. On 100 held-out 8-s closed-loop episodes the fine-tuned policy collides less
    often than its imitation start and keeps (at least 95% of) its progress; the greedy 4-s return on
    the 512 held-out states rises.

    Measured (docs/results.md, issue 28): the return goes from 19.38 to 21.2-23.0 with trainer.seed 0-2 at
    one thread; it swings by several points between steps, so the margin is +0.5. Closed-loop collisions go
    from 0.04 to 0.00 for seed 0 (0.00-0.04 over seeds 0-2)."""
    from mmrl.tasks.driving.rift_eval import load_policies

    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
    run = train(load_config(RECIPE, QUIET), tmp_path / "run")
    rows = read_rows(run)
    assert rows[-1]["eval/reward_mean"] > rows[0]["eval/reward_mean"] + 0.5, (rows[0], rows[-1])
    before, after, task = load_policies(run)
    seeds = np.random.default_rng(4321).integers(0, task.seed_high, size=100)
    il = task.closed_loop_metrics(before.choose, "test", seeds)
    rift = task.closed_loop_metrics(after.choose, "test", seeds)
    assert rift["collision_rate"] < il["collision_rate"], (il, rift)
    assert rift["progress_mean"] >= 0.95 * il["progress_mean"], (il, rift)
