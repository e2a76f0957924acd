"""``driving/laviplan-v0`` on the driving world: prompts, expert references, simulated penalties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmrl.core.contracts import VisualPrompt
from mmrl.core.registry import make_task


@pytest.fixture(scope="module")
def task():
    return make_task("driving/laviplan-v0", {"decimals": 1})


@pytest.fixture(scope="module")
def examples(task):
    return task.sample_batch("test", 4, np.random.default_rng(0))


def test_examples_are_seeded_visual_prompts(task, examples):
    again = task.sample_batch("test", 4, np.random.default_rng(0))
    for a, b in zip(examples, again):
        assert isinstance(a, VisualPrompt) and a.prompt.count("<image>") == 1
        assert np.asarray(a.images[0]).shape == (64, 64, 3)
        np.testing.assert_array_equal(a.expert, b.expert)
        assert a.scenario.instruction in a.prompt


def test_the_expert_reference_is_near_perfect_and_succeeds(task, examples):
    outputs = [task.reference_output(e) for e in examples]
    results = [task.reward(e, o) for e, o in zip(examples, outputs)]
    assert all(r.score > 0.95 and r.components["format"] == 1.0 for r in results)
    metrics = task.metrics(examples, outputs, results)
    assert metrics["ade"] < 0.1 and metrics["valid_rate"] == 1.0 and metrics["success_rate"] == 1.0


def test_a_plan_off_the_road_is_penalised(task, examples):
    e = examples[0]
    sideways = "<think>x</think><answer>[(0.0,10.0),(0.0,20.0),(0.0,30.0),(0.0,40.0)]</answer>"
    result = task.reward(e, sideways)
    assert result.components["offroad"] == 1.0 and result.score < task.reward(e, task.reference_output(e)).score - 0.5


@pytest.mark.parametrize("output", ["", "no plan", "<answer>[(1,2)]</answer>", "<answer>[(nan,0),(1,1),(2,2),(3,3)]</answer>",
                                    "<answer>[(5000,0),(1,1),(2,2),(3,3)]</answer>"])
def test_unusable_plans_get_the_invalid_score_with_a_reason(task, examples, output):
    result = task.reward(examples[0], output)
    assert result.score == -1.0 and result.components["invalid"] == 1.0 and result.info


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="<>/answerthink()[],.-0123456789 e", max_size=120))
def test_reward_is_total_and_in_range(task, examples, output):
    low, high = task.reward_range
    assert low <= task.reward(examples[1], output).score <= high


def test_bad_split_and_args_are_clear_errors(task):
    with pytest.raises(ValueError, match="unknown split"):
        task.sample_batch("validation", 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="horizon"):
        make_task("driving/laviplan-v0", {"horizon": 0})
