"""scripts/results/paired_eval.py: the paired summary's formulas and per-example measures on one set of answers."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("paired_eval", ROOT / "scripts/results/paired_eval.py")
paired_eval = importlib.util.module_from_spec(spec)
spec.loader.exec_module(paired_eval)


def test_paired_summary_golden():
    before, after = np.array([0.0, 1.0, 1.0, 0.0]), np.array([1.0, 1.0, 0.0, 1.0])
    s = paired_eval.paired_summary(before, after)
    # gains d = (1, 0, −1, 1): mean 0.25, sd (ddof 1) = sqrt(((.75)² + (.25)² + (1.25)² + (.75)²) / 3) = 0.9574
    assert s["gain"] == pytest.approx(0.25) and s["gain_se"] == pytest.approx(0.9574271 / 2)
    assert (s["before"], s["after"], s["improved"], s["worsened"]) == (0.5, 0.75, 2, 1)
    assert s["before_se"] == pytest.approx(math.sqrt(1 / 3) / 2)


def test_components_and_task_metrics_are_read_from_the_same_answers(tmp_path, monkeypatch):
    monkeypatch.setenv("MMRL_CACHE", str(tmp_path))
    cfg, policy = paired_eval.load_policy("configs/sanity/tiny_cpu.yaml", paired_eval.WARM_START, [])
    task = paired_eval.make_task(cfg.task.name, cfg.task.args)
    examples = task.sample_batch("test", 12, np.random.default_rng(0))
    out = paired_eval.scores(policy, task, cfg, examples, [None], ["exact_match"])
    assert set(out) == {"reward", "exact_match"} and not np.isnan(out["reward"]).any()
    assert set(out["exact_match"].tolist()) <= {0.0, 1.0}
    assert ((out["exact_match"] == 1.0) <= (out["reward"] == 1.0)).all()  # an exact answer has the full reward
    with pytest.raises(KeyError, match="--metric 'nope'"):
        paired_eval.scores(policy, task, cfg, examples[:2], [], ["nope"])


def test_sampled_scores_are_seeded(tmp_path, monkeypatch):
    monkeypatch.setenv("MMRL_CACHE", str(tmp_path))
    cfg, policy = paired_eval.load_policy("configs/sanity/tiny_cpu.yaml", paired_eval.WARM_START, [])
    task = paired_eval.make_task(cfg.task.name, cfg.task.args)
    examples = task.sample_batch("test", 16, np.random.default_rng(0))
    greedy = paired_eval.scores(policy, task, cfg, examples, [None])["reward"]
    first = paired_eval.scores(policy, task, cfg, examples, [None], temperature=1.0, seed=3)["reward"]
    again = paired_eval.scores(policy, task, cfg, examples, [None], temperature=1.0, seed=3)["reward"]
    np.testing.assert_array_equal(first, again)  # one sample per example, reproducible from the seed
    assert not np.array_equal(first, greedy)  # and not the greedy answers
