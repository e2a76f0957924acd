"""MR-RLVR's pretexts over a text task: pretext/mask-fill-v0 (one number masked, its value the answer) and
pretext/step-order-v0 (the steps shown shuffled, their original order the answer)."""

from __future__ import annotations

import numpy as np
import pytest

from mmrl.core.registry import make_task
from mmrl.core.typed import ConfigError
from mmrl.tasks.pretext.step_order import StepOrderExample, split_steps

ROWS = {"train_files": "assets/data/arith_train.jsonl", "test_files": "assets/data/arith_test.jsonl",
        "template": "Q: {prompt}\nA:", "reward": "number", "answer_template": "{answer}"}


def task(**extra):
    return make_task("pretext/mask-fill-v0", {"task": "data/rows-v0", "args": ROWS, **extra})


def test_one_number_of_question_and_answer_is_masked_and_is_the_answer():
    t = task(mask_token="?")
    examples = t.sample_batch("train", 32, np.random.default_rng(0))
    assert [e.prompt for e in examples] == [e.prompt for e in t.sample_batch("train", 32, np.random.default_rng(0))]
    for e in examples:
        full = f"{e.base.prompt} {t.base.reference_output(e.base)}"
        n = len(e.missing)
        assert any(e.text[:k] == full[:k] and full[k:k + n] == e.missing and e.text[k] == "?"
                   and e.text[k + 1:] == full[k + n:] for k in range(len(e.text)))  # one number, masked in place
        assert e.prompt == f"{e.text}\nMissing:"
        assert t.reward(e, t.reference_output(e)).score == 1.0
    assert len({e.text.endswith("A: ?") for e in examples}) == 2  # answers are masked too, not only questions


@pytest.mark.parametrize("output, score", [("4", 1.0), (" 4 pens", 1.0), ("4.", 1.0), ("40", 0.0), ("", 0.0),
                                           (None, 0.0), ("four", 0.0)])
def test_the_fill_is_the_first_token(output, score):
    t = task()
    example = next(e for e in t.sample_batch("train", 64, np.random.default_rng(1)) if e.missing == "4")
    assert t.reward(example, output).score == score


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="text"):
        task(template="Missing:")
    with pytest.raises(ConfigError, match="mask_token"):
        task(mask_token="0")


# -- pretext/step-order-v0: MR-RLVR's step reordering -------------------------------------------------------------

def order_task(**extra):
    return make_task("pretext/step-order-v0", {"task": "data/rows-v0", "args": ROWS, **extra})


def test_steps_are_shown_shuffled_and_the_answer_restores_the_transcript():
    t = order_task()
    examples = t.sample_batch("train", 32, np.random.default_rng(0))
    assert [e.prompt for e in examples] == [e.prompt for e in t.sample_batch("train", 32, np.random.default_rng(0))]
    for e in examples:
        transcript = f"{e.base.prompt} {t.base.reference_output(e.base)}"
        assert [e.shown[k - 1] for k in e.order] == split_steps(transcript)  # the answer's order is the original
        assert e.order != tuple(range(1, len(e.order) + 1))  # never shown in the original order
        lines = e.prompt.splitlines()
        assert lines[-1] == "Order:" and lines[:-1] == [f"{k}: {s}" for k, s in enumerate(e.shown, 1)]
        assert t.reward(e, t.reference_output(e)).score == 1.0
    assert len({e.order for e in examples}) > 2  # the shuffles differ between examples


def test_split_steps_cuts_at_lines_and_sentence_ends():
    assert split_steps("Q: Ann has 7 cups and gets 3 more. How many cups?\nA: 10") == [
        "Q: Ann has 7 cups and gets 3 more.", "How many cups?", "A: 10"]
    assert split_steps("x=1.5 then y!\n\n z") == ["x=1.5 then y!", "z"]  # a decimal point is not a sentence end


@pytest.mark.parametrize("output, score, exact", [
    ("2 3 1", 1.0, 1.0), (" 2 3 1 and more", 1.0, 1.0), ("2,3,1", 1.0, 1.0),
    ("2 1 3", 2 / 3, 0.0), ("1 3 2", 0.0, 0.0),  # one pair swapped; the reverse order
    ("2 3", 0.0, 0.0), ("2 3 3", 0.0, 0.0), ("2 3 4", 0.0, 0.0), ("", 0.0, 0.0), (None, 0.0, 0.0), ("abc", 0.0, 0.0)])
def test_the_reward_is_the_fraction_of_pairs_in_order(output, score, exact):
    t = order_task()
    example = StepOrderExample(base=None, shown=("c", "a", "b"), order=(2, 3, 1), template="{steps}\nOrder:")
    result = t.reward(example, output)
    assert result.score == pytest.approx(score) and result.components["exact"] == exact
    assert (result.info == "") == (exact == 1.0)


def test_step_order_settings_are_checked():
    with pytest.raises(ConfigError, match="steps"):
        order_task(template="Order:")
    with pytest.raises(ConfigError, match="max_steps"):
        order_task(max_steps=12)
    with pytest.raises(ConfigError, match="fewer than 5 steps"):  # arithmetic transcripts have 3
        order_task(min_steps=5).sample_batch("train", 4, np.random.default_rng(0))
