"""CIPO (mmrl/algos/variants/corrections.py) and EBFT (feature_matching.py): golden numbers by hand, and the
hooks on the sanity policy (correction groups in the batch, feature-matching rewards replacing the verifier's)."""

from __future__ import annotations

import torch

from mmrl.algos.variants.corrections import correction_candidates
from mmrl.algos.variants.feature_matching import char_ngram_features, feature_matching_rewards
from mmrl.core.config import load_config
from mmrl.core.trainer import Trainer

QUIET = ["log.progress=false", "log.tensorboard=false", "eval.every=0", "eval.num_examples=4",
         "warm_start.sft_steps=0", "rollout.prompts_per_step=4", "rollout.group_size=4", "trainer.minibatches=1",
         "trainer.steps=1"]


# -- CIPO ---------------------------------------------------------------------------------------------------


def test_correction_candidates_prefer_failures_of_prompts_solved_most_often():
    outcome = torch.tensor([0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.3, 1.0, 1.0])
    group = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 3, 3])
    # success rates: g0 2/3, g1 0, g2 1/2, g3 1 (no failure); each group's first failure: g0 row 0, g1 row 3, g2 row 7
    assert correction_candidates(outcome, group, 4, 1.0, 10) == [0, 7, 3]
    assert correction_candidates(outcome, group, 4, 1.0, 2) == [0, 7]
    assert correction_candidates(outcome, group, 4, 0.2, 10) == [0, 3]  # g2 passes at 0.2: 0.3 is a success


def test_cipo_adds_a_group_of_corrections_per_failed_sample(tmp_path):
    cfg = load_config("sanity/tiny_cpu", [*QUIET, "algo.cipo=true", "algo.extra.cipo={instruction: '>', "
                                                                    "max_corrections: 3}"])
    trainer = Trainer(cfg, tmp_path / "run")
    batch = trainer.collect()  # an untrained policy: every sample fails
    rollout, tokenizer = batch.rollout, trainer.policy.tokenizer
    assert batch.stats["rollout/cipo_prompts"] == 3
    assert len(batch.examples) == 4 + 3 and rollout.num_rows == 16 + 3 * 4
    assert sorted(rollout.group_id.tolist()) == sorted([g for g in range(7) for _ in range(4)])
    first = rollout.select(torch.arange(16))
    for g in range(4, 7):  # each correction prompt: the example's prompt, a failed answer of its group, ">"
        rows = (rollout.group_id == g).nonzero().squeeze(1)
        base = batch.examples[g]
        prompt = tokenizer.decode(rollout.payload.prompt_ids[rows[0]], skip_special_tokens=True)
        failed = [o for i, o in enumerate(first.outputs) if batch.examples[int(first.example_index[i])] == base]
        assert prompt.startswith(base.prompt) and prompt.endswith(">")
        assert prompt[len(base.prompt):-1] in failed
        # scored by the example's own verifier
        assert all(batch.results[int(i)].score == trainer.task.reward(base, rollout.outputs[int(i)]).score
                   for i in rows)
    trainer.update(rollout, *trainer.advantages(batch))  # the correction groups train with the others


# -- EBFT ---------------------------------------------------------------------------------------------------


def test_feature_matching_rewards_golden():
    features = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0], [3.0, 4.0]])  # norms do not matter
    reference = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    group = torch.tensor([0, 0, 0, 1])
    # unit features: (1,0), (0,1), (1,0) | (0.6, 0.8); reference (1,0)
    # r_0 = −0 + mean(‖(1,−1)‖² = 2, 0) = 1;  r_1 = −2 + mean(2, 2) = 0;  r_2 = 1;  r_3 = −(0.16 + 0.64) (alone)
    rewards = feature_matching_rewards(features, reference, group, diversity=1.0)
    assert torch.allclose(rewards, torch.tensor([1.0, 0.0, 1.0, -0.8]))
    assert torch.allclose(feature_matching_rewards(features, reference, group, 0.0), torch.tensor([0.0, -2.0, 0.0, -0.8]))


def test_feature_matching_reward_is_the_gradient_weight_of_the_matching_objective():
    """For unit features, r_i − (2⟨φ_i, φ*⟩ − 2⟨φ_i, mean_{j≠i} φ_j⟩) is the same for every row of a group: the
    group baseline removes it, leaving the policy-gradient weight of ‖E_π φ − φ*‖²."""
    phi = torch.nn.functional.normalize(torch.randn(5, 3, generator=torch.Generator().manual_seed(0)), dim=-1)
    target = torch.nn.functional.normalize(torch.tensor([[1.0, 2.0, 2.0]]), dim=-1).expand(5, 3)
    rewards = feature_matching_rewards(phi, target, torch.zeros(5, dtype=torch.long), 1.0)
    loo_mean = (phi.sum(0) - phi) / 4
    weight = 2 * (phi * target).sum(-1) - 2 * (phi * loo_mean).sum(-1)
    gap = rewards - weight
    assert torch.allclose(gap, gap[0].expand(5), atol=1e-6)


def test_char_ngram_features_count_hashed_ngrams():
    features = char_ngram_features(["aba", ""], ngram=2, buckets=4096)
    assert features[0].sum() == 3 + 2 and features[1].sum() == 0  # a, b, a + ab, ba
    assert features[0].max() == 2  # "a" twice (no collision among 4 n-grams in 4096 buckets)
    assert torch.equal(char_ngram_features(["aba"], 2, 4096), features[:1])  # deterministic


def test_ebft_replaces_the_reward_by_feature_matching(tmp_path):
    cfg = load_config("sanity/tiny_cpu", [*QUIET, "algo.ebft=true", "algo.extra.ebft={features: char_ngram}"])
    trainer = Trainer(cfg, tmp_path / "run")
    batch = trainer.collect()
    rollout = batch.rollout
    references = [trainer.task.reference_output(batch.examples[i]) for i in rollout.example_index.tolist()]
    expected = feature_matching_rewards(char_ngram_features(rollout.outputs, 3, 256),
                                        char_ngram_features(references, 3, 256), rollout.group_id, 1.0)
    assert torch.allclose(batch.rewards, expected)
    assert torch.equal(batch.outcome, torch.tensor([r.score for r in batch.results]))  # the verifier is still logged


def test_ebft_hidden_features_come_from_the_frozen_initial_policy(tmp_path):
    cfg = load_config("sanity/tiny_cpu", [*QUIET, "algo.ebft=true"])
    trainer = Trainer(cfg, tmp_path / "run")
    batch = trainer.collect()
    rollout = batch.rollout
    examples = [batch.examples[i] for i in rollout.example_index.tolist()]
    references = [trainer.task.reference_output(e) for e in examples]
    policy = trainer.policy
    expected = feature_matching_rewards(policy.completion_features(examples, rollout.outputs),
                                        policy.completion_features(examples, references), rollout.group_id, 1.0)
    assert torch.allclose(batch.rewards, expected, atol=1e-5)
    trainer.update(rollout, *trainer.advantages(batch))
    with torch.no_grad():  # the policy moved; the features did not
        again = dict(trainer.rollout_hooks)["ebft"].finish(batch).rewards
    assert torch.allclose(again, expected, atol=1e-5)
