"""imagegen/shapes-v0: procedural prompts, total rewards, the DDPO JPEG definitions and
reward-hacking probes (blank / saturated / noise images must not score)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from mmrl.core.registry import make_task
from mmrl.tasks.imagegen import ShapePrompt, all_prompts, render
from mmrl.tasks.imagegen.rewards import jpeg_size_kb, prompt_checks


@pytest.fixture(scope="module")
def task():
    return make_task("imagegen/shapes-v0")


def test_prompts_and_held_out_split(task):
    prompts = {p.prompt for p in all_prompts()}
    assert len(prompts) == 64 and "two red circles left" in prompts and "one blue square top" in prompts
    train = {p.prompt for p in task.prompts["train"]}
    test = {p.prompt for p in task.prompts["test"]}
    assert train and test and not train & test and train | test == prompts
    rng = np.random.default_rng(0)
    assert all(ex.prompt in test for ex in task.sample_batch("test", 50, rng))
    a = task.sample_batch("train", 8, np.random.default_rng(3))
    assert a == task.sample_batch("train", 8, np.random.default_rng(3))
    with pytest.raises(ValueError, match="unknown split"):
        task.sample_batch("val", 1, rng)


def test_rendered_images_satisfy_their_prompts(task):
    """The procedural generator is the reward's ground truth: every prompt, many draws, score 1."""
    rng = np.random.default_rng(0)
    for prompt in all_prompts():
        for _ in range(3):
            result = task.reward(prompt, render(prompt, 16, rng))
            assert result.score == 1.0, (prompt.prompt, result.info)
            assert result.components["correct"] == 1.0
    big = render(ShapePrompt("two", "blue", "circle", "bottom"), 32, rng)
    assert task.reward(ShapePrompt("two", "blue", "circle", "bottom"), big).score == 1.0


def test_each_check_fails_on_its_own(task):
    rng = np.random.default_rng(1)
    prompt = ShapePrompt("one", "red", "square", "left")
    cases = {"colour": ShapePrompt("one", "green", "square", "left"),
             "count": ShapePrompt("two", "red", "square", "left"),
             "shape": ShapePrompt("one", "red", "circle", "left"),
             "position": ShapePrompt("one", "red", "square", "right")}
    for check, drawn in cases.items():
        result = task.reward(prompt, render(drawn, 16, rng))
        assert result.components[check] == 0.0, check
        assert result.score == pytest.approx(0.75) and check in result.info


def test_reward_hacking_probes_score_zero(task):
    """Blank, saturated, half-filled and noise images must not score on a prompt-correctness reward."""
    prompt = ShapePrompt("one", "red", "square", "left")
    blank = np.full((16, 16, 3), 90, np.uint8)
    saturated = np.zeros((16, 16, 3), np.uint8)
    saturated[..., 0] = 255
    half = np.full((16, 16, 3), 90, np.uint8)
    half[:, :8] = (220, 40, 40)  # "red on the left", but no object on a background
    noise = np.random.default_rng(0).integers(0, 256, (16, 16, 3)).astype(np.uint8)
    for name, image in (("blank", blank), ("saturated", saturated), ("half", half), ("noise", noise)):
        result = task.reward(prompt, image)
        assert result.score == 0.0, (name, result)
        assert result.info


def test_corrupt_outputs_score_zero_with_a_reason(task):
    prompt = all_prompts()[0]
    for output, reason in ((np.full((16, 16, 3), np.nan), "non-finite"), (np.zeros((16, 16)), "[H, W, 3]"),
                           ("an image", "not an image"), (None, "not an image"),
                           (np.full((16, 16, 3), 300.0), "outside 0..255")):
        result = task.reward(prompt, output)
        assert result.score == 0.0 and reason in result.info
        assert set(result.components) >= {"correctness", "correct", "colour"}
    pil = Image.fromarray(render(prompt, 16, np.random.default_rng(0)))
    assert task.reward(prompt, pil).score == 1.0  # PIL images are accepted


def test_jpeg_rewards_are_the_ddpo_definitions():
    """size in kB of the image saved as JPEG at quality 95; compressibility = −size."""
    image = np.random.default_rng(0).integers(0, 256, (16, 16, 3)).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=95)
    assert jpeg_size_kb(image) == pytest.approx(len(buffer.getvalue()) / 1000)
    flat = np.full((16, 16, 3), 128, np.uint8)
    assert jpeg_size_kb(flat) < jpeg_size_kb(image)
    task = make_task("imagegen/shapes-v0", {"reward_weights": {"jpeg_compressibility": 1.0, "correctness": 0.5}})
    prompt = all_prompts()[0]
    result = task.reward(prompt, image)
    assert result.score == pytest.approx(-jpeg_size_kb(image) + 0.5 * result.components["correctness"])
    assert task.reward_range == (-np.inf, np.inf)
    assert make_task("imagegen/shapes-v0").reward_range == (0.0, 1.0)


def test_bad_task_config():
    with pytest.raises(ValueError, match="unknown or no rewards \\['aesthetic'\\]"):
        make_task("imagegen/shapes-v0", {"reward_weights": {"aesthetic": 1.0}})
    with pytest.raises(ValueError, match="test_fraction"):
        make_task("imagegen/shapes-v0", {"test_fraction": 1.5})


def test_metrics_aggregate_the_checks(task):
    rng = np.random.default_rng(2)
    prompts = task.sample_batch("test", 4, rng)
    outputs = [render(p, 16, rng) for p in prompts[:2]] + [np.zeros((16, 16, 3), np.uint8)] * 2
    results = [task.reward(p, o) for p, o in zip(prompts, outputs)]
    metrics = task.metrics(prompts, outputs, results)
    assert metrics["correct"] == 0.5 and metrics["object_acc"] == 0.5 and metrics["position_acc"] == 0.5


@pytest.mark.parametrize("size", [512, 1024])
def test_speckled_images_are_rejected_from_the_component_statistics(task, size):
    """find_objects measured every component before the "too many blobs" rejection: 4 s at 512², > 60 s at 1024²."""
    import time

    image = np.full((size, size, 3), 200, np.uint8)
    image[np.random.default_rng(0).random((size, size)) < 0.3] = 0
    start = time.perf_counter()
    checks, info = prompt_checks(image, all_prompts()[0])
    assert time.perf_counter() - start < 2.0 and "blobs: noise" in info and not any(checks.values())
