"""The candidate-scoring traffic policy: RIFT groups, greedy choice, re-scoring, imitation, save/load."""

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from mmrl.policies.traffic import CandidateScorerConfig, CandidateScorerPolicy
from mmrl.core.rollout import SamplingParams


@dataclass(frozen=True, eq=False)
class Example:
    features: np.ndarray
    context: np.ndarray


def examples(n: int, g: int = 15, seed: int = 0) -> list[Example]:
    rng = np.random.default_rng(seed)
    return [Example(rng.normal(size=(g, 12)).astype(np.float32), rng.normal(size=5).astype(np.float32))
            for _ in range(n)]


def policy(**kw) -> CandidateScorerPolicy:
    return CandidateScorerPolicy.from_config(CandidateScorerConfig(**kw))


def test_all_candidates_group_holds_every_candidate_with_its_log_prob():
    p, ex = policy(), examples(3)
    r = p.rollout(ex, 15, SamplingParams(1.0), seed=0)
    assert r.num_rows == 45 and r.logp.shape == (45, 1)
    assert r.outputs == list(range(15)) * 3
    assert torch.equal(r.group_id, torch.arange(3).repeat_interleave(15))
    torch.testing.assert_close(r.logp.exp().view(3, 15).sum(1), torch.ones(3))
    torch.testing.assert_close(p(r).logp.detach(), r.logp)  # re-scoring gives the sampling log-probs
    with pytest.raises(ValueError, match="group_size == the number of candidates"):
        p.rollout(ex, 4, SamplingParams(1.0), seed=0)


def test_greedy_picks_the_argmax_and_sampling_is_seeded():
    p, ex = policy(), examples(4)
    r = p.rollout(ex, 1, SamplingParams(0.0), seed=0)
    with torch.no_grad():
        best = [int(p.logits(torch.tensor(e.features)[None], torch.tensor(e.context)[None]).argmax()) for e in ex]
    assert r.outputs == best == [p.choose(e.features, e.context) for e in ex]
    s = policy(group="sample")
    a, b = (s.rollout(ex, 6, SamplingParams(1.0), seed=3) for _ in range(2))
    assert a.outputs == b.outputs and a.num_rows == 24
    with pytest.raises(ValueError, match="greedy"):
        p.rollout(ex, 2, SamplingParams(0.0), seed=0)


def test_nan_features_raise():
    ex = examples(1)
    ex[0].features[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        policy().rollout(ex, 15, SamplingParams(1.0), seed=0)


def test_imitation_loss_learns_a_rule():
    """Cross-entropy on 'the candidate with the largest first feature' is learned in a few steps."""
    torch.manual_seed(0)
    p, ex = policy(), examples(64, seed=1)
    targets = [int(e.features[:, 0].argmax()) for e in ex]
    opt = torch.optim.Adam(p.parameters(), 1e-2)
    first = p.sft_loss(ex, targets).item()
    for _ in range(150):
        loss = p.sft_loss(ex, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.3 * first
    assert np.mean([p.choose(e.features, e.context) == t for e, t in zip(ex, targets)]) > 0.9


def test_save_and_load_round_trip(tmp_path):
    p, ex = policy(init_seed=1), examples(2)
    p.save_pretrained(str(tmp_path))
    q = policy(init_seed=2, pretrained=str(tmp_path))
    assert [p.choose(e.features, e.context) for e in ex] == [q.choose(e.features, e.context) for e in ex]
    with pytest.raises(ValueError, match="does not fit"):
        policy(hidden=32).load_weights(str(tmp_path))
