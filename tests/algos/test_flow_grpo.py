"""Flow-GRPO's estimator (per-prompt mean, global std) and the closed-form KL on Gaussian means."""

from __future__ import annotations

import pytest
import torch

from mmrl.algos import ADVANTAGE_ESTIMATORS, GAUSSIAN_KL_ESTIMATORS, AdvantageInputs, AlgoConfig
from mmrl.core.config import ConfigError
from mmrl.core.contracts import PolicyOutput


def test_grpo_global_std_golden():
    """rewards [1, 3 | 2, 6]: group means 2, 4; global unbiased std of all four = std([1,3,2,6])."""
    rewards = torch.tensor([1.0, 3.0, 2.0, 6.0])
    inp = AdvantageInputs(rewards=rewards, mask=torch.ones(4, 3), group_id=torch.tensor([0, 0, 1, 1]))
    adv, returns = ADVANTAGE_ESTIMATORS.get("grpo_global_std")(inp, AlgoConfig(adv_eps=1e-4))
    std = torch.tensor([1.0, 3.0, 2.0, 6.0]).std()  # 2.1602
    expected = torch.tensor([-1.0, 1.0, -2.0, 2.0]) / (std + 1e-4)
    torch.testing.assert_close(adv[:, 0], expected)
    assert returns is None and (adv == adv[:, :1]).all()
    # unlike grpo, a group with a larger spread keeps larger advantages
    grpo, _ = ADVANTAGE_ESTIMATORS.get("grpo")(inp, AlgoConfig())
    torch.testing.assert_close(grpo[:, 0].abs(), torch.full((4,), 2 ** -0.5), atol=1e-5, rtol=0)


def test_gaussian_mean_kl_golden_and_errors():
    mean = torch.zeros(1, 2, 4)
    ref = torch.zeros(1, 2, 4)
    ref[0, 1] = torch.tensor([1.0, 1.0, 0.0, 0.0])  # step 1: ‖Δμ‖² / D = 0.5
    std = torch.tensor([[1.0, 0.5]])
    out = PolicyOutput(logp=torch.zeros(1, 2), mean=mean, std=std)
    kl = GAUSSIAN_KL_ESTIMATORS.get("gaussian_mean")(out, PolicyOutput(logp=torch.zeros(1, 2), mean=ref, std=std))
    torch.testing.assert_close(kl, torch.tensor([[0.0, 0.5 / (2 * 0.25)]]))
    with pytest.raises(ValueError, match="PolicyOutput.mean"):
        GAUSSIAN_KL_ESTIMATORS.get("gaussian_mean")(PolicyOutput(logp=torch.zeros(1, 2)), out)


def test_config_accepts_gaussian_kl_and_rejects_unknown():
    from mmrl.core.config import load_config

    cfg = load_config("flow_grpo/tiny_cpu")
    assert cfg.algo.kl_estimator == "gaussian_mean" and cfg.algo.advantage == "grpo_global_std"
    with pytest.raises(ConfigError, match="unknown KL estimator 'gausian_mean'"):
        load_config("flow_grpo/tiny_cpu", ["algo.kl_estimator=gausian_mean"])
