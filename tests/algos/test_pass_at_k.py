"""The unbiased pass@k estimator (Chen et al. 2021) behind ``mmrl eval --k K --n N``: golden values,
parity with the binomial formula, and the curve from one set of n samples."""

from __future__ import annotations

import math

import pytest
import torch

from mmrl.core.evaluate import curve_ks, pass_at_k, pass_at_k_curve, unbiased_pass_at_k


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (5, 2, 2, 0.7),  # 1 − C(3,2)/C(5,2) = 1 − 3/10
    (5, 0, 3, 0.0),  # no correct sample
    (5, 4, 2, 1.0),  # n − c = 1 < k: every pair holds a correct one
    (10, 3, 1, 0.3),  # pass@1 = c / n
    (4, 1, 4, 1.0),  # n = k: "any of the k passes"
    (4, 0, 4, 0.0),
])
def test_unbiased_pass_at_k_golden(n, c, k, expected):
    assert unbiased_pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_matches_the_binomial_formula_and_stays_finite_for_large_n():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1.0 - math.comb(n - c, k) / math.comb(n, k)
                assert unbiased_pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)
    value = unbiased_pass_at_k(2000, 3, 1000)  # C(2000, 1000) overflows a float; the product does not
    assert value == pytest.approx(1.0 - (1000 * 999 * 998) / (2000 * 1999 * 1998), abs=1e-12)


def test_invalid_counts_are_refused():
    with pytest.raises(ValueError, match="1 <= k <= n"):
        unbiased_pass_at_k(4, 1, 5)


def test_curve_from_the_same_samples_and_n_equal_k_is_the_indicator():
    # example 0: 5 samples, 2 correct; example 1: 5 samples, none correct
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.2, 0.0, 0.0], dtype=torch.float64)
    index = torch.tensor([0] * 5 + [1] * 5)
    curve = pass_at_k_curve(scores, index, 2, [1, 2, 4], threshold=1.0)
    assert curve == pytest.approx({1: 0.2, 2: 0.35, 4: 0.5})  # example 0: 2/5, 0.7, 1 − 0 = 1
    assert pass_at_k_curve(scores, index, 2, [5], 1.0)[5] == pass_at_k(scores, index, 2, 1.0) == 0.5
    with pytest.raises(ValueError, match="same n >= 8"):
        pass_at_k_curve(scores, index, 2, [8], 1.0)


def test_curve_ks():
    assert curve_ks(1) == [1] and curve_ks(8) == [1, 2, 4, 8] and curve_ks(6) == [1, 2, 4, 6]
