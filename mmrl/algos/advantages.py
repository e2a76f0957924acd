"""Advantage estimators: pure functions ``(AdvantageInputs, AlgoConfig) -> (A [N,T], R [N,T] | None)``.

``A`` is the per-decision advantage; ``R`` the value target (returns) for estimators that use a
value function, else None. Outcome estimators broadcast one scalar per sequence over its valid
decisions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from mmrl.algos.config import AlgoConfig
from mmrl.algos.masked import group_is_constant, group_mean_std, masked_whiten, outcome_to_token_rewards
from mmrl.core.registry import Registry


@dataclass(frozen=True)
class AdvantageInputs:
    rewards: Tensor  # [N] scalar (shaped) reward per sequence; for env tasks the episode return
    mask: Tensor  # [N, T] float {0,1}: valid decisions
    group_id: Tensor  # [N] long: rows sharing a prompt / initial state
    step_rewards: Tensor | None = None  # [N, T] per-decision rewards (env tasks); None: outcome only
    values: Tensor | None = None  # [N, T] critic values V(s_t) from the rollout
    dones: Tensor | None = None  # [N, T] 1.0 where an episode ends after decision t
    kl: Tensor | None = None  # [N, T] log π_old − log π_ref, for KL-in-reward (REINFORCE++)
    # [N] each row's prompt's success / failure pseudo-counts from earlier steps (the trainer's
    # per-prompt history; only for estimators that declare the "prompt_history" need)
    prompt_successes: Tensor | None = None
    prompt_failures: Tensor | None = None
    # [N] long: rows of a group with equal ids decoded to equal outputs (estimators that declare the
    # "output_classes" need: set diversity, Polychromic PPO)
    output_class: Tensor | None = None
    # [N, T] dense per-token implicit rewards computed by a rollout hook (estimators that declare the
    # "teacher_shift" need: Direct-OPD's teacher log-ratio log π_teacher − log π_teacher_base on each token)
    implicit_rewards: Tensor | None = None


AdvantageFn = Callable[[AdvantageInputs, AlgoConfig], tuple[Tensor, Tensor | None]]
ADVANTAGE_ESTIMATORS: Registry[AdvantageFn] = Registry("advantage estimator")


def _broadcast(per_seq: Tensor, mask: Tensor) -> Tensor:
    return per_seq[:, None] * mask  # [N] → [N, T]


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo_advantage(inp: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, None]:
    """GRPO (Shao et al. 2024, DeepSeekMath eq. 3): A_i = (r_i − mean_g) / (std_g + ε).

    ``norm_adv_by_std=False`` gives Dr. GRPO's A_i = r_i − mean_g (Liu et al. 2025, §3.1).
    std is the unbiased group std (torch.std, as EasyR1/verl). A group of one gets A_i = r_i
    (mean 0, std 1 as in verl): there is no group to compare with. A group of two or more whose
    rewards are all equal gets exactly A = 0 (computed in float64, returned in the rewards' dtype).
    """
    rewards = inp.rewards.double()
    mean, std, count = group_mean_std(rewards, inp.group_id)
    single = count < 2
    mean = torch.where(single, torch.zeros_like(mean), mean)
    adv = rewards - mean
    if cfg.norm_adv_by_std:
        std = torch.where(single, torch.ones_like(std), std)
        adv = adv / (std + cfg.adv_eps)
    adv = _zero_constant_groups(adv, rewards, inp.group_id, single)
    return _broadcast(adv.to(inp.rewards.dtype), inp.mask), None


def _zero_constant_groups(adv: Tensor, rewards: Tensor, group_id: Tensor, single: Tensor) -> Tensor:
    """A = 0 exactly for the rows of groups of two or more with equal rewards ([N] → [N]): such a
    group has no signal (``groups_with_signal`` drops it), whatever rounding did to its mean."""
    return torch.where(group_is_constant(rewards, group_id) & ~single, torch.zeros_like(adv), adv)


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo_advantage(inp: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, None]:
    """RLOO (Ahmadian et al. 2024, eq. 7): A_i = r_i − (1/(G−1)) Σ_{j≠i} r_j.

    A group of one has no leave-one-out baseline: A_i = r_i. A group of equal rewards gets A = 0.
    """
    rewards = inp.rewards.double()
    mean, _, count = group_mean_std(rewards, inp.group_id)
    loo_mean = (mean * count - rewards) / (count - 1).clamp(min=1)
    adv = torch.where(count > 1, rewards - loo_mean, rewards)
    adv = _zero_constant_groups(adv, rewards, inp.group_id, count < 2)
    return _broadcast(adv.to(inp.rewards.dtype), inp.mask), None


def discounted_returns(rewards: Tensor, mask: Tensor, gamma: float, dones: Tensor | None = None) -> Tensor:
    """G_t = r_t + γ·(1 − done_t)·G_{t+1} over valid decisions ([N, T] → [N, T]).

    Masked positions are skipped (the recursion passes through them) and get 0.
    """
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        cont = 1.0 - dones[:, t] if dones is not None else 1.0
        running = torch.where(mask[:, t] > 0, rewards[:, t] + gamma * cont * running, running)
        returns[:, t] = running * mask[:, t]
    return returns


def _token_rewards(inp: AdvantageInputs) -> Tensor:
    if inp.step_rewards is not None:
        return inp.step_rewards * inp.mask
    return outcome_to_token_rewards(inp.rewards, inp.mask)


@ADVANTAGE_ESTIMATORS.register("reinforce_pp")
def reinforce_pp_advantage(inp: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, None]:
    """REINFORCE++ (Hu 2025, eq. 4–6): per-token reward r_t − β·KL_t, discounted returns,
    then normalised over all valid tokens of the batch (global mean and std).
    """
    token_rewards = _token_rewards(inp)
    if cfg.kl_in_reward_coef:
        if inp.kl is None:
            raise ValueError("reinforce_pp with kl_in_reward_coef > 0 needs per-token kl (a reference model)")
        token_rewards = token_rewards - cfg.kl_in_reward_coef * inp.kl * inp.mask
    returns = discounted_returns(token_rewards, inp.mask, cfg.gamma, inp.dones)
    return masked_whiten(returns, inp.mask, cfg.adv_eps), None


@ADVANTAGE_ESTIMATORS.register("gae")
def gae_advantage(inp: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, Tensor]:
    """GAE (Schulman et al. 2016, eq. 16): δ_t = r_t + γ(1−d_t)V_{t+1} − V_t,
    A_t = δ_t + γλ(1−d_t)A_{t+1}; returns R_t = A_t + V_t (the value target).

    Positions outside the mask neither bootstrap nor carry advantage. Advantages are whitened over
    the batch when ``whiten_advantages`` (returns are not).
    """
    if inp.values is None:
        raise ValueError("gae needs the rollout's values: use a policy with a value head")
    rewards, values, mask = _token_rewards(inp), inp.values, inp.mask
    adv = torch.zeros_like(values)
    next_adv = torch.zeros_like(values[:, 0])
    next_value = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        cont = 1.0 - inp.dones[:, t] if inp.dones is not None else torch.ones_like(next_value)
        delta = rewards[:, t] + cfg.gamma * cont * next_value - values[:, t]
        adv_t = (delta + cfg.gamma * cfg.lam * cont * next_adv) * mask[:, t]
        adv[:, t] = adv_t
        # A masked position passes the later values/advantages through unchanged, so padding
        # inside a sequence (e.g. between env steps) does not cut the recursion.
        next_adv = torch.where(mask[:, t] > 0, adv_t, next_adv)
        next_value = torch.where(mask[:, t] > 0, values[:, t], next_value)
    returns = (adv + values) * mask
    if cfg.whiten_advantages:
        adv = masked_whiten(adv, mask, cfg.adv_eps)
    return adv, returns


@ADVANTAGE_ESTIMATORS.register("returns")
def returns_to_go_advantage(inp: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, None]:
    """Plain REINFORCE (Williams 1992): A_t = G_t = Σ_{k≥t} γ^{k−t} r_k, no baseline;
    whitened over the batch when ``whiten_advantages``.
    """
    returns = discounted_returns(_token_rewards(inp), inp.mask, cfg.gamma, inp.dones)
    if cfg.whiten_advantages:
        return masked_whiten(returns, inp.mask, cfg.adv_eps), None
    return returns, None
