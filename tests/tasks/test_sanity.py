"""sanity/reverse-v0: deterministic data, disjoint splits, a total reward."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

from mmrl.core.registry import make_task
from mmrl.tasks.sanity import reverse
from mmrl.tasks.sanity.reverse import ReverseExample, sequence_reward


@pytest.fixture
def task():
    return make_task("sanity/reverse-v0", {"min_len": 3, "max_len": 4})


def test_doctests():
    assert doctest.testmod(reverse).failed == 0


def test_same_rng_same_examples(task):
    a = task.sample_batch("train", 20, np.random.default_rng(5))
    b = task.sample_batch("train", 20, np.random.default_rng(5))
    assert a == b and all(3 <= len(e.digits) <= 4 for e in a)


def test_splits_are_disjoint(task):
    rng = np.random.default_rng(0)
    train = {e.digits for e in task.sample_batch("train", 2000, rng)}
    test = {e.digits for e in task.sample_batch("test", 500, rng)}
    assert train and test and not train & test
    with pytest.raises(ValueError, match="unknown split 'valid'"):
        task.sample_batch("valid", 1, rng)


@pytest.mark.parametrize("output, score, exact", [
    ("2413", 1.0, 1.0),          # exact
    ("2433", 0.75, 0.0),         # one wrong position
    ("241", 0.75, 0.0),          # missing character: 3 matches over 4
    ("24135", 0.8, 0.0),         # extra character: 4 matches over 5
    ("", 0.0, 0.0),              # empty
    ("abcd", 0.0, 0.0),          # garbage
    ("2413>>>>>>", 0.4, 0.0),    # running on past the answer costs
])
def test_reward(task, output, score, exact):
    result = task.reward(ReverseExample("3142"), output)
    assert result.score == pytest.approx(score)
    assert result.components["exact"] == exact
    assert (result.info == "") == (exact == 1.0)  # every non-perfect score says why


def test_reward_is_total_on_non_text():
    assert sequence_reward(None, "12").score == 0.0
    assert sequence_reward(12, "12").info == "empty or non-text output"


def test_metrics(task):
    examples = [ReverseExample("12"), ReverseExample("34")]
    outputs = ["21", "44"]
    results = [task.reward(e, o) for e, o in zip(examples, outputs)]
    assert task.metrics(examples, outputs, results) == {"exact_match": 0.5, "position_acc": 0.75}
