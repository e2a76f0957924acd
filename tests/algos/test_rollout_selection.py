"""Rollout selection (mmrl/algos/variants/rollout_selection.py): RoRecomp's priority / compensation batches and the
contextual-bandit rollout scheduler. Golden numbers of their rules, the hooks on hand-made batches (which rows are
kept, what is stored, replayed rows carry their stored π_old), and exact resume of their checkpointed state."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.testing import assert_close

from mmrl.algos.variants.hooks import training_sampling
from mmrl.algos.variants.rollout_selection import (bandit_update, normalised_gain, priority_rows, replayable,
                                                   rollout_features, top_rows_per_group, ucb_scores)
from mmrl.core.config import ConfigError
from mmrl.core.trainer import Trainer
from mmrl.tasks.sanity import ReverseExample

SMALL = ["warm_start.sft_steps=15", "rollout.prompts_per_step=4", "rollout.group_size=4", "trainer.minibatches=1",
         "eval.every=0", "eval.num_examples=8"]


def hook_of(trainer: Trainer, name: str):
    (hook,) = [h for n, h in trainer.rollout_hooks if n == name]
    return hook


def hand_batch(trainer: Trainer, groups: list[tuple[str, list[str]]]):
    """Scored rows with the given outputs for the given digit strings (group g answers example g)."""
    examples = [ReverseExample(digits) for digits, _ in groups]
    index = torch.tensor([g for g, (_, outputs) in enumerate(groups) for _ in outputs])
    rows = trainer.policy.rollout_from_outputs([examples[g] for g in index.tolist()],
                                               [o for _, outputs in groups for o in outputs],
                                               training_sampling(trainer.cfg))
    return trainer.score(rows.replace(example_index=index, group_id=index.clone()), examples)


# -- RoRecomp -------------------------------------------------------------------------------------------------

def test_priority_rows_keep_the_shortest_correct_and_longest_incorrect():
    outcome = torch.tensor([1, 0, 1, 0, 1, 0, 1, 1, 1, 0.5, 1.0, 1, 1, 0])
    lengths = torch.tensor([5, 7, 3, 2, 4, 6, 1, 9, 5, 3, 3, 4, 4, 1])
    index = torch.tensor([0] * 6 + [1] * 3 + [2] * 2 + [3] * 3)
    keep = priority_rows(outcome, lengths, index, 0.5, 1.0)
    # group 0: correct rows 0 (5), 2 (3), 4 (4) → the ⌈1.5⌉ = 2 shortest: 2, 4; incorrect 1 (7), 3 (2), 5 (6) → 1, 5
    # group 1: all correct, kept whole; group 2: one of each, both kept; group 3: a tie of correct lengths → row 11
    assert keep.tolist() == [False, True, True, False, True, True, True, True, True, True, True, True, False, True]
    assert bool(priority_rows(outcome, lengths, index, 1.0, 1.0).all())
    # a lower threshold changes the classes: in group 2, 0.5 is now correct too (one class: kept whole)
    assert priority_rows(outcome, lengths, index, 0.5, 0.5)[9:11].tolist() == [True, True]


def test_rorecomp_trains_the_priority_batch_and_replays_the_rest_later(sanity_config, tmp_path):
    trainer = Trainer(sanity_config(*SMALL, "trainer.steps=1", "algo.rorecomp=true",
                                    "algo.extra.rorecomp={compensation_every: 1, compensation_groups: 1}"), tmp_path / "r")
    hook = hook_of(trainer, "rorecomp")
    # group 0 scores [1, 0.75, 1/3, 1] with lengths (EOS included) [4, 5, 2, 4]: priority rows 0 (the first of the
    # two shortest correct) and 1 (the longest incorrect); rows 2 and 3 hold both classes → stored.
    # group 1 is all correct: kept whole, nothing stored.
    batch = hand_batch(trainer, [("123", ["321", "3219", "3", "321"]), ("456", ["654"] * 4)])
    assert batch.outcome.tolist() == pytest.approx([1, 0.75, 1 / 3, 1, 1, 1, 1, 1])
    first = hook.finish(batch)
    assert first.rollout.outputs == ["321", "3219", "654", "654", "654", "654"]
    assert first.rollout.example_index.tolist() == [0, 0, 1, 1, 1, 1]
    (stored,) = hook.buffer
    assert stored.outputs == ("3", "321") and stored.example == ReverseExample("123") and stored.step == 1
    again = trainer.policy.rollout_from_outputs([stored.example] * 2, list(stored.outputs), training_sampling(trainer.cfg))
    assert_close(torch.tensor(stored.logp[1]), again.logp[1, :4])
    # the next step replays the stored group as a compensation group of its own, with the stored π_old
    second = hook.finish(hand_batch(trainer, [("123", ["321", "3219", "3", "321"]), ("456", ["654"] * 4)]))
    assert len(second.examples) == 3 and second.examples[2] == ReverseExample("123")
    replayed = (second.rollout.example_index == 2).nonzero().squeeze(1)
    assert [second.rollout.outputs[i] for i in replayed.tolist()] == ["3", "321"]
    assert second.outcome[replayed].tolist() == pytest.approx([1 / 3, 1])
    assert_close(second.rollout.logp[replayed[1], :4], torch.tensor(stored.logp[1]))
    assert hook.metrics()["rollout/rorecomp_compensation_rows"] == 2
    assert len(hook.buffer) == 1 and hook.buffer[0].step == 2  # the replayed group left, the new one entered


def test_replayed_groups_fill_whole_minibatches():
    assert [replayable(n, 2) for n in (0, 1, 2, 3, 4)] == [0, 0, 2, 2, 4]
    assert replayable(3, 1) == 3


def metric_rows(out):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


def resumes_exactly(sanity_config, tmp_path, *overrides: str) -> list[dict]:
    """Train 4 steps, and 2 + resume + 2; the metrics must be identical. Returns the full run's rows."""
    common = [*SMALL, "warm_start.sft_steps=60", "eval.every=2", *overrides]  # the recipe's warm start: mixed groups
    full_overrides = [*common, "trainer.steps=4", "checkpoint.every=2"]
    Trainer(sanity_config(*full_overrides), tmp_path / "full").train()
    Trainer(sanity_config(*common, "trainer.steps=2", "checkpoint.every=2"), tmp_path / "half").train()
    Trainer(sanity_config(*full_overrides), tmp_path / "half", resume=True).train()
    assert metric_rows(tmp_path / "half") == metric_rows(tmp_path / "full")
    return metric_rows(tmp_path / "full")


def test_a_rorecomp_run_resumes_exactly(sanity_config, tmp_path):
    rows = resumes_exactly(sanity_config, tmp_path, "algo.rorecomp=true",
                           "algo.extra.rorecomp={compensation_every: 1, success_threshold: 0.7}")
    assert rows[3]["rollout/rorecomp_compensation_rows"] > 0  # step 3 replays what step 2 stored before the break
    assert all(r["rollout/rorecomp_dropped_rows"] > 0 for r in rows[1:])


# -- the contextual-bandit scheduler --------------------------------------------------------------------------

def test_rollout_features_golden():
    features = rollout_features(torch.tensor([1.0, 0.0, 0.5, 0.5]), torch.tensor([2, 4, 3, 3]),
                                torch.tensor([0, 0, 1, 1]), 4, torch.tensor([0, 0, 2, 0]))
    third = 0.5 / (0.5 + 1e-6) / 3
    assert_close(features, torch.tensor([[1, third, third, 0.5, 0.5, 0], [1, -third, third, 0.5, 1.0, 0],
                                         [1, 0, 0, 0.5, 0.75, 2 / 3], [1, 0, 0, 0.5, 0.75, 0]], dtype=torch.float64))
    # one success among 16: a = (15/16) / 0.2421 = 3.87, clipped to 3 → 1
    rare = rollout_features(torch.tensor([1.0] + [0.0] * 15), torch.ones(16), torch.zeros(16, dtype=torch.long), 1,
                            torch.zeros(16))
    assert rare[0, 1].item() == pytest.approx(1.0) and rare[1, 1].item() == pytest.approx(-(1 / 16) / 0.2421 / 3, rel=1e-3)


def test_ucb_scores_and_update_golden():
    a_matrix, b_vector = torch.tensor([[2.0, 0.0], [0.0, 4.0]], dtype=torch.float64), torch.tensor([2.0, 4.0],
                                                                                                    dtype=torch.float64)
    # θ = A⁻¹b = [1, 1]; widths sqrt(xᵀA⁻¹x) = sqrt(0.5), sqrt(0.5 + 4 · 0.25)
    scores = ucb_scores(torch.tensor([[1.0, 0.0], [1.0, 2.0]], dtype=torch.float64), a_matrix, b_vector, 2.0)
    assert scores.tolist() == pytest.approx([1 + 2 * math.sqrt(0.5), 3 + 2 * math.sqrt(1.5)])
    a_new, b_new = bandit_update(torch.eye(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64),
                                 torch.tensor([[1.0, 0.0], [1.0, 2.0]], dtype=torch.float64), 3.0)
    assert a_new.tolist() == [[2.0, 1.0], [1.0, 3.0]] and b_new.tolist() == [3.0, 3.0]
    assert normalised_gain(0.2, 0.4, 2) == pytest.approx(1.0)


def test_top_rows_per_group_keeps_ties_in_row_order():
    keep = top_rows_per_group(torch.tensor([0.1, 0.5, 0.5, 0.2, 1.0, 0.0]), torch.tensor([0, 0, 0, 0, 1, 1]), 2)
    assert keep.tolist() == [False, True, True, False, True, True]


def test_the_scheduler_selects_rows_reuses_groups_and_learns_from_the_gain(sanity_config, tmp_path):
    trainer = Trainer(sanity_config(*SMALL, "trainer.steps=1", "algo.rollout_bandit=true",
                                    "algo.extra.rollout_bandit={keep_per_group: 2, replay_groups: 1, alpha: 0.0}"),
                      tmp_path / "r")
    hook = hook_of(trainer, "rollout_bandit")
    # θ = 0, α = 0: every score ties, so each group keeps its first two rows; the varied group 0 is stored
    first = hook.finish(hand_batch(trainer, [("123", ["321", "3219", "3", "321"]), ("456", ["654"] * 4)]))
    assert first.rollout.outputs == ["321", "3219", "654", "654"]
    assert len(hook.buffer) == 1 and hook.buffer[0].group.outputs == ("321", "3219", "3", "321")
    assert len(hook.pending) == 4 and hook.last_reward == pytest.approx((1 + 0.75 + 1 / 3 + 1 + 4) / 8)
    # a worse step: the gain is negative, the four arms chosen before share it (normalised to −1)
    second = hook.finish(hand_batch(trainer, [("789", ["987", "9", "9", "98"])]))
    gain = (1 + 1 / 3 + 1 / 3 + 2 / 3) / 4 - (1 + 0.75 + 1 / 3 + 1 + 4) / 8
    assert hook.metrics()["rollout/bandit_gain"] == pytest.approx(gain)
    chosen = torch.tensor(rollout_features(torch.tensor([1, 0.75, 1 / 3, 1, 1, 1, 1, 1]), torch.tensor([4, 5, 2, 4, 4, 4, 4, 4]),
                                           torch.tensor([0] * 4 + [1] * 4), trainer.cfg.rollout.max_new_tokens,
                                           torch.zeros(8))[[0, 1, 4, 5]].tolist(), dtype=torch.float64)
    assert_close(hook.b_vector, -chosen.sum(0) / 4)
    # the new group keeps its two best rows under the updated model; the stored group is reused whole
    theta = torch.linalg.solve(hook.a_matrix, hook.b_vector)
    new = rollout_features(torch.tensor([1, 1 / 3, 1 / 3, 2 / 3]), torch.tensor([4, 2, 2, 3]), torch.zeros(4, dtype=torch.long),
                           trainer.cfg.rollout.max_new_tokens, torch.zeros(4))
    best = sorted(range(4), key=lambda i: -float(new[i] @ theta))[:2]
    assert second.rollout.outputs == [["987", "9", "9", "98"][i] for i in sorted(best)] + ["321", "3219", "3", "321"]
    assert second.rollout.example_index.tolist() == [0, 0, 1, 1, 1, 1]
    assert hook.buffer[0].group.outputs == ("987", "9", "9", "98")


def test_a_bandit_run_resumes_exactly(sanity_config, tmp_path):
    rows = resumes_exactly(sanity_config, tmp_path, "algo.rollout_bandit=true",
                           "algo.extra.rollout_bandit={keep_per_group: 3}")
    assert [r["rollout/bandit_kept_rows"] for r in rows[1:]] == [4 * 3] * 4
    assert rows[3]["rollout/bandit_replayed_rows"] > 0 and rows[3]["rollout/bandit_gain"] is not None


@pytest.mark.parametrize("overrides, message", [
    (["algo.rorecomp=true", "trainer.recompute_logp_old=true"], "compensation rows with their stored"),
    (["algo.rorecomp=true", "algo.rollout_bandit=true"], "both choose the rows"),
    (["algo.rollout_bandit=true", "algo.advantage=polychromic"], "per-row inputs"),
    (["algo.rorecomp=true", "algo.temperature_schedule=erpo"], "wrong π_old"),
])
def test_conflicting_recipes_are_refused(sanity_config, overrides, message):
    with pytest.raises(ConfigError, match=message):
        sanity_config(*overrides)


def test_bad_parameters_are_refused(sanity_config, tmp_path):
    with pytest.raises(ConfigError, match="keep_per_group >= 2"):
        Trainer(sanity_config(*SMALL, "algo.rollout_bandit=true", "algo.extra.rollout_bandit={keep_per_group: 1}"),
                tmp_path / "a")
    with pytest.raises(ConfigError, match="priority_share"):
        Trainer(sanity_config(*SMALL, "algo.rorecomp=true", "algo.extra.rorecomp={priority_share: 0}"), tmp_path / "b")
