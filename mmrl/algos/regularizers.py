"""Regularisers: KL-to-reference estimators, entropy, and the PPO value loss.

KL estimators (Schulman 2020, "Approximating KL divergence") take per-token log-probs of the
*sampled* tokens under the current policy (``logp``, with grad) and the reference (``ref_logp``)
and estimate KL(π_θ ‖ π_ref) per token ([N, T] → [N, T]).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.nn import functional as F

from mmrl.algos.losses import bounded_log_ratio
from mmrl.algos.masked import masked_mean
from mmrl.core.registry import Registry

KLFn = Callable[[Tensor, Tensor], Tensor]
KL_ESTIMATORS: Registry[KLFn] = Registry("KL estimator")


@KL_ESTIMATORS.register("k1")
def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 = log π_θ − log π_ref (unbiased, high variance, can be negative)."""
    return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 = ½ (log π_θ − log π_ref)²."""
    return 0.5 * (logp - ref_logp) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 = e^q − q − 1 with q = log π_ref − log π_θ (unbiased, ≥ 0; GRPO eq. 4).

    q is bounded to ±20 before the exponent, as every policy ratio (``bounded_log_ratio``): e^q
    overflows float32 past q = 88.7 and the loss would be inf. Unlike ``low_var_kl`` the result is
    not clamped.
    """
    q = bounded_log_ratio(ref_logp - logp)
    return torch.expm1(q) - q


@KL_ESTIMATORS.register("low_var_kl")
def kl_low_var(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 with q clamped to [−20, 20] and the result to [−10, 10] (verl / EasyR1 ``low_var_kl``)."""
    q = (ref_logp - logp).clamp(-20.0, 20.0)
    return (torch.expm1(q) - q).clamp(-10.0, 10.0)


def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: str) -> Tensor:
    return KL_ESTIMATORS.get(estimator)(logp, ref_logp)


def drift_gate(drift: float, threshold: float) -> float:
    """Weight of VLA-RFT's behaviour-cloning regulariser (Li et al. 2025, ``dp_actor.py`` ``use_mse_loss``):
    clamp(drift / threshold, 0, 1): off while the policy stays near its reference, ramping in linearly as
    the KL ``drift`` grows, full from ``threshold`` on (VLA-RFT: 0.2).

    >>> drift_gate(0.05, 0.2), drift_gate(-0.01, 0.2), drift_gate(0.5, 0.2)
    (0.25, 0.0, 1.0)
    """
    if threshold <= 0:
        raise ValueError(f"drift threshold must be > 0, got {threshold}")
    return float(min(max(drift / threshold, 0.0), 1.0))


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the categorical distribution per position ([..., V] → [...])."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def value_loss(values: Tensor, values_old: Tensor, returns: Tensor, mask: Tensor,
               clip: float | None, huber_delta: float | None) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO value loss (per token [N, T]): max(e(V), e(V_clip)) with V_clip = V_old + clip(V − V_old, ±c)
    and e(v) = ½(v − R)² or Huber_δ(v − R) (Schulman et al. 2017 baselines; verl ``compute_value_loss``).
    """

    def err(v: Tensor) -> Tensor:
        if huber_delta is None:
            return 0.5 * (v - returns) ** 2
        return F.huber_loss(v, returns, reduction="none", delta=huber_delta)

    loss = err(values)
    clip_frac = torch.zeros((), device=values.device)
    if clip is not None:
        clipped_values = values_old + (values - values_old).clamp(-clip, clip)
        clipped_loss = err(clipped_values)
        clip_frac = masked_mean((clipped_loss > loss).float(), mask)
        loss = torch.maximum(loss, clipped_loss)
    metrics = {"value/clip_frac": clip_frac.detach(),
               "value/explained_var": explained_variance(values.detach(), returns, mask)}
    return loss * mask, metrics


def explained_variance(pred: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """1 − Var[target − pred] / Var[target] over valid entries (1 is perfect, ≤ 0 is useless)."""
    var_target = masked_mean((target - masked_mean(target, mask)) ** 2, mask)
    resid = target - pred
    var_resid = masked_mean((resid - masked_mean(resid, mask)) ** 2, mask)
    return 1.0 - var_resid / var_target.clamp(min=1e-8)
