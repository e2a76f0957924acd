"""``imagegen/shapes-v0``: procedural text-to-image prompts over coloured shapes on plain backgrounds.

A prompt names a count, a colour, a shape and a half of the image: ``"two red circles left"``.
Images are ``size``×``size`` RGB (uint8 [H, W, 3]); shapes are drawn with OpenCV on a neutral
(unsaturated) background of random grey level. Prompts are split into train / test by a hash of
the prompt text (the held-out split never appears in RL training).
"""

from __future__ import annotations

import itertools
import zlib
from dataclasses import dataclass

import cv2
import numpy as np

COUNTS = {"one": 1, "two": 2}
COLOURS = {"red": (220, 40, 40), "green": (40, 200, 60), "blue": (50, 80, 230), "yellow": (230, 210, 40)}
SHAPES = ("circle", "square")
POSITIONS = ("left", "right", "top", "bottom")
BACKGROUND_LEVELS = (30, 70, 110, 150)  # grey levels: far from every palette colour in chroma
OOD_COMBINATIONS = (("yellow", "square"), ("green", "circle"))
"""Colour × shape pairs of the ``ood`` split: held out of VAR pretraining (``mmrl pretrain-imagegen
assets/imagegen/var_tiny.json``) and, with ``exclude_ood``, of the task's train / test splits, so
they are combinations a model has never seen (every word has been seen, in other pairs)."""


@dataclass(frozen=True)
class ShapePrompt:
    """One prompt: ``count`` shapes of ``colour`` and ``shape`` in the ``position`` half."""

    count: str
    colour: str
    shape: str
    position: str

    @property
    def prompt(self) -> str:
        plural = "s" if COUNTS[self.count] > 1 else ""
        return f"{self.count} {self.colour} {self.shape}{plural} {self.position}"

    @property
    def num_objects(self) -> int:
        return COUNTS[self.count]


def all_prompts() -> list[ShapePrompt]:
    """Every prompt of the grammar (2 counts × 4 colours × 2 shapes × 4 positions = 64)."""
    return [ShapePrompt(*p) for p in itertools.product(COUNTS, COLOURS, SHAPES, POSITIONS)]


def prompt_vocabulary() -> list[str]:
    """The words prompts are made of (a text encoder's vocabulary)."""
    words = list(COUNTS) + list(COLOURS) + [s for shape in SHAPES for s in (shape, shape + "s")] + list(POSITIONS)
    return words


def is_ood(prompt: ShapePrompt) -> bool:
    """True for the held-out colour × shape combinations of :data:`OOD_COMBINATIONS`."""
    return (prompt.colour, prompt.shape) in OOD_COMBINATIONS


def split_of(prompt: ShapePrompt, test_fraction: float) -> str:
    bucket = zlib.crc32(prompt.prompt.encode()) % 1000
    return "test" if bucket < 1000 * test_fraction else "train"


def half_box(position: str, size: int) -> tuple[int, int, int, int]:
    """(x0, y0, x1, y1) of the named half, exclusive end."""
    h = size // 2
    return {"left": (0, 0, h, size), "right": (h, 0, size, size),
            "top": (0, 0, size, h), "bottom": (0, h, size, size)}[position]


def render(prompt: ShapePrompt, size: int, rng: np.random.Generator) -> np.ndarray:
    """A correct image for ``prompt`` (uint8 [size, size, 3]); shapes never touch each other.

    Circles have radius ``size // 5``, squares side ``2·(size // 5)``; centres are jittered inside
    the prompt's half, and two shapes are placed in the two quarters of that half.
    """
    bg = int(rng.choice(BACKGROUND_LEVELS))
    image = np.full((size, size, 3), bg, dtype=np.uint8)
    colour = tuple(int(c) for c in COLOURS[prompt.colour])
    r = size // 5
    x0, y0, x1, y1 = half_box(prompt.position, size)
    if prompt.num_objects == 1:
        cells = [(x0, y0, x1, y1)]
    elif prompt.position in ("left", "right"):  # a tall half: top and bottom quarter
        ym = (y0 + y1) // 2
        cells = [(x0, y0, x1, ym), (x0, ym, x1, y1)]
    else:
        xm = (x0 + x1) // 2
        cells = [(x0, y0, xm, y1), (xm, y0, x1, y1)]
    for cx0, cy0, cx1, cy1 in cells:
        # keep a one-pixel gap to the cell border so shapes stay separate components
        cx = int(rng.integers(cx0 + r + 1, max(cx0 + r + 2, cx1 - r)))
        cy = int(rng.integers(cy0 + r + 1, max(cy0 + r + 2, cy1 - r)))
        if prompt.shape == "circle":
            cv2.circle(image, (cx, cy), r, colour, thickness=-1, lineType=cv2.LINE_8)
        else:
            cv2.rectangle(image, (cx - r, cy - r), (cx + r - 1, cy + r - 1), colour, thickness=-1)
    return image
