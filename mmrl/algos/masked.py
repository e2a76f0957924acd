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
    """(x − mean) / (std + eps) over the masked entries (unbiased variance); zero outside the mask."""
    mean = masked_mean(x, mask)
    n = mask.sum()
    var = masked_sum((x - mean) ** 2, mask) / (n - 1).clamp(min=1)
    return (x - mean) / (var.sqrt() + eps) * mask


def group_mean_std(values: Tensor, group_id: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row mean, unbiased std and size of the row's group.

    values [N], group_id [N] (any integers) → three tensors [N]. A group of one has std 0.
    """
    _, inverse = torch.unique(group_id, return_inverse=True)  # [N] in 0..G-1
    num_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    count = torch.zeros(num_groups, dtype=values.dtype, device=values.device)
    count.index_add_(0, inverse, torch.ones_like(values))
    total = torch.zeros_like(count).index_add_(0, inverse, values)
    mean = total / count
    sq = torch.zeros_like(count).index_add_(0, inverse, (values - mean[inverse]) ** 2)
    std = (sq / (count - 1).clamp(min=1)).sqrt()
    return mean[inverse], std[inverse], count[inverse]


def outcome_to_token_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """Place each sequence's scalar reward [N] on its last valid token → [N, T]."""
    token_rewards = torch.zeros_like(mask, dtype=rewards.dtype)
    positions = torch.arange(mask.shape[1], device=mask.device)
    last = (mask * positions).argmax(dim=1)  # index of the last valid token
    has_tokens = mask.sum(1) > 0
    token_rewards[torch.arange(len(rewards))[has_tokens], last[has_tokens]] = rewards[has_tokens]
    return token_rewards
