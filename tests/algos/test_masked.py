"""The shared reductions of mmrl/algos/masked.py: exact group statistics, whitening of constant
entries, and the count of non-finite valid entries the trainer logs."""

from __future__ import annotations

import statistics

import pytest
import torch

from mmrl.algos.masked import count_nonfinite, group_is_constant, group_mean_std, masked_whiten

F32 = torch.float32


@pytest.mark.parametrize("size,value", [(8, 0.1), (16, 0.7), (128, 0.3), (3, 1 / 3)])
def test_group_mean_std_of_a_constant_float32_group_is_exact(size, value):
    # Summed in float32, 8 × 0.1 has mean 0.1 + 1.5e-9 and std ~1e-8: GRPO divided that by (std + ε).
    rewards = torch.full((size,), value, dtype=F32)
    mean, std, count = group_mean_std(rewards, torch.zeros(size, dtype=torch.long))
    assert mean.dtype == std.dtype == count.dtype == torch.float64
    assert (mean == float(rewards[0])).all()  # the float32 value, exactly
    assert (std == 0).all()
    assert (count == size).all()


def test_group_mean_std_golden_against_the_statistics_module():
    rewards = torch.tensor([0.1, 0.7, 0.3, 0.9, 0.2, 0.2], dtype=F32)
    group_id = torch.tensor([5, 5, 5, 2, 2, 2])
    mean, std, count = group_mean_std(rewards, group_id)
    values = [float(r) for r in rewards]  # the float32 rewards as Python floats (float64)
    for rows in ([0, 1, 2], [3, 4, 5]):
        group = [values[i] for i in rows]
        for i in rows:
            assert mean[i].item() == pytest.approx(statistics.fmean(group), rel=1e-12)
            assert std[i].item() == pytest.approx(statistics.stdev(group), rel=1e-12)
            assert count[i].item() == 3


def test_group_is_constant():
    # float64 0.1 · 3 rounds (0.30000000000000004): a mean / std test could miss this constant group.
    values = torch.tensor([0.1, 0.1, 0.1, 0.4, 0.5, 7.0], dtype=torch.float64)
    group_id = torch.tensor([3, 3, 3, 1, 1, 0])
    assert group_is_constant(values, group_id).tolist() == [True, True, True, False, False, True]


def test_masked_whiten_of_equal_entries_is_exactly_zero_in_their_dtype():
    # 16 rows of return 0.7 (float32) over 3 valid tokens: the float32 mean is off and the std ~1e-8,
    # which made every token's advantage +0.056 before.
    x = torch.full((16, 4), 0.7, dtype=F32)
    mask = torch.ones(16, 4, dtype=F32)
    mask[:, 3] = 0.0
    x[:, 3] = 123.0  # padding is ignored
    white = masked_whiten(x, mask)
    assert white.dtype == F32
    assert (white == 0).all()


def test_masked_whiten_golden_in_float32():
    x = torch.tensor([[0.1, 0.7, 0.3], [0.9, 0.2, 5.0]], dtype=F32)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    values = [float(v) for v in x[mask > 0]]
    mean, std = statistics.fmean(values), statistics.stdev(values)
    expected = torch.tensor([[(v - mean) / (std + 1e-6) for v in [float(v) for v in x[0]]],
                             [(float(x[1, 0]) - mean) / (std + 1e-6), (float(x[1, 1]) - mean) / (std + 1e-6), 0.0]],
                            dtype=F32)
    white = masked_whiten(x, mask)
    assert white.dtype == F32
    torch.testing.assert_close(white, expected)


def test_count_nonfinite_counts_valid_entries_only():
    logp = torch.tensor([[-0.5, float("nan"), float("-inf")], [float("inf"), -1.0, float("nan")]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # the last NaN is padding
    assert count_nonfinite(logp, mask) == 3
    assert count_nonfinite(torch.zeros(2, 3), mask) == 0
