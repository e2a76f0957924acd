"""Per-prompt history (mmrl/algos/variants/history.py): the key contract and the pseudo-counts."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from mmrl.algos.variants.history import PromptHistory, prompt_key
from mmrl.tasks.sanity.reverse import ReverseExample


def test_prompt_key_is_stable_across_processes():
    # Python's hash() of a str changes per process; the key must not (it is checkpointed)
    code = ("from mmrl.algos.variants.history import prompt_key;"
            "from mmrl.tasks.sanity.reverse import ReverseExample; print(prompt_key(ReverseExample('3142')))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123", "PATH": ""}).stdout.strip()
    assert other == prompt_key(ReverseExample("3142"))
    assert prompt_key(ReverseExample("3142")) != prompt_key(ReverseExample("2413"))


@dataclass(frozen=True)
class ImageExample:
    image: np.ndarray
    prompt: str


@dataclass
class MutableExample:
    prompt: str


def test_prompt_key_refuses_examples_outside_the_contract():
    with pytest.raises(TypeError, match="frozen dataclasses"):
        prompt_key({"prompt": "12>"})
    with pytest.raises(TypeError, match="frozen dataclasses"):
        prompt_key(MutableExample("12>"))
    with pytest.raises(TypeError, match="ImageExample.image holds a ndarray"):
        prompt_key(ImageExample(np.zeros(2), "12>"))
    with pytest.raises(TypeError, match="Holder.inner holds a ndarray"):  # also inside a nested dataclass
        prompt_key(Holder(ImageExample(np.zeros(2), "12>")))


@dataclass(frozen=True)
class Holder:
    inner: ImageExample


def test_prompt_key_of_examples_made_of_frozen_dataclasses():
    """vlm_sanity's examples hold a tuple of shapes (frozen dataclasses): keyed by their fields, so the per-prompt
    hooks (SEELE, EAPO, MSSR's history, ERPO) run on that VLM task. Plain examples keep the key they had."""
    from mmrl.core.registry import make_task

    assert prompt_key(ReverseExample("3142")) == "d818a830f8bbc6f55e09"  # unchanged: checkpointed histories load
    examples = make_task("vlm_sanity/shape_color-v0", {}).sample_batch("train", 16, np.random.default_rng(0))
    again = make_task("vlm_sanity/shape_color-v0", {}).sample_batch("train", 16, np.random.default_rng(0))
    keys = [prompt_key(e) for e in examples]
    assert keys == [prompt_key(e) for e in again]
    assert len(set(keys)) == len({e for e in examples})  # equal examples, equal keys; different ones differ


def test_history_counts_soft_outcomes_and_round_trips():
    history = PromptHistory()
    history.update(["a", "b", "a"], [1.0, 0.0, 0.25])
    successes, failures = history.lookup(["a", "b", "unseen"])
    assert successes.tolist() == [1.25, 0.0, 0.0] and failures.tolist() == [0.75, 1.0, 0.0]
    restored = PromptHistory()
    restored.load_state_dict(history.state_dict())
    assert torch.equal(restored.lookup(["a", "b"])[0], history.lookup(["a", "b"])[0]) and len(restored) == 2
    with pytest.raises(ValueError, match="2 keys for 1 outcomes"):
        history.update(["a", "b"], [1.0])
