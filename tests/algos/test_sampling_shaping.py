"""DAPO dynamic sampling and overlong shaping (mmrl/algos/sampling.py; Yu et al. 2025 §3.2, §3.4 eq. 13)
and the ``adv_clip`` shaping hook (mmrl/algos/shaping.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.testing import assert_close

from mmrl.algos.config import AlgoConfig
from mmrl.algos.sampling import groups_with_signal, overlong_penalty
from mmrl.algos.shaping import SHAPING_HOOKS, ShapingContext

F64 = torch.float64


# -- dynamic sampling -----------------------------------------------------------------------------------------


def test_groups_with_signal():
    # groups [1, 1] (all correct), [0, 1] (mixed), [0, 0] (all wrong): only the mixed group carries signal
    outcome = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    group_id = torch.tensor([0, 0, 1, 1, 2, 2])
    assert groups_with_signal(outcome, group_id).tolist() == [False, False, True, True, False, False]


def test_groups_with_signal_interleaved_and_scalar():
    # interleaved ids; group 4 = {0.5, 0.5} constant, group 9 = {0.2, 0.7} varies; a group of one has std 0
    outcome = torch.tensor([0.5, 0.2, 0.5, 0.7, 1.0])
    group_id = torch.tensor([4, 9, 4, 9, 3])
    assert groups_with_signal(outcome, group_id).tolist() == [False, True, False, True, False]


# -- overlong shaping (DAPO eq. 13) -----------------------------------------------------------------------------


def test_overlong_penalty_golden():
    # L_max = 10, L_buf = 4 → L_max − L_buf = 6:
    #   |y| = 5  ≤ 6           → 0
    #   |y| = 6  ≤ 6           → 0
    #   |y| = 8  in the buffer → (6 − 8)/4 = −0.5
    #   |y| = 10 in the buffer → (6 − 10)/4 = −1.0
    #   |y| = 11 > L_max       → −1
    penalty = overlong_penalty(torch.tensor([5, 6, 8, 10, 11]), max_len=10, buffer=4)
    assert_close(penalty, torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))


def test_overlong_penalty_inside_buffer_fraction_and_factor():
    # |y| = 7 → (6 − 7)/4 = −0.25; factor 0.5 scales: [0, −0.125, −0.25, −0.5, −0.5]
    penalty = overlong_penalty(torch.tensor([5, 7, 8, 10, 50]), max_len=10, buffer=4, factor=0.5)
    assert_close(penalty, torch.tensor([0.0, -0.125, -0.25, -0.5, -0.5]))


@pytest.mark.parametrize("buffer", [0, -1, 11])
def test_overlong_penalty_rejects_bad_buffer(buffer):
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(torch.tensor([5]), max_len=10, buffer=buffer)


def test_overlong_buffer_equal_to_max_len_is_allowed():
    # L_buf = L_max = 4 → penalty starts at 0: |y| = 2 → (0 − 2)/4 = −0.5
    assert_close(overlong_penalty(torch.tensor([2]), max_len=4, buffer=4), torch.tensor([-0.5]))


# -- adv_clip shaping hook (DDPO) ---------------------------------------------------------------------------------


def _context(mask: torch.Tensor) -> ShapingContext:
    n = mask.shape[0]
    return ShapingContext(outcome=torch.zeros(n, dtype=F64), rewards=torch.zeros(n, dtype=F64),
                          group_id=torch.arange(n), mask=mask, logp_old=torch.zeros_like(mask), ref_logp=None,
                          entropy=None)


def test_adv_clip_clamps_and_zeroes_padding():
    # c = 5: [7, −7, 1] → [5, −5, 1]; row 1 valid [0.5], padding 9 → 0
    adv = torch.tensor([[7.0, -7.0, 1.0], [0.5, 9.0, -9.0]], dtype=F64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=F64)
    out = SHAPING_HOOKS.get("adv_clip")(adv, _context(mask), AlgoConfig(shaping=("adv_clip",), adv_clip=5.0))
    assert_close(out, torch.tensor([[5.0, -5.0, 1.0], [0.5, 0.0, 0.0]], dtype=F64))


@pytest.mark.parametrize("adv_clip", [None, 0.0, -1.0])
def test_adv_clip_requires_positive_bound(adv_clip):
    cfg = dataclasses.replace(AlgoConfig(), shaping=("adv_clip",), adv_clip=adv_clip)
    mask = torch.ones(1, 2, dtype=F64)
    with pytest.raises(ValueError, match="adv_clip"):
        SHAPING_HOOKS.get("adv_clip")(torch.ones(1, 2, dtype=F64), _context(mask), cfg)
