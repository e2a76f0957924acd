"""judge/verdict-v0 (JudgeRLVR's judging stage over any task): verdicts from the base reward, a total reward."""

from __future__ import annotations

import numpy as np
import pytest

from mmrl.core.registry import make_task
from mmrl.core.typed import ConfigError
from mmrl.tasks.judge import verdict_of

TEXT = {"task": "data/rows-v0", "args": {"train_files": "assets/data/arith_train.jsonl",
                                         "test_files": "assets/data/arith_test.jsonl", "template": "Q: {prompt}\nA:",
                                         "reward": "number", "answer_template": "{answer}"}}


def test_verdicts_are_the_base_rewards_and_sampling_is_seeded():
    task = make_task("judge/verdict-v0", TEXT)
    examples = task.sample_batch("train", 64, np.random.default_rng(0))
    again = task.sample_batch("train", 64, np.random.default_rng(0))
    assert [(e.prompt, e.verdict) for e in examples] == [(e.prompt, e.verdict) for e in again]
    base = task.base
    for e in examples:
        correct = base.reward(e.base, e.proposal).score >= 1.0
        assert e.verdict == ("yes" if correct else "no")
        assert e.prompt == f"{e.base.prompt} {e.proposal}\nCorrect? yes or no:"
    share = np.mean([e.verdict == "yes" for e in examples])
    assert 0.35 < share < 0.8  # half the proposals are the example's own answer, a few others happen to be right
    assert task.reference_output(examples[0]) == examples[0].verdict
    assert task.reward(examples[0], examples[0].verdict).score == 1.0


@pytest.mark.parametrize("output, said", [("yes", "yes"), (" No.", "no"), ("YES it is", "yes"), ("maybe", None),
                                          ("", None), (None, None), (7, None), ("yesno", None)])
def test_the_verdict_is_the_first_word(output, said):
    assert verdict_of(output) == said


def test_images_and_system_ride_along_and_bad_settings_are_refused():
    task = make_task("judge/verdict-v0", {"task": "vlm_sanity/shape_color-v0"})
    example = task.sample_batch("test", 1, np.random.default_rng(0))[0]
    assert example.images == tuple(example.base.images) and len(example.images) == 1
    assert task.reward(example, "perhaps").score == 0.0 and task.reward(example, "perhaps").info
    with pytest.raises(ConfigError, match="correct_fraction"):
        make_task("judge/verdict-v0", {**TEXT, "correct_fraction": 2})
    with pytest.raises(ConfigError, match="proposal"):
        make_task("judge/verdict-v0", {**TEXT, "template": "{prompt} right?"})
