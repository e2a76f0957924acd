"""The paper variants on the shaping axis (mmrl/algos/variants/shaping.py): golden numbers on hand-built
groups, degenerate cases (zero std, empty masks, missing inputs), and composition of every variant with
clip-higher / dual-clip PPO and every loss aggregation."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from mmrl.algos import ADVANTAGE_ESTIMATORS, AGGREGATIONS, POLICY_LOSSES, SHAPING_HOOKS, AdvantageInputs, AlgoConfig
from mmrl.algos import ShapingContext, aggregate
from mmrl.algos.variants.shaping import confidence_shift, focal_weight

# all-correct [1, 1, 1, 1], all-wrong [0, 0, 0, 0], mixed [1, 0, 0, 0], a single rollout [1]
OUTCOME = torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 1])
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3])
N, T = len(OUTCOME), 3


def make_mask() -> torch.Tensor:
    mask = torch.ones(N, T)
    mask[1, 2] = mask[5, 1:] = mask[9, 2] = 0.0  # padding in every kind of group
    return mask


def context(entropy=None, ref_shift: torch.Tensor | None = None, mask=None) -> ShapingContext:
    mask = make_mask() if mask is None else mask
    logp_old = torch.linspace(-2.0, -0.1, N * T).reshape(N, T) * mask
    ref_logp = None if ref_shift is None else (logp_old - ref_shift) * mask
    return ShapingContext(outcome=OUTCOME, rewards=OUTCOME, group_id=GROUPS, mask=mask, logp_old=logp_old,
                          ref_logp=ref_logp, entropy=entropy)


def grpo(ctx: ShapingContext) -> torch.Tensor:
    adv, _ = ADVANTAGE_ESTIMATORS.get("grpo")(AdvantageInputs(ctx.rewards, ctx.mask, ctx.group_id), AlgoConfig())
    return adv


def shape(name: str, adv: torch.Tensor, ctx: ShapingContext, **extra) -> torch.Tensor:
    out = SHAPING_HOOKS.get(name)(adv, ctx, AlgoConfig(shaping=(name,), extra=extra))
    assert out.shape == adv.shape and torch.isfinite(out).all()
    assert torch.all(out[ctx.mask == 0] == 0), "padding must carry no advantage"
    return out


# -- F-GRPO ----------------------------------------------------------------------------------------------


def test_f_grpo_golden():
    ctx = context()
    adv = grpo(ctx)
    out = shape("f_grpo", adv, ctx, f_grpo={"gamma": 2.0})
    # mixed [1, 0, 0, 0]: μ = 0.25, σ = 0.5 → A = [1.5, −0.5, −0.5, −0.5]; g = (1 − 0.25)² = 0.5625
    assert_close(out[8:12, 0], torch.tensor([1.5, -0.5, -0.5, -0.5]) * 0.5625, atol=1e-5, rtol=0)
    # uniform groups: A = 0 stays 0; the single rollout (p̂ = 1) is scaled to 0
    assert torch.all(out[:8] == 0) and torch.all(out[12] == 0)
    assert_close(focal_weight(OUTCOME, GROUPS, 1.0)[[0, 4, 8, 12]], torch.tensor([0.0, 1.0, 0.75, 0.0]))


def test_f_grpo_gamma_zero_is_identity_and_negative_gamma_raises():
    ctx = context()
    adv = grpo(ctx)
    assert_close(shape("f_grpo", adv, ctx, f_grpo={"gamma": 0.0}), adv)
    with pytest.raises(ValueError, match="gamma must be >= 0"):
        shape("f_grpo", adv, ctx, f_grpo={"gamma": -1.0})


# -- ACE -------------------------------------------------------------------------------------------------


def test_ace_scales_negative_advantages_by_softplus_of_the_confidence_shift():
    shift = torch.zeros(N, T)
    shift[9] = torch.tensor([1.0, 1.0, 0.0])  # row 9 (a wrong answer, A = −0.5): c = 2 over its 2 tokens
    ctx = context(ref_shift=shift)
    adv = grpo(ctx)
    out = shape("ace", adv, ctx, ace={"alpha": 1.0})
    assert_close(confidence_shift(ctx.logp_old, ctx.ref_logp, ctx.mask, False)[9], torch.tensor(2.0))
    assert_close(out[9, :2], torch.full((2,), -0.5 * (1 + math.log1p(math.e ** 2))), atol=1e-5, rtol=0)
    # c = 0: softplus(0) = ln 2
    assert_close(out[10], torch.full((T,), -0.5 * (1 + math.log(2.0))), atol=1e-5, rtol=0)
    assert_close(out[8], adv[8])  # the positive advantage is unchanged
    # length-normalised shift: c = 1 for row 9
    out = shape("ace", adv, ctx, ace={"alpha": 1.0, "length_normalize": True})
    assert_close(out[9, 0], torch.tensor(-0.5 * (1 + math.log1p(math.e))), atol=1e-5, rtol=0)


def test_ace_needs_reference_log_probs():
    with pytest.raises(ValueError, match="reference log-probs"):
        shape("ace", grpo(context()), context())


# -- RL-ZVP ----------------------------------------------------------------------------------------------


def test_rl_zvp_golden():
    entropy = torch.arange(N * T, dtype=torch.float32).reshape(N, T) / 10.0
    ctx = context(entropy=entropy * make_mask())
    adv = grpo(ctx)
    out = shape("rl_zvp", adv, ctx, rl_zvp={"alpha": 0.5})
    # all-correct row 0: +α·H = 0.5·[0, 0.1, 0.2]
    assert_close(out[0], torch.tensor([0.0, 0.05, 0.1]))
    # all-wrong row 4 (H = [1.2, 1.3, 1.4]): −α·(max H − H) = −0.5·[0.2, 0.1, 0]
    assert_close(out[4], torch.tensor([-0.1, -0.05, 0.0]))
    # all-wrong row 5 with one valid token: max H − H = 0
    assert_close(out[5], torch.zeros(T))
    # the mixed group keeps GRPO's advantages; a single rollout (std 0, correct) counts as all-correct
    assert_close(out[8:12], adv[8:12])
    assert_close(out[12], 0.5 * entropy[12])


def test_rl_zvp_leaves_constant_intermediate_scores_alone_and_needs_entropy():
    outcome = torch.tensor([0.5, 0.5])
    ctx = ShapingContext(outcome=outcome, rewards=outcome, group_id=torch.tensor([0, 0]), mask=torch.ones(2, 2),
                         logp_old=torch.zeros(2, 2), ref_logp=None, entropy=torch.ones(2, 2))
    assert torch.equal(shape("rl_zvp", torch.zeros(2, 2), ctx), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="behaviour entropy"):
        shape("rl_zvp", grpo(context()), context())


# -- divergence-weighted ---------------------------------------------------------------------------------


def test_divergence_weighted_golden():
    shift = torch.zeros(N, T)
    shift[8, 0] = math.log(2.0)  # log π_old − log π_ref = ln 2 on one token
    ctx = context(ref_shift=shift)
    adv = grpo(ctx)
    # k3 with q = log π_ref − log π_old = −ln 2: e^q − q − 1 = 0.5 + ln 2 − 1
    d = 0.5 + math.log(2.0) - 1.0
    out = shape("divergence_weighted", adv, ctx, divergence_weighted={"coef": 2.0, "normalize": False})
    assert_close(out[8, 0], adv[8, 0] * (1 + 2.0 * d), atol=1e-5, rtol=0)
    assert_close(out[8, 1:], adv[8, 1:])
    # normalised by the mean d over valid tokens (one token of 34 carries d): weight 1 + β·34
    valid = make_mask().sum().item()
    out = shape("divergence_weighted", adv, ctx, divergence_weighted={"coef": 1.0})
    assert_close(out[8, 0], adv[8, 0] * (1 + valid), atol=1e-3, rtol=1e-5)


def test_divergence_weighted_is_identity_on_policy():
    ctx = context(ref_shift=torch.zeros(N, T))
    adv = grpo(ctx)
    assert_close(shape("divergence_weighted", adv, ctx), adv)


# -- bounded entropy bonus (MSSR) --------------------------------------------------------------------------


def test_entropy_bonus_golden_and_never_flips_the_sign():
    entropy = torch.full((N, T), 2.0) * make_mask()
    ctx = context(entropy=entropy)
    adv = grpo(ctx)
    out = shape("entropy_bonus", adv, ctx, entropy_bonus={"alpha": 0.4, "kappa": 2.0})
    # mixed group: A = 1.5 → + min(0.8, 0.75) = 2.25; A = −0.5 → + min(0.8, 0.25) = −0.25
    assert_close(out[8, 0], torch.tensor(2.25), atol=1e-5, rtol=0)
    assert_close(out[10, 0], torch.tensor(-0.25), atol=1e-5, rtol=0)
    assert torch.all(torch.sign(out) * torch.sign(adv) >= 0)
    with pytest.raises(ValueError, match="kappa > 1"):
        shape("entropy_bonus", adv, ctx, entropy_bonus={"kappa": 1.0})


# -- degenerate inputs --------------------------------------------------------------------------------------

ENTROPY = torch.rand(N, T, generator=torch.Generator().manual_seed(0))
SHIFT = 0.3 * torch.randn(N, T, generator=torch.Generator().manual_seed(1))
HOOKS = ["f_grpo", "ace", "rl_zvp", "divergence_weighted", "entropy_bonus"]


@pytest.mark.parametrize("hook", HOOKS)
def test_empty_masks_give_zero_not_nan(hook):
    mask = torch.zeros(N, T)
    ctx = context(entropy=ENTROPY * mask, ref_shift=SHIFT, mask=mask)
    assert torch.equal(shape(hook, torch.zeros(N, T), ctx), torch.zeros(N, T))


# -- composition with clip-higher / dual-clip and every aggregation ------------------------------------------


@pytest.mark.parametrize("aggregation", AGGREGATIONS.names())
@pytest.mark.parametrize("clip", [{"clip_high": 0.28}, {"clip_high": 0.28, "dual_clip_c": 3.0}])
@pytest.mark.parametrize("hook", HOOKS)
def test_composes_with_ppo_clip_and_every_aggregation(hook, clip, aggregation):
    """On-policy, ppo_clip's gradient is −A' per token whatever the clip settings, so the aggregated loss
    has the gradient of the aggregated −A'·log π; off-policy tokens outside [1 − ε_low, 1 + ε_high] get none."""
    mask = make_mask()
    ctx = context(entropy=ENTROPY * mask, ref_shift=SHIFT * mask)
    cfg = AlgoConfig(shaping=(hook,), loss_agg=aggregation, **clip)
    adv = SHAPING_HOOKS.get(hook)(grpo(ctx), ctx, cfg)
    logp = ctx.logp_old.clone().requires_grad_(True)
    loss, _ = POLICY_LOSSES.get("ppo_clip")(logp, ctx.logp_old, adv, mask, cfg)
    aggregate(loss, mask, aggregation).backward()
    reference = ctx.logp_old.clone().requires_grad_(True)
    aggregate(-adv * reference * mask, mask, aggregation).backward()
    assert_close(logp.grad, reference.grad)
    # move every token's ratio to 1.5 (> 1 + ε_high): tokens with A' > 0 lose their gradient
    moved = (ctx.logp_old + math.log(1.5)).requires_grad_(True)
    loss, metrics = POLICY_LOSSES.get("ppo_clip")(moved, ctx.logp_old, adv, mask, cfg)
    aggregate(loss, mask, aggregation).backward()
    assert torch.all(moved.grad[(adv > 0) & (mask > 0)] == 0)
    assert torch.isfinite(metrics["policy/clip_frac"])
