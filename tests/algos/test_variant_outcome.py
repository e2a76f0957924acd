"""The paper variants on the advantage-estimator axis (mmrl/algos/variants/outcome.py): golden numbers on
hand-built groups (all-correct, all-wrong, mixed, a single rollout), degenerate inputs, typed parameters."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from mmrl.algos import ADVANTAGE_ESTIMATORS, AdvantageInputs, AlgoConfig
from mmrl.algos.variants.outcome import backward_corrected_rewards, beta_posterior_mean
from mmrl.core.config import ConfigError

# Groups: 0 = all-correct [1, 1, 1, 1], 1 = all-wrong [0, 0, 0, 0], 2 = mixed [1, 0, 0, 1], 3 = a single rollout [1]
REWARDS = torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 1, 1])
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3])


def inputs(rewards=REWARDS, groups=GROUPS, t: int = 3, **extra) -> AdvantageInputs:
    mask = torch.ones(len(rewards), t)
    mask[0, 2] = 0.0  # some padding
    return AdvantageInputs(rewards=rewards, mask=mask, group_id=groups, **extra)


def per_sequence(adv: torch.Tensor) -> torch.Tensor:
    return adv[:, 0]


def run(name: str, inp: AdvantageInputs, **extra) -> torch.Tensor:
    adv, returns = ADVANTAGE_ESTIMATORS.get(name)(inp, AlgoConfig(advantage=name, extra=extra))
    assert returns is None
    assert torch.all(adv[inp.mask == 0] == 0), "padding must carry no advantage"
    return adv


def test_psr_nsr_w_reinforce_golden():
    soft = torch.tensor([1.0, 0.0, 0.5])
    inp = inputs(soft, torch.tensor([0, 0, 1]))
    assert_close(per_sequence(run("psr", inp)), torch.tensor([1.0, 0.0, 0.5]))
    assert_close(per_sequence(run("nsr", inp)), torch.tensor([0.0, -1.0, -0.5]))
    # λ = 0.1: correct → 0.1, wrong → −1, a soft 0.5 → 0.1·0.5 + 0.5 − 1 = −0.45
    assert_close(per_sequence(run("w_reinforce", inp)), torch.tensor([0.1, -1.0, -0.45]))
    assert_close(per_sequence(run("w_reinforce", inp, w_reinforce={"positive_weight": 0.5})),
                 torch.tensor([0.5, -1.0, -0.25]))


def test_w_reinforce_is_lambda_psr_plus_nsr_on_every_group_kind():
    inp = inputs()
    want = 0.1 * run("psr", inp) + run("nsr", inp)
    assert_close(run("w_reinforce", inp), want)
    # uniform groups keep a signal (no baseline): all-correct rows get +λ, all-wrong rows −1, the single rollout +λ
    seq = per_sequence(run("w_reinforce", inp))
    assert_close(seq[:4], torch.full((4,), 0.1)) and assert_close(seq[4:8], torch.full((4,), -1.0))
    assert_close(seq[12], torch.tensor(0.1))


def test_rewards_outside_unit_interval_are_refused():
    with pytest.raises(ValueError, match=r"rewards in \[0, 1\]"):
        run("w_reinforce", inputs(torch.tensor([1.0, -0.2]), torch.tensor([0, 0])))


def test_noisy_backward_is_unbiased_and_golden():
    rho0, rho1 = 0.1, 0.2
    r_hat = backward_corrected_rewards(torch.tensor([1.0, 0.0]), rho0, rho1)
    assert_close(r_hat, torch.tensor([0.9 / 0.7, -0.1 / 0.7]))
    # E[r̂ | r* = 1] = (1 − ρ1)·r̂(1) + ρ1·r̂(0) = 1 and E[r̂ | r* = 0] = ρ0·r̂(1) + (1 − ρ0)·r̂(0) = 0
    assert math.isclose((1 - rho1) * r_hat[0].item() + rho1 * r_hat[1].item(), 1.0, rel_tol=1e-6)
    assert math.isclose(rho0 * r_hat[0].item() + (1 - rho0) * r_hat[1].item(), 0.0, abs_tol=1e-6)
    # base = returns without whitening, γ = 1: A_t = r̂ on every token (plain REINFORCE on the corrected reward)
    params = {"false_positive_rate": rho0, "false_negative_rate": rho1, "base": "returns"}
    inp = inputs(torch.tensor([1.0, 0.0]), torch.tensor([0, 1]))
    cfg = AlgoConfig(advantage="noisy_backward", whiten_advantages=False, extra={"noisy_backward": params})
    adv, _ = ADVANTAGE_ESTIMATORS.get("noisy_backward")(inp, cfg)
    assert_close(per_sequence(adv), r_hat)


def test_noisy_backward_with_std_normalised_grpo_is_plain_grpo():
    # the correction is affine with a positive scale: GRPO's (r − μ)/σ does not change for groups of
    # two or more (documented caveat); a single rollout's A = r/(1 + ε) does
    params = {"false_positive_rate": 0.1, "false_negative_rate": 0.2, "base": "grpo"}
    inp = inputs()
    got, want = run("noisy_backward", inp, noisy_backward=params), run("grpo", inp)
    assert_close(got[:12], want[:12], atol=1e-5, rtol=0)
    assert_close(got[12, 0], torch.tensor(0.9 / 0.7), atol=1e-5, rtol=0)
    # Dr. GRPO feels it: A = (r − μ)/(1 − ρ0 − ρ1)
    cfg = AlgoConfig(advantage="noisy_backward", norm_adv_by_std=False, extra={"noisy_backward": params})
    dr, _ = ADVANTAGE_ESTIMATORS.get("noisy_backward")(inp, cfg)
    plain, _ = ADVANTAGE_ESTIMATORS.get("grpo")(inp, AlgoConfig(norm_adv_by_std=False))
    assert_close(dr[:12], plain[:12] / 0.7)


def test_noisy_forward_weights_golden_and_zero_mean_on_true_positives():
    rho1 = 0.2
    inp = inputs(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]))
    adv = run("noisy_forward", inp, noisy_forward={"false_negative_rate": rho1})
    assert_close(per_sequence(adv), torch.tensor([0.2, -0.8]))  # w_1 = ρ1, w_0 = ρ1 − 1
    # E[w | r* = 1] = (1 − ρ1)·w_1 + ρ1·w_0 = 0
    assert math.isclose((1 - rho1) * 0.2 + rho1 * -0.8, 0.0, abs_tol=1e-12)


def test_noise_rates_are_checked():
    inp = inputs(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="rho_0 \\+ rho_1 < 1"):
        run("noisy_forward", inp, noisy_forward={"false_positive_rate": 0.6, "false_negative_rate": 0.5})


def test_beta_posterior_group_counts_golden():
    adv = per_sequence(run("beta_posterior", inputs()))
    # all-correct G = 4, Beta(1 + 4, 1): p̃ = 5/6, A = (1 − 5/6)/√(5/36) = 1/√5; all-wrong: −1/√5
    assert_close(adv[:4], torch.full((4,), 1 / math.sqrt(5)), atol=1e-5, rtol=0)
    assert_close(adv[4:8], torch.full((4,), -1 / math.sqrt(5)), atol=1e-5, rtol=0)
    # mixed [1, 0, 0, 1]: p̃ = 3/6, A = ±0.5/0.5; the single rollout r = 1: p̃ = 2/3, A = (1/3)/√(2/9) = 1/√2
    assert_close(adv[8:12], torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-5, rtol=0)
    assert_close(adv[12], torch.tensor(1 / math.sqrt(2)), atol=1e-5, rtol=0)


def test_beta_posterior_history_counts_mssr_form():
    # MSSR form: baseline from the prompt's history only, no std: prior (1, 1) + (2 successes, 1 failure) → p̃ = 3/5
    inp = inputs(torch.tensor([1.0, 0.0]), torch.tensor([0, 1]),
                 prompt_successes=torch.tensor([2.0, 2.0]), prompt_failures=torch.tensor([1.0, 1.0]))
    params = {"count_group": False, "count_history": True, "normalize_std": False}
    assert_close(per_sequence(run("beta_posterior", inp, beta_posterior=params)), torch.tensor([0.4, -0.6]))
    assert_close(beta_posterior_mean(torch.tensor([2.0]), torch.tensor([1.0]), 1.0, 1.0), torch.tensor([0.6]))


def test_beta_posterior_history_needs_the_trainer_counts():
    with pytest.raises(ValueError, match="per-prompt history"):
        run("beta_posterior", inputs(), beta_posterior={"count_history": True})


def test_empty_mask_rows_give_zero_not_nan():
    inp = AdvantageInputs(rewards=torch.tensor([1.0, 0.0]), mask=torch.zeros(2, 3), group_id=torch.tensor([0, 0]))
    for name in ("psr", "nsr", "w_reinforce", "beta_posterior"):
        adv, _ = ADVANTAGE_ESTIMATORS.get(name)(inp, AlgoConfig(advantage=name))
        assert torch.equal(adv, torch.zeros(2, 3)), name


def test_unknown_parameter_is_a_config_error_naming_the_valid_keys():
    with pytest.raises(ConfigError, match="positive_weight"):
        run("w_reinforce", inputs(), w_reinforce={"lambda": 0.1})


def test_recipe_validation_rejects_unknown_extra_section(sanity_config):
    with pytest.raises(ConfigError, match="did you mean 'f_grpo'"):
        sanity_config("algo.extra={f_grp: {gamma: 1}}")
    cfg = sanity_config("algo.advantage=w_reinforce", "algo.extra={w_reinforce: {positive_weight: 0.2}}")
    assert cfg.algo.extra == {"w_reinforce": {"positive_weight": 0.2}}
    with pytest.raises(ConfigError, match="need reference"):
        sanity_config("algo.shaping=[ace]", "trainer.ref_model=none")


def test_prompt_history_is_needed_only_when_counted():
    from mmrl.algos.variants import algo_needs

    assert algo_needs(AlgoConfig(advantage="beta_posterior")) == frozenset()
    assert algo_needs(AlgoConfig(advantage="beta_posterior", extra={"beta_posterior": {"count_history": True}})) \
        == {"prompt_history"}
    assert algo_needs(AlgoConfig(advantage="grpo", shaping=("ace", "rl_zvp"))) == {"ref_logp", "entropy"}


ESTIMATOR_CONFIGS = {
    "psr": {}, "nsr": {}, "w_reinforce": {},
    "noisy_backward": {"noisy_backward": {"false_positive_rate": 0.1, "false_negative_rate": 0.2, "base": "rloo"}},
    "noisy_forward": {"noisy_forward": {"false_negative_rate": 0.2}},
    "beta_posterior": {},
}


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                         "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("clip", [{"clip_high": 0.28}, {"clip_high": 0.28, "dual_clip_c": 3.0}])
@pytest.mark.parametrize("name", sorted(ESTIMATOR_CONFIGS))
def test_estimators_compose_with_ppo_clip_and_every_aggregation(name, clip, aggregation):
    """On-policy, the aggregated PPO-clip loss on these advantages has the gradient of the aggregated −A·log π."""
    from mmrl.algos import POLICY_LOSSES, aggregate

    inp = inputs()
    cfg = AlgoConfig(advantage=name, loss_agg=aggregation, extra=ESTIMATOR_CONFIGS[name], **clip)
    adv, _ = ADVANTAGE_ESTIMATORS.get(name)(inp, cfg)
    logp_old = -torch.rand(inp.mask.shape, generator=torch.Generator().manual_seed(0)) * inp.mask
    logp = logp_old.clone().requires_grad_(True)
    loss, _ = POLICY_LOSSES.get("ppo_clip")(logp, logp_old, adv, inp.mask, cfg)
    aggregate(loss, inp.mask, aggregation).backward()
    reference = logp_old.clone().requires_grad_(True)
    aggregate(-adv * reference * inp.mask, inp.mask, aggregation).backward()
    assert_close(logp.grad, reference.grad)
    assert torch.isfinite(logp.grad).all()
