"""DPH-RL rehearsal divergences (mmrl/algos/variants/divergences.py): golden values, zero with zero gradient
at π_θ = π_0, and the trainer's rehearsal set (π_0's always-solved samples, rebuilt exactly on resume)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from mmrl.algos.variants import REHEARSAL_DIVERGENCES
from mmrl.algos.variants.divergences import RehearsalParams
from mmrl.core.config import ConfigError, load_config
from mmrl.core.trainer import Trainer, train

LN2 = math.log(2.0)


@pytest.mark.parametrize(("name", "value_at_two"), [
    ("forward_kl", 2.0 - LN2 - 1.0),                                           # u − log u − 1
    ("js", 2.0 * LN2 - 3.0 * math.log(1.5)),                                   # u log u − (u+1) log((u+1)/2)
    ("alpha", (2.0 ** 0.8 - 0.8 * 2.0 - 0.2) / (0.2 * -0.8)),                  # α = 0.2
])
def test_golden_values_and_zero_at_the_initial_policy(name, value_at_two):
    fn = REHEARSAL_DIVERGENCES.get(name)
    logp_init = torch.tensor([[-1.0, -2.0]])
    logp = torch.tensor([[-1.0 + LN2, -2.0]], requires_grad=True)  # u = 2 on the first token, 1 on the second
    term = fn(logp, logp_init, RehearsalParams())
    assert term[0, 0].item() == pytest.approx(value_at_two, rel=1e-5)
    assert term[0, 1].item() == pytest.approx(0.0, abs=1e-7)
    term.sum().backward()
    assert logp.grad[0, 1].item() == pytest.approx(0.0, abs=1e-6) and logp.grad[0, 0] > 0  # pulls u back to 1
    grid = torch.linspace(-3, 3, 61)[None]
    assert torch.all(fn(grid, torch.zeros_like(grid), RehearsalParams()) >= -1e-6)


def test_alpha_must_lie_in_the_unit_interval():
    with pytest.raises(ValueError, match=r"in \(0, 1\)"):
        REHEARSAL_DIVERGENCES.get("alpha")(torch.zeros(1, 1), torch.zeros(1, 1), RehearsalParams(alpha=1.0))


OVERRIDES = ["log.progress=false", "log.tensorboard=false", "eval.every=3", "eval.num_examples=8",
             "rollout.prompts_per_step=8", "rollout.group_size=4", "warm_start.sft_steps=20", "checkpoint.every=3",
             "algo.rehearsal_divergence=js",
             "algo.extra={dph_rl: {coef: 0.1, success_threshold: 0.25, rehearsal_prompts: 64, samples_per_prompt: 4}}"]


def rows(out):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_rehearsal_set_holds_only_always_solved_prompts(tmp_path):
    trainer = Trainer(load_config("sanity/tiny_cpu", [*OVERRIDES, "trainer.steps=1"]), tmp_path / "run")
    rehearsal = dict(trainer.loss_hooks)["rehearsal"].rows
    assert rehearsal.num_rows > 0 and rehearsal.num_rows % 4 == 0  # whole groups of k = 4
    assert all(torch.bincount(rehearsal.example_index)[rehearsal.example_index] == 4)
    # its log-probs are π_0's: re-scoring with the initial weights gives them back
    with torch.no_grad():
        assert torch.allclose(trainer.policy(rehearsal).logp * rehearsal.mask, rehearsal.logp, atol=1e-5)
    trainer.train()
    last = rows(tmp_path / "run")[-1]
    assert last["loss/rehearsal"] >= 0 and last["rollout/rehearsal_rows"] == rehearsal.num_rows


def test_resume_rebuilds_the_same_rehearsal_set(tmp_path):
    train(load_config("sanity/tiny_cpu", [*OVERRIDES, "trainer.steps=6"]), tmp_path / "full")
    train(load_config("sanity/tiny_cpu", [*OVERRIDES, "trainer.steps=3"]), tmp_path / "part")
    Trainer(load_config("sanity/tiny_cpu", [*OVERRIDES, "trainer.steps=6"]), tmp_path / "part", resume=True).train()
    assert rows(tmp_path / "part") == rows(tmp_path / "full")
    assert rows(tmp_path / "full")[-1]["rollout/rehearsal_rows"] > 0


def test_unknown_divergence_is_a_config_error(sanity_config):
    with pytest.raises(ConfigError, match="rehearsal divergence 'kl'"):
        sanity_config("algo.rehearsal_divergence=kl")
