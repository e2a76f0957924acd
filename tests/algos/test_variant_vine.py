"""Vine sampling for Polychromic PPO (mmrl/algos/variants/vine.py): the branch states, the vine groups on the
sanity policy (prefixes, counts, decisions, set advantages), refusals, and a short training run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mmrl.algos.variants.group_estimators import set_marginal_advantage
from mmrl.algos.variants.hooks import output_key
from mmrl.algos.variants.vine import branch_states, check_resumable
from mmrl.core.config import ConfigError, load_config
from mmrl.core.logging import read_metrics
from mmrl.core.registry import make_policy, make_task
from mmrl.core.trainer import Trainer, train

QUIET = ["log.progress=false", "log.tensorboard=false", "eval.every=0", "eval.num_examples=4",
         "warm_start.sft_steps=0", "rollout.prompts_per_step=4", "rollout.group_size=4", "trainer.minibatches=1",
         "trainer.steps=1"]
VINE = ["algo.advantage=polychromic", "algo.extra.polychromic={set_size: 2, vine_states: 3, vine_samples: 5}"]


def test_branch_states_lie_strictly_inside_answers_one_per_group_and_are_seeded():
    outputs = ["1234", "9", "", "56", "7", "8", "abcdef", "xyz"]
    group = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3])  # group 2 has no answer of two characters: never a state
    for seed in range(20):
        states = branch_states(outputs, group, 4, 3, np.random.default_rng(seed))
        assert states == branch_states(outputs, group, 4, 3, np.random.default_rng(seed))
        assert len(states) == 3
        groups = [int(group[row]) for row, _ in states]
        assert groups == sorted(set(groups)) and 2 not in groups
        assert all(len(outputs[row]) >= 2 and 1 <= t < len(outputs[row]) for row, t in states)
    drawn = {state for seed in range(200) for state in branch_states(outputs, group, 4, 3, np.random.default_rng(seed))}
    assert drawn == {(0, 1), (0, 2), (0, 3), (3, 1), (6, 1), (6, 2), (6, 3), (6, 4), (6, 5), (7, 1), (7, 2)}
    assert len(branch_states(outputs, group, 4, 10, np.random.default_rng(0))) == 3  # as many as there are groups
    assert branch_states(["1", ""], torch.tensor([0, 1]), 2, 3, np.random.default_rng(0)) == []


def collect(tmp_path, name):
    trainer = Trainer(load_config("sanity/tiny_cpu", [*QUIET, *VINE]), tmp_path / name)
    return trainer, trainer.collect()


def test_vine_groups_continue_a_sampled_answer_and_get_the_set_advantage(tmp_path):
    trainer, batch = collect(tmp_path, "a")
    rollout, tokenizer, payload = batch.rollout, trainer.policy.tokenizer, batch.rollout.payload
    assert batch.stats["rollout/vine_groups"] == 3
    assert len(batch.examples) == 4 + 3 and rollout.num_rows == 16 + 3 * 5
    assert sorted(rollout.group_id.tolist()) == [g for g in range(4) for _ in range(4)] + [g for g in range(4, 7)
                                                                                          for _ in range(5)]
    first = rollout.select(torch.arange(16))
    advantages, _, _ = trainer.advantages(batch)
    credited = 0
    for g in range(4, 7):
        rows = (rollout.group_id == g).nonzero().squeeze(1)
        base = batch.examples[g]
        context = tokenizer.decode(payload.prompt_ids[rows[0]], skip_special_tokens=True)
        assert context.startswith(base.prompt)
        prefix = context[len(base.prompt):]
        sources = [o for i, o in enumerate(first.outputs) if batch.examples[int(first.example_index[i])] == base]
        assert any(len(prefix) < len(o) and o.startswith(prefix) for o in sources) and prefix  # inside an answer
        for i in rows.tolist():
            assert tokenizer.decode(payload.prompt_ids[i], skip_special_tokens=True) == context
            output = rollout.outputs[i]
            assert output.startswith(prefix)  # the task scores prefix + continuation
            assert batch.results[i].score == trainer.task.reward(base, output).score
            # only the continuation's tokens are decisions (one character each, then EOS unless cut at 8)
            decided = tokenizer.decode(payload.completion_ids[i][payload.completion_mask[i] > 0],
                                       skip_special_tokens=True)
            assert decided == output[len(prefix):]
            assert int(rollout.mask[i].sum()) == min(len(decided) + 1, 8)
        ids: dict[str, int] = {}
        classes = torch.tensor([ids.setdefault(output_key(rollout.outputs[i]), len(ids)) for i in rows.tolist()])
        expected = set_marginal_advantage(batch.rewards[rows].double(), classes, 2, 20000)
        torch.testing.assert_close(advantages[rows, 0].double(), expected, atol=1e-6, rtol=0)
        credited += bool(expected.abs().max() > 0)
    assert credited > 0  # some vine group's continuations differ in score: the parity is not 0 = 0
    _, again = collect(tmp_path, "b")  # the states and continuations are seeded by the round
    assert again.rollout.outputs == rollout.outputs


@pytest.mark.parametrize("overrides, match", [
    (["algo.advantage=polychromic", "algo.extra.polychromic={vine_states: -1}"], "vine_states must be >= 0"),
    (["algo.advantage=polychromic", "algo.extra.polychromic={vine_states: 2, vine_samples: 1}"], "vine_samples"),
    (["algo.extra.polychromic={vine_states: 2}"], "algo.advantage=polychromic"),
    (["algo.advantage=polychromic", "algo.extra.polychromic={vine_states: 2}", "algo.answer_prefix='1'"],
     "cannot be combined"),
])
def test_vine_refuses_bad_settings(tmp_path, overrides, match):
    with pytest.raises(ConfigError, match=match):
        Trainer(load_config("sanity/tiny_cpu", [*QUIET, *overrides]), tmp_path / "run")


def test_vine_refuses_a_policy_or_task_that_cannot_resume_from_a_prefix():
    text_task = make_task("sanity/reverse-v0", {"min_len": 3, "max_len": 4})
    scorer = make_policy("candidate_scorer", {"hidden": 8, "layers": 1})  # scores candidates, writes no text
    with pytest.raises(ConfigError, match="cannot resume an answer from a prefix"):
        check_resumable(scorer, text_task, "algo.extra.polychromic.vine_states")
    driving = make_task("driving/rift-v0", {"train_pool": 4})  # its answers are candidate indices
    with pytest.raises(ConfigError, match="text answers"):
        check_resumable(scorer, driving, "algo.extra.polychromic.vine_states")


def test_two_training_steps_with_vine_sampling(tmp_path):
    cfg = load_config("sanity/tiny_cpu", [*QUIET, *VINE, "trainer.steps=2", "warm_start.sft_steps=5"])
    out = train(cfg, tmp_path / "run")
    steps = [m for m in read_metrics(out) if "rollout/vine_groups" in m]
    assert len(steps) == 2
    for m in steps:
        assert m["rollout/vine_groups"] == 3 and m["rollout/trained_rows"] == 16 + 15
        assert 0 <= m["rollout/vine_success"] <= 1 and 0 < m["rollout/vine_prefix_frac"] < 1
        assert math.isfinite(m["loss/total"])


def test_vine_groups_on_the_vlm_policy(tmp_path):
    """The Qwen-VL policy resumes from a prefix too: the vine groups show the example's image and train."""
    small = ["trainer.steps=1", "warm_start.sft_steps=5", "warm_start.vision_steps=0", "rollout.prompts_per_step=4",
             "rollout.group_size=4", "trainer.minibatches=1", "eval.num_examples=4", "eval.every=0",
             "log.progress=false", "log.tensorboard=false"]
    cfg = load_config("vlm_sanity/tiny_cpu", [*small, "algo.advantage=polychromic",
                                              "algo.extra.polychromic={set_size: 2, vine_states: 2}"])
    trainer = Trainer(cfg, tmp_path / "run")
    batch = trainer.collect()
    assert batch.stats["rollout/vine_groups"] == 2
    assert len(batch.examples) == 6 and batch.rollout.num_rows == 16 + 2 * 4
    for i in range(16, 24):
        base = batch.examples[int(batch.rollout.example_index[i])]
        assert batch.results[i].score == trainer.task.reward(base, batch.rollout.outputs[i]).score
    trainer.update(batch.rollout, *trainer.advantages(batch))
