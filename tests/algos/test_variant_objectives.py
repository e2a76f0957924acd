"""Issue 24's objectives and estimators (mmrl/algos/variants/objectives.py, group_estimators.py): golden
numbers worked out by hand on tiny tensors, their gradients, and the errors for inputs they cannot use."""

from __future__ import annotations

import math

import pytest
import torch

from mmrl.algos import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, AdvantageInputs, AlgoConfig
from mmrl.algos.variants import LOSS_TERMS, LossTermInputs, LossTermRows
from mmrl.algos.variants.group_estimators import set_marginal_advantage
from mmrl.algos.variants.objectives import FrpoParams, PacsParams, frpo_loss, pacs_loss
from mmrl.core.config import ConfigError, load_config


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))


# -- rw_sft -------------------------------------------------------------------------------------------------


def test_rw_sft_golden_values_and_bounded_negative_branch():
    # row 0: weight +2 on tokens of probability 0.5, 0.25; row 1: weight −1 on 0.5, 0.2 (its last token padded)
    logp = torch.log(torch.tensor([[0.5, 0.25], [0.5, 0.2]])).requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([[2.0, 2.0], [-1.0, -1.0]])
    loss, metrics = POLICY_LOSSES.get("rw_sft")(logp, logp.detach(), adv, mask, AlgoConfig())
    expected = torch.tensor([[-2 * math.log(0.5), -2 * math.log(0.25)], [0.5, 0.0]])
    torch.testing.assert_close(loss.detach(), expected)
    loss.sum().backward()
    # −w on the positive row; |w|·π on the negative one (vanishes as π → 0, unlike −w·log π's constant −w)
    torch.testing.assert_close(logp.grad, torch.tensor([[-2.0, -2.0], [0.5, 0.0]]))
    assert metrics["policy/rw_sft_negative_frac"].item() == pytest.approx(1 / 3)


def test_rw_sft_negative_loss_is_bounded_below_where_the_naive_one_is_not():
    logp = torch.tensor([[-60.0]])  # a suppressed negative sample: π ≈ 1e-26
    loss, _ = POLICY_LOSSES.get("rw_sft")(logp, logp, torch.tensor([[-1.0]]), torch.ones(1, 1), AlgoConfig())
    assert 0.0 <= loss.item() < 1e-20  # the naive −w·log π would be −60 and keep falling


# -- PACS ---------------------------------------------------------------------------------------------------


def pacs_inputs():
    # one group of 3 rows, one decision each: ψ = β·(log π_θ − log π_old) = 1, 0, −1
    logp_old = torch.zeros(3, 1)
    logp = torch.tensor([[1.0], [0.0], [-1.0]], requires_grad=True)
    return logp, logp_old, torch.ones(3, 1), torch.tensor([1.0, 1.0, 0.0]), torch.zeros(3, dtype=torch.long)


def test_pacs_golden_rloo_centred_class_balanced_bce():
    logp, logp_old, mask, outcome, group = pacs_inputs()
    loss, logit = pacs_loss(logp, logp_old, mask, outcome, group, 1, PacsParams())
    # RLOO centring: 1 − (0 − 1)/2 = 1.5, 0 − (1 − 1)/2 = 0, −1 − (1 + 0)/2 = −1.5
    torch.testing.assert_close(logit.detach(), torch.tensor([1.5, 0.0, -1.5]))
    # class balance in a group of 3 with labels (1, 1, 0): 3/(2·2) = 0.75 for the 1s, 3/(2·1) = 1.5 for the 0
    expected = torch.tensor([0.75 * softplus(-1.5), 0.75 * math.log(2.0), 1.5 * softplus(-1.5)])
    torch.testing.assert_close(loss.detach(), expected)


def test_pacs_gradient_couples_the_rows_of_a_group():
    logp, logp_old, mask, outcome, group = pacs_inputs()
    loss, _ = pacs_loss(logp, logp_old, mask, outcome, group, 1, PacsParams(balance_classes=False))
    loss.sum().backward()
    # ∂ℓ_i/∂ψ̂_i = σ(ψ̂_i) − y_i = e_i; ψ̂_i = ψ_i − mean_{j≠i} ψ_j, so ∂/∂ψ_j = e_j − Σ_{i≠j} e_i / 2
    e = [1 / (1 + math.exp(1.5)) * -1, 0.5 - 1.0, 1 / (1 + math.exp(1.5))]
    expected = [e[j] - sum(e[i] for i in range(3) if i != j) / 2 for j in range(3)]
    torch.testing.assert_close(logp.grad.squeeze(1), torch.tensor(expected))


def test_pacs_grpo_centring_and_no_balance():
    logp, logp_old, mask, outcome, group = pacs_inputs()
    loss, logit = pacs_loss(logp, logp_old, mask, outcome, group, 1, PacsParams(centre="grpo", balance_classes=False))
    torch.testing.assert_close(logit.detach(), torch.tensor([1.0, 0.0, -1.0]), atol=1e-5, rtol=0)  # std 1
    torch.testing.assert_close(loss.detach(), torch.tensor([softplus(-1.0), math.log(2.0), softplus(-1.0)]),
                               atol=1e-5, rtol=0)


def test_pacs_term_refuses_a_micro_batch_with_part_of_a_group():
    logp, logp_old, mask, outcome, _ = pacs_inputs()
    rows = LossTermRows(outcome, None, None, torch.zeros(3, dtype=torch.long), torch.tensor([4, 4, 4]))
    inputs = LossTermInputs(logp, logp_old, torch.zeros(3, 1), mask, rows)
    with pytest.raises(ValueError, match="multiple of rollout.group_size"):
        LOSS_TERMS.get("pacs")(inputs, AlgoConfig())
    whole = LossTermRows(outcome, None, None, torch.zeros(3, dtype=torch.long), torch.tensor([3, 3, 3]))
    loss, _ = LOSS_TERMS.get("pacs")(LossTermInputs(logp, logp_old, torch.zeros(3, 1), mask, whole), AlgoConfig())
    assert loss.shape == (3,)  # a per-sequence term


# -- FRPO ---------------------------------------------------------------------------------------------------


def frpo_case(params: FrpoParams):
    # one group of 2 one-decision rows, on-policy (ρ = 1); sequence advantages +1, −1; λ = 1
    logp = torch.zeros(2, 1, requires_grad=True)
    loss, weight = frpo_loss(logp, torch.zeros(2, 1), torch.tensor([[1.0], [-1.0]]), torch.ones(2, 1),
                             torch.zeros(2, dtype=torch.long), 1, params, AlgoConfig())
    return logp, loss, weight


def test_frpo_golden_without_jackknife():
    logp, loss, weight = frpo_case(FrpoParams(jackknife=False))
    torch.testing.assert_close(weight, torch.tensor([math.exp(-1.0), math.exp(1.0)]))
    u = (math.exp(-1.0) + math.exp(1.0)) / 2  # cosh 1
    torch.testing.assert_close(loss.detach(), torch.full((2,), math.log(u) - 1.0))  # log u − mean ρ
    loss.mean().backward()
    # on-policy gradient of the group term: (w_i / ū − 1) / 2 per row: the low-advantage row is pushed down
    expected = torch.tensor([(math.exp(-1.0) / u - 1) / 2, (math.exp(1.0) / u - 1) / 2])
    torch.testing.assert_close(logp.grad.squeeze(1), expected)


def test_frpo_golden_with_jackknife():
    _, loss, _ = frpo_case(FrpoParams())
    # n·log u − (n − 1)·mean_i log u_{−i}: the leave-one-out means are e and 1/e, whose logs average to 0
    u = (math.exp(-1.0) + math.exp(1.0)) / 2
    torch.testing.assert_close(loss.detach(), torch.full((2,), 2 * math.log(u) - 0.0 - 1.0))


def test_frpo_large_lambda_approaches_centred_advantages():
    # λ → ∞: λ·(w_i/ū − 1) → −(A_i − mean A); the loss is scaled by λ, so the gradient tends to −(A − Ā)/2
    logp = torch.zeros(2, 1, requires_grad=True)
    loss, _ = frpo_loss(logp, torch.zeros(2, 1), torch.tensor([[1.0], [-1.0]]), torch.ones(2, 1),
                        torch.zeros(2, dtype=torch.long), 1, FrpoParams(lam=1e4, jackknife=False), AlgoConfig())
    loss.mean().backward()
    torch.testing.assert_close(logp.grad.squeeze(1), torch.tensor([-0.5, 0.5]), atol=1e-3, rtol=0)


# -- Polychromic PPO ------------------------------------------------------------------------------------------


def test_set_marginal_advantage_golden():
    # rewards (1, 0, 1), all outputs distinct, sets of 2: f{0,1} = .5, f{0,2} = 1, f{1,2} = .5, mean 2/3
    adv = set_marginal_advantage(torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64), torch.tensor([0, 1, 2]), 2, 100)
    torch.testing.assert_close(adv, torch.tensor([0.75 - 2 / 3, 0.5 - 2 / 3, 0.75 - 2 / 3], dtype=torch.float64))


def test_polychromic_estimator_credits_diversity():
    # group 0: two equal correct answers and two different wrong ones. Sets of 2: {0,1} = 1·½ (same output),
    # {0,2} {0,3} {1,2} {1,3} = ½·1, {2,3} = 0: mean 5/12; rows 0, 1 get ½ − 5/12, rows 2, 3 get ⅓ − 5/12.
    # group 1 (one row) has no set to compare with: 0.
    inp = AdvantageInputs(rewards=torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0]), mask=torch.ones(5, 2),
                          group_id=torch.tensor([0, 0, 0, 0, 1]), output_class=torch.tensor([0, 0, 1, 2, 0]))
    cfg = AlgoConfig(advantage="polychromic", extra={"polychromic": {"set_size": 2}})
    adv, _ = ADVANTAGE_ESTIMATORS.get("polychromic")(inp, cfg)
    a, b = 1 / 2 - 5 / 12, 1 / 3 - 5 / 12
    torch.testing.assert_close(adv[:, 0], torch.tensor([a, a, b, b, 0.0]))
    # GRPO would give the two duplicates +0.866 each and the two failures −0.866: the set score halves it


def test_polychromic_needs_output_classes_and_bounds_the_subsets():
    inp = AdvantageInputs(rewards=torch.ones(3), mask=torch.ones(3, 1), group_id=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="output class"):
        ADVANTAGE_ESTIMATORS.get("polychromic")(inp, AlgoConfig())
    with pytest.raises(ValueError, match="max_sets"):
        set_marginal_advantage(torch.ones(30, dtype=torch.float64), torch.arange(30), 10, 1000)


# -- Weighted GRPO ---------------------------------------------------------------------------------------------


def test_weighted_grpo_golden():
    # hard group (1, 0, 0, 0): GRPO (1.5, −.5, −.5, −.5), the rare success × 2;
    # easy group (1, 1, 1, 0): GRPO (.5, .5, .5, −1.5), the rare failure × 2
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    inp = AdvantageInputs(rewards=rewards, mask=torch.ones(8, 1), group_id=torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]))
    adv, _ = ADVANTAGE_ESTIMATORS.get("weighted_grpo")(inp, AlgoConfig())
    torch.testing.assert_close(adv[:, 0], torch.tensor([3.0, -0.5, -0.5, -0.5, 0.5, 0.5, 0.5, -3.0]),
                               atol=1e-5, rtol=0)


def test_weighted_grpo_with_unit_weights_is_grpo():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    inp = AdvantageInputs(rewards=rewards, mask=torch.ones(6, 2), group_id=torch.tensor([0, 0, 0, 1, 1, 1]))
    cfg = AlgoConfig(extra={"weighted_grpo": {"positive_weight": 1.0, "negative_weight": 1.0}})
    torch.testing.assert_close(ADVANTAGE_ESTIMATORS.get("weighted_grpo")(inp, cfg)[0],
                               ADVANTAGE_ESTIMATORS.get("grpo")(inp, cfg)[0])


# -- recipes --------------------------------------------------------------------------------------------------


def test_whole_group_objectives_are_checked_at_recipe_load():
    with pytest.raises(ConfigError, match="multiple of rollout.group_size"):
        load_config("sanity/tiny_cpu", ["algo.policy_loss=none", "algo.loss_terms=[pacs]", "trainer.micro_batch_size=12"])
    with pytest.raises(ConfigError, match="policy_loss: none leaves no objective"):
        load_config("sanity/tiny_cpu", ["algo.policy_loss=none"])
