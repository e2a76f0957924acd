"""``video/motion-v0``: short procedural videos of coloured shapes; questions need more than one frame.

In the spirit of ReWatch-R1 (#42: questions answerable only by watching the video), at the scale of
a tiny VLM. A video is ``num_frames`` frames (``frame_size`` px, square) of ``shapes_per_video``
shapes, each of a different colour, on a light background; the frames reach the policy as a
``<video>`` (frames at the policy's ``video.fps``). Questions (``question``):

- ``color``: exactly one shape moves ``step`` px per frame in a straight line, the others stay put;
  "Which colour is the shape that moves?" → the colour name;
- ``direction``: the same videos; "In which direction does the {colour} {shape} move?" → ``left``,
  ``right``, ``up`` or ``down`` (image directions: up is toward the top edge);
- ``count``: nothing moves; one shape is shown in a contiguous run of 1..``num_frames`` frames and
  hidden in the rest; "In how many frames is the {colour} {shape} visible?" → a digit;
- ``mixed``: each of the three with probability 1/3.

Reward (range [0, 1]): the ``vlm_sanity`` rule, (1 − w)·accuracy + w·format with
``w = format_weight``: accuracy is 1 when the last ``<answer>…</answer>`` (or ``\\boxed{}``) holds the
answer after normalisation (case, a trailing full stop, number words); format is 1 when the whole
output is one ``<think>…</think>`` followed by one ``<answer>…</answer>``. Total: any output scores.

Splits by seed: every video is drawn from its own seed, train seeds in ``[0, 2^31)`` and test seeds
in ``[2^31, 2^32)``, so the splits never share a video.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from PIL import Image, ImageDraw

from mmrl.core.contracts import VIDEO_PLACEHOLDER, RewardResult
from mmrl.tasks.vlm_sanity.shapes import PALETTE, SHAPES, answer_reward

SPLIT_SEEDS = {"train": (0, 2**31), "test": (2**31, 2**32)}
QUESTIONS = ("color", "direction", "count")
DIRECTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
BACKGROUND = (245, 245, 245)
MAX_PLACEMENT_TRIES = 200


@dataclass(frozen=True)
class MotionConfig:
    question: Literal["color", "direction", "count", "mixed"] = "color"
    """Which questions to ask (mixed: a third each)."""
    colors: tuple[str, ...] = ("red", "green", "blue", "yellow")
    """Colour names used (from vlm_sanity's palette: red, green, blue, yellow, purple, orange)."""
    shapes_per_video: int = 2
    """Shapes in every video, each of a different colour (so a colour names one shape)."""
    num_frames: int = 4
    """Frames per video (Qwen2.5-VL merges frames in pairs: 4 frames of 56 px = 8 video tokens)."""
    frame_size: int = 56
    """Side of the square frames in pixels."""
    shape_size: int = 14
    """Side of each shape's bounding box in pixels."""
    step: int = 8
    """Pixels the moving shape travels per frame."""
    format_weight: float = 0.1
    """Weight w of the format term in the reward."""


@dataclass(frozen=True)
class MovingShape:
    kind: str  # one of vlm_sanity's SHAPES
    color: str  # a PALETTE key
    x: int  # top-left corner in frame 0, pixels
    y: int
    dx: int  # pixels per frame (0 for a shape that stays put)
    dy: int
    first: int  # first frame it is shown in
    last: int  # last frame it is shown in (inclusive)


@dataclass(frozen=True)
class MotionExample:
    """One video and its question. Satisfies :class:`mmrl.core.contracts.VideoPrompt`."""

    question: str  # "color", "direction" or "count"
    shapes: tuple[MovingShape, ...]  # shapes[0] is the one asked about (the mover, or the counted one)
    direction: str  # the mover's direction ("" for count questions)
    num_frames: int
    frame_size: int
    shape_size: int
    seed: int  # the video's seed (its split follows from it)

    @property
    def prompt(self) -> str:
        target = self.shapes[0]
        if self.question == "color":
            text = "Which colour is the shape that moves?"
        elif self.question == "direction":
            text = f"In which direction does the {target.color} {target.kind} move?"
        else:
            text = f"In how many frames is the {target.color} {target.kind} visible?"
        return f"{VIDEO_PLACEHOLDER}{text}"

    @property
    def images(self) -> tuple[()]:
        return ()

    @property
    def videos(self) -> tuple[list[Image.Image]]:
        return (draw_frames(self.shapes, self.num_frames, self.frame_size, self.shape_size),)

    @property
    def system(self) -> None:
        return None

    @property
    def answer(self) -> str:
        target = self.shapes[0]
        if self.question == "color":
            return target.color
        if self.question == "direction":
            return self.direction
        return str(target.last - target.first + 1)


def draw_frames(shapes: Sequence[MovingShape], num_frames: int, frame_size: int, shape_size: int) -> list[Image.Image]:
    """The video: frame t shows every shape with ``first <= t <= last`` at ``(x + t·dx, y + t·dy)``."""
    frames = []
    for t in range(num_frames):
        frame = Image.new("RGB", (frame_size, frame_size), BACKGROUND)
        pen = ImageDraw.Draw(frame)
        for s in shapes:
            if s.first <= t <= s.last:
                draw_shape(pen, s.kind, PALETTE[s.color], s.x + t * s.dx, s.y + t * s.dy, shape_size)
        frames.append(frame)
    return frames


def draw_shape(pen: ImageDraw.ImageDraw, kind: str, fill: tuple[int, int, int], x: int, y: int, size: int) -> None:
    box = (x, y, x + size - 1, y + size - 1)
    if kind == "circle":
        pen.ellipse(box, fill=fill)
    elif kind == "square":
        pen.rectangle(box, fill=fill)
    else:
        pen.polygon([(x + size / 2, y), (x, y + size - 1), (x + size - 1, y + size - 1)], fill=fill)


def swept_box(s: MovingShape, num_frames: int, size: int) -> tuple[int, int, int, int]:
    """``(x0, y0, x1, y1)``, exclusive end: every pixel the shape covers over the whole video."""
    xs = (s.x, s.x + (num_frames - 1) * s.dx)
    ys = (s.y, s.y + (num_frames - 1) * s.dy)
    return min(xs), min(ys), max(xs) + size, max(ys) + size


def overlaps(a: tuple[int, int, int, int], b: tuple[int, int, int, int], gap: int) -> bool:
    return a[0] < b[2] + gap and b[0] < a[2] + gap and a[1] < b[3] + gap and b[1] < a[3] + gap


class MotionTask:
    def __init__(self, cfg: MotionConfig):
        unknown = [c for c in cfg.colors if c not in PALETTE]
        if unknown or len(set(cfg.colors)) != len(cfg.colors):
            raise ValueError(f"task.args.colors must be distinct names from {sorted(PALETTE)}, got {list(cfg.colors)}")
        if not 1 <= cfg.shapes_per_video <= len(cfg.colors):
            raise ValueError(f"task.args.shapes_per_video must be in 1..{len(cfg.colors)} (one colour each), "
                             f"got {cfg.shapes_per_video}")
        if cfg.question in ("color", "mixed") and cfg.shapes_per_video < 2:
            raise ValueError("task.args.shapes_per_video must be >= 2 for colour questions (one moves, one stays)")
        if not 2 <= cfg.num_frames <= 9:
            raise ValueError(f"task.args.num_frames must be in 2..9 (count answers are one digit), got {cfg.num_frames}")
        if cfg.frame_size < 28 or not 4 <= cfg.shape_size <= cfg.frame_size // 2:
            raise ValueError(f"task.args: need frame_size >= 28 and 4 <= shape_size <= frame_size / 2, got "
                             f"{cfg.frame_size}, {cfg.shape_size}")
        if cfg.step < 1 or cfg.shape_size + cfg.step * (cfg.num_frames - 1) > cfg.frame_size:
            raise ValueError(f"task.args.step must be >= 1 and keep the moving shape inside the frame: shape_size + "
                             f"step·(num_frames − 1) = {cfg.shape_size + cfg.step * (cfg.num_frames - 1)} > "
                             f"frame_size {cfg.frame_size}")
        if not 0 <= cfg.format_weight < 1:
            raise ValueError(f"task.args.format_weight must be in [0, 1), got {cfg.format_weight}")
        self.cfg = cfg
        self.id = "video/motion-v0"
        self.reward_range = (0.0, 1.0)
        if self.place_still_shapes(np.random.default_rng(0), MovingShape("square", cfg.colors[0], 0, 0, 0, 0, 0, 0),
                                   cfg.colors[1:cfg.shapes_per_video]) is None:
            raise ValueError(f"task.args: {cfg.shapes_per_video} shapes of {cfg.shape_size} px do not fit apart in a "
                             f"{cfg.frame_size} px frame; lower shapes_per_video or shape_size")

    def example_from_seed(self, seed: int) -> MotionExample:
        """The video and question of ``seed`` (deterministic; its split is the seed's range)."""
        cfg = self.cfg
        rng = np.random.default_rng(seed)
        question = cfg.question if cfg.question != "mixed" else QUESTIONS[int(rng.integers(len(QUESTIONS)))]
        colors = rng.permutation(len(cfg.colors))[:cfg.shapes_per_video]
        span = cfg.frame_size - cfg.shape_size + 1  # top-left positions that keep a still shape inside
        direction, target = "", None
        if question == "count":
            first = int(rng.integers(cfg.num_frames))
            last = int(rng.integers(first, cfg.num_frames))
            target = MovingShape(SHAPES[int(rng.integers(len(SHAPES)))], cfg.colors[colors[0]],
                                 int(rng.integers(span)), int(rng.integers(span)), 0, 0, first, last)
        else:
            direction = tuple(DIRECTIONS)[int(rng.integers(len(DIRECTIONS)))]
            ux, uy = DIRECTIONS[direction]
            travel = cfg.step * (cfg.num_frames - 1)
            # Start so that the whole path stays inside the frame.
            x = int(rng.integers(travel if ux < 0 else 0, span - (travel if ux > 0 else 0)))
            y = int(rng.integers(travel if uy < 0 else 0, span - (travel if uy > 0 else 0)))
            target = MovingShape(SHAPES[int(rng.integers(len(SHAPES)))], cfg.colors[colors[0]], x, y,
                                 ux * cfg.step, uy * cfg.step, 0, cfg.num_frames - 1)
        others = self.place_still_shapes(rng, target, [cfg.colors[c] for c in colors[1:].tolist()])
        if others is None:  # the target's path left no room: the next seed (still in the split's range)
            return replace(self.example_from_seed(seed + 1), seed=seed)
        return MotionExample(question, (target, *others), direction, cfg.num_frames, cfg.frame_size, cfg.shape_size,
                             seed)

    def place_still_shapes(self, rng: np.random.Generator, target: MovingShape,
                           colors: Sequence[str]) -> list[MovingShape] | None:
        """Still shapes of ``colors``, apart from ``target``'s path and each other; None if they do not fit."""
        cfg = self.cfg
        span = cfg.frame_size - cfg.shape_size + 1
        shapes, boxes = [], [swept_box(target, cfg.num_frames, cfg.shape_size)]
        for color in colors:
            for _ in range(MAX_PLACEMENT_TRIES):
                still = MovingShape(SHAPES[int(rng.integers(len(SHAPES)))], color, int(rng.integers(span)),
                                    int(rng.integers(span)), 0, 0, 0, cfg.num_frames - 1)
                box = swept_box(still, cfg.num_frames, cfg.shape_size)
                if not any(overlaps(box, other, gap=2) for other in boxes):
                    break
            else:
                return None
            shapes.append(still)
            boxes.append(box)
        return shapes

    def sample_batch(self, split: str, n: int, rng: np.random.Generator) -> list[MotionExample]:
        if split not in SPLIT_SEEDS:
            raise ValueError(f"unknown split {split!r}; {self.id} has {tuple(SPLIT_SEEDS)}")
        low, high = SPLIT_SEEDS[split]
        return [self.example_from_seed(int(seed)) for seed in rng.integers(low, high, size=n, dtype=np.int64)]

    @property
    def vision_classes(self) -> int:
        """Classes of :meth:`vision_label`: the target's colour × what it does (4 directions, or 1..num_frames shown)."""
        return len(self.cfg.colors) * (len(DIRECTIONS) + self.cfg.num_frames)

    def vision_label(self, example: MotionExample) -> int:
        """Perception label for ``warm_start.vision_steps``: the asked-about shape's colour and what it
        does in the video (the direction it moves, or in how many frames it is shown), as one class:
        what the reference ``<think>`` states. Pretraining on it gives the vision tower features that
        differ between frames (the CPU analogue of a pretrained video encoder), before SFT ties the
        language model to them.

        >>> task = MotionTask(MotionConfig(question="mixed"))
        >>> [(e.question, e.shapes[0].color, e.direction or e.answer, task.vision_label(e))
        ...  for e in map(task.example_from_seed, (0, 1, 6))]
        [('count', 'blue', '1', 20), ('direction', 'red', 'left', 0), ('direction', 'blue', 'right', 17)]
        """
        events = len(DIRECTIONS) + self.cfg.num_frames
        target = example.shapes[0]
        if example.question == "count":
            event = len(DIRECTIONS) + target.last - target.first  # shown in 1..num_frames frames
        else:
            event = tuple(DIRECTIONS).index(example.direction)
        return self.cfg.colors.index(target.color) * events + event

    def reward(self, example: MotionExample, output: str) -> RewardResult:
        return answer_reward(output, example.answer, self.cfg.format_weight)

    def reference_output(self, example: MotionExample) -> str:
        target = example.shapes[0]
        name = f"{target.color} {target.kind}"
        if example.question == "count":
            n = target.last - target.first + 1
            think = f"The {name} is visible in {n} frame{'s' if n > 1 else ''}."
        else:
            think = f"The {name} moves {example.direction}; the other shapes stay."
        return f"<think>{think}</think><answer>{example.answer}</answer>"

    def metrics(self, examples: Sequence[MotionExample], outputs: Sequence[str],
                results: Sequence[RewardResult]) -> dict[str, float]:
        metrics = {"accuracy": float(np.mean([r.components["accuracy"] for r in results])),
                   "format_rate": float(np.mean([r.components["format"] for r in results]))}
        if self.cfg.question == "mixed":
            for q in QUESTIONS:
                picked = [r.components["accuracy"] for e, r in zip(examples, results) if e.question == q]
                metrics[f"accuracy_{q}"] = float(np.mean(picked)) if picked else float("nan")
        return metrics
