"""Golden numbers for the KL estimators, entropy, value loss and explained variance
(mmrl/algos/regularizers.py). KL estimators follow Schulman (2020), "Approximating KL divergence".
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from mmrl.algos.regularizers import KL_ESTIMATORS, entropy_from_logits, explained_variance, kl_penalty, value_loss

F64 = torch.float64


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


# logp = −1, ref = −2 → q = ref − logp = −1;  logp = −2, ref = −1 → q = +1;  logp = ref → q = 0
LOGP = t([[-1.0, -2.0, -0.5]])
REF = t([[-2.0, -1.0, -0.5]])


def test_k1():
    # k1 = logp − ref: [1, −1, 0] (can be negative)
    assert_close(KL_ESTIMATORS.get("k1")(LOGP, REF), t([[1.0, -1.0, 0.0]]))


def test_k2():
    # k2 = ½(logp − ref)²: [0.5, 0.5, 0]
    assert_close(KL_ESTIMATORS.get("k2")(LOGP, REF), t([[0.5, 0.5, 0.0]]))


def test_k3():
    # k3 = e^q − q − 1:  q = −1 → e^{−1} + 1 − 1 = 0.3678794412;  q = 1 → e − 2 = 0.7182818285;  q = 0 → 0
    assert_close(KL_ESTIMATORS.get("k3")(LOGP, REF), t([[0.3678794412, 0.7182818285, 0.0]]))


def test_low_var_kl_equals_k3_inside_the_clamps():
    assert_close(KL_ESTIMATORS.get("low_var_kl")(LOGP, REF), t([[0.3678794412, 0.7182818285, 0.0]]))


def test_low_var_kl_clamps():
    # ref − logp = 30 → q clamped to 20 → e^{20} − 21 ≈ 4.85e8 → result clamped to 10
    # ref − logp = −30 → q clamped to −20 → e^{−20} + 20 − 1 ≈ 19 → clamped to 10
    # ref − logp = 3 → q = 3 → e^3 − 4 = 16.0855 → clamped to 10;  q = 2 → e² − 3 = 4.3890561 (kept)
    logp = t([0.0, 0.0, 0.0, 0.0])
    ref = t([30.0, -30.0, 3.0, 2.0])
    assert_close(KL_ESTIMATORS.get("low_var_kl")(logp, ref), t([10.0, 10.0, 10.0, 4.3890560989]))
    # plain k3 is not clamped: q = 2 → 4.3890560989, q = 3 → 16.0855369232
    assert_close(KL_ESTIMATORS.get("k3")(logp[2:], ref[2:]), t([16.0855369232, 4.3890560989]))


def test_k3_is_non_negative():
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(64, 16, generator=gen, dtype=F64) * 3
    ref = torch.randn(64, 16, generator=gen, dtype=F64) * 3
    assert (KL_ESTIMATORS.get("k3")(logp, ref) >= 0).all()
    assert (KL_ESTIMATORS.get("low_var_kl")(logp, ref) >= 0).all()


def test_kl_penalty_dispatches_by_name():
    assert_close(kl_penalty(LOGP, REF, "k2"), t([[0.5, 0.5, 0.0]]))


def test_k3_gradient():
    # ∂k3/∂logp = ∂(e^{ref−logp} − (ref − logp) − 1)/∂logp = −e^q + 1: q = −1 → 1 − e^{−1} = 0.6321205588
    logp = t([-1.0]).requires_grad_(True)
    KL_ESTIMATORS.get("k3")(logp, t([-2.0])).sum().backward()
    assert_close(logp.grad, t([0.6321205588]))


def test_k3_is_finite_for_extreme_log_ratios():
    # float32: e^{100} = inf. q is bounded to ±20 before the exponent (the policy ratio's bound):
    # q = 100 → e^{20} − 20 − 1, q = −100 → e^{−20} + 20 − 1; the result itself is not clamped.
    logp = torch.tensor([-100.0, 0.0, -1.0]).requires_grad_(True)
    ref = torch.tensor([0.0, -100.0, -2.0])
    kl = KL_ESTIMATORS.get("k3")(logp, ref)
    assert torch.isfinite(kl).all()
    assert kl[0].item() == pytest.approx(math.exp(20) - 21, rel=1e-6)
    assert kl[1].item() == pytest.approx(math.exp(-20) + 19, rel=1e-6)
    assert kl[2].item() == pytest.approx(0.3678794412, rel=1e-6)  # inside the bound: unchanged
    kl.sum().backward()
    assert torch.isfinite(logp.grad).all()


# -- entropy ---------------------------------------------------------------------------------------------------


def test_entropy_of_uniform_logits_is_log_v():
    # V = 4 uniform: H = −Σ ¼·log ¼ = log 4 = 1.3862943611
    logits = torch.full((2, 3, 4), 0.7)
    assert_close(entropy_from_logits(logits), torch.full((2, 3), 1.3862943611))


def test_entropy_of_a_skewed_distribution():
    # p = [½, ¼, ¼]: H = ½·log 2 + 2·¼·log 4 = ½ log 2 + log 2 = 1.5·log 2 = 1.0397207708
    logits = torch.tensor([math.log(0.5), math.log(0.25), math.log(0.25)]) + 3.0  # shift-invariant
    assert entropy_from_logits(logits).item() == pytest.approx(1.0397207708, abs=1e-6)


# -- value loss ------------------------------------------------------------------------------------------------


def test_value_loss_clipped_branch():
    # ½·max((V − R)², (V_clip − R)²), V_clip = V_old + clip(V − V_old, −0.2, 0.2); V_old = 1, R = 2
    #   V = 1.5:  (0.5)² = 0.25;  V_clip = 1.2, (−0.8)² = 0.64 → ½·0.64 = 0.32   (clipped branch active)
    #   V = 1.1:  inside: (−0.9)² = 0.81 → 0.405                                 (not active)
    #   V = 3.0:  (1)² = 1;  V_clip = 1.2, 0.64 → max = 1 → 0.5                   (unclipped larger)
    values = t([[1.5, 1.1, 3.0, 7.0]])
    values_old = t([[1.0, 1.0, 1.0, 0.0]])
    returns = t([[2.0, 2.0, 2.0, 0.0]])
    mask = t([[1.0, 1.0, 1.0, 0.0]])
    loss, metrics = value_loss(values, values_old, returns, mask, clip=0.2, huber_delta=None)
    assert_close(loss, t([[0.32, 0.405, 0.5, 0.0]]))
    assert metrics["value/clip_frac"].item() == pytest.approx(1 / 3)


def test_value_loss_without_clip():
    # ½(V − R)²: V = 1.5, R = 2 → 0.125;  V = 3, R = 2 → 0.5
    loss, metrics = value_loss(t([1.5, 3.0]), t([1.0, 1.0]), t([2.0, 2.0]), t([1.0, 1.0]), clip=None,
                               huber_delta=None)
    assert_close(loss, t([0.125, 0.5]))
    assert metrics["value/clip_frac"].item() == 0.0


def test_value_loss_huber():
    # Huber δ = 1: |x| ≤ δ → ½x²;  else δ(|x| − ½δ)
    #   V = 5,   R = 2: x = 3   → 1·(3 − 0.5) = 2.5
    #   V = 2.5, R = 2: x = 0.5 → ½·0.25 = 0.125
    #   V = −1,  R = 2: x = −3  → 2.5
    values = t([5.0, 2.5, -1.0])
    loss, _ = value_loss(values, values.clone(), t([2.0, 2.0, 2.0]), t([1.0, 1.0, 1.0]), clip=None, huber_delta=1.0)
    assert_close(loss, t([2.5, 0.125, 2.5]))


def test_value_loss_huber_with_clip():
    # V_old = 1, V = 5, R = 2, clip 0.2: V_clip = 1.2; Huber(5 − 2 = 3) = 2.5, Huber(1.2 − 2 = −0.8) = 0.32
    # → max = 2.5 (unclipped larger)
    loss, metrics = value_loss(t([5.0]), t([1.0]), t([2.0]), t([1.0]), clip=0.2, huber_delta=1.0)
    assert_close(loss, t([2.5]))
    assert metrics["value/clip_frac"].item() == 0.0


def test_value_loss_gradient_zero_on_clipped_branch():
    # V = 1.5 (clipped branch active, V_clip constant in V) → 0;  V = 1.1 → ∂½(V − R)²/∂V = V − R = −0.9
    values = t([1.5, 1.1]).requires_grad_(True)
    loss, _ = value_loss(values, t([1.0, 1.0]), t([2.0, 2.0]), t([1.0, 1.0]), clip=0.2, huber_delta=None)
    loss.sum().backward()
    assert_close(values.grad, t([0.0, -0.9]))


# -- explained variance -----------------------------------------------------------------------------------------


def test_explained_variance():
    target = t([1.0, 2.0, 3.0, 100.0])
    mask = t([1.0, 1.0, 1.0, 0.0])
    # perfect prediction → 1
    assert explained_variance(target.clone(), target, mask).item() == pytest.approx(1.0)
    # constant prediction at the mean → Var[R − V] = Var[R] → 0
    assert explained_variance(t([2.0, 2.0, 2.0, 0.0]), target, mask).item() == pytest.approx(0.0)
    # V = [1, 2, 4]: residual [0, 0, −1], mean −1/3, Var = (1/9 + 1/9 + 4/9)/3 = 2/9; Var[R] = 2/3
    # → 1 − (2/9)/(2/3) = 1 − 1/3 = 2/3
    assert explained_variance(t([1.0, 2.0, 4.0, -50.0]), target, mask).item() == pytest.approx(2 / 3)


def test_drift_gate_ramps_from_zero_to_one_at_the_threshold():
    from mmrl.algos.regularizers import drift_gate

    # VLA-RFT's clamp((KL − 0) / (0.2 − 0), 0, 1)
    assert [drift_gate(kl, 0.2) for kl in (-0.1, 0.0, 0.05, 0.1, 0.2, 3.0)] == pytest.approx([0, 0, 0.25, 0.5, 1, 1])
    with pytest.raises(ValueError, match="threshold"):
        drift_gate(0.1, 0.0)
