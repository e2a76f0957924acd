"""Golden numbers and gradients for the per-token policy objectives (mmrl/algos/losses.py).

Ratios are set directly through ``logp = log ρ`` with ``logp_old = 0``; expected losses are written
out from ℓ = −min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A) by hand.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from mmrl.algos.aggregation import aggregate
from mmrl.algos.config import AlgoConfig
from mmrl.algos.losses import POLICY_LOSSES, clipped_surrogate, truncated_is_weights

F64 = torch.float64


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


def log_of(ratios) -> torch.Tensor:
    return torch.tensor(ratios, dtype=F64).log()


# -- PPO-clip (Schulman et al. 2017 eq. 7) ----------------------------------------------------------------


def test_ppo_clip_inside_and_outside_the_trust_region():
    # ε_low = ε_high = 0.2 → clip range [0.8, 1.2]
    #   ρ=1.1, A=+1: −min(1.1, 1.1) = −1.1                 (inside)
    #   ρ=1.5, A=+1: −min(1.5, 1.2) = −1.2                 (clipped)
    #   ρ=0.5, A=+1: −min(0.5, 0.8) = −0.5                 (pessimistic: unclipped, not clipped)
    #   ρ=0.5, A=−1: −min(−0.5, −0.8) = 0.8                (clipped)
    #   ρ=1.5, A=−1: −min(−1.5, −1.2) = 1.5                (unclipped, not clipped)
    #   ρ=0.9, A=−2: −min(−1.8, −1.8) = 1.8                (inside)
    cfg = AlgoConfig(clip_low=0.2, clip_high=0.2)
    logp = log_of([[1.1, 1.5, 0.5], [0.5, 1.5, 0.9]])
    adv = t([[1.0, 1.0, 1.0], [-1.0, -1.0, -2.0]])
    mask = torch.ones(2, 3, dtype=F64)
    loss, metrics = POLICY_LOSSES.get("ppo_clip")(logp, torch.zeros_like(logp), adv, mask, cfg)
    assert_close(loss, t([[-1.1, -1.2, -0.5], [0.8, 1.5, 1.8]]))
    # clipped tokens: (0,1) and (1,0) → 2 of 6
    assert metrics["policy/clip_frac"].item() == pytest.approx(2 / 6)
    # mean ratio (1.1 + 1.5 + 0.5 + 0.5 + 1.5 + 0.9)/6 = 6/6 = 1.0
    assert metrics["policy/ratio_mean"].item() == pytest.approx(1.0)


def test_ppo_clip_padding_is_zero_and_excluded_from_metrics():
    # row 1 has one valid token (ρ=1.5, A=+1 → −1.2, clipped); the padding has a huge ratio and advantage
    cfg = AlgoConfig()
    logp = log_of([[1.1, 1.0], [1.5, 100.0]])
    adv = t([[1.0, 0.0], [1.0, 50.0]])
    mask = t([[1.0, 0.0], [1.0, 0.0]])
    loss, metrics = POLICY_LOSSES.get("ppo_clip")(logp, torch.zeros_like(logp), adv, mask, cfg)
    assert_close(loss, t([[-1.1, 0.0], [-1.2, 0.0]]))
    assert metrics["policy/clip_frac"].item() == pytest.approx(0.5)  # 1 of 2 valid tokens
    # approx_kl (k3 of KL(π_old‖π_θ)) = mean over valid of (ρ − 1) − log ρ:
    #   ρ=1.1: 0.1 − 0.0953102 = 0.0046898; ρ=1.5: 0.5 − 0.4054651 = 0.0945349 → mean 0.0496124
    assert metrics["policy/approx_kl"].item() == pytest.approx(0.0496124, abs=1e-7)


def test_ppo_clip_asymmetric_clip_higher():
    # DAPO clip-higher: ε_low = 0.2, ε_high = 0.28 → clip range [0.8, 1.28]
    #   ρ=1.25, A=+1: inside (1.25 < 1.28) → −1.25     (symmetric 0.2 would give −1.2)
    #   ρ=1.4,  A=+1: → −1.28
    #   ρ=0.7,  A=−1: clip(0.7) = 0.8 → −min(−0.7, −0.8) = 0.8
    #   ρ=0.85, A=−1: inside → 0.85
    cfg = AlgoConfig(clip_low=0.2, clip_high=0.28)
    logp = log_of([[1.25, 1.4, 0.7, 0.85]])
    adv = t([[1.0, 1.0, -1.0, -1.0]])
    loss, metrics = POLICY_LOSSES.get("ppo_clip")(logp, torch.zeros_like(logp), adv, torch.ones_like(adv), cfg)
    assert_close(loss, t([[-1.25, -1.28, 0.8, 0.85]]))
    assert metrics["policy/clip_frac"].item() == pytest.approx(0.5)  # 1.4 and 0.7 are clipped


def test_ppo_dual_clip_caps_negative_advantage_loss():
    # dual clip c = 3 (Ye et al. 2020): for A < 0, ℓ = min(ℓ_clip, −c·A)
    #   ρ=5,  A=−1:   ℓ_clip = max(5, 1.2) = 5 → capped at −3·(−1) = 3 = 3|A|
    #   ρ=2,  A=−1:   ℓ_clip = 2 < 3 → 2
    #   ρ=5,  A=+1:   A > 0, no dual clip → −min(5, 1.2) = −1.2
    #   ρ=10, A=−0.5: ℓ_clip = 5 → capped at 1.5
    cfg = AlgoConfig(dual_clip_c=3.0)
    logp = log_of([[5.0, 2.0, 5.0, 10.0]])
    adv = t([[-1.0, -1.0, 1.0, -0.5]])
    loss, metrics = POLICY_LOSSES.get("ppo_clip")(logp, torch.zeros_like(logp), adv, torch.ones_like(adv), cfg)
    assert_close(loss, t([[3.0, 2.0, -1.2, 1.5]]))
    # gradient-free tokens: the two dual-capped ones and ρ=5, A=+1 (upper clip) → 3 of 4
    assert metrics["policy/clip_frac"].item() == pytest.approx(0.75)


def test_ppo_dual_clip_gradient_is_zero_when_capped():
    cfg = AlgoConfig(dual_clip_c=3.0)
    logp = log_of([[5.0, 2.0]]).requires_grad_(True)
    adv = t([[-1.0, -1.0]])
    loss, _ = POLICY_LOSSES.get("ppo_clip")(logp, torch.zeros_like(logp), adv, torch.ones_like(adv), cfg)
    loss.sum().backward()
    # capped token: constant 3 → 0; ρ=2 unclipped: d/dlogp(−A·e^{logp}) = −A·ρ = 2
    assert_close(logp.grad, t([[0.0, 2.0]]))


@pytest.mark.parametrize("c", [1.0, 0.5])
def test_dual_clip_constant_must_exceed_one(c):
    with pytest.raises(ValueError, match="dual_clip_c"):
        clipped_surrogate(t([1.0]), t([-1.0]), AlgoConfig(dual_clip_c=c))


def test_ppo_clip_on_policy_gradient_is_minus_advantage():
    # logp == logp_old → ρ = 1; d/dlogp [−A·exp(logp − logp_old)] = −A·ρ = −A; padding has zero gradient
    logp = t([[-1.0, -2.0, -0.5], [-0.3, -4.0, -1.0]]).requires_grad_(True)
    adv = t([[1.0, -2.0, 0.5], [-0.25, 3.0, 7.0]])
    mask = t([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    loss, _ = POLICY_LOSSES.get("ppo_clip")(logp, logp.detach().clone(), adv, mask, AlgoConfig())
    loss.sum().backward()
    assert_close(logp.grad, t([[-1.0, 2.0, -0.5], [0.25, -3.0, 0.0]]))


def test_ppo_clip_clipped_tokens_have_zero_gradient():
    #   ρ=1.5, A=+1 (clipped) → 0;  ρ=0.5, A=−1 (clipped) → 0
    #   ρ=1.1, A=+1 (inside)  → −A·ρ = −1.1;  ρ=1.5, A=−1 (pessimistic unclipped) → −A·ρ = 1.5
    logp = log_of([[1.5, 0.5, 1.1, 1.5]]).requires_grad_(True)
    adv = t([[1.0, -1.0, 1.0, -1.0]])
    loss, _ = POLICY_LOSSES.get("ppo_clip")(logp, torch.zeros(1, 4, dtype=F64), adv, torch.ones_like(adv),
                                            AlgoConfig())
    loss.sum().backward()
    assert_close(logp.grad, t([[0.0, 0.0, -1.1, 1.5]]))


# -- GSPO (Zheng et al. 2025 eq. 5-7) ------------------------------------------------------------------------

GSPO_CFG = AlgoConfig(policy_loss="gspo", clip_low=3e-4, clip_high=4e-4)  # range [0.9997, 1.0004]


def _gspo_batch():
    # per-token log ratios (logp − logp_old, with logp_old = 0):
    #   row 0: [1e-4, −2e-4, 4e-4]       mean 1e-4   → s0 = e^{1e-4} = 1.000100005 (inside), A = 2
    #   row 1: [1e-3, 2e-3, pad 0.5]     mean 1.5e-3 → s1 = e^{1.5e-3} = 1.001501126 (> 1.0004), A = 1
    #   row 2: [−1e-3, −1e-3, pad −0.7]  mean −1e-3  → s2 = e^{−1e-3} = 0.999000500 (< 0.9997), A = −1
    logp = t([[1e-4, -2e-4, 4e-4], [1e-3, 2e-3, 0.5], [-1e-3, -1e-3, -0.7]])
    mask = t([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    adv = t([[2.0, 2.0, 2.0], [1.0, 1.0, 0.0], [-1.0, -1.0, 0.0]])
    return logp, torch.zeros_like(logp), adv, mask


def test_gspo_sequence_ratio_clipped_and_constant_over_tokens():
    # row 0: −2·e^{1e-4} = −2.00020001 on every valid token
    # row 1: A > 0, s1 above 1+ε_high → −1·1.0004 = −1.0004
    # row 2: A < 0, s2 below 1−ε_low → −min(−0.9990005, −0.9997) = 0.9997
    logp, logp_old, adv, mask = _gspo_batch()
    loss, metrics = POLICY_LOSSES.get("gspo")(logp, logp_old, adv, mask, GSPO_CFG)
    r0 = -2.0 * math.exp(1e-4)
    assert abs(r0 - (-2.00020001)) < 1e-8
    assert_close(loss, t([[r0, r0, r0], [-1.0004, -1.0004, 0.0], [0.9997, 0.9997, 0.0]]))
    # clipped sequences 1 and 2 cover 4 of the 7 valid tokens
    assert metrics["policy/clip_frac"].item() == pytest.approx(4 / 7)


def test_gspo_uses_mean_token_advantage_of_the_sequence():
    # A over valid tokens [1, 3] → A_i = 2; log ratios [0, 0] → s = 1 → ℓ = −2 on both valid tokens
    logp = t([[0.0, 0.0, 0.0]])
    adv = t([[1.0, 3.0, 100.0]])
    mask = t([[1.0, 1.0, 0.0]])
    loss, _ = POLICY_LOSSES.get("gspo")(logp, logp.clone(), adv, mask, GSPO_CFG)
    assert_close(loss, t([[-2.0, -2.0, 0.0]]))


def test_gspo_gradient_with_seq_mean_token_mean():
    # J_i = −A_i·s_i with log s_i = (1/|y_i|) Σ_t log ρ_t; seq-mean-token-mean gives (1/N) Σ_i J_i.
    # row 0 unclipped: ∂/∂logp_t = −(1/N)·A_0·s_0/|y_0| = −(1/3)·2·e^{1e-4}/3; rows 1, 2 clipped → 0
    logp, logp_old, adv, mask = _gspo_batch()
    logp.requires_grad_(True)
    loss, _ = POLICY_LOSSES.get("gspo")(logp, logp_old, adv, mask, GSPO_CFG)
    aggregate(loss, mask, "seq-mean-token-mean").backward()
    g = -(1 / 3) * 2.0 * math.exp(1e-4) / 3
    assert_close(logp.grad, t([[g, g, g], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))


def test_gspo_token_same_forward_value_as_gspo_for_constant_advantages():
    logp, logp_old, adv, mask = _gspo_batch()
    loss_seq, m_seq = POLICY_LOSSES.get("gspo")(logp, logp_old, adv, mask, GSPO_CFG)
    loss_tok, m_tok = POLICY_LOSSES.get("gspo_token")(logp, logp_old, adv, mask, GSPO_CFG)
    r0 = -2.0 * math.exp(1e-4)
    expected = t([[r0, r0, r0], [-1.0004, -1.0004, 0.0], [0.9997, 0.9997, 0.0]])
    assert_close(loss_tok, expected)
    assert_close(loss_seq, expected)
    assert m_tok["policy/clip_frac"].item() == pytest.approx(4 / 7)


def test_gspo_token_gradient_carries_each_tokens_advantage():
    # GSPO-token (eq. 13): log s_{i,t} = sg[log s_i] + logp_t − sg[logp_t]; value s_i, and
    # ∂/∂logp_t [−A_t·s_{i,t}] = −A_t·s_i when unclipped (the sg[mean] contributes nothing).
    # row 0: s_0 = e^{1e-4}; A = [1, −2, 3] (token-level advantages) → grad = [−1, 2, −3]·e^{1e-4}
    # row 1: clipped sequence (s_1 > 1.0004) with A = [1, 1] > 0 → zero gradient; padding → 0
    logp, logp_old, _, mask = _gspo_batch()
    logp = logp.clone().requires_grad_(True)
    adv = t([[1.0, -2.0, 3.0], [1.0, 1.0, 0.0], [-1.0, -1.0, 0.0]])
    loss, _ = POLICY_LOSSES.get("gspo_token")(logp, logp_old, adv, mask, GSPO_CFG)
    s0 = math.exp(1e-4)
    assert_close(loss.detach()[0], t([-1.0 * s0, 2.0 * s0, -3.0 * s0]))
    loss.sum().backward()
    assert_close(logp.grad, t([[-1.0 * s0, 2.0 * s0, -3.0 * s0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))


def test_gspo_token_matches_gspo_gradient_for_constant_advantages():
    # with A constant over a sequence and seq-mean-token-mean, both give −(1/N)·A_i·s_i/|y_i| per token
    logp, logp_old, adv, mask = _gspo_batch()
    g = -(1 / 3) * 2.0 * math.exp(1e-4) / 3
    lp = logp.clone().requires_grad_(True)
    loss, _ = POLICY_LOSSES.get("gspo_token")(lp, logp_old, adv, mask, GSPO_CFG)
    aggregate(loss, mask, "seq-mean-token-mean").backward()
    assert_close(lp.grad, t([[g, g, g], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))


# -- vanilla policy gradient ------------------------------------------------------------------------------------


def test_reinforce_loss_and_gradient():
    # ℓ = −A·logp: [−1·(−0.5), −(−2)·(−1), 0(padding)] = [0.5, −2, 0]; ∂ℓ/∂logp = −A on valid tokens
    logp = t([[-0.5, -1.0, -3.0]]).requires_grad_(True)
    logp_old = t([[-0.7, -1.0, -3.0]])
    adv = t([[1.0, -2.0, 4.0]])
    mask = t([[1.0, 1.0, 0.0]])
    loss, metrics = POLICY_LOSSES.get("reinforce")(logp, logp_old, adv, mask, AlgoConfig(policy_loss="reinforce"))
    assert_close(loss.detach(), t([[0.5, -2.0, 0.0]]))
    assert metrics["policy/clip_frac"].item() == 0.0
    loss.sum().backward()
    assert_close(logp.grad, t([[-1.0, 2.0, 0.0]]))


# -- truncated importance sampling (Yao et al. 2025) ---------------------------------------------------------


def test_truncated_is_weights():
    # min(exp(old − behaviour), C) with C = 2:
    #   old −1,   behav −1.5 → e^{0.5} = 1.648721
    #   old −0.5, behav −2.0 → e^{1.5} = 4.481689 → 2
    #   old −2,   behav −1.0 → e^{−1}  = 0.367879
    logp_old = t([[-1.0, -0.5, -2.0]]).requires_grad_(True)
    w = truncated_is_weights(logp_old, t([[-1.5, -2.0, -1.0]]), cap=2.0)
    assert not w.requires_grad
    assert_close(w, t([[1.6487212707, 2.0, 0.3678794412]]))


# -- bounded log-ratio: exp(log ρ) never overflows (verl clamps log ρ to ±20) ---------------------------------

RATIO_LOSSES = ["ppo_clip", "gspo", "gspo_token"]


@pytest.mark.parametrize("name", RATIO_LOSSES + ["reinforce"])
@pytest.mark.parametrize("log_ratio", [100.0, -100.0])
@pytest.mark.parametrize("advantage", [0.0, 1.0, -1.0])
@pytest.mark.parametrize("dual_clip_c", [None, 3.0])
def test_extreme_log_ratio_gives_finite_loss_gradient_and_metrics(name, log_ratio, advantage, dual_clip_c):
    # float32, as in training: e^100 = inf, so before the clamp A = 0 gave 0·inf = NaN and A < 0 (no dual
    # clip) an infinite loss; the gradient was NaN in every case with log ρ = 100.
    logp_old = torch.tensor([[-3.0, -2.0, -1.0], [-0.5, -1.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    logp = (logp_old + log_ratio * mask).requires_grad_(True)
    adv = torch.full((2, 3), advantage) * mask
    cfg = AlgoConfig(policy_loss=name, dual_clip_c=dual_clip_c)
    loss, metrics = POLICY_LOSSES.get(name)(logp, logp_old, adv, mask, cfg)
    assert torch.isfinite(loss).all()
    aggregate(loss, mask, "token-mean").backward()
    assert torch.isfinite(logp.grad).all()
    assert all(torch.isfinite(v) for v in metrics.values()), metrics
    assert metrics["policy/ratio_clamped_frac"].item() == 1.0  # every valid token is out of the bound


def test_ratio_clamped_frac_is_a_token_mean_over_the_mask():
    # valid log-ratios [100, 0.1, −100, 25 | −19.9, 0, 50]: 100, −100, 25, 50 are beyond ±20 → 4 of 7;
    # the padding (1000) is not counted.
    log_ratio = torch.tensor([[100.0, 0.1, -100.0, 25.0], [-19.9, 0.0, 50.0, 1000.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    _, metrics = POLICY_LOSSES.get("ppo_clip")(log_ratio, torch.zeros(2, 4), torch.ones(2, 4), mask, AlgoConfig())
    assert metrics["policy/ratio_clamped_frac"].item() == pytest.approx(4 / 7)
    # the ratio metrics see the bounded ratio: mean of e^{20}, e^{0.1}, e^{−20}, e^{20}, e^{−19.9}, 1, e^{20}
    expected = (3 * math.exp(20) + math.exp(0.1) + math.exp(-20) + math.exp(-19.9) + 1) / 7
    assert metrics["policy/ratio_mean"].item() == pytest.approx(expected, rel=1e-6)
    # GSPO counts a sequence's tokens when its mean log-ratio is out of the bound: the row means 6.275 and
    # 10.03 are inside; × 4 (25.1, 40.1) both are out, all 7 tokens
    _, metrics = POLICY_LOSSES.get("gspo")(log_ratio * 4, torch.zeros(2, 4), torch.ones(2, 4), mask, AlgoConfig())
    assert metrics["policy/ratio_clamped_frac"].item() == pytest.approx(1.0)
    _, metrics = POLICY_LOSSES.get("gspo")(log_ratio, torch.zeros(2, 4), torch.ones(2, 4), mask, AlgoConfig())
    assert metrics["policy/ratio_clamped_frac"].item() == 0.0


@pytest.mark.parametrize("name", RATIO_LOSSES)
@pytest.mark.parametrize("dual_clip_c", [None, 3.0])
def test_bound_leaves_the_normal_range_bit_for_bit(name, dual_clip_c):
    # |log ρ| < 20: loss and gradient are exactly those of the unbounded formula exp(log ρ).
    gen = torch.Generator().manual_seed(0)
    logp_old = -5 * torch.rand(6, 5, generator=gen)
    log_ratio = (torch.rand(6, 5, generator=gen) * 2 - 1) * torch.tensor([0.01, 0.3, 2.0, 10.0, 19.9])
    adv = torch.randn(6, 5, generator=gen)
    mask = (torch.rand(6, 5, generator=gen) > 0.2).float()
    cfg = AlgoConfig(policy_loss=name, clip_low=0.2, clip_high=0.28, dual_clip_c=dual_clip_c)

    def unbounded(logp: torch.Tensor) -> torch.Tensor:  # the pre-clamp formulas, written out
        if name == "ppo_clip":
            return clipped_surrogate(((logp - logp_old) * mask).exp(), adv, cfg)[0] * mask
        seq = ((logp - logp_old) * mask).sum(1) / mask.sum(1).clamp(min=1)
        if name == "gspo":
            seq_adv = (adv * mask).sum(1) / mask.sum(1).clamp(min=1)
            return clipped_surrogate(seq.exp(), seq_adv, cfg)[0][:, None] * mask
        return clipped_surrogate((seq.detach()[:, None] + logp - logp.detach()).exp(), adv, cfg)[0] * mask

    logp_a = (logp_old + log_ratio).requires_grad_(True)
    logp_b = (logp_old + log_ratio).requires_grad_(True)
    loss_a, metrics = POLICY_LOSSES.get(name)(logp_a, logp_old, adv, mask, cfg)
    loss_b = unbounded(logp_b)
    assert torch.equal(loss_a, loss_b)
    loss_a.sum().backward()
    loss_b.sum().backward()
    assert torch.equal(logp_a.grad, logp_b.grad)
    assert metrics["policy/ratio_clamped_frac"].item() == 0.0


def test_truncated_is_weights_extreme_log_ratios():
    # e^{100} is inf in float32 and would still have been capped, but the weight is now computed from the
    # bounded log-ratio; −100 gives ~0, and a NaN log-prob stays NaN (visible, not hidden).
    w = truncated_is_weights(torch.tensor([100.0, -100.0, float("nan"), 0.5]), torch.zeros(4), cap=2.0)
    assert w[0].item() == 2.0
    assert 0.0 <= w[1].item() < 1e-8
    assert math.isnan(w[2].item())
    assert w[3].item() == pytest.approx(math.exp(0.5))


def test_nan_logp_is_not_hidden_by_the_bound():
    logp = torch.tensor([[float("nan"), -1.0]])
    loss, _ = POLICY_LOSSES.get("ppo_clip")(logp, torch.tensor([[-1.0, -1.0]]), torch.ones(1, 2), torch.ones(1, 2),
                                            AlgoConfig())
    assert math.isnan(loss[0, 0].item()) and loss[0, 1].item() == -1.0
