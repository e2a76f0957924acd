"""LaViPlan waypoint answers without the world: parser (total), golden reward values, metrics, and a
hypothesis fuzz of arbitrary / adversarial outputs (never an exception, always a score in range)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmrl.core.config import load_config
from mmrl.core.registry import make_task
from mmrl.tasks.parsing import MAX_OUTPUT_CHARS
from mmrl.tasks.driving.laviplan_reward import (COMPONENTS, RewardWeights, alignment_score, displacement_errors,
                                                 format_waypoints, parse_plan, plan_reward, planning_metrics)

EXPERT = np.array([[4.0, 0.0], [8.0, 0.0], [12.0, 1.0], [16.0, 2.0]])
W = RewardWeights()
GOOD = "<think>keep lane</think><answer>[(4,0),(8,0),(12,1),(16,2)]</answer>"


def score(output: object, collision: bool = False, offroad: bool = False):
    return plan_reward(parse_plan(output, 4, 100.0), EXPERT, collision, offroad, W)


def test_expert_answer_scores_one_and_formats_round_trip():
    result = score(GOOD)
    assert result.score == pytest.approx(1.0) and result.components == {
        "format": 1.0, "alignment": 1.0, "collision": 0.0, "offroad": 0.0, "invalid": 0.0}
    for decimals in (0, 1, 2):
        text = format_waypoints(EXPERT + 0.123, decimals)
        parsed = parse_plan(f"<think>x</think><answer>{text}</answer>", 4, 100.0)
        assert parsed.well_formed and np.allclose(parsed.waypoints, EXPERT + 0.123, atol=0.5 * 10 ** -decimals)
    assert format_waypoints(np.array([[-0.04, 1.0]]), 1) == "[(0.0,1.0)]"


def test_golden_alignment_and_penalties():
    # Every waypoint 2 m to the side: ADE = FDE = 2.
    shifted = "<think>x</think><answer>[(4,2),(8,2),(12,3),(16,4)]</answer>"
    ade, fde = displacement_errors(parse_plan(shifted, 4, 100.0).waypoints, EXPERT)
    assert (ade, fde) == (2.0, 2.0)
    alignment = 0.5 * math.exp(-1.0) + 0.5 * math.exp(-2.0 / 3.0)
    assert alignment_score(2.0, 2.0, W) == pytest.approx(alignment)
    assert score(shifted).score == pytest.approx(0.1 + 0.9 * alignment)
    assert score(shifted, collision=True).score == pytest.approx(0.1 + 0.9 * alignment - 0.5)
    assert score(shifted, collision=True, offroad=True).score == pytest.approx(0.1 + 0.9 * alignment - 1.0)
    no_think = score("<answer>[(4,0),(8,0),(12,1),(16,2)]</answer>")
    assert no_think.score == pytest.approx(0.9) and no_think.components["format"] == 0 and "not exactly" in no_think.info


@pytest.mark.parametrize("output, reason", [
    ("<think>x</think><answer>[(4,0),(8,0),(12,1)]</answer>", "wrong length: 3"),
    ("<think>x</think><answer>[(4,0),(8,0),(12,1),(16,2),(20,2)]</answer>", "wrong length: 5"),
    ("<think>x</think><answer>[(nan,0),(8,0),(12,1),(16,2)]</answer>", "non-finite"),
    ("<think>x</think><answer>[(4,0),(8,inf),(12,1),(16,2)]</answer>", "non-finite"),
    ("<think>x</think><answer>[(4,0),(8,0),(12,1),(1e999,2)]</answer>", "non-finite"),
    ("<think>x</think><answer>[(4,0),(8,0),(12,1),(5000,2)]</answer>", "beyond the 100 m bound"),
    ("<think>x</think><answer>[(4,0),(8,0),(12,1),(16,two)]</answer>", "not a number"),
    ("<think>x</think><answer>(4,0),(8,0),(12,1),(16,2)</answer>", "not a [(x,y)"),
    ("<think>x</think><answer>[(4,0),(8,0) and (12,1),(16,2)]</answer>", "unparseable"),
    ("<think>x</think><answer>[(4,0,1),(8,0),(12,1),(16,2)]</answer>", "unparseable"),
    ("<think>turn left</think>", "found 0"),
    (GOOD + GOOD, "found 2"),
    ("", "empty"), (None, "non-text"), (b"[(4,0)]", "non-text"), (3.5, "non-text"),
    ("<answer>" + "(4,0)," * (MAX_OUTPUT_CHARS // 6) + "</answer>", "too long"),
])
def test_unusable_plans_get_zero_alignment_and_the_worst_score(output, reason):
    result = score(output, collision=True, offroad=True)  # the world verdict is ignored for invalid plans
    assert result.components == {"format": 0.0, "alignment": 0.0, "collision": 0.0, "offroad": 0.0, "invalid": 1.0}
    assert result.score == W.score_range[0] == -1.0 and reason in result.info


def test_hacking_probes_do_not_pay():
    # Hedging with several answers, or junk after the answer, cannot beat the honest plan.
    hedge = "<think>x</think><answer>[(4,0),(8,0),(12,1),(16,2)]</answer><answer>[(0,0),(0,0),(0,0),(0,0)]</answer>"
    assert score(hedge).score == -1.0
    trailing = score(GOOD + " and more text")
    assert trailing.components["format"] == 0.0 and trailing.score < score(GOOD).score
    nested = "<think><think>a</think></think><answer>[(4,0),(8,0),(12,1),(16,2)]</answer>"
    assert score(nested).components["format"] == 0.0
    # A colliding plan still scores at least as well as garbage (no incentive to break the format).
    standing_still = "<think>x</think><answer>[(0,0),(0,0),(0,0),(0,0)]</answer>"
    assert score(standing_still, collision=True, offroad=True).score >= score("garbage").score


def test_metrics_count_valid_plans_and_success():
    outputs = [GOOD, "<think>x</think><answer>[(4,2),(8,2),(12,3),(16,4)]</answer>",
               "<think>x</think><answer>[(4,0),(8,0),(12,1),(16,6)]</answer>", "junk"]
    verdicts = [(False, False), (True, False), (False, True), (False, False)]
    plans = [parse_plan(o, 4, 100.0) for o in outputs]
    results = [plan_reward(p, EXPERT, c, o, W) for p, (c, o) in zip(plans, verdicts)]
    m = planning_metrics(plans, [EXPERT] * 4, results, success_fde=2.0)
    assert m["valid_rate"] == 0.75 and m["format_rate"] == 0.75
    assert m["ade"] == pytest.approx((0 + 2 + 1) / 3) and m["fde"] == pytest.approx((0 + 2 + 4) / 3)
    assert m["collision_rate"] == pytest.approx(1 / 3) and m["offroad_rate"] == pytest.approx(1 / 3)
    assert m["success_rate"] == 0.25  # only the expert plan: valid, safe and FDE < 2 m
    empty = planning_metrics([parse_plan("x", 4, 100.0)], [EXPERT], [score("x")], 2.0)
    assert math.isnan(empty["ade"]) and empty["valid_rate"] == 0.0 and empty["success_rate"] == 0.0


def test_bad_weights_are_rejected():
    with pytest.raises(ValueError, match="format_weight"):
        RewardWeights(format_weight=1.0).validate()
    with pytest.raises(ValueError, match="sigma"):
        RewardWeights(sigma_ade=0.0).validate()
    with pytest.raises(ValueError, match="collision_penalty"):
        RewardWeights(collision_penalty=-1.0).validate()


def test_weights_where_garbage_beats_a_colliding_off_road_plan_are_rejected():
    """The worst valid plan scores about −(c_col + c_off); an unusable answer −c_inv must not beat it."""
    with pytest.raises(ValueError, match="invalid_penalty .* must be >= collision_penalty \\+ offroad_penalty"):
        RewardWeights(collision_penalty=1.0, invalid_penalty=1.0).validate()
    with pytest.raises(ValueError, match="invalid_penalty"):
        make_task("driving/laviplan-v0", {"collision_penalty": 1.0})
    weights = RewardWeights(collision_penalty=1.0, invalid_penalty=1.5)
    weights.validate()
    far = parse_plan("<answer>[(20,20),(20,20),(20,20),(20,20)]</answer>", 4, 100.0)
    worst_valid = plan_reward(far, EXPERT, True, True, weights).score
    garbage = plan_reward(parse_plan("x", 4, 100.0), EXPERT, True, True, weights).score
    assert garbage == weights.score_range[0] == -1.5 < worst_valid


def test_the_tiny_recipe_keeps_garbage_below_every_valid_plan():
    args = load_config("laviplan/tiny_cpu").task.args
    assert (args.collision_penalty, args.offroad_penalty, args.invalid_penalty) == (1.0, 0.5, 1.5)
    args.validate()


NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**6, 10**6),
                    st.sampled_from(["nan", "-inf", "1e999", "", "--1", "٣", "1.2.3"]))
PIECES = st.sampled_from(["<think>", "</think>", "<answer>", "</answer>", "[", "]", "(", ")", ",", " ", "\n",
                          "\\boxed{", "}", "🙂", "\x00", "<|im_end|>"])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=300),
                 st.lists(st.one_of(PIECES, NUMBERS.map(str)), max_size=60).map("".join),
                 st.lists(st.tuples(NUMBERS, NUMBERS), max_size=8).map(
                     lambda ps: "<think>t</think><answer>[" + ",".join(f"({x},{y})" for x, y in ps) + "]</answer>")),
       st.booleans(), st.booleans())
def test_fuzzed_outputs_never_raise_and_stay_in_range(output, collision, offroad):
    result = score(output, collision, offroad)
    low, high = W.score_range
    assert low - 1e-9 <= result.score <= high + 1e-9 and math.isfinite(result.score)
    assert set(result.components) == set(COMPONENTS)
    assert all(math.isfinite(v) for v in result.components.values())
    if result.components["invalid"]:
        assert result.info and result.components["alignment"] == 0.0
