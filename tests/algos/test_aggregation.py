"""Golden numbers for the loss aggregations (mmrl/algos/aggregation.py) and the micro-batch property:
aggregating the halves of a batch with the *global* denominators and summing gives the whole-batch loss.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from mmrl.algos.aggregation import AGGREGATIONS, aggregate

F64 = torch.float64
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]

# [2, 3] per-token loss; row 0 has 3 valid tokens, row 1 one (its 5 and 6 are padding)
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=F64)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=F64)


def scalar(x: float) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


@pytest.mark.parametrize(("mode", "expected"), [
    ("token-mean", 2.5),                    # (1+2+3+4) / 4 tokens = 10/4
    ("seq-mean-token-mean", 3.0),           # ((1+2+3)/3 + 4/1) / 2 = (2 + 4)/2
    ("seq-mean-token-sum", 5.0),            # (6 + 4) / 2
    ("seq-mean-token-sum-norm", 10 / 6),    # (6 + 4) / (2 · T=3) = 1.666667
])
def test_default_denominators(mode, expected):
    assert_close(aggregate(LOSS, MASK, mode), scalar(expected))
    assert_close(AGGREGATIONS.get(mode)(LOSS, MASK), scalar(expected))


@pytest.mark.parametrize(("mode", "denominators", "expected"), [
    ("token-mean", dict(num_tokens=8), 1.25),                          # 10 / 8
    ("seq-mean-token-mean", dict(num_seqs=4), 1.5),                    # (2 + 4) / 4
    ("seq-mean-token-sum", dict(num_seqs=4), 2.5),                     # 10 / 4
    ("seq-mean-token-sum-norm", dict(norm_len=5), 1.0),                # 10 / (2·5)
    ("seq-mean-token-sum-norm", dict(num_seqs=4, norm_len=5), 0.5),    # 10 / (4·5)
])
def test_explicit_denominators(mode, denominators, expected):
    assert_close(aggregate(LOSS, MASK, mode, **denominators), scalar(expected))


# 4 sequences, T = 3, ragged; split into micro-batches rows {0, 1} and {2, 3}
BIG_LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [0.5, -1.0, 2.0], [3.0, 3.0, 9.0]], dtype=F64)
BIG_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=F64)
# valid sums per row: 6, 4, −0.5, 15 → total 24.5; tokens 3 + 1 + 2 + 3 = 9
# per-row means: 2, 4, −0.25, 5 → sum 10.75
BIG_EXPECTED = {
    "token-mean": 24.5 / 9,                  # 2.722222
    "seq-mean-token-mean": 10.75 / 4,        # 2.6875
    "seq-mean-token-sum": 24.5 / 4,          # 6.125
    "seq-mean-token-sum-norm": 24.5 / (4 * 8),  # with norm_len L = 8: 0.765625
}
GLOBAL = dict(num_tokens=9, num_seqs=4, norm_len=8)


@pytest.mark.parametrize("mode", MODES)
def test_whole_batch_golden(mode):
    assert_close(aggregate(BIG_LOSS, BIG_MASK, mode, **GLOBAL), scalar(BIG_EXPECTED[mode]))


@pytest.mark.parametrize("mode", MODES)
def test_micro_batches_with_global_denominators_sum_to_the_whole(mode):
    first = aggregate(BIG_LOSS[:2], BIG_MASK[:2], mode, **GLOBAL)
    second = aggregate(BIG_LOSS[2:], BIG_MASK[2:], mode, **GLOBAL)
    assert_close(first + second, scalar(BIG_EXPECTED[mode]))
    # and equals the whole batch aggregated with its own default counts (norm_len is a constant: pass it)
    assert_close(first + second, aggregate(BIG_LOSS, BIG_MASK, mode, norm_len=8))


def test_micro_batch_token_mean_golden_halves():
    # rows {0, 1}: valid sum 6 + 4 = 10 → 10/9; rows {2, 3}: −0.5 + 15 = 14.5 → 14.5/9; total 24.5/9
    first = aggregate(BIG_LOSS[:2], BIG_MASK[:2], "token-mean", num_tokens=9)
    second = aggregate(BIG_LOSS[2:], BIG_MASK[2:], "token-mean", num_tokens=9)
    assert_close(first, scalar(10 / 9))
    assert_close(second, scalar(14.5 / 9))
    # with local denominators the halves would be 10/4 and 14.5/5: their mean 2.7 ≠ 24.5/9
    local_first = aggregate(BIG_LOSS[:2], BIG_MASK[:2], "token-mean")
    local_second = aggregate(BIG_LOSS[2:], BIG_MASK[2:], "token-mean")
    local = (local_first + local_second) / 2
    assert_close(local, scalar((10 / 4 + 14.5 / 5) / 2))


def test_empty_mask_gives_zero_not_nan():
    empty = torch.zeros(2, 3, dtype=F64)
    for mode in MODES:
        assert aggregate(LOSS, empty, mode).item() == 0.0


def test_gradient_weights_of_token_mean_vs_seq_mean():
    # token-mean: every valid token weighs 1/4; seq-mean-token-mean: row 0 tokens 1/(2·3), row 1 token 1/(2·1)
    loss = LOSS.clone().requires_grad_(True)
    aggregate(loss, MASK, "token-mean").backward()
    assert_close(loss.grad, torch.tensor([[0.25, 0.25, 0.25], [0.25, 0.0, 0.0]], dtype=F64))
    loss.grad = None
    aggregate(loss, MASK, "seq-mean-token-mean").backward()
    assert_close(loss.grad, torch.tensor([[1 / 6, 1 / 6, 1 / 6], [0.5, 0.0, 0.0]], dtype=F64))
