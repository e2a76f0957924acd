"""Golden numbers for the advantage estimators (mmrl/algos/advantages.py).

Every expected value is derived by hand from the cited formula; the derivation is in the comment
next to it. Inputs are tiny and float64 so the tolerances can be tight.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from mmrl.algos.advantages import ADVANTAGE_ESTIMATORS, AdvantageInputs, discounted_returns
from mmrl.algos.config import AlgoConfig

F64 = torch.float64
EPS = 1e-6  # AlgoConfig.adv_eps default


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


def estimate(name: str, cfg: AlgoConfig, **inputs) -> tuple[torch.Tensor, torch.Tensor | None]:
    return ADVANTAGE_ESTIMATORS.get(name)(AdvantageInputs(**inputs), cfg)


# -- GRPO (DeepSeekMath eq. 3) / Dr. GRPO ----------------------------------------------------------


def test_grpo_one_group_std_normalised():
    # rewards [1,0,0,1] in one group: mean 0.5; unbiased var = 4·0.25/3 = 1/3, std = 0.577350
    # → A = ±0.5 / (0.577350 + 1e-6) = ±0.866024
    a = 0.5 / (math.sqrt(1 / 3) + EPS)
    assert abs(a - 0.866024) < 1e-6
    adv, returns = estimate("grpo", AlgoConfig(), rewards=t([1.0, 0.0, 0.0, 1.0]),
                            mask=torch.ones(4, 2, dtype=F64), group_id=torch.tensor([0, 0, 0, 0]))
    assert returns is None
    assert_close(adv, t([[a, a], [-a, -a], [-a, -a], [a, a]]))


def test_dr_grpo_no_std_normalisation():
    # Dr. GRPO (Liu et al. 2025 §3.1): A = r − mean = [1,0,0,1] − 0.5 = ±0.5
    adv, _ = estimate("grpo", AlgoConfig(norm_adv_by_std=False), rewards=t([1.0, 0.0, 0.0, 1.0]),
                      mask=torch.ones(4, 2, dtype=F64), group_id=torch.tensor([0, 0, 0, 0]))
    assert_close(adv, t([[0.5, 0.5], [-0.5, -0.5], [-0.5, -0.5], [0.5, 0.5]]))


def test_grpo_two_interleaved_groups():
    # group_id [10, 3, 10, 3] (arbitrary ints, interleaved), rewards [1, 2, 3, 2]
    # group 10: {1, 3}: mean 2, unbiased var (1+1)/1 = 2, std √2 → A = ∓1/(√2 + ε) = ∓0.707106
    # group 3:  {2, 2}: mean 2, std 0 → A = 0/(0 + ε) = 0
    a = 1.0 / (math.sqrt(2.0) + EPS)
    mask = torch.ones(4, 1, dtype=F64)
    adv, _ = estimate("grpo", AlgoConfig(), rewards=t([1.0, 2.0, 3.0, 2.0]), mask=mask,
                      group_id=torch.tensor([10, 3, 10, 3]))
    assert_close(adv, t([[-a], [0.0], [a], [0.0]]))
    # Dr. GRPO on the same batch: r − mean = [−1, 0, 1, 0]
    adv, _ = estimate("grpo", AlgoConfig(norm_adv_by_std=False), rewards=t([1.0, 2.0, 3.0, 2.0]), mask=mask,
                      group_id=torch.tensor([10, 3, 10, 3]))
    assert_close(adv, t([[-1.0], [0.0], [1.0], [0.0]]))


def test_grpo_group_of_three_and_group_of_one():
    # group_id [1, 0, 1, 1], rewards [1, 5, 0, 2]
    # group 1: {1, 0, 2}: mean 1, deviations 0, −1, 1, unbiased var 2/2 = 1, std 1 → A = 0, −1/(1+ε), 1/(1+ε)
    # group 0: {5} alone: no group to compare with → mean 0, std 1 → A = 5/(1+ε)
    one = 1.0 / (1.0 + EPS)
    adv, _ = estimate("grpo", AlgoConfig(), rewards=t([1.0, 5.0, 0.0, 2.0]), mask=torch.ones(4, 1, dtype=F64),
                      group_id=torch.tensor([1, 0, 1, 1]))
    assert_close(adv, t([[0.0], [5.0 * one], [-one], [one]]))
    # Dr. GRPO: a group of one also gets A = r = 5
    adv, _ = estimate("grpo", AlgoConfig(norm_adv_by_std=False), rewards=t([1.0, 5.0, 0.0, 2.0]),
                      mask=torch.ones(4, 1, dtype=F64), group_id=torch.tensor([1, 0, 1, 1]))
    assert_close(adv, t([[0.0], [5.0], [-1.0], [1.0]]))


def test_grpo_broadcast_is_zero_on_padding():
    # rewards [1, 0] in one group: mean 0.5, unbiased std √(0.5) → A = ±0.5/(0.707107+ε) = ±0.707106
    a = 0.5 / (math.sqrt(0.5) + EPS)
    mask = t([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    adv, _ = estimate("grpo", AlgoConfig(), rewards=t([1.0, 0.0]), mask=mask, group_id=torch.tensor([0, 0]))
    assert_close(adv, t([[a, a, a, 0.0], [-a, 0.0, 0.0, 0.0]]))


# -- RLOO (Ahmadian et al. 2024 eq. 7) ----------------------------------------------------------------


def test_rloo_leave_one_out():
    # one group of 4, rewards [1, 0, 0, 1]:
    # r=1: others {0, 0, 1} mean 1/3 → A = 1 − 1/3 = 2/3; r=0: others {1, 0, 1} mean 2/3 → A = −2/3
    mask = t([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    adv, returns = estimate("rloo", AlgoConfig(), rewards=t([1.0, 0.0, 0.0, 1.0]), mask=mask,
                            group_id=torch.tensor([0, 0, 0, 0]))
    assert returns is None
    assert_close(adv, t([[2 / 3, 2 / 3], [-2 / 3, 0.0], [-2 / 3, -2 / 3], [2 / 3, 2 / 3]]))


def test_rloo_interleaved_groups_and_singleton():
    # group_id [0, 1, 0, 2], rewards [3, 7, 1, 4]
    # group 0 {3, 1}: A(3) = 3 − 1 = 2, A(1) = 1 − 3 = −2; group 1 {7} alone → A = r = 7; group 2 {4} → 4
    adv, _ = estimate("rloo", AlgoConfig(), rewards=t([3.0, 7.0, 1.0, 4.0]), mask=torch.ones(4, 1, dtype=F64),
                      group_id=torch.tensor([0, 1, 0, 2]))
    assert_close(adv, t([[2.0], [7.0], [-2.0], [4.0]]))


# -- discounted returns ------------------------------------------------------------------------------


def test_discounted_returns_skip_masked_positions_inside_a_sequence():
    # row 0, γ = 0.5, mask [1, 0, 1, 1], rewards [1, 5, 2, 4] (the 5 sits on a masked position):
    #   G3 = 4; G2 = 2 + 0.5·4 = 4; G1 (masked) = 0, recursion passes through; G0 = 1 + 0.5·4 = 3
    # row 1, right padding: mask [1, 1, 0, 0], rewards [1, 2, 9, 9]: G1 = 2, G0 = 1 + 0.5·2 = 2
    rewards = t([[1.0, 5.0, 2.0, 4.0], [1.0, 2.0, 9.0, 9.0]])
    mask = t([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    assert_close(discounted_returns(rewards, mask, 0.5), t([[3.0, 0.0, 4.0, 4.0], [2.0, 2.0, 0.0, 0.0]]))


def test_discounted_returns_with_dones():
    # γ = 0.5, rewards [1, 1, 1, 1], done after t=1: G3 = 1, G2 = 1 + 0.5 = 1.5, G1 = 1 (no carry), G0 = 1.5
    rewards = t([[1.0, 1.0, 1.0, 1.0]])
    dones = t([[0.0, 1.0, 0.0, 0.0]])
    assert_close(discounted_returns(rewards, torch.ones_like(rewards), 0.5, dones), t([[1.5, 1.0, 1.5, 1.0]]))


# -- returns-to-go (plain REINFORCE) ------------------------------------------------------------------


def test_returns_to_go_outcome_on_last_valid_token():
    # γ = 0.9, outcome 1 placed on the last valid token (t=2) of row 0: G = [0.81, 0.9, 1, 0]
    # row 1 (2 valid tokens), outcome 2 on t=1: G = [0.9·2, 2, 0, 0] = [1.8, 2, 0, 0]
    cfg = AlgoConfig(advantage="returns", gamma=0.9, whiten_advantages=False)
    mask = t([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    adv, returns = estimate("returns", cfg, rewards=t([1.0, 2.0]), mask=mask, group_id=torch.tensor([0, 1]))
    assert returns is None
    assert_close(adv, t([[0.81, 0.9, 1.0, 0.0], [1.8, 2.0, 0.0, 0.0]]))


def test_returns_to_go_step_rewards():
    # γ = 0.5, step rewards [1, 2, 3]: G2 = 3, G1 = 2 + 1.5 = 3.5, G0 = 1 + 1.75 = 2.75
    cfg = AlgoConfig(gamma=0.5, whiten_advantages=False)
    adv, _ = estimate("returns", cfg, rewards=t([99.0]), mask=torch.ones(1, 3, dtype=F64),
                      group_id=torch.tensor([0]), step_rewards=t([[1.0, 2.0, 3.0]]))
    assert_close(adv, t([[2.75, 3.5, 3.0]]))


def test_returns_to_go_whitened():
    # same batch as the outcome test: valid returns {0.81, 0.9, 1, 1.8, 2}: sum 6.51, mean 1.302
    # deviations −0.492, −0.402, −0.302, 0.498, 0.698; squares 0.242064, 0.161604, 0.091204, 0.248004,
    # 0.487204 → sum 1.23008, unbiased var 0.30752
    std = math.sqrt(0.30752)
    cfg = AlgoConfig(gamma=0.9, whiten_advantages=True)
    mask = t([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    adv, _ = estimate("returns", cfg, rewards=t([1.0, 2.0]), mask=mask, group_id=torch.tensor([0, 1]))
    expected = t([[-0.492, -0.402, -0.302, 0.0], [0.498, 0.698, 0.0, 0.0]]) / (std + EPS)
    assert_close(adv, expected)


# -- REINFORCE++ (Hu 2025 eq. 4-6) -----------------------------------------------------------------------


def _reinforce_pp_batch():
    # row 0: 3 valid tokens, outcome 1; row 1: 2 valid tokens + padding, outcome 0
    # kl = log π_old − log π_ref; the 5.0 on row 1's padding must be ignored
    return dict(rewards=t([1.0, 0.0]), mask=t([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]), group_id=torch.tensor([0, 0]),
                kl=t([[0.2, 0.4, 0.0], [1.0, -1.0, 5.0]]))


def test_reinforce_pp_kl_in_reward_returns_and_whitening():
    # β = 0.1, γ = 0.5. Token rewards r_t = outcome·[t = last] − β·kl_t:
    #   row 0: [−0.02, −0.04, 1 − 0] → G2 = 1, G1 = −0.04 + 0.5·1 = 0.46, G0 = −0.02 + 0.5·0.46 = 0.21
    #   row 1: [−0.1, 0 + 0.1] (outcome 0 on t=1) → G1 = 0.1, G0 = −0.1 + 0.05 = −0.05
    # whitening over the 5 valid tokens: sum 1.72, mean 0.344; deviations −0.134, 0.116, 0.656, −0.394,
    # −0.244; squares 0.017956, 0.013456, 0.430336, 0.155236, 0.059536 → sum 0.67652, unbiased var 0.16913
    std = math.sqrt(0.16913)
    cfg = AlgoConfig(advantage="reinforce_pp", gamma=0.5, kl_in_reward_coef=0.1)
    adv, returns = estimate("reinforce_pp", cfg, **_reinforce_pp_batch())
    assert returns is None
    expected = t([[-0.134, 0.116, 0.656], [-0.394, -0.244, 0.0]]) / (std + EPS)
    assert_close(adv, expected)


def test_reinforce_pp_is_whitened_over_valid_tokens():
    cfg = AlgoConfig(gamma=0.5, kl_in_reward_coef=0.1)
    inputs = _reinforce_pp_batch()
    adv, _ = estimate("reinforce_pp", cfg, **inputs)
    valid = adv[inputs["mask"] > 0]
    assert abs(valid.mean().item()) < 1e-12
    assert abs(valid.std(unbiased=True).item() - 1.0) < 1e-5  # 1 up to the ε in the denominator
    assert adv[1, 2].item() == 0.0


def test_reinforce_pp_without_kl_uses_plain_returns():
    # β = 0, γ = 1: row 0 G = [1, 1, 1], row 1 G = [0, 0]; mean 0.6, deviations 0.4 (×3), −0.6 (×2),
    # squares 3·0.16 + 2·0.36 = 1.2, unbiased var 0.3
    std = math.sqrt(0.3)
    inputs = _reinforce_pp_batch()
    inputs["kl"] = None  # not needed when kl_in_reward_coef == 0
    adv, _ = estimate("reinforce_pp", AlgoConfig(gamma=1.0), **inputs)
    assert_close(adv, t([[0.4, 0.4, 0.4], [-0.6, -0.6, 0.0]]) / (std + EPS))


def test_reinforce_pp_requires_kl_when_coef_set():
    inputs = _reinforce_pp_batch()
    inputs["kl"] = None
    with pytest.raises(ValueError, match="kl"):
        estimate("reinforce_pp", AlgoConfig(kl_in_reward_coef=0.1), **inputs)


# -- GAE (Schulman et al. 2016 eq. 16) -------------------------------------------------------------------

GAE_CFG = AlgoConfig(advantage="gae", gamma=0.9, lam=0.8, whiten_advantages=False)  # γλ = 0.72


def test_gae_three_steps_with_right_padding():
    # row 0: outcome 1 on t=2, V = [0.5, 0.6, 0.7]:
    #   δ2 = 1 + 0 − 0.7 = 0.3                   A2 = 0.3
    #   δ1 = 0 + 0.9·0.7 − 0.6 = 0.03            A1 = 0.03 + 0.72·0.3 = 0.246
    #   δ0 = 0 + 0.9·0.6 − 0.5 = 0.04            A0 = 0.04 + 0.72·0.246 = 0.21712
    #   R = A + V = [0.71712, 0.846, 1.0]
    # row 1: 2 valid tokens, outcome 2 on t=1, V = [1.0, 0.5, 9.0] (9.0 is padding, must not bootstrap):
    #   δ1 = 2 + 0 − 0.5 = 1.5                   A1 = 1.5
    #   δ0 = 0 + 0.9·0.5 − 1.0 = −0.55           A0 = −0.55 + 0.72·1.5 = 0.53
    #   R = [1.53, 2.0, 0]
    mask = t([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    values = t([[0.5, 0.6, 0.7], [1.0, 0.5, 9.0]])
    adv, returns = estimate("gae", GAE_CFG, rewards=t([1.0, 2.0]), mask=mask, group_id=torch.tensor([0, 1]),
                            values=values)
    assert_close(adv, t([[0.21712, 0.246, 0.3], [0.53, 1.5, 0.0]]))
    assert_close(returns, t([[0.71712, 0.846, 1.0], [1.53, 2.0, 0.0]]))


def test_gae_with_dones():
    # step rewards [1, 1, 1], V = [0.5, 0.4, 0.3], episode ends after t=1 (done_1 = 1):
    #   δ2 = 1 + 0 − 0.3 = 0.7                                A2 = 0.7
    #   δ1 = 1 + 0.9·(1−1)·0.3 − 0.4 = 0.6                    A1 = 0.6 + 0 = 0.6   (no carry across done)
    #   δ0 = 1 + 0.9·0.4 − 0.5 = 0.86                         A0 = 0.86 + 0.72·0.6 = 1.292
    #   R = [1.792, 1.0, 1.0]
    adv, returns = estimate("gae", GAE_CFG, rewards=t([0.0]), mask=torch.ones(1, 3, dtype=F64),
                            group_id=torch.tensor([0]), step_rewards=t([[1.0, 1.0, 1.0]]),
                            values=t([[0.5, 0.4, 0.3]]), dones=t([[0.0, 1.0, 0.0]]))
    assert_close(adv, t([[1.292, 0.6, 0.7]]))
    assert_close(returns, t([[1.792, 1.0, 1.0]]))


def test_gae_masked_step_inside_sequence_passes_through():
    # mask [1, 0, 1]: the masked middle position neither bootstraps nor carries advantage.
    # step rewards [0, 7, 1], V = [0.5, 9.0, 0.7], γ = 0.9, λ = 0.8:
    #   A2 = 1 − 0.7 = 0.3; t=1 masked → A1 = 0; δ0 = 0 + 0.9·0.7 − 0.5 = 0.13, A0 = 0.13 + 0.72·0.3 = 0.346
    adv, returns = estimate("gae", GAE_CFG, rewards=t([0.0]), mask=t([[1.0, 0.0, 1.0]]), group_id=torch.tensor([0]),
                            step_rewards=t([[0.0, 7.0, 1.0]]), values=t([[0.5, 9.0, 0.7]]))
    assert_close(adv, t([[0.346, 0.0, 0.3]]))
    assert_close(returns, t([[0.846, 0.0, 1.0]]))


def test_gae_whitened_advantages_keep_raw_returns():
    mask = t([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    values = t([[0.5, 0.6, 0.7], [1.0, 0.5, 9.0]])
    adv, returns = estimate("gae", AlgoConfig(gamma=0.9, lam=0.8, whiten_advantages=True), rewards=t([1.0, 2.0]),
                            mask=mask, group_id=torch.tensor([0, 1]), values=values)
    # raw A (test above): {0.21712, 0.246, 0.3, 0.53, 1.5}: sum 2.79312, mean 0.558624
    # deviations −0.341504, −0.312624, −0.258624, −0.028624, 0.941376
    dev = [-0.341504, -0.312624, -0.258624, -0.028624, 0.941376]
    std = math.sqrt(sum(d * d for d in dev) / 4)  # unbiased
    assert_close(adv, t([[dev[0], dev[1], dev[2]], [dev[3], dev[4], 0.0]]) / (std + EPS))
    valid = adv[mask > 0]
    assert abs(valid.mean().item()) < 1e-12 and abs(valid.std().item() - 1.0) < 1e-5
    assert_close(returns, t([[0.71712, 0.846, 1.0], [1.53, 2.0, 0.0]]))  # returns are not whitened


def test_gae_needs_values():
    with pytest.raises(ValueError, match="values"):
        estimate("gae", GAE_CFG, rewards=t([1.0]), mask=torch.ones(1, 2, dtype=F64), group_id=torch.tensor([0]))


# -- float32 rewards: constant groups get exactly 0, normal groups the textbook value --------------------------

# (3, 0.1) and (6, 0.7) in float64: the mean is off by an ulp and the std ~1e-17, not 0
CONSTANT_GROUPS = [(2, 0.1), (3, 0.1), (6, 0.7), (8, 0.1), (16, 0.7), (128, 0.3), (5, 1 / 3), (4, 1.0), (4, 0.0),
                   (6, -2.5)]


def _constant_group_batch(size: int, value: float, dtype=torch.float32) -> AdvantageInputs:
    """A constant group of ``size`` rows (id 7) next to a mixed group {0, 1, 0.5} (id 2), interleaved."""
    rewards = torch.cat([torch.full((size,), value, dtype=dtype), torch.tensor([0.0, 1.0, 0.5], dtype=dtype)])
    group_id = torch.cat([torch.full((size,), 7), torch.tensor([2, 2, 2])])
    order = torch.randperm(size + 3, generator=torch.Generator().manual_seed(size))
    return AdvantageInputs(rewards=rewards[order], mask=torch.ones(size + 3, 2, dtype=dtype),
                           group_id=group_id[order])


@pytest.mark.parametrize("size,value", CONSTANT_GROUPS)
@pytest.mark.parametrize("name,cfg", [("grpo", AlgoConfig()), ("grpo", AlgoConfig(norm_adv_by_std=False)),
                                      ("rloo", AlgoConfig()), ("grpo_global_std", AlgoConfig(adv_eps=1e-4))],
                         ids=["grpo", "dr_grpo", "rloo", "grpo_global_std"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_constant_groups_get_exactly_zero_advantage(name, cfg, size, value, dtype):
    # Before, float32 sums gave 8 × 0.1 → A = −0.0074, 16 × 0.7 → +0.106, 128 × 0.3 → +0.279 on every row
    # of the group, while groups_with_signal (float64) dropped the same groups as signal-free.
    from mmrl.algos.sampling import groups_with_signal

    inp = _constant_group_batch(size, value, dtype)
    adv, _ = ADVANTAGE_ESTIMATORS.get(name)(inp, cfg)
    assert adv.dtype == dtype
    constant = inp.group_id == 7
    assert (adv[constant] == 0).all(), adv[constant][:, 0].unique()
    assert (adv[~constant] != 0).any()
    assert not groups_with_signal(inp.rewards, inp.group_id)[constant].any()


def test_grpo_float32_group_matches_a_float64_reference():
    # The textbook value (r − mean_g) / (std_g + ε), computed here from the float32 rewards in float64.
    import statistics

    rewards = torch.tensor([0.1, 0.7, 0.3, 0.9, 0.1, 0.1, 0.1], dtype=torch.float32)
    group_id = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    adv, _ = estimate("grpo", AlgoConfig(), rewards=rewards, mask=torch.ones(7, 1), group_id=group_id)
    group = [float(r) for r in rewards[:4]]
    mean, std = statistics.fmean(group), statistics.stdev(group)
    expected = torch.tensor([[(r - mean) / (std + EPS)] for r in group] + [[0.0]] * 3, dtype=torch.float32)
    assert adv.dtype == torch.float32
    assert_close(adv, expected, rtol=0, atol=1e-7)


@pytest.mark.parametrize("name,cfg", [("reinforce_pp", AlgoConfig()), ("returns", AlgoConfig(whiten_advantages=True))])
@pytest.mark.parametrize("size,value,padded", [(8, 0.1, False), (16, 0.7, False), (128, 0.3, True)])
def test_whitened_estimators_give_zero_for_equal_returns(name, cfg, size, value, padded):
    # γ = 1 and outcome rewards only: every valid token's return is the row's reward, equal over the batch,
    # so whitening has nothing to centre (before: +0.056 on every token for 16 × 0.7).
    mask = torch.ones(size, 3)
    if padded:
        mask[::2, 2] = 0.0
    adv, _ = estimate(name, cfg, rewards=torch.full((size,), value), mask=mask,
                      group_id=torch.arange(size) // 4)
    assert adv.dtype == torch.float32
    assert (adv == 0).all()
