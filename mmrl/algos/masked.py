"""Masked reductions shared by the algorithms. ``mask`` is a float {0, 1} tensor of the same shape."""

from __future__ import annotations

import torch
from torch import Tensor


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    return (x * mask).sum() if dim is None else (x * mask).sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean over entries where mask is 1; 0 where there are none (never NaN)."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-6) -> Tensor:
    """(x − mean) / (std + eps) over the masked entries (unbiased variance); zero outside the mask.

    Computed in float64 and returned in ``x``'s dtype. Entries that are all equal give exactly 0
    (a float32 mean of equal values is off by rounding, and that error over ``std + eps`` with
    std ~1e-8 would be a spurious advantage of the same sign on every token).
    """
    x64, mask64 = x.double(), mask.double()
    mean = masked_mean(x64, mask64)
    n = mask64.sum()
    var = masked_sum((x64 - mean) ** 2, mask64) / (n - 1).clamp(min=1)
    white = (x64 - mean) / (var.sqrt() + eps) * mask64
    if masked_range_is_zero(x64, mask):
        white = torch.zeros_like(white)
    return white.to(x.dtype)


def masked_range_is_zero(x: Tensor, mask: Tensor) -> bool:
    """True when every masked entry of ``x`` has the same value (or there is none)."""
    valid = x[mask > 0]
    return bool(valid.numel() == 0 or valid.max() == valid.min())


def _group_index(group_id: Tensor) -> tuple[Tensor, int]:
    """Each row's group as 0..G−1 ([N] long) and G."""
    _, inverse = torch.unique(group_id, return_inverse=True)
    return inverse, int(inverse.max()) + 1 if inverse.numel() else 0


def group_mean_std(values: Tensor, group_id: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row mean, unbiased std and size of the row's group, in float64.

    values [N], group_id [N] (any integers) → three float64 tensors [N]. A group of one has std 0.
    The sums run in float64 whatever ``values``' dtype: summed in float32, eight rewards of 0.1 have
    a mean that is not 0.1 and a std of ~1e-8 instead of 0. In float64 a group of equal float32
    values has its exact mean and std 0; for equal float64 values use :func:`group_is_constant`.
    """
    values = values.double()
    inverse, num_groups = _group_index(group_id)  # [N] in 0..G-1
    count = torch.zeros(num_groups, dtype=torch.float64, device=values.device)
    count.index_add_(0, inverse, torch.ones_like(values))
    total = torch.zeros_like(count).index_add_(0, inverse, values)
    mean = total / count
    sq = torch.zeros_like(count).index_add_(0, inverse, (values - mean[inverse]) ** 2)
    std = (sq / (count - 1).clamp(min=1)).sqrt()
    return mean[inverse], std[inverse], count[inverse]


def group_is_constant(values: Tensor, group_id: Tensor) -> Tensor:
    """[N] bool: every value of the row's group is the same (max == min; a group of one is constant).

    The exact test for "this group carries no signal", independent of rounding in a mean or std.
    """
    inverse, num_groups = _group_index(group_id)
    values = values.double()
    hi = torch.full((num_groups,), -torch.inf, dtype=torch.float64, device=values.device)
    lo = torch.full((num_groups,), torch.inf, dtype=torch.float64, device=values.device)
    hi = hi.scatter_reduce(0, inverse, values, "amax")
    lo = lo.scatter_reduce(0, inverse, values, "amin")
    return (hi == lo)[inverse]


def outcome_to_token_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """Place each sequence's scalar reward [N] on its last valid token → [N, T]."""
    token_rewards = torch.zeros_like(mask, dtype=rewards.dtype)
    positions = torch.arange(mask.shape[1], device=mask.device)
    last = (mask * positions).argmax(dim=1)  # index of the last valid token
    has_tokens = mask.sum(1) > 0
    token_rewards[torch.arange(len(rewards))[has_tokens], last[has_tokens]] = rewards[has_tokens]
    return token_rewards


def count_nonfinite(x: Tensor, mask: Tensor) -> int:
    """Number of valid entries (mask 1) of ``x`` that are NaN or ±inf; entries outside the mask are
    not counted. For log-probs, a non-zero count means the forward pass diverged."""
    return int((~torch.isfinite(x) & (mask > 0)).sum())
