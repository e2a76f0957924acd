"""``mmrl sweep`` (mmrl/experiments/sweep.py) on a tiny budget: every (arm, seed) trains, the table / JSON / plot hold
the numbers of the runs, finished runs are reused, bad arguments are one-line errors. Also the pass@k
estimator the sweep's evaluation uses (``eval.pass_k``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mmrl.cli import main
from mmrl.core.config import ConfigError
from mmrl.experiments.sweep import SWEEP_ARMS, mean_std, parse_sweep_arguments
from mmrl.core.evaluate import pass_at_k

TINY = ["trainer.steps=2", "eval.every=0", "eval.num_examples=8", "rollout.prompts_per_step=8", "rollout.group_size=4",
        "warm_start.sft_steps=20", "checkpoint.every=0", "log.tensorboard=false"]


def test_pass_at_k_golden():
    # 3 examples × 2 samples: example 0 passes once, example 1 never (0.99 < 1), example 2 twice → 2/3
    scores = torch.tensor([1.0, 0.2, 0.99, 0.5, 1.0, 1.0], dtype=torch.float64)
    index = torch.tensor([0, 0, 1, 1, 2, 2])
    assert pass_at_k(scores, index, 3, 1.0) == pytest.approx(2 / 3)
    assert pass_at_k(scores, index, 3, 0.5) == pytest.approx(1.0)


def test_mean_std_is_the_sample_std():
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0) and mean_std([0.5]) == (0.5, 0.0)


def test_sweep_writes_table_json_and_plot(tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["sweep", "sanity/tiny_cpu", "algo=grpo,f_grpo", "seeds=0,1", *TINY, "--out", str(out), "--pass-k", "2"]
    assert main(argv) == 0
    results = json.loads((out / "sweep.json").read_text())
    assert results["arms"] == ["grpo", "f_grpo"] and results["seeds"] == [0, 1] and results["pass_k"] == 2
    table = (out / "sweep.md").read_text()
    assert table in capsys.readouterr().out
    for arm in ("grpo", "f_grpo"):
        finals = [results["runs"][arm][s]["final"] for s in ("0", "1")]
        for seed in ("0", "1"):
            rows = [json.loads(line) for line in (out / "runs" / arm / f"seed_{seed}" / "metrics.jsonl").open()]
            assert rows[-1]["step"] == 2 and results["runs"][arm][seed]["final"]["eval/reward_mean"] == \
                rows[-1]["eval/reward_mean"]
            assert results["runs"][arm][seed]["rollouts_generated"] == 2 * 8 * 4
        mean, std = mean_std([f["eval/pass@2"] for f in finals])
        row = next(line for line in table.splitlines() if line.startswith(f"| {arm} |"))
        assert f"{mean:.3f} ± {std:.3f}" in row and "| 64 | 64 |" in row
        assert f"{np.mean([f['eval/reward_mean'] for f in finals]):.3f} ±" in row
    # seeds change the RL phase only: the held-out set and the warm start are shared
    assert len({json.dumps(results["runs"][a][s]["initial"]) for a in ("grpo", "f_grpo") for s in ("0", "1")}) == 1
    assert "pass@2" in table.splitlines()[2] and "(before RL)" in table
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a second call reuses the finished runs
    assert main(argv) == 0
    assert capsys.readouterr().out.count("reusing") == 4


def test_bad_sweep_arguments_are_user_errors(tmp_path, capsys):
    with pytest.raises(ConfigError, match="Did you mean 'f_grpo'"):
        parse_sweep_arguments(["algo=grpo,f_grp", "seeds=0"])
    with pytest.raises(ConfigError, match="seeds="):
        parse_sweep_arguments(["algo=grpo"])
    assert parse_sweep_arguments(["algo=grpo", "seeds=0,2", "trainer.lr=1e-4"]).overrides == ("trainer.lr=1e-4",)
    assert main(["sweep", "sanity/tiny_cpu", "algo=nope", "seeds=0", "--out", str(tmp_path / "s")]) == 2
    assert "unknown sweep arm 'nope'" in capsys.readouterr().err


def test_every_arm_builds_a_valid_config():
    from mmrl.core.config import load_config

    for arm in SWEEP_ARMS.names():
        load_config("sanity/tiny_cpu", list(SWEEP_ARMS.get(arm).overrides))
