"""Flow-GRPO's two additions to the core (Liu et al. 2025, ``flow_grpo/stat_tracking.py`` and
``scripts/train_sd3.py``), registered on the existing axes:

- advantage estimator ``grpo_global_std``: per-prompt (group) mean, std over the whole batch;
- KL estimator ``gaussian_mean`` (``GAUSSIAN_KL_ESTIMATORS``): the closed-form KL between the
  policy's and the reference's Gaussian decisions, from their means (``PolicyOutput.mean/std``),
  instead of an estimate from the sampled decision's log-probs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from mmrl.algos.advantages import ADVANTAGE_ESTIMATORS, AdvantageInputs
from mmrl.algos.config import AlgoConfig
from mmrl.algos.masked import group_is_constant, group_mean_std
from mmrl.core.contracts import PolicyOutput
from mmrl.core.registry import Registry


@ADVANTAGE_ESTIMATORS.register("grpo_global_std")
def grpo_global_std_advantage(inp: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, None]:
    """A_i = (r_i − mean_g) / (std_batch + ε)  (Flow-GRPO ``global_std=True``; ε = ``adv_eps``,
    Flow-GRPO uses 1e-4). std is the unbiased std of all rewards of the batch on this process.
    A group of one has no group mean: A_i = r_i / (std_batch + ε). A group of two or more with
    equal rewards gets exactly A = 0 (computed in float64, returned in the rewards' dtype).
    """
    rewards = inp.rewards.double()
    mean, _, count = group_mean_std(rewards, inp.group_id)
    single = count < 2
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = rewards.std() if rewards.numel() > 1 else torch.ones((), dtype=rewards.dtype)
    adv = (rewards - mean) / (std + cfg.adv_eps)
    adv = torch.where(group_is_constant(rewards, inp.group_id) & ~single, torch.zeros_like(adv), adv)
    return adv.to(inp.rewards.dtype)[:, None] * inp.mask, None


GaussianKLFn = Callable[[PolicyOutput, PolicyOutput], Tensor]
GAUSSIAN_KL_ESTIMATORS: Registry[GaussianKLFn] = Registry("Gaussian KL estimator")


def gaussian_mean_kl(mean: Tensor, ref_mean: Tensor, std: Tensor) -> Tensor:
    """KL(N(μ_θ, σ²I) ‖ N(μ_ref, σ²I)) per dimension, averaged over the decision's dims:
    ‖μ_θ − μ_ref‖² / (2σ²)   (mean [N, T, *D], ref_mean [N, T, *D], std [N, T] → [N, T]).

    Flow-GRPO ``train_sd3.py``: ``((prev_sample_mean - prev_sample_mean_ref) ** 2).mean(dims) / (2 * std_dev_t ** 2)``.
    """
    return ((mean - ref_mean) ** 2).flatten(2).mean(2) / (2 * std**2)


@GAUSSIAN_KL_ESTIMATORS.register("gaussian_mean")
def kl_gaussian_mean(out: PolicyOutput, ref: PolicyOutput) -> Tensor:
    """:func:`gaussian_mean_kl` of two policy outputs; the policy's σ (both share it)."""
    if out.mean is None or out.std is None or ref.mean is None:
        raise ValueError("algo.kl_estimator gaussian_mean needs a policy whose decisions are Gaussian and that "
                         "returns PolicyOutput.mean / std (the diffusion policy); use k1 / k3 / low_var_kl otherwise")
    return gaussian_mean_kl(out.mean.float(), ref.mean.float().detach(), out.std.float().detach())
