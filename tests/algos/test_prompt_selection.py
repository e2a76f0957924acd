"""Prompt selection (``algo.prompt_selection``): the trainer draws k candidates per prompt and one hook keeps
``prompts_per_step`` of them, the same on every process."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mmrl.algos.variants.history import prompt_key
from mmrl.core.rollout import SamplingParams
from mmrl.core.trainer import Trainer

SMALL = ["warm_start.sft_steps=15", "rollout.prompts_per_step=4", "rollout.group_size=4", "trainer.minibatches=1",
         "eval.every=0", "eval.num_examples=8"]


def selector(trainer: Trainer):
    (hook,) = [h for name, h in trainer.rollout_hooks if name == "prompt_selection"]
    return hook


def test_hard_focus_keeps_the_prompts_that_failed_most(sanity_config, tmp_path):
    trainer = Trainer(sanity_config(*SMALL, "algo.prompt_selection=hard_focus", "trainer.steps=1"), tmp_path / "r")
    hook = selector(trainer)
    candidates = trainer.task.sample_batch("train", 6, np.random.default_rng(0))
    keys = [prompt_key(c) for c in candidates]
    # posterior failure rates (f + 1) / (s + f + 2): c0 1/4 (2 successes), c1 3/4 (2 failures), c2 unseen 1/2,
    # c3 never solved in 16 samples (deprioritised), c4 2/3 (1 failure), c5 unseen 1/2
    hook.history.update([keys[0]] * 2 + [keys[1]] * 2 + [keys[3]] * 16 + [keys[4]], [1, 1, 0, 0] + [0] * 16 + [0])
    chosen = hook.select_prompts(candidates, 4)
    assert chosen == [candidates[1], candidates[4], candidates[2], candidates[5]]
    assert hook.candidates_per_prompt == 4


def test_low_likelihood_keeps_the_prompts_whose_reference_is_least_likely(sanity_config, tmp_path):
    trainer = Trainer(sanity_config(*SMALL, "algo.prompt_selection=low_likelihood", "trainer.steps=1"),
                      tmp_path / "r")
    hook, task = selector(trainer), trainer.task
    candidates = task.sample_batch("train", 8, np.random.default_rng(1))
    rows = trainer.policy.rollout_from_outputs(candidates, [task.reference_output(c) for c in candidates],
                                               SamplingParams(trainer.cfg.rollout.temperature))
    mean = rows.logp.sum(1) / rows.mask.sum(1)
    expected = [candidates[i] for i in torch.argsort(mean, stable=True)[:3].tolist()]
    assert hook.select_prompts(candidates, 3) == expected


def test_a_selecting_run_resumes_exactly(sanity_config, tmp_path):
    overrides = [*SMALL, "eval.every=2", "algo.prompt_selection=hard_focus", "trainer.steps=4", "checkpoint.every=2"]
    full = Trainer(sanity_config(*overrides), tmp_path / "full")
    full.train()
    half = Trainer(sanity_config(*overrides[:-2], "trainer.steps=2", "checkpoint.every=2"), tmp_path / "half")
    half.train()
    resumed = Trainer(sanity_config(*overrides), tmp_path / "half", resume=True)
    resumed.train()

    def rows(out):
        return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
                for line in (out / "metrics.jsonl").read_text().splitlines()]

    assert rows(tmp_path / "half") == rows(tmp_path / "full")
    assert rows(tmp_path / "full")[-1]["rollout/selection_seen_prompts"] == pytest.approx(4 * 4)


def test_pairing_keeps_hard_but_solvable_and_easy_but_brittle_prompts(sanity_config, tmp_path):
    trainer = Trainer(sanity_config(*SMALL, "algo.prompt_selection=pos_neg_pairing", "trainer.steps=1"),
                      tmp_path / "r")
    hook = selector(trainer)
    candidates = trainer.task.sample_batch("train", 7, np.random.default_rng(0))
    keys = [prompt_key(c) for c in candidates]
    # success rates: c0 1/4 (hard, solvable), c1 0 (never solved), c2 3/4 (easy, brittle), c3 1 (always),
    # c4 1/2 (easy side), c5 1/8 (hardest solvable), c6 unseen
    outcomes = {0: [1, 0, 0, 0], 1: [0, 0], 2: [1, 1, 1, 0], 3: [1, 1], 4: [1, 0], 5: [1] + [0] * 7}
    for i, rows in outcomes.items():
        hook.history.update([keys[i]] * len(rows), rows)
    assert hook.select_prompts(candidates, 4) == [candidates[5], candidates[0], candidates[2], candidates[4]]
    assert hook.select_prompts(candidates, 6)[4:] == [candidates[1], candidates[3]]  # the rest, in draw order


def test_at_most_one_hook_may_choose_prompts_or_drive_rounds():
    from mmrl.algos.hooks import RolloutHook, prompt_selector, round_driver

    class Chooser(RolloutHook):
        candidates_per_prompt = 2

    class Driver(RolloutHook):
        drives_rounds = True

    plain, chooser = RolloutHook(), Chooser()
    assert prompt_selector([("a", plain), ("b", chooser)]) is chooser and prompt_selector([("a", plain)]) is None
    with pytest.raises(ValueError, match=r"\['b', 'c'\] each choose a round's prompts"):
        prompt_selector([("a", plain), ("b", chooser), ("c", Chooser())])
    assert type(round_driver([("a", plain)])) is RolloutHook  # a pass-through driver when none drives
    with pytest.raises(ValueError, match="each decide a step's rounds"):
        round_driver([("a", Driver()), ("b", Driver())])
