"""The one logits processor of every ``generate`` call (mmrl/policies/tokens.py BehaviourLogprobs: the HF sampler
and the text policy): the sampling distribution it hands to generate, and the behaviour log-probs it records."""

from __future__ import annotations

import math

import torch

from mmrl.core.rollout import SamplingParams
from mmrl.policies.tokens import token_logprobs
from mmrl.policies.tokens import BehaviourLogprobs
from tests.policies.test_shared_prefix import tiny
from tests.policies.test_vlm import mixed_examples


def test_recorded_logprobs_equal_token_logprobs_of_the_raw_logits():
    torch.manual_seed(0)
    raw = torch.randn(3, 4, 6) * 3  # [rows, steps, vocab]
    tokens = torch.randint(0, 5, (3, 4))
    suppressed = torch.tensor([5])
    for tau in (0.7, 0.0):
        processor = BehaviourLogprobs(tau, 1.0, suppressed)
        seen = torch.zeros(3, 2, dtype=torch.long)  # the prompt
        for t in range(4):
            out = processor(seen, raw[:, t].clone())
            assert torch.isinf(out[:, 5]).all() and out[:, 5].max() < 0  # suppressed id never sampled
            seen = torch.cat([seen, tokens[:, t:t + 1]], 1)
        recorded = processor.finish(tokens[:, -1])
        expected, _ = token_logprobs(raw, tokens, tau, suppressed, torch.ones(3, 4))
        torch.testing.assert_close(recorded, expected)


def test_top_p_cuts_what_is_sampled_but_not_the_scored_distribution():
    # logits log [0.5, 0.3, 0.15, 0.05]: top-p 0.7 keeps ids 0 and 1 for sampling; the recorded
    # log-prob of id 1 is still log 0.3 (the full tempered distribution, as re-scoring computes it).
    raw = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    processor = BehaviourLogprobs(1.0, 0.7, torch.zeros(0, dtype=torch.long))
    out = processor(torch.zeros(1, 1, dtype=torch.long), raw.clone())
    assert torch.isfinite(out[0, :2]).all() and torch.isinf(out[0, 2:]).all()
    assert math.isclose(processor.finish(torch.tensor([1]))[0, 0].item(), math.log(0.3), rel_tol=1e-6)


def test_top_p_rollouts_stay_on_policy():
    # the recorded log-probs are the full tempered distribution's, which re-scoring computes
    policy = tiny().eval()
    rollout = policy.rollout(mixed_examples(), 2, SamplingParams(temperature=1.0, top_p=0.5, max_new_tokens=6), seed=1)
    out = policy.score(rollout.payload)
    assert ((out.logp - rollout.logp) * rollout.mask).abs().max() < 1e-5
