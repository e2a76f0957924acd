"""``vlm_sanity/shape_color-v0``: a tiny VQA task drawn with PIL that proves the VLM path learns.

Each image shows coloured shapes (circle, square, triangle) on a light background. Questions:

- ``color``: one shape; "What colour is the shape?" → the colour name;
- ``count``: 1..``max_shapes`` shapes; "How many shapes are there?" → a digit;
- ``mixed``: either, half and half.

Answers are expected as ``<think>…</think><answer>…</answer>`` (a ``\\boxed{…}`` answer is also
read). Reward (range [0, 1]) = (1 − w)·accuracy + w·format, ``w = format_weight``: accuracy is 1
when the extracted answer is right; format is 1 when the whole output is exactly one think block
followed by one answer block (so completions cannot run on after ``</answer>``). The reward is
total: any string gives a score, and a zero says why in ``info``; outputs longer than
:data:`~mmrl.tasks.parsing.MAX_OUTPUT_CHARS` score 0 unread.

Train and test images are disjoint: a hash of the drawing parameters picks the split.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from PIL import Image, ImageDraw

from mmrl.core.contracts import IMAGE_PLACEHOLDER, RewardResult
from mmrl.tasks.parsing import tag_blocks, text_problem

SPLITS = ("train", "test")
SHAPES = ("circle", "square", "triangle")
PALETTE = {"red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 60, 220), "yellow": (235, 200, 20),
           "purple": (140, 40, 180), "orange": (245, 130, 20)}
NUMBER_WORDS = {"zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
                "seven": "7", "eight": "8", "nine": "9"}
SYNONYMS = {"grey": "gray", "violet": "purple"}
QUESTIONS = {"color": "What colour is the shape?", "count": "How many shapes are there?"}

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
WELL_FORMED = re.compile(r"\s*<think>(?:(?!<think>|</think>).)*</think>\s*<answer>(?:(?!<answer>).)*?</answer>\s*",
                         re.DOTALL)


@dataclass(frozen=True)
class ShapeColorConfig:
    question: Literal["color", "count", "mixed"] = "color"
    """Which questions to ask (mixed: half colour, half count)."""
    colors: tuple[str, ...] = ("red", "green", "blue", "yellow", "purple", "orange")
    """Colour names used (from the palette: red, green, blue, yellow, purple, orange)."""
    image_size: int = 56
    """Side of the square image in pixels (56 px = 4 image tokens for Qwen2.5-VL's 28 px cells)."""
    max_shapes: int = 3
    """Most shapes in a counting image."""
    test_fraction: float = 0.2
    """Share of drawing parameters held out for the test split."""
    format_weight: float = 0.1
    """Weight w of the format term in the reward."""


@dataclass(frozen=True)
class Shape:
    kind: str  # one of SHAPES
    color: str  # a PALETTE key
    x: int  # top-left corner, pixels
    y: int
    size: int  # side of the bounding box, pixels


@dataclass(frozen=True)
class ShapeExample:
    """Satisfies :class:`mmrl.core.contracts.VisualPrompt`."""

    question: str  # "color" or "count"
    shapes: tuple[Shape, ...]
    image_size: int

    @property
    def prompt(self) -> str:
        return f"{IMAGE_PLACEHOLDER}{QUESTIONS[self.question]}"

    @property
    def images(self) -> tuple[Image.Image, ...]:
        return (draw(self.shapes, self.image_size),)

    @property
    def system(self) -> None:
        return None

    @property
    def answer(self) -> str:
        return self.shapes[0].color if self.question == "color" else str(len(self.shapes))


def draw(shapes: Sequence[Shape], size: int) -> Image.Image:
    image = Image.new("RGB", (size, size), (245, 245, 245))
    pen = ImageDraw.Draw(image)
    for s in shapes:
        box = (s.x, s.y, s.x + s.size - 1, s.y + s.size - 1)
        fill = PALETTE[s.color]
        if s.kind == "circle":
            pen.ellipse(box, fill=fill)
        elif s.kind == "square":
            pen.rectangle(box, fill=fill)
        else:
            pen.polygon([(s.x + s.size / 2, s.y), (s.x, s.y + s.size - 1), (s.x + s.size - 1, s.y + s.size - 1)],
                        fill=fill)
    return image


def normalise(answer: str) -> str:
    text = answer.strip().lower().rstrip(".").strip()
    return NUMBER_WORDS.get(text, SYNONYMS.get(text, text))


def extract_answer(output: str) -> str | None:
    """The last ``<answer>…</answer>``, else the last ``\\boxed{…}``, else None.

    >>> extract_answer("<think>x</think><answer> Red </answer>")
    ' Red '
    >>> extract_answer("so \\\\boxed{3}") , extract_answer("red")
    ('3', None)
    """
    tags = tag_blocks(output, "answer")
    if tags:
        return tags[-1]
    boxed = BOXED.findall(output)
    return boxed[-1] if boxed else None


def answer_reward(output: object, answer: str, format_weight: float) -> RewardResult:
    """(1 − w)·accuracy + w·format; total for any input.

    >>> answer_reward("<think>one red circle</think><answer>red</answer>", "red", 0.1).score
    1.0
    >>> answer_reward("<think>hm</think><answer>blue</answer>", "red", 0.1).score
    0.1
    >>> round(answer_reward("<answer>red</answer> and more", "red", 0.1).score, 6)
    0.9
    """
    if problem := text_problem(output):
        return RewardResult(0.0, {"accuracy": 0.0, "format": 0.0}, problem)
    well_formed = float(WELL_FORMED.fullmatch(output) is not None)
    extracted = extract_answer(output)
    correct = float(extracted is not None and normalise(extracted) == answer)
    score = (1.0 - format_weight) * correct + format_weight * well_formed
    if extracted is None:
        info = "no <answer>…</answer> or \\boxed{} in the output"
    elif not correct:
        info = f"wrong answer {normalise(extracted)!r} (expected {answer!r})"
    elif not well_formed:
        info = "right answer, but not exactly <think>…</think><answer>…</answer>"
    else:
        info = ""
    return RewardResult(score, {"accuracy": correct, "format": well_formed}, info)


class ShapeColorTask:
    def __init__(self, cfg: ShapeColorConfig):
        unknown = [c for c in cfg.colors if c not in PALETTE]
        if unknown or len(cfg.colors) < 2:
            raise ValueError(f"task.args.colors must be >= 2 of {sorted(PALETTE)}, got {list(cfg.colors)}")
        if cfg.image_size < 28:
            raise ValueError(f"task.args.image_size must be >= 28 pixels, got {cfg.image_size}")
        if not 1 <= cfg.max_shapes <= 9:
            raise ValueError(f"task.args.max_shapes must be in 1..9, got {cfg.max_shapes}")
        if not 0 < cfg.test_fraction < 1:
            raise ValueError(f"task.args.test_fraction must be in (0, 1), got {cfg.test_fraction}")
        if not 0 <= cfg.format_weight < 1:
            raise ValueError(f"task.args.format_weight must be in [0, 1), got {cfg.format_weight}")
        self.cfg = cfg
        self.id = "vlm_sanity/shape_color-v0"
        self.reward_range = (0.0, 1.0)

    def split_of(self, example: ShapeExample) -> str:
        key = repr((example.question, example.shapes)).encode()
        return "test" if zlib.crc32(key) % 1000 < 1000 * self.cfg.test_fraction else "train"

    def _draw_example(self, rng: np.random.Generator) -> ShapeExample:
        cfg = self.cfg
        question = cfg.question if cfg.question != "mixed" else ("color", "count")[int(rng.integers(2))]
        n = 1 if question == "color" else int(rng.integers(1, cfg.max_shapes + 1))
        # Shapes sit in distinct cells of a grid, so they never overlap and stay countable.
        cells_per_side = 1 if question == "color" else (2 if cfg.max_shapes <= 4 else 3)
        cell = cfg.image_size // cells_per_side
        cells = rng.permutation(cells_per_side * cells_per_side)[:n]
        shapes = []
        for c in cells.tolist():
            size = int(rng.integers(max(6, cell // 2), max(7, cell - 2) + 1))
            x0, y0 = (c % cells_per_side) * cell, (c // cells_per_side) * cell
            x = x0 + int(rng.integers(0, cell - size + 1))
            y = y0 + int(rng.integers(0, cell - size + 1))
            shapes.append(Shape(SHAPES[int(rng.integers(len(SHAPES)))], cfg.colors[int(rng.integers(len(cfg.colors)))],
                                x, y, size))
        return ShapeExample(question, tuple(shapes), cfg.image_size)

    def sample_batch(self, split: str, n: int, rng: np.random.Generator) -> list[ShapeExample]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; {self.id} has {SPLITS}")
        examples: list[ShapeExample] = []
        while len(examples) < n:
            example = self._draw_example(rng)
            if self.split_of(example) == split:
                examples.append(example)
        return examples

    def reward(self, example: ShapeExample, output: str) -> RewardResult:
        return answer_reward(output, example.answer, self.cfg.format_weight)

    def reference_output(self, example: ShapeExample) -> str:
        if example.question == "color":
            s = example.shapes[0]
            return f"<think>I see one {s.color} {s.kind}.</think><answer>{s.color}</answer>"
        n = len(example.shapes)
        return f"<think>I count {n} shape{'s' if n > 1 else ''}.</think><answer>{n}</answer>"

    def metrics(self, examples: Sequence[ShapeExample], outputs: Sequence[str],
                results: Sequence[RewardResult]) -> dict[str, float]:
        metrics = {"accuracy": float(np.mean([r.components["accuracy"] for r in results])),
                   "format_rate": float(np.mean([r.components["format"] for r in results]))}
        if self.cfg.question == "mixed":
            for q in ("color", "count"):
                picked = [r.components["accuracy"] for e, r in zip(examples, results) if e.question == q]
                metrics[f"accuracy_{q}"] = float(np.mean(picked)) if picked else float("nan")
        return metrics
