"""Spatial-SSRL building blocks (issue 4, in progress): the RGB-D scene renderer and the reward."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmrl.tasks.parsing import MAX_OUTPUT_CHARS
from mmrl.tasks.spatial_ssrl.render import Camera, Primitive, random_scene, render
from mmrl.tasks.spatial_ssrl.reward import normalise_tags, ssrl_reward

GOOD = "<think>tile 2 is upside down</think> \\boxed{2,0,1,3}"


def test_depth_of_the_ground_seen_straight_down_is_the_camera_height():
    _, depth = render(Camera(32, height=3.0, pitch_deg=90.0), ())
    np.testing.assert_allclose(depth, 3.0, atol=1e-9)


def test_depth_at_the_centre_of_a_sphere_straight_ahead_is_its_near_surface():
    camera = Camera(33, height=1.5, pitch_deg=0.0)
    rgb, depth = render(camera, (Primitive("sphere", (0.0, 1.5, 6.0), (0.5, 0.5, 0.5), (255, 0, 0)),))
    assert depth[16, 16] == pytest.approx(5.5, abs=1e-9)
    assert tuple(rgb[16, 16]) != tuple(rgb[0, 0])  # the sphere is drawn where it is nearest
    assert np.isnan(depth[0, 16])  # above the horizon: sky


def test_random_scenes_are_seeded():
    a, da = random_scene(np.random.default_rng(3), 48)
    b, db = random_scene(np.random.default_rng(3), 48)
    c, _ = random_scene(np.random.default_rng(4), 48)
    assert a.shape == (48, 48, 3) and a.dtype == np.uint8
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(da, db)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("answer", ["2,0,1,3", "[2, 0, 1, 3]", "2 0 1 3", "(2,0,1,3)"])
def test_permutation_spellings_are_one_answer(answer):
    assert ssrl_reward(f"<think>t</think> \\boxed{{{answer}}}", "2 0 1 3").score == pytest.approx(1.0)


def test_reward_is_0_9_accuracy_plus_0_1_format():
    assert ssrl_reward(GOOD, "2,0,1,3").score == pytest.approx(1.0)
    assert ssrl_reward("\\boxed{2,0,1,3}", "2,0,1,3").score == pytest.approx(0.9)  # no <think>
    assert ssrl_reward("<think>t</think> \\boxed{3,0,1,2}", "2,0,1,3").score == pytest.approx(0.1)


@pytest.mark.parametrize("output", [
    "<think>t</think> \\boxed{A, B, C, D}",  # every option at once
    "<think>t</think> \\boxed{ABCD}",
    "<think>t</think> \\boxed{B} \\boxed{A}",  # hedging with several boxes
    "<think>t</think> \\boxed{A",  # unbalanced
    "<think>t</think> A",  # no box
])
def test_hacking_probes_are_not_correct(output):
    result = ssrl_reward(output, "A")
    assert result.components["accuracy"] == 0.0 and result.info


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.text().map(lambda s: f"<think>{s}</think>\\boxed{{{s}}}" * 3),
                 st.none(), st.integers(), st.binary()))
def test_reward_is_total_and_in_range(output):
    result = ssrl_reward(output, "1 0 2")
    assert 0.0 <= result.score <= 1.0


def test_long_outputs_are_scored_and_overlong_ones_refused():
    long = "<think>" + "x" * (MAX_OUTPUT_CHARS - 40) + "</think>\\boxed{A}"
    assert ssrl_reward(long, "A").score == pytest.approx(1.0)
    result = ssrl_reward("<think>" + "x" * 1_000_000 + "</think>\\boxed{A}", "A")
    assert result.score == 0.0 and "too long" in result.info


@pytest.mark.parametrize("output", [
    "a" + " " * 32_000 + "b",  # the paper's re.sub rescans the run from every space: 5 s
    "<think>" + "</think>" * 4000,  # a backtracking format regex retries every </think>
    " < think > x </ think > " + "\n\t " * 5000 + " / \\boxed{ A } ",
])
def test_whitespace_runs_and_repeated_tags_are_scored_in_linear_time(output):
    start = time.perf_counter()
    ssrl_reward(output, "A")
    assert time.perf_counter() - start < 0.25


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["<", ">", "/", " ", "\n", "\u00a0", "\u2003", "a", "think"]), max_size=40).map("".join))
def test_tag_normalisation_is_the_papers_regex(text):
    assert normalise_tags(text) == re.sub(r"\s*(<|>|/)\s*", r"\1", text)
