"""DAPO's batch-level pieces (Yu et al. 2025, §3.2 and §3.4): dynamic sampling and overlong shaping."""

from __future__ import annotations

import torch
from torch import Tensor

from mmrl.algos.masked import group_mean_std


def groups_with_signal(outcome: Tensor, group_id: Tensor, atol: float = 1e-6) -> Tensor:
    """Rows whose group's *verifiable outcome* varies ([N] → bool [N]).

    DAPO dynamic sampling keeps only groups with 0 < accuracy < 1; for scalar rewards: groups
    whose outcome is not constant. Filter on the verifier's outcome, never on a shaped reward
    (a length penalty would make every group look informative).
    """
    _, std, _ = group_mean_std(outcome, group_id)  # float64: a constant group has std exactly 0
    return std > atol


def overlong_penalty(lengths: Tensor, max_len: int, buffer: int, factor: float = 1.0) -> Tensor:
    """DAPO soft overlong punishment (eq. 13) per sequence ([N] lengths → [N] penalties ≤ 0).

    0 if |y| ≤ L_max − L_buf; (L_max − L_buf − |y|) / L_buf inside the buffer; −1 beyond L_max.
    """
    if buffer <= 0 or buffer > max_len:
        raise ValueError(f"overlong buffer must be in 1..max_len ({max_len}), got {buffer}")
    lengths = lengths.float()
    expected = max_len - buffer
    penalty = ((expected - lengths) / buffer).clamp(max=0.0)
    penalty = torch.where(lengths > max_len, torch.full_like(penalty, -1.0), penalty)
    return factor * penalty
