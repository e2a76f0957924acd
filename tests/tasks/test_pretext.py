"""pretext/mask-fill-v0 (MR-RLVR's masked-then-fill over a text task): one number masked, its value the answer."""

from __future__ import annotations

import numpy as np
import pytest

from mmrl.core.registry import make_task
from mmrl.core.typed import ConfigError

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
