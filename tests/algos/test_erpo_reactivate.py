"""ERPO's "reactivate" (``algo.prompt_selection: erpo_reactivate``, mmrl/algos/variants/selection.py): residual
prompts (last group all-correct) are tracked and drawn again in later rounds; the tracker's rules, the selector
on hand-made batches, and exact resume with the tracker checkpointed."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mmrl.algos.variants.hooks import training_sampling
from mmrl.algos.variants.selection import ResidualTracker, reactivation_count
from mmrl.core.config import ConfigError
from mmrl.core.trainer import Trainer
from mmrl.tasks.sanity import ReverseExample

SMALL = ["warm_start.sft_steps=15", "rollout.prompts_per_step=4", "rollout.group_size=4", "trainer.minibatches=1",
         "eval.every=0", "eval.num_examples=8"]


def test_reactivation_count():
    assert reactivation_count(5, 16, 0.25) == 4
    assert reactivation_count(2, 16, 0.25) == 2
    assert reactivation_count(5, 3, 0.25) == 0  # ⌊0.75⌋
    assert reactivation_count(5, 4, 1.0) == 4


def test_the_tracker_enters_reactivates_revives_and_retires():
    tracker = ResidualTracker(capacity=3)
    assert tracker.observe("a", "A", True, 2) == "entered"
    assert tracker.observe("b", "B", False, 2) == "none"  # a prompt with signal is not residual
    assert tracker.observe("c", "C", True, 2) == "entered"
    assert tracker.take(1) == ["A"]  # least recently drawn first; a moves to the back
    assert list(tracker.entries) == ["c", "a"] and tracker.entries["a"] == ("A", 1)
    assert tracker.observe("a", "A", True, 2) == "kept"  # still all-correct, re-drawn once of 2
    assert tracker.take(2) == ["C", "A"]
    assert tracker.observe("a", "A", True, 2) == "retired"  # all-correct after 2 re-draws: solved for good
    assert tracker.observe("c", "C", False, 2) == "revived"  # its group is mixed now: the signal is back
    assert len(tracker) == 0
    for key in "defg":
        tracker.observe(key, key.upper(), True, 2)
    assert list(tracker.entries) == ["e", "f", "g"]  # over capacity: the oldest leaves


def test_residual_prompts_are_drawn_again(sanity_config, tmp_path):
    trainer = Trainer(sanity_config(*SMALL, "trainer.steps=1", "algo.prompt_selection=erpo_reactivate",
                                    "algo.extra.erpo_reactivate={share: 0.5, max_reactivations: 1}"), tmp_path / "r")
    (hook,) = [h for name, h in trainer.rollout_hooks if name == "prompt_selection"]
    assert hook.candidates_per_prompt == 1
    examples = [ReverseExample("123"), ReverseExample("456")]
    index = torch.tensor([0] * 2 + [1] * 2)
    rows = trainer.policy.rollout_from_outputs([examples[g] for g in index.tolist()], ["321", "321", "654", "6"],
                                               training_sampling(trainer.cfg))
    batch = trainer.score(rows.replace(example_index=index, group_id=index.clone()), examples)
    hook.finish(batch)  # "123" was solved by its whole group: residual; "456" was not
    assert [e for e, _ in hook.tracker.entries.values()] == [ReverseExample("123")]
    candidates = trainer.task.sample_batch("train", 4, np.random.default_rng(0))
    assert hook.select_prompts(candidates, 4) == [ReverseExample("123"), *candidates[:3]]
    assert hook.select_prompts(candidates, 4) == [ReverseExample("123"), *candidates[:3]]  # the only one: again
    hook.finish(batch)  # still all-correct after its re-draws: retired
    assert len(hook.tracker) == 0 and hook.select_prompts(candidates, 4) == candidates
    assert hook.metrics() == {"rollout/residual_prompts": 0.0, "rollout/reactivated_prompts": 2.0,
                              "rollout/reactivated_revived": 0.0}


def test_a_reactivating_run_resumes_exactly(sanity_config, tmp_path):
    # a soft success threshold so that the recipe's warm start leaves residual prompts within a few steps
    overrides = [*SMALL, "warm_start.sft_steps=60", "eval.every=2", "algo.prompt_selection=erpo_reactivate",
                 "algo.temperature_schedule=erpo", "algo.extra.erpo={success_threshold: 0.5}",
                 "algo.extra.erpo_reactivate={share: 0.5, success_threshold: 0.5}"]
    Trainer(sanity_config(*overrides, "trainer.steps=4", "checkpoint.every=2"), tmp_path / "full").train()
    Trainer(sanity_config(*overrides, "trainer.steps=2", "checkpoint.every=2"), tmp_path / "half").train()
    Trainer(sanity_config(*overrides, "trainer.steps=4", "checkpoint.every=2"), tmp_path / "half", resume=True).train()

    def rows(out):
        return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
                for line in (out / "metrics.jsonl").read_text().splitlines()]

    assert rows(tmp_path / "half") == rows(tmp_path / "full")
    assert sum(r["rollout/reactivated_prompts"] for r in rows(tmp_path / "full")[3:]) > 0  # after the break too


def test_bad_parameters_are_refused(sanity_config, tmp_path):
    with pytest.raises(ConfigError, match="share"):
        Trainer(sanity_config(*SMALL, "algo.prompt_selection=erpo_reactivate",
                              "algo.extra.erpo_reactivate={share: 1.5}"), tmp_path / "r")
