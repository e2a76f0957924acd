"""PSN-RLVR parameter-space noise (mmrl/algos/variants/param_noise.py) and its use by the trainer:
rollouts from perturbed weights, the update against the unperturbed policy with truncated IS."""

from __future__ import annotations

import json

import pytest
import torch

from mmrl.algos.variants import perturbed_parameters
from mmrl.core.config import ConfigError, load_config
from mmrl.core.trainer import train

QUIET = ["log.progress=false", "log.tensorboard=false"]
SHORT = ["trainer.steps=2", "eval.every=0", "eval.num_examples=8", "rollout.prompts_per_step=8",
         "rollout.group_size=4", "warm_start.sft_steps=20", "trainer.recompute_logp_old=true", "algo.tis_cap=2.0"]


def test_perturbation_has_the_given_scale_is_seeded_and_is_undone_exactly():
    module = torch.nn.Linear(200, 100)
    frozen = torch.nn.Parameter(torch.ones(3), requires_grad=False)
    module.register_parameter("frozen", frozen)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    with perturbed_parameters(module, 0.01, seed=5):
        noise = module.weight.detach() - before["weight"]
        assert noise.std().item() == pytest.approx(0.01, rel=0.05) and abs(noise.mean().item()) < 1e-3
        assert torch.equal(module.frozen, before["frozen"])  # only trainable parameters move
        first = module.weight.detach().clone()
    for key, value in module.state_dict().items():
        assert torch.equal(value, before[key]), key  # bitwise restored
    with perturbed_parameters(module, 0.01, seed=5):
        assert torch.equal(module.weight, first)  # the same seed, the same draw
    with perturbed_parameters(module, 0.0, seed=5):
        assert torch.equal(module.weight, before["weight"])
    with pytest.raises(ValueError, match=">= 0"):
        with perturbed_parameters(module, -1.0, seed=0):
            pass


def rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_trainer_samples_from_perturbed_weights_and_trains_with_truncated_is(tmp_path):
    plain = rows(train(load_config("sanity/tiny_cpu", [*QUIET, *SHORT]), tmp_path / "plain"))
    noisy = rows(train(load_config("sanity/tiny_cpu", [*QUIET, *SHORT, "rollout.param_noise_std=0.01"]),
                       tmp_path / "noisy"))
    # without noise the re-computed π_old is the sampling policy; with noise they differ
    assert plain[1]["rollout/logp_diff"] < 1e-5 < 0.01 < noisy[1]["rollout/logp_diff"]
    assert noisy[1]["reward/mean"] != plain[1]["reward/mean"]
    # the held-out evaluation uses the unperturbed weights: before training both runs agree
    assert noisy[0] == plain[0]


def test_param_noise_needs_truncated_is(sanity_config):
    with pytest.raises(ConfigError, match="recompute_logp_old: true and algo.tis_cap"):
        sanity_config("rollout.param_noise_std=0.01")
