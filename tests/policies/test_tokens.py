"""token_logprobs (mmrl/policies/tokens.py): 0 on padding, non-finite log-probs of real tokens kept visible."""

from __future__ import annotations

import math

import pytest
import torch

from mmrl.algos.masked import count_nonfinite
from mmrl.policies.tokens import token_logprobs


def test_logprobs_golden_and_zero_on_suppressed_padding():
    # V = 3, id 2 suppressed: softmax over ids {0, 1} of logits [0, log 3] → log ¼, log ¾.
    # Row 1's padding holds the suppressed id 2 (log-prob −inf): 0 there, never NaN.
    logits = torch.tensor([[0.0, math.log(3.0), 5.0]]).expand(2, 3, 3)
    tokens = torch.tensor([[0, 1, 1], [1, 2, 2]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    logp, _ = token_logprobs(logits, tokens, 1.0, torch.tensor([2]), mask)
    quarter, three_quarters = math.log(0.25), math.log(0.75)
    torch.testing.assert_close(logp, torch.tensor([[quarter, three_quarters, three_quarters],
                                                   [three_quarters, 0.0, 0.0]]))


def test_nonfinite_logprobs_of_real_tokens_stay_visible():
    # A diverged forward pass (NaN logits at row 0, t = 1; inf at row 1, t = 0) and a real token that is a
    # suppressed id (row 1, t = 1): before, all three became 0 and the update trained on them silently.
    logits = torch.zeros(2, 3, 4)
    logits[0, 1, 2] = float("nan")
    logits[1, 0, 0] = float("inf")
    tokens = torch.tensor([[0, 1, 3], [1, 3, 0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    logits[0, 2] = float("nan")  # padding: not counted, 0
    logp, _ = token_logprobs(logits, tokens, 1.0, torch.tensor([3]), mask)
    assert math.isnan(logp[0, 1].item())
    assert not math.isfinite(logp[1, 0].item()) and not math.isfinite(logp[1, 1].item())
    assert logp[0, 2].item() == 0.0
    assert logp[0, 0].item() == pytest.approx(math.log(1 / 3)) and logp[1, 2].item() == pytest.approx(math.log(1 / 3))
    assert count_nonfinite(logp, mask) == 3
