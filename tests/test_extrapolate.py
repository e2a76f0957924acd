"""``mmrl extrapolate`` (mmrl/experiments/extrapolate.py): the rank-1 formula on hand-made checkpoints (golden numbers)
and the command on a tiny real run (it writes and evaluates the prediction)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.testing import assert_close

from mmrl.cli import main
from mmrl.core.config import load_config
from mmrl.experiments.extrapolate import (linear_extrapolate, linear_fit, rank1_direction, rank1_extrapolate,
                                          relative_distance)
from mmrl.core.trainer import train


def test_linear_fit_golden():
    # points (0, 0), (10, 1), (20, 3): slope Σ(x − 10)(y − 4/3) / Σ(x − 10)² = 30/200 = 0.15,
    # intercept 4/3 − 1.5
    a, b = linear_fit([0, 10, 20], [0, 1, 3])
    assert math.isclose(b, 0.15) and math.isclose(a, 4 / 3 - 1.5)


def test_rank1_direction_is_the_top_singular_pair():
    delta = torch.tensor([[3.0, 0.0], [0.0, 1.0]])
    assert_close(rank1_direction(delta), torch.tensor([[1.0, 0.0], [0.0, 0.0]]).double())
    assert rank1_direction(torch.zeros(2, 2)) is None
    vector = rank1_direction(torch.tensor([3.0, 4.0]))  # a vector's direction is itself, normalised
    assert_close(vector.abs(), torch.tensor([0.6, 0.8]).double())


def test_rank1_extrapolation_golden_drops_off_direction_noise():
    w0 = {"w": torch.zeros(2, 2), "b": torch.zeros(2), "frozen": torch.ones(3), "ids": torch.arange(3)}
    observed = [
        (10, {"w": torch.tensor([[1.0, 0.3], [0.0, 0.0]]), "b": torch.tensor([0.5, 0.0]), "frozen": torch.ones(3),
              "ids": torch.arange(3)}),
        (20, {"w": torch.tensor([[3.0, 0.0], [0.0, 0.0]]), "b": torch.tensor([1.0, 0.0]), "frozen": torch.ones(3),
              "ids": torch.arange(3)}),
    ]
    predicted, fit = rank1_extrapolate(w0, observed, target=40)
    # w: direction E11 (from the last delta); magnitudes (0, 0), (10, 1), (20, 3) → c(40) = −1/6 + 0.15·40;
    # the 0.3 off the direction at step 10 never enters the prediction
    assert_close(predicted["w"], torch.tensor([[4 / 3 - 1.5 + 6.0, 0.0], [0.0, 0.0]]))
    # b: direction e1, magnitudes 0, 0.5, 1 → exactly linear: c(40) = 2
    assert_close(predicted["b"].abs(), torch.tensor([2.0, 0.0]))
    assert torch.equal(predicted["frozen"], torch.ones(3)) and torch.equal(predicted["ids"], torch.arange(3))
    assert fit["rank1_energy_fraction"] == pytest.approx(1.0)  # both last deltas are rank 1
    assert relative_distance(predicted, predicted, w0) == 0.0


def test_linear_extrapolation_golden_keeps_every_weight_on_its_own_line():
    # (Linear evolution, #10) each element on the least-squares line through (0, W0) and the observed points:
    # element [0, 0]: (0, 0), (10, 1), (20, 3) → 4/3 + 0.15·(40 − 10); element [0, 1]: (0, 0), (10, 0.3), (20, 0)
    # → slope 0, mean 0.1 (the off-direction value rank-1 drops is kept here); exactly linear b: 2 at step 40.
    w0 = {"w": torch.zeros(2, 2), "b": torch.zeros(2), "ids": torch.arange(3)}
    observed = [(10, {"w": torch.tensor([[1.0, 0.3], [0.0, 0.0]]), "b": torch.tensor([0.5, 0.0]), "ids": torch.arange(3)}),
                (20, {"w": torch.tensor([[3.0, 0.0], [0.0, 0.0]]), "b": torch.tensor([1.0, 0.0]), "ids": torch.arange(3)})]
    predicted, fit = linear_extrapolate(w0, observed, target=40)
    assert_close(predicted["w"], torch.tensor([[4 / 3 + 0.15 * 30, 0.1], [0.0, 0.0]]))
    assert_close(predicted["b"], torch.tensor([2.0, 0.0]))
    assert torch.equal(predicted["ids"], torch.arange(3)) and fit == {}
    with pytest.raises(ValueError, match="beyond the last observed"):
        linear_extrapolate(w0, observed, target=20)


def test_rank1_extrapolation_checks_its_steps():
    w0 = {"w": torch.zeros(2)}
    with pytest.raises(ValueError, match="beyond the last observed"):
        rank1_extrapolate(w0, [(10, {"w": torch.ones(2)})], target=10)
    with pytest.raises(ValueError, match="increasing"):
        rank1_extrapolate(w0, [(20, {"w": torch.ones(2)}), (10, {"w": torch.ones(2)})], target=30)


def test_command_predicts_saves_and_evaluates(tmp_path, capsys):
    run = tmp_path / "run"
    train(load_config("sanity/tiny_cpu", ["log.progress=false", "log.tensorboard=false", "trainer.steps=6",
                                          "checkpoint.every=2", "checkpoint.keep_last=0", "eval.every=0",
                                          "eval.num_examples=16", "rollout.prompts_per_step=8",
                                          "rollout.group_size=4", "warm_start.sft_steps=20"]), run)
    out = tmp_path / "relex"
    assert main(["extrapolate", str(run), "--observe", "2,4", "--target", "6", "--out", str(out)]) == 0
    report = json.loads((out / "extrapolation.json").read_text())
    assert set(report["eval"]) == {"initial", "observed_step_4", "predicted_step_6", "trained_step_6"}
    assert all(0 <= m["eval/reward_mean"] <= 1 for m in report["eval"].values())
    assert report["eval"]["trained_step_6"]["eval/reward_mean"] == pytest.approx(
        json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["eval/reward_mean"])  # the trainer's eval
    assert report["weight_distance_to_trained"]["predicted"] > 0
    assert (out / "policy" / "config.json").is_file()
    assert "predicted_step_6" in capsys.readouterr().out
    assert main(["extrapolate", str(run), "--observe", "2,4", "--target", "6", "--method", "linear", "--out",
                 str(tmp_path / "linear")]) == 0
    linear = json.loads((tmp_path / "linear" / "extrapolation.json").read_text())
    assert linear["method"] == "linear" and linear["weight_distance_to_trained"]["predicted"] > 0
    assert "linear extrapolation" in capsys.readouterr().out
    # a missing checkpoint is a one-line user error naming the fix
    assert main(["extrapolate", str(run), "--observe", "3", "--target", "6", "--out", str(tmp_path / "x")]) == 2
    assert "checkpoint.keep_last=0" in capsys.readouterr().err
