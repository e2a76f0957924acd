"""Per-token policy objectives: ``(logp, logp_old, A, mask, cfg) -> (loss [N,T], metrics)``.

``logp`` [N, T] carries gradients (current policy); ``logp_old`` [N, T] is the behaviour ("old")
policy's log-prob of the same decisions; ``A`` [N, T] the advantages. The returned per-token
loss is *minimised*; aggregation to a scalar is a separate axis (``aggregation.py``).
Metrics are detached scalars averaged over valid tokens.

Every ratio is exp(log ρ) with log ρ clamped to ±``LOG_RATIO_BOUND`` first (verl
``compute_policy_loss``): exp overflows float32 past 88.7, and an infinite ratio makes the loss
NaN (A = 0: 0·∞) or infinite (A < 0). A clamped token carries no gradient (its ratio is already
e^±20, far outside any clip range); ``policy/ratio_clamped_frac`` reports how often it happens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from mmrl.algos.config import AlgoConfig
from mmrl.algos.masked import masked_mean
from mmrl.core.registry import Registry

PolicyLossFn = Callable[[Tensor, Tensor, Tensor, Tensor, AlgoConfig], tuple[Tensor, dict[str, Tensor]]]
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")

LOG_RATIO_BOUND = 20.0
"""|log ρ| is clamped to this before the exponent (verl: 20; e^20 ≈ 4.9e8, finite in float32)."""


def bounded_log_ratio(log_ratio: Tensor) -> Tensor:
    """log ρ clamped to [−LOG_RATIO_BOUND, LOG_RATIO_BOUND]; unchanged (bit for bit, gradient
    included) inside the bound, so ``exp`` of it is always finite. NaN stays NaN."""
    return log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def _ratio_metrics(log_ratio: Tensor, clipped: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """Metrics of the (unbounded) log-ratio: the clip and clamp fractions, k3 KL and mean ratio of
    the bounded one (finite whatever the log-ratio)."""
    log_ratio = log_ratio.detach()
    out_of_bound = log_ratio.abs() > LOG_RATIO_BOUND
    log_ratio = bounded_log_ratio(log_ratio)
    return {
        "policy/clip_frac": masked_mean(clipped.float(), mask),
        "policy/ratio_clamped_frac": masked_mean(out_of_bound.float(), mask),
        # k3 estimator of KL(π_old ‖ π_θ) on the old policy's samples (Schulman 2020).
        "policy/approx_kl": masked_mean(torch.expm1(log_ratio) - log_ratio, mask),
        "policy/ratio_mean": masked_mean(log_ratio.exp(), mask),
    }


def clipped_surrogate(ratio: Tensor, adv: Tensor, cfg: AlgoConfig) -> tuple[Tensor, Tensor]:
    """PPO-clip per-token loss with asymmetric bounds and optional dual clip.

    ℓ = −min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A)            (Schulman et al. 2017, eq. 7;
    for A < 0 and dual clip: ℓ = min(ℓ, −c·A)             DAPO clip-higher; Ye et al. 2020)
    Returns (loss, clipped) where ``clipped`` marks tokens whose gradient the clip removed.
    """
    unclipped = -adv * ratio
    clipped_loss = -adv * ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    loss = torch.maximum(unclipped, clipped_loss)
    clipped = clipped_loss > unclipped
    if cfg.dual_clip_c is not None:
        if cfg.dual_clip_c <= 1.0:
            raise ValueError(f"dual_clip_c must be > 1, got {cfg.dual_clip_c}")
        cap = -adv * cfg.dual_clip_c
        dual = (adv < 0) & (loss > cap)
        loss = torch.where(dual, cap, loss)
        clipped = clipped | dual
    return loss, clipped


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip_loss(logp: Tensor, logp_old: Tensor, adv: Tensor, mask: Tensor, cfg: AlgoConfig):
    """Token-level PPO-clip with ``clip_low``/``clip_high`` and optional ``dual_clip_c``."""
    log_ratio = (logp - logp_old) * mask
    loss, clipped = clipped_surrogate(bounded_log_ratio(log_ratio).exp(), adv, cfg)
    return loss * mask, _ratio_metrics(log_ratio, clipped, mask)


def _sequence_log_ratio(logp: Tensor, logp_old: Tensor, mask: Tensor) -> Tensor:
    """(1/|y_i|) Σ_t (log π_θ − log π_old) → [N]: the log of GSPO's length-normalised ratio s_i."""
    return ((logp - logp_old) * mask).sum(1) / mask.sum(1).clamp(min=1)


@POLICY_LOSSES.register("gspo")
def gspo_loss(logp: Tensor, logp_old: Tensor, adv: Tensor, mask: Tensor, cfg: AlgoConfig):
    """GSPO (Zheng et al. 2025, eq. 5–7): sequence ratio s_i = exp(mean_t log ρ_{i,t}), clipped to
    [1−ε_low, 1+ε_high] (paper: 3e-4 / 4e-4) with the sequence advantage A_i (the mean of A over the
    sequence's tokens). The per-sequence loss is placed on every valid token; aggregate with
    ``seq-mean-token-mean`` to get the paper's per-sequence average.
    """
    seq_log_ratio = _sequence_log_ratio(logp, logp_old, mask)  # [N]
    seq_adv = (adv * mask).sum(1) / mask.sum(1).clamp(min=1)  # [N]
    loss, clipped = clipped_surrogate(bounded_log_ratio(seq_log_ratio).exp(), seq_adv, cfg)  # [N]
    metrics = _ratio_metrics(seq_log_ratio[:, None].expand_as(mask), clipped[:, None].expand_as(mask), mask)
    return loss[:, None] * mask, metrics


@POLICY_LOSSES.register("gspo_token")
def gspo_token_loss(logp: Tensor, logp_old: Tensor, adv: Tensor, mask: Tensor, cfg: AlgoConfig):
    """GSPO-token (Zheng et al. 2025, eq. 13): log s_{i,t} = sg[log s_i] + log π_θ(y_t) − sg[log π_θ(y_t)].

    Same value as s_i on every token, but each token's gradient carries its own advantage A_{i,t}.
    """
    seq_log_ratio = _sequence_log_ratio(logp, logp_old, mask).detach()  # [N]
    token_log_ratio = seq_log_ratio[:, None] + logp - logp.detach()  # [N, T]
    loss, clipped = clipped_surrogate(bounded_log_ratio(token_log_ratio).exp(), adv, cfg)
    return loss * mask, _ratio_metrics(token_log_ratio * mask, clipped, mask)


@POLICY_LOSSES.register("reinforce")
def reinforce_loss(logp: Tensor, logp_old: Tensor, adv: Tensor, mask: Tensor, cfg: AlgoConfig):
    """Vanilla policy gradient (Williams 1992): ℓ = −A·log π_θ; no ratio, no clip.

    On-policy its gradient equals PPO's before any update; use one epoch per batch.
    """
    log_ratio = ((logp - logp_old) * mask).detach()
    return -adv * logp * mask, _ratio_metrics(log_ratio, torch.zeros_like(mask, dtype=torch.bool), mask)


def truncated_is_weights(logp_old: Tensor, logp_behaviour: Tensor, cap: float) -> Tensor:
    """Truncated importance weights min(π_old / π_behaviour, C), detached ([N, T]).

    ``logp_behaviour`` comes from the rollout engine (e.g. vLLM), ``logp_old`` from the trainer's
    own forward of the same weights; their mismatch biases the update (Yao et al. 2025, "Your
    efficient RL framework secretly brings you off-policy RL training"). Multiply per-token losses.
    The log-ratio is bounded (``bounded_log_ratio``) before the exponent, as every ratio here.
    """
    return torch.exp(bounded_log_ratio(logp_old - logp_behaviour)).clamp(max=cap).detach()


@POLICY_LOSSES.register("none")
def no_policy_loss(logp: Tensor, logp_old: Tensor, adv: Tensor, mask: Tensor, cfg: AlgoConfig):
    """No policy-gradient term (ℓ = 0, no gradient): the objective is entirely ``algo.loss_terms``
    (objectives that replace the surrogate, such as PACS or FRPO, which need whole groups). The ratio
    metrics are still reported."""
    log_ratio = ((logp - logp_old) * mask).detach()
    # 0·log π keeps the term in the graph, so a micro-batch whose loss terms add nothing still backpropagates.
    return logp * 0.0 * mask, _ratio_metrics(log_ratio, torch.zeros_like(mask, dtype=torch.bool), mask)
