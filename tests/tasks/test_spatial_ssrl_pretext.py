"""Spatial-SSRL pretext tasks (issue 4): the five generators' ground truth, image folders (RGB and
RGB-D), disjoint splits, determinism, config errors, the mixture, and whole-task reward fuzzing and
hacking probes."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from mmrl.core.contracts import VisualPrompt
from mmrl.core.registry import make_task
from mmrl.tasks.spatial_ssrl.position import PositionSettings, position_puzzle, relation
from mmrl.tasks.spatial_ssrl.pretext import (DEPTH_BANDS, PRETEXTS, Unsuitable, crop_puzzle, depth_puzzle,
                                             flip_puzzle, normalised_depth, shuffle_puzzle, window_range)
from mmrl.tasks.spatial_ssrl.render import Backdrop, Camera, render
from mmrl.tasks.spatial_ssrl.sources import RenderSource, SourceImage

IDS = [f"spatial_ssrl/{p}-v0" for p in (*PRETEXTS, "mixture")]
SMALL = {"image_size": 112}


def colourful(size: int = 64, seed: int = 0) -> SourceImage:
    """Random colours with no black pixel (so a blackened square is findable) and no depth."""
    return SourceImage("colourful", np.random.default_rng(seed).integers(10, 256, (size, size, 3), dtype=np.uint8),
                       None)


def tiles_of(image: Image.Image, rows: int, cols: int) -> list[np.ndarray]:
    a = np.asarray(image)
    th, tw = a.shape[0] // rows, a.shape[1] // cols
    return [a[r * th:(r + 1) * th, c * tw:(c + 1) * tw] for r in range(rows) for c in range(cols)]


@pytest.fixture(scope="module", params=IDS)
def task_and_examples(request):
    task = make_task(request.param, SMALL)
    return task, task.sample_batch("test", 6, np.random.default_rng(7))


def test_every_id_makes_deterministic_visual_prompts_whose_references_score_one(task_and_examples):
    task, examples = task_and_examples
    again = task.sample_batch("test", 6, np.random.default_rng(7))
    assert [(e.prompt, e.answer, e.source_key) for e in examples] == [(e.prompt, e.answer, e.source_key) for e in again]
    assert all(a.images == b.images for a, b in zip(examples, again))
    for e in examples:
        assert isinstance(e, VisualPrompt) and e.prompt.count("<image>") == len(e.images) >= 1
        assert e.prompt.endswith("The final answer MUST BE put in \\boxed{}.")
        result = task.reward(e, task.reference_output(e))
        assert result.score == 1.0 and result.components == {"accuracy": 1.0, "format": 1.0}
    outputs = [task.reference_output(e) for e in examples]
    metrics = task.metrics(examples, outputs, [task.reward(e, o) for e, o in zip(examples, outputs)])
    assert metrics["accuracy"] == 1.0 and metrics["format_rate"] == 1.0
    assert {f"accuracy/{p}" for p in task.pretexts} <= set(metrics)


def test_rendered_splits_use_disjoint_scene_seeds():
    task = make_task("spatial_ssrl/flip-v0", {"image_size": 56})
    rng = np.random.default_rng(0)
    train = {e.source_key for e in task.sample_batch("train", 60, rng)}
    test = {e.source_key for e in task.sample_batch("test", 60, rng)}
    assert all(int(k.split(":")[1]) < 2**31 for k in train) and all(int(k.split(":")[1]) >= 2**31 for k in test)
    assert not train & test
    with pytest.raises(ValueError, match="unknown split 'val'"):
        task.sample_batch("val", 1, rng)


@pytest.mark.parametrize("grid, blank", [((2, 2), False), ((3, 2), True), ((3, 3), False)])
def test_shuffle_answer_restores_the_image(grid, blank):
    rows, cols = grid
    image = colourful(60)
    puzzle = shuffle_puzzle(image, np.random.default_rng(1), grid, blank, label_tiles=False)
    shown = tiles_of(puzzle.images[0], rows, cols)
    original = tiles_of(Image.fromarray(image.rgb), rows, cols)
    answer = [int(t) for t in puzzle.answer.split(",")]
    assert sorted(answer) == list(range(rows * cols))
    restored = [(shown[answer[j]] == original[j]).all() for j in range(rows * cols)]
    white = [(t == 255).all() for t in shown]
    assert sum(restored) == rows * cols - int(blank) and sum(white) == int(blank)


@pytest.mark.parametrize("ask_direction", [False, True])
def test_flip_answer_names_the_only_flipped_tile(ask_direction):
    image = colourful(64, seed=2)
    for seed in range(8):
        puzzle = flip_puzzle(image, np.random.default_rng(seed), ask_direction=ask_direction, label_tiles=False)
        index = int(puzzle.answer.split(",")[0])
        shown, original = tiles_of(puzzle.images[0], 2, 2), tiles_of(Image.fromarray(image.rgb), 2, 2)
        assert [i for i in range(4) if not (shown[i] == original[i]).all()] == [index]
        flips = {"vertical": np.flipud(original[index]), "horizontal": np.fliplr(original[index])}
        direction = next(d for d, f in flips.items() if (f == shown[index]).all())
        assert puzzle.answer == (f"{index}, {direction}" if ask_direction else str(index))


def test_flip_of_a_symmetric_tile_is_refused():
    flat = SourceImage("flat", np.full((32, 32, 3), 120, np.uint8), None)
    with pytest.raises(Unsuitable, match="looks the same"):
        flip_puzzle(flat, np.random.default_rng(0))


def test_crop_options_hold_the_true_patch_at_the_answer_letter_and_three_distractors():
    image = colourful(80, seed=3)
    letters = set()
    for seed in range(12):
        puzzle = crop_puzzle(image, np.random.default_rng(seed))
        context, *options = (np.asarray(i) for i in puzzle.images)
        ys, xs = np.nonzero((context == 0).all(-1))
        y, x, side = ys.min(), xs.min(), 40
        assert ys.max() - y + 1 == side == xs.max() - x + 1
        truth = image.rgb[y:y + side, x:x + side]
        matches = [i for i, o in enumerate(options) if o.shape == truth.shape and (o == truth).all()]
        assert matches == ["ABCD".index(puzzle.answer)]
        letters.add(puzzle.answer)
    assert letters == set("ABCD")


def test_window_range_matches_brute_force():
    values = np.random.default_rng(0).random((9, 11))
    values[4, 5] = np.nan
    got = window_range(values, 3)
    assert np.isnan(got[0, 0]) and np.isnan(got[4, 5]) and np.isnan(got[3, 4])
    assert got[1, 1] == pytest.approx(values[0:3, 0:3].max() - values[0:3, 0:3].min())
    assert got[7, 9] == pytest.approx(values[6:9, 8:11].max() - values[6:9, 8:11].min())


def test_depth_marks_lie_in_their_bands_on_flat_windows_and_the_answer_orders_them_near_to_far():
    source = RenderSource(112)
    rng = np.random.default_rng(4)
    answers, refused = set(), 0
    while len(answers) < 3 or refused + len(answers) < 10:
        image = source.draw("train", rng)
        try:
            puzzle = depth_puzzle(image, rng)
        except Unsuitable:  # the task then draws another picture
            refused += 1
            assert refused < 10
            continue
        norm = normalised_depth(image.depth, 0.5, 99.5)
        z = {label: norm[y, x] for label, y, x in puzzle.marks}
        order = puzzle.answer.split(",")
        assert sorted(order) == ["1", "2", "3"] and [z[k] for k in order] == sorted(z.values())
        for label, band in zip(order, DEPTH_BANDS):
            assert band[0] <= z[label] <= band[1]
        answers.add(puzzle.answer)
    assert len(answers) >= 3


@pytest.mark.parametrize("facing, dx, dz, kind, diagonal, expected", [
    ("the left of the image", 10, 0.0, "near", False, "Back"),  # seed_tasks.md §1.3 row
    ("the left of the image", -10, 0.0, "near", False, "Front"),
    ("the left of the image", 0, 0.4, "far", False, "Right"),  # seed_tasks.md §1.3 row
    ("the right of the image", 10, 0.0, "near", False, "Front"),
    ("the right of the image", 0, 0.4, "far", False, "Left"),
    ("me", 10, 0.0, "near", False, "Left"),
    ("me", 0, -0.4, "far", False, "Front"),
    ("away from me", -10, 0.0, "near", False, "Left"),
    ("away from me", 0, 0.4, "far", False, "Front"),
    ("away from me", 200, 0.4, "far", True, "Right-Front"),
    ("me", 200, 0.4, "far", True, "Left-Back"),
    ("the left of the image", 200, -0.4, "far", True, "Left-Back"),
    ("the right of the image", 200, -0.4, "far", True, "Right-Front"),
])
def test_relative_position_sign_table(facing, dx, dz, kind, diagonal, expected):
    assert relation(facing, dx, dz, kind, diagonal) == expected


PROMPT = re.compile(r"camera at position '(\d)' and it's facing to (.+?)\. According to the camera, where is the "
                    r"region marker '(\d)'\? A\. (\S+) B\. (\S+) C\. (\S+) D\. (\S+)\.")


def test_position_answers_follow_the_sign_table_on_rendered_scenes():
    source, cfg = RenderSource(160), PositionSettings(diagonal_dx=40)
    rng = np.random.default_rng(5)
    seen, refused = set(), 0
    for _ in range(16):
        image = source.draw("train", rng)
        try:
            puzzle = position_puzzle(image, rng, cfg)
        except Unsuitable:
            refused += 1
            continue
        a, facing, b, *options = PROMPT.search(puzzle.question).groups()
        norm = (image.depth - np.nanmin(image.depth)) / (np.nanmax(image.depth) - np.nanmin(image.depth))
        where = {label: (y, x, norm[y - 7:y + 8, x - 7:x + 8].mean()) for label, y, x in puzzle.marks}
        (ya, xa, za), (yb, xb, zb) = where[a], where[b]
        far = "ignore the height difference" in puzzle.question
        diagonal = far and abs(xb - xa) > cfg.diagonal_dx
        expected = relation(facing, xb - xa, zb - za, "far" if far else "near", diagonal)
        assert options["ABCD".index(puzzle.answer)] == expected and sorted(options) == sorted(set(options))
        seen.add((far, diagonal))
    assert len(seen) >= 2 and refused <= 4


def test_backdrop_depth_is_exact_for_a_level_camera():
    camera = Camera(33, height=1.0, pitch_deg=0.0)
    _, depth = render(camera, (), backdrop=Backdrop(z=10.0, height=3.0))
    np.testing.assert_allclose(depth[16, :], 10.0, atol=1e-9)  # the horizon row sees the wall
    assert np.isnan(depth[0, 16])  # above the wall: sky
    assert (depth[32, :] < 10.0).all()  # below: the ground in front of it


def make_folder(root, n: int = 12, depth: bool = True, size: int = 96):
    rng = np.random.default_rng(0)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (size, size + 16, 3), dtype=np.uint8)).save(root / f"img{i:02d}.png")
        if depth:
            rows = np.linspace(1.0, 9.0, size)[:, None] * np.ones((1, size + 16))
            np.save(root / f"img{i:02d}.npy", rows)
    return root


def test_an_rgb_folder_feeds_the_rgb_tasks_with_a_hash_split(tmp_path):
    make_folder(tmp_path, depth=False)
    task = make_task("spatial_ssrl/shuffle-v0", {"source": "folder", "image_dir": str(tmp_path), "image_size": 64})
    rng = np.random.default_rng(0)
    train = task.sample_batch("train", 20, rng)
    test = task.sample_batch("test", 20, rng)
    assert not {e.source_key for e in train} & {e.source_key for e in test}
    assert train[0].images[0].size == (64, 54)  # longer side downscaled to image_size
    with pytest.raises(ValueError, match="need img00.npy"):
        make_task("spatial_ssrl/depth-v0", {"source": "folder", "image_dir": str(tmp_path)})
    mixture = make_task("spatial_ssrl/mixture-v0", {"source": "folder", "image_dir": str(tmp_path),
                                                    "weights": [1, 1, 1, 0, 0]})
    assert {e.pretext for e in mixture.sample_batch("train", 12, rng)} <= {"shuffle", "flip", "crop"}


def test_an_rgbd_folder_with_masks_feeds_the_depth_task(tmp_path):
    make_folder(tmp_path)
    mask = np.ones((96, 112), bool)
    mask[:, :20] = False
    np.save(tmp_path / "img00_mask.npy", mask)
    task = make_task("spatial_ssrl/depth-v0", {"source": "folder", "image_dir": str(tmp_path)})
    examples = task.sample_batch("train", 4, np.random.default_rng(0)) + task.sample_batch("test", 4,
                                                                                          np.random.default_rng(0))
    assert all(e.answer.count(",") == 2 for e in examples)


def test_bad_folders_are_errors_naming_the_file(tmp_path):
    make_folder(tmp_path, n=4)
    (tmp_path / "broken.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match="broken.png: not a readable image"):
        make_task("spatial_ssrl/flip-v0", {"source": "folder", "image_dir": str(tmp_path)})
    (tmp_path / "broken.png").unlink()
    np.save(tmp_path / "img01.npy", np.ones((5, 5)))
    with pytest.raises(ValueError, match="img01.npy: depth shape"):
        make_task("spatial_ssrl/depth-v0", {"source": "folder", "image_dir": str(tmp_path)})
    with pytest.raises(FileNotFoundError, match="not a folder"):
        make_task("spatial_ssrl/flip-v0", {"source": "folder", "image_dir": str(tmp_path / "nope")})
    with pytest.raises(ValueError, match="image_dir is required"):
        make_task("spatial_ssrl/flip-v0", {"source": "folder"})


@pytest.mark.parametrize("args, message", [
    ({"weights": [1, 1, 1, 1]}, "task.args.weights"),
    ({"weights": [0, 0, 0, 0, 0]}, "task.args.weights"),
    ({"grid": [1, 1]}, "task.args.grid"),
    ({"flip_directions": ["diagonal"]}, "task.args.flip_directions"),
    ({"image_size": 8}, "task.args.image_size"),
    ({"depth_window_sizes": [25]}, "depth_window_sizes"),
    ({"colour": 1}, "colour"),
])
def test_bad_task_args_are_rejected(args, message):
    with pytest.raises(Exception, match=message):
        make_task("spatial_ssrl/mixture-v0", args)


def test_mixture_weights_pick_the_pretexts():
    task = make_task("spatial_ssrl/mixture-v0", {"image_size": 56, "weights": [0, 3, 0, 0, 1]})
    examples = task.sample_batch("train", 40, np.random.default_rng(0))
    counts = {p: sum(e.pretext == p for e in examples) for p in PRETEXTS}
    assert counts["shuffle"] == counts["crop"] == counts["depth"] == 0 and counts["flip"] > counts["position"] > 0
    metrics = task.metrics(examples, ["x"] * 40, [task.reward(e, "x") for e in examples])
    assert metrics["accuracy/flip"] == 0.0 and np.isnan(metrics["accuracy/crop"])


@pytest.fixture(scope="module")
def mixed_examples():
    task = make_task("spatial_ssrl/mixture-v0", SMALL)
    return task, task.sample_batch("train", 10, np.random.default_rng(11))


def hacks(answer: str) -> list[str]:
    """Outputs that try to win without knowing the answer."""
    every_option = "A, B, C, D"
    boxes = " ".join(f"\\boxed{{{o}}}" for o in ("A", "B", "C", "D", answer))
    return [f"<think>x</think>\\boxed{{{every_option}}}", "<think>x</think>\\boxed{ABCD}", f"<think>x</think>{boxes}",
            f"<think>x</think>\\boxed{{{answer}}} \\boxed{{0}}", '<think>x</think>\\boxed{{"A": 1, "B": 1, "C": 1}}',
            "<think>x</think>\\boxed{0,1,2,3 1,0,3,2 2,3,0,1 3,2,1,0}", "<think>x</think>\\boxed{1,2,3 3,2,1}",
            f"<think>\\boxed{{{answer}}}</think>\\boxed{{}}", f"{answer}", f"<answer>{answer}</answer>"]


def test_hacking_probes_never_score_as_correct(mixed_examples):
    task, examples = mixed_examples
    for e in examples:
        for output in hacks(e.answer):
            result = task.reward(e, output)
            assert result.components["accuracy"] == 0.0 and result.score <= 0.1, (e.answer, output)


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.text(), st.text(alphabet="<>/{}\\boxedthink ,ABCD0123").map(lambda s: s * 5),
                 st.text().map(lambda s: f"<think><think>{s}</think></think>\\boxed{{\\boxed{{{s}}}}}"),
                 st.builds(lambda n: "🙂\\boxed{" * n + "}" * (n // 2), st.integers(0, 2000)),
                 st.none(), st.integers(), st.binary()), st.integers(0, 9))
def test_task_reward_is_total_and_in_range(mixed_examples, output, which):
    task, examples = mixed_examples
    result = task.reward(examples[which], output)
    assert 0.0 <= result.score <= 1.0 and set(result.components) == {"accuracy", "format"}


@pytest.mark.parametrize("task_id", IDS)
def test_terse_prompts_ask_the_same_puzzles_in_fewer_words(task_id):
    full = make_task(task_id, SMALL).sample_batch("test", 4, np.random.default_rng(3))
    terse = make_task(task_id, {**SMALL, "terse_prompts": True}).sample_batch("test", 4, np.random.default_rng(3))
    for a, b in zip(full, terse):
        assert (a.pretext, a.source_key, a.answer) == (b.pretext, b.source_key, b.answer) and a.images == b.images
        assert b.prompt.count("<image>") == len(b.images)
        if a.pretext == "position":  # always the paper's template
            assert b.prompt == a.prompt
        else:
            assert len(b.prompt) < len(a.prompt) - 60
