"""Pure tensor functions of value-based fine-tuning: TD targets, Cal-QL's conservative term, the SAC actor
and temperature losses, Polyak averaging. Shapes: E ensemble members, B transitions, N sampled actions.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def td_target(rewards: Tensor, terminal: Tensor, next_q: Tensor, next_logp: Tensor, gamma: float,
              alpha: float) -> Tensor:
    """Clipped double-Q / min-ensemble soft TD target (Fujimoto et al. 2018, eq. 10; Haarnoja et al. 2018,
    eq. 3; REDQ, Chen et al. 2021, takes the min over a random subset of the target ensemble):

        y = r + γ (1 − d) ( min_{i ∈ M} Q̄_i(s', a') − α log π(a' | s') ),   a' ~ π(· | s')

    ``rewards``, ``terminal`` (d ∈ {0, 1}), ``next_logp``: [B]; ``next_q``: [|M|, B] the target members
    already chosen by the caller. ``alpha`` = 0 drops the entropy backup (CQL / Cal-QL's default). → [B].

    >>> td_target(torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([[2.0], [3.0]]), torch.tensor([0.5]), 0.5, 0.2)
    tensor([1.9500])
    """
    soft_value = next_q.min(dim=0).values - alpha * next_logp
    return rewards + gamma * (1.0 - terminal) * soft_value


def chunk_td_target(chunk_rewards: Tensor, terminal: Tensor, next_q: Tensor, next_logp: Tensor, gamma: float,
                    alpha: float) -> Tensor:
    """CO-RFT's chunked TD target (Chunked RL, seed #97; the n-step backup of Sutton & Barto §7.1 with the
    chunk as the n steps) for a Q over whole action chunks of c env steps, γ per env step:

        y = Σ_{k<c} γ^k r_{t+k} + γ^c (1 − d) ( min_{i ∈ M} Q̄_i(s_{t+c}, a') − α log π(a' | s_{t+c}) ),
        a' ~ π(· | s_{t+c}) a whole next chunk

    ``chunk_rewards``: [B, c] the env rewards inside each chunk (0 after an episode's end, where d = 1);
    the rest as :func:`td_target`, which this equals for c = 1. → [B].

    >>> chunk_td_target(torch.tensor([[1.0, 0.0, 2.0]]), torch.tensor([0.0]), torch.tensor([[4.0], [3.0]]),
    ...                 torch.tensor([0.0]), 0.5, 0.0)
    tensor([1.8750])
    """
    c = chunk_rewards.shape[1]
    discounts = gamma ** torch.arange(c, dtype=chunk_rewards.dtype, device=chunk_rewards.device)
    soft_value = next_q.min(dim=0).values - alpha * next_logp
    return (chunk_rewards * discounts).sum(1) + gamma ** c * (1.0 - terminal) * soft_value


def calql_penalty(q_data: Tensor, q_random: Tensor, q_policy: Tensor, logp_policy: Tensor | None,
                  q_next_policy: Tensor, logp_next_policy: Tensor | None, mc_returns: Tensor | None, action_dims: int,
                  temperature: float = 1.0) -> tuple[Tensor, dict[str, Tensor]]:
    """Cal-QL's calibrated conservative regulariser, per ensemble member (Nakamoto et al. 2023, "Cal-QL:
    Calibrated Offline RL Pre-Training for Efficient Online Fine-Tuning", eq. 5.2 / Alg. 1; CQL(H), Kumar et
    al. 2020, eq. 4 with the importance-sampled log-sum-exp of its appendix F):

        R_i = E_s[ τ · log Σ_{a ∈ 𝒜_s} exp( q̃_i(s, a) / τ ) ] − E_{(s,a) ∈ D}[ Q_i(s, a) ]

    with 𝒜_s = N uniform actions a ~ U[−1, 1]^D, N actions a ~ π(·|s) and N actions a ~ π(·|s'), each
    importance-weighted by its sampling density:

        q̃(s, a_unif) = Q(s, a_unif) + D log 2                        (density 2^−D)
        q̃(s, a_π)    = max(Q(s, a_π), V^μ(s)) − log π(a_π | s)        (likewise for a ~ π(·|s'))

    V^μ(s) is the Monte-Carlo discounted return-to-go of the data from s (Cal-QL's calibration: the
    pushed-down policy values never go below the reference policy's return; ``mc_returns`` None gives
    plain CQL(H)). The push-down only affects policy actions, as in Cal-QL's reference code.

    A deterministic actor (``logp_policy`` and ``logp_next_policy`` None: no density, e.g. a consistency
    policy) uses the log-mean-exp without importance weights over the 3N sampled actions and the data action,
    as the Cal-QL / ConRFT code does with ``cql_importance_sample`` off:

        push-down = τ · log( 1/(3N+1) · [ Σ_{a ∈ 𝒜_s} exp(q̃(s, a)/τ) + exp(Q(s, a_D)/τ) ] ),
        q̃ = Q (uniform), max(Q, V^μ) (policy actions)

    ``q_data``: [E, B] Q of the dataset actions; ``q_random``, ``q_policy``, ``q_next_policy``: [E, B, N];
    ``logp_policy``, ``logp_next_policy``: [B, N] (detached); ``mc_returns``: [B]. Returns R [E] (gradient
    through the Q values) and detached metrics.
    """
    if mc_returns is not None:
        bound = mc_returns[None, :, None]
        bounded = (q_policy < bound).float().mean() * 0.5 + (q_next_policy < bound).float().mean() * 0.5
        q_policy, q_next_policy = torch.maximum(q_policy, bound), torch.maximum(q_next_policy, bound)
    else:
        bounded = torch.zeros(())
    if logp_policy is None or logp_next_policy is None:
        if logp_policy is not None or logp_next_policy is not None:
            raise ValueError("calql_penalty: give both policy log-probs or neither (a deterministic actor)")
        pooled = torch.cat([q_random, q_next_policy, q_policy, q_data[..., None]], dim=2)  # [E, B, 3N + 1]
        push_down = temperature * (torch.logsumexp(pooled / temperature, dim=2) - math.log(pooled.shape[2]))
    else:
        weighted = torch.cat([q_random + action_dims * math.log(2.0), q_next_policy - logp_next_policy[None],
                              q_policy - logp_policy[None]], dim=2)  # [E, B, 3N]
        push_down = temperature * torch.logsumexp(weighted / temperature, dim=2)  # [E, B]
    penalty = push_down.mean(1) - q_data.mean(1)
    return penalty, {"critic/cql_logsumexp": push_down.detach().mean(), "critic/calql_bounded_frac": bounded.detach()}


def actor_loss(q_policy: Tensor, logp: Tensor, alpha: float, reduce: str = "min") -> Tensor:
    """SAC's actor objective (Haarnoja et al. 2018, eq. 7 with the reparameterisation of eq. 11), minimised:

        L_π = E_s[ α log π(ã | s) − Q(s, ã) ],   ã = μ(s) + σ(s) ε,   Q = min_i Q_i (clipped double Q) or mean_i

    ``q_policy``: [E, B] (gradient through ã); ``logp``: [B]. → scalar.

    >>> actor_loss(torch.tensor([[1.0, 2.0], [3.0, 0.0]]), torch.tensor([0.0, -1.0]), 0.5)
    tensor(-0.7500)
    """
    if reduce not in ("min", "mean"):
        raise ValueError(f"actor Q reduction must be 'min' or 'mean', got {reduce!r}")
    q = q_policy.min(dim=0).values if reduce == "min" else q_policy.mean(dim=0)
    return (alpha * logp - q).mean()


def temperature_loss(log_alpha: Tensor, logp: Tensor, target_entropy: float) -> Tensor:
    """SAC's automatic entropy tuning (Haarnoja et al. 2018b, "SAC: Algorithms and Applications", eq. 18, in
    log α as in its reference code): L(α) = −E[ log α · (log π(ã|s) + H̄) ], with the log-probs detached;
    α grows while the policy's entropy −E[log π] is below the target H̄.

    >>> temperature_loss(torch.tensor(0.5, requires_grad=True), torch.tensor([1.0, 2.0]), -2.0)
    tensor(0.2500, grad_fn=<NegBackward0>)
    """
    return -(log_alpha * (logp.detach() + target_entropy)).mean()


@torch.no_grad()
def polyak_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """θ̄ ← (1 − τ) θ̄ + τ θ for every parameter and floating buffer (Lillicrap et al. 2016, DDPG §7)."""
    for t, s in zip(target.parameters(), source.parameters(), strict=True):
        t.lerp_(s, tau)
    for t, s in zip(target.buffers(), source.buffers(), strict=True):
        if t.is_floating_point():
            t.lerp_(s, tau)


def tanh_gaussian_logprob(u: Tensor, mean: Tensor, log_std: Tensor) -> Tensor:
    """log density of e = tanh(u), u ~ N(mean, exp(log_std)²) per dimension, summed over the last axis
    (Haarnoja et al. 2018, app. C, eq. 21; log(1 − tanh² u) in the stable form 2(log 2 − u − softplus(−2u)) of
    SAC's reference code): [B, D] → [B].

    >>> round(tanh_gaussian_logprob(torch.tensor([[0.0]]), torch.tensor([[0.0]]), torch.tensor([[0.0]])).item(), 6)
    -0.918939
    """
    z = (u - mean) / log_std.exp()
    gaussian = (-0.5 * z ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    return gaussian - (2.0 * (math.log(2.0) - u - torch.nn.functional.softplus(-2.0 * u))).sum(-1)


def q_guided_choice(candidates: Tensor, q: Tensor, reduce: str = "min") -> tuple[Tensor, Tensor]:
    """EXPO's on-the-fly policy (Dong et al. 2025, "EXPO", the argmax over base and edited actions; EXPO-FT's
    Q-guided sampling over action chunks): of K candidate decisions per state, the one whose ensemble value
    (``reduce``: min or mean over the E members) is largest, the first on ties.

    ``candidates``: [B, K, D]; ``q``: [E, B, K] their values. → chosen [B, D], index [B] long.

    >>> chosen, index = q_guided_choice(torch.tensor([[[0.25], [0.5], [-0.75]]]), torch.tensor([[[1.0, 3.0, 2.0]],
    ...                                 [[1.0, 0.0, 2.0]]]))
    >>> chosen.tolist(), index.tolist()
    ([[-0.75]], [2])
    """
    if reduce not in ("min", "mean"):
        raise ValueError(f"selection Q reduction must be 'min' or 'mean', got {reduce!r}")
    value = q.min(dim=0).values if reduce == "min" else q.mean(dim=0)  # [B, K]
    index = value.argmax(dim=1)
    return candidates[torch.arange(len(index), device=candidates.device), index], index


def squashed_latent_logprob(u: Tensor, mean: Tensor, log_std: Tensor, bound: float) -> Tensor:
    """log density of DSRL's latent action w = b · tanh(u), u ~ N(mean, exp(log_std)²) per dimension, summed over
    the last axis: the tanh-Gaussian density (:func:`tanh_gaussian_logprob`) of tanh(u) less D log b, the scaling's
    log-Jacobian (the latent actor's bounded noise box [−b, b]^D): [B, D] → [B].

    At u = μ = 0, σ = 1, b = 2.5, one dimension: −½ ln 2π − ln 2.5 = −0.918939 − 0.916291:

    >>> round(squashed_latent_logprob(torch.tensor([[0.0]]), torch.tensor([[0.0]]), torch.tensor([[0.0]]), 2.5).item(), 6)
    -1.835229
    """
    return tanh_gaussian_logprob(u, mean, log_std) - u.shape[-1] * math.log(bound)


def latent_distillation_loss(q_latent: Tensor, q_action: Tensor) -> Tensor:
    """DSRL-NA's distillation of the action critic into the latent critic (Wagenmaker et al. 2025, "Steering Your
    Diffusion Policy with Latent Space RL", §4.2): member i of Q^W regresses onto member i of Q^A at the action the
    flow head makes of the noise, Q^A_i(s, g(s, w)), which is held fixed:

        L_W = Σ_i mean_B ( Q^W_i(s, w) − Q^A_i(s, g(s, w)) )²

    ``q_latent``, ``q_action``: [E, B]. → scalar (gradient into ``q_latent`` only).

    >>> latent_distillation_loss(torch.tensor([[1.0, 2.0], [0.0, 0.0]]), torch.tensor([[0.0, 2.0], [1.0, 3.0]]))
    tensor(5.5000)
    """
    return ((q_latent - q_action.detach()) ** 2).mean(1).sum()
