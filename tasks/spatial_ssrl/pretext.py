"""The five Spatial-SSRL pretext tasks (arXiv 2510.27606; the paper's ``data_process/*.py``, as
summarised in seed_tasks.md §1.3). Each generator turns one :class:`~.sources.SourceImage` and an rng
into a :class:`Puzzle` — images, question, ground-truth answer — or raises :class:`Unsuitable` when
the image cannot make a fair puzzle (then the task draws another image).

Conventions shared by all five: tiles are numbered from 0 in reading order (left to right, top to
bottom); depth is "larger = farther"; option letters are A–D. Prompt texts of tasks 1–4 are not
in the paper's repository (NOT FOUND): the ones here are ours (docs/tasks.md). The relative-position
prompt is the paper's template. ``terse=True`` swaps the question of tasks 1–4 for a few words (the
tiny CPU model; its context must stay short) — the answer format is the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from PIL import Image, ImageDraw, ImageFont

from mmrl.core.contracts import IMAGE_PLACEHOLDER as IMG
from mmrl.tasks.spatial_ssrl.sources import SourceImage

PRETEXTS = ("shuffle", "flip", "crop", "depth", "position")
LETTERS = "ABCD"
MIN_CHANGE = 2.0  # mean |Δ| (0-255) below which a flipped tile or a distractor looks like the truth
DEPTH_BANDS = ((0.0, 0.3), (0.35, 0.65), (0.7, 1.0))  # Depth.py
FACINGS = ("the left of the image", "the right of the image", "me", "away from me")
# The camera's (front, right) unit vectors in the viewer's frame (x: image right, z: away from the viewer).
CAMERA_AXES = {"the left of the image": ((-1, 0), (0, 1)), "the right of the image": ((1, 0), (0, -1)),
               "me": ((0, -1), (-1, 0)), "away from me": ((0, 1), (1, 0))}
FOUR_WAY = ("Left", "Right", "Front", "Back")
DIAGONAL = ("Left-Front", "Right-Front", "Right-Back", "Left-Back")


class Unsuitable(Exception):
    """This image cannot make a fair puzzle of this kind (e.g. no flat region in a depth band)."""


@dataclass(frozen=True)
class Puzzle:
    question: str  # the user text, one IMAGE_PLACEHOLDER per image
    images: tuple[Image.Image, ...]
    answer: str  # the ground truth, as the reward compares it
    think: str  # a short reasoning sentence for the SFT reference output
    marks: tuple[tuple[str, int, int], ...] = ()  # depth / position: (label, y, x) of each marked point


@lru_cache(maxsize=32)
def _font(size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size)


def _cut(rgb: np.ndarray, rows: int, cols: int) -> list[np.ndarray]:
    """Equal tiles in reading order (the image is cropped to a multiple of the grid)."""
    th, tw = rgb.shape[0] // rows, rgb.shape[1] // cols
    if th < 4 or tw < 4:
        raise ValueError(f"a {rgb.shape[1]}×{rgb.shape[0]} image is too small for a {rows}×{cols} grid")
    return [rgb[r * th:(r + 1) * th, c * tw:(c + 1) * tw].copy() for r in range(rows) for c in range(cols)]


def _assemble(tiles: list[np.ndarray], rows: int, cols: int, label_tiles: bool) -> Image.Image:
    """Tiles back into one image; with ``label_tiles`` each gets a red border and its index (Shuffle.py)."""
    th, tw = tiles[0].shape[:2]
    canvas = Image.fromarray(np.concatenate([np.concatenate(tiles[r * cols:(r + 1) * cols], axis=1)
                                             for r in range(rows)], axis=0))
    if label_tiles:
        pen = ImageDraw.Draw(canvas)
        border, size = max(1, min(th, tw) // 50), max(7, min(th, tw) // 5)
        for i in range(rows * cols):
            x, y = (i % cols) * tw, (i // cols) * th
            pen.rectangle((x, y, x + tw - 1, y + th - 1), outline=(255, 0, 0), width=border)
            pen.text((x + border + 1, y + border), str(i), fill=(255, 255, 255), font=_font(size),
                     stroke_width=1, stroke_fill=(0, 0, 0))
    return canvas


def _differs(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape != b.shape or float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean()) >= MIN_CHANGE


def shuffle_puzzle(image: SourceImage, rng: np.random.Generator, grid: tuple[int, int] = (2, 2),
                   blank_tile: bool = False, label_tiles: bool = True, terse: bool = False) -> Puzzle:
    """Shuffled patch reordering (Shuffle.py): displayed tile i shows original tile ``shown[i]``;
    optionally one displayed tile is blanked white; GT = ``argsort(shown)`` — for each original
    position, the displayed tile that belongs there."""
    rows, cols = grid
    tiles = _cut(image.rgb, rows, cols)
    n = rows * cols
    shown = rng.permutation(n)
    display = [tiles[j] for j in shown]
    if blank_tile:
        display[int(rng.integers(n))] = np.full_like(display[0], 255)
    answer = ",".join(str(i) for i in np.argsort(shown))
    blank = " One tile has been blanked out in white." if blank_tile else ""
    question = (f"{IMG}This image was cut into a {rows}x{cols} grid of tiles, numbered 0 to {n - 1} in reading "
                f"order, and the tiles were shuffled.{blank} Restore the original image: for each position in "
                f"reading order, which tile goes there? Answer with {n} tile numbers separated by commas.")
    if terse:
        question = f"{IMG}Unshuffle the {rows}x{cols} tiles."
    return Puzzle(question, (_assemble(display, rows, cols, label_tiles),), answer,
                  "I match the edges of neighbouring tiles.")


def flip_puzzle(image: SourceImage, rng: np.random.Generator, directions: tuple[str, ...] = ("vertical", "horizontal"),
                ask_direction: bool = False, label_tiles: bool = True, terse: bool = False) -> Puzzle:
    """Flipped patch recognition (Flip.py): one of 2×2 tiles is flipped vertically (upside down,
    ``cv2.flip(·, 0)``) or horizontally (mirrored, ``cv2.flip(·, 1)``); GT = its index (harder
    variant: "index, direction")."""
    tiles = _cut(image.rgb, 2, 2)
    index = int(rng.integers(4))
    direction = directions[int(rng.integers(len(directions)))]
    flipped = np.flipud(tiles[index]) if direction == "vertical" else np.fliplr(tiles[index])
    if not _differs(flipped, tiles[index]):
        raise Unsuitable(f"tile {index} looks the same flipped {direction}")
    tiles[index] = np.ascontiguousarray(flipped)
    if ask_direction:
        ask, answer = (" Which tile is it, and was it flipped vertically or horizontally? Answer as the tile "
                       "number and the direction, e.g. 1, vertical."), f"{index}, {direction}"
    else:
        ask, answer = " Which tile is it? Answer with the tile number.", str(index)
    question = f"{IMG}The image is cut into 2x2 tiles numbered 0 to 3 in reading order. One tile is flipped.{ask}"
    if terse:
        question = f"{IMG}Which tile is flipped{', and how' if ask_direction else ''}?"
    return Puzzle(question, (_assemble(tiles, 2, 2, label_tiles),), answer, f"Tile {index} is flipped {direction}.")


def _resized(rgb: np.ndarray, side: int) -> np.ndarray:
    return np.asarray(Image.fromarray(rgb).resize((side, side), Image.BILINEAR))


def crop_candidates(rgb: np.ndarray, x: int, y: int, side: int) -> dict[str, np.ndarray]:
    """The five distractor transforms of Crop.py (enlarged crops are clipped at the image border)."""
    h, w = rgb.shape[:2]
    crop = rgb[y:y + side, x:x + side]
    q, inner = side // 4, side // 2

    def enlarged(m: int) -> np.ndarray:
        return _resized(rgb[max(0, y - m):min(h, y + side + m), max(0, x - m):min(w, x + side + m)], side)

    return {"rotate_ccw": np.rot90(crop, 1).copy(), "rotate_cw": np.rot90(crop, -1).copy(),
            "zoom_in": _resized(crop[q:q + inner, q:q + inner], side), "zoom_out_1": enlarged(q),
            "zoom_out_2": enlarged(inner)}


def crop_puzzle(image: SourceImage, rng: np.random.Generator, terse: bool = False) -> Puzzle:
    """Cropped patch inpainting (Crop.py): a square of side min(H, W)/2 is blackened; options are the
    true patch and 3 of the 5 transforms of :func:`crop_candidates`, the truth at a uniform letter."""
    rgb = image.rgb
    h, w = rgb.shape[:2]
    side = min(h, w) // 2
    x, y = int(rng.integers(0, w - side + 1)), int(rng.integers(0, h - side + 1))
    truth = rgb[y:y + side, x:x + side].copy()
    context = rgb.copy()
    context[y:y + side, x:x + side] = 0
    transforms = crop_candidates(rgb, x, y, side)
    names = list(transforms)
    distractors = [transforms[names[i]] for i in rng.choice(len(names), size=3, replace=False)]
    gt = int(rng.integers(4))
    options = distractors[:gt] + [truth] + distractors[gt:]
    if any(not _differs(a, b) for i, a in enumerate(options) for b in options[i + 1:]):
        raise Unsuitable("two options look the same")
    listed = " ".join(f"{LETTERS[i]}. {IMG}" for i in range(4))
    question = (f"{IMG}A square region of this image has been blacked out. Which patch fills it? {listed} "
                f"Answer with the option letter.")
    if terse:
        question = f"{IMG}Which patch fills the black square? {listed}"
    return Puzzle(question, (Image.fromarray(context), *(Image.fromarray(o) for o in options)), LETTERS[gt],
                  "This patch continues the edges around the black square.")


def normalised_depth(depth: np.ndarray, low_q: float, high_q: float) -> np.ndarray:
    """Valid depth mapped to [0, 1] by its percentiles (clipped); NaN stays NaN."""
    if np.isfinite(depth).sum() < 16:
        raise Unsuitable("too little valid depth")
    lo, hi = np.nanpercentile(depth, [low_q, high_q])
    if not hi > lo:
        raise Unsuitable("flat depth map")
    return np.clip((depth - lo) / (hi - lo), 0.0, 1.0)


def window_range(values: np.ndarray, size: int) -> np.ndarray:
    """max − min over the ``size``×``size`` window centred at each pixel; NaN where the window holds a
    NaN or leaves the image (separable sliding max/min)."""
    h, w = values.shape
    out = np.full((h, w), np.nan)
    if h < size or w < size:
        return out

    def sweep(a: np.ndarray, reduce) -> np.ndarray:
        a = reduce(sliding_window_view(a, size, axis=1), axis=-1)
        return reduce(sliding_window_view(a, size, axis=0), axis=-1)

    half = size // 2
    out[half:h - size + 1 + half, half:w - size + 1 + half] = sweep(values, np.max) - sweep(values, np.min)
    return out


def _flat_point(norm: np.ndarray, band: tuple[float, float], tries: tuple[tuple[int, float], ...],
                taken: list[tuple[int, int]], spacing: float, rng: np.random.Generator) -> tuple[int, int]:
    """A random pixel with depth in ``band`` whose window is flat (Depth.py: 25 px < 0.15, else 11 px < 0.2)."""
    yy, xx = np.mgrid[0:norm.shape[0], 0:norm.shape[1]]
    with np.errstate(invalid="ignore"):
        in_band = (norm >= band[0]) & (norm <= band[1])
    far_from_taken = np.ones(norm.shape, bool)
    for ty, tx in taken:
        far_from_taken &= (yy - ty) ** 2 + (xx - tx) ** 2 >= spacing ** 2
    for size, max_range in tries:
        with np.errstate(invalid="ignore"):
            ok = in_band & far_from_taken & (window_range(norm, size) < max_range)
        ys, xs = np.nonzero(ok)
        if len(ys):
            i = int(rng.integers(len(ys)))
            return int(ys[i]), int(xs[i])
    raise Unsuitable(f"no flat point in the depth band {band}")


def _marker(pen: ImageDraw.ImageDraw, y: int, x: int, label: str, radius: int) -> None:
    pen.ellipse((x - radius, y - radius, x + radius, y + radius), fill=(255, 255, 255), outline=(0, 0, 0),
                width=max(1, radius // 5))
    pen.text((x, y), label, fill=(0, 0, 0), font=_font(max(7, int(radius * 1.5))), anchor="mm")


def depth_puzzle(image: SourceImage, rng: np.random.Generator,
                 flat_windows: tuple[tuple[int, float], ...] = ((25, 0.15), (11, 0.2)), terse: bool = False) -> Puzzle:
    """Regional depth ordering (Depth.py): one flat point from each depth band, labelled 1–3 in
    shuffled order (``lst[i]`` = band of label i+1); GT = ``argsort(lst) + 1``, labels near → far."""
    if image.depth is None:
        raise ValueError(f"{image.key}: the depth pretext task needs a depth map")
    norm = normalised_depth(image.depth, 0.5, 99.5)
    radius = max(4, round(min(norm.shape) / 28))
    points: list[tuple[int, int]] = []
    for band in DEPTH_BANDS:
        points.append(_flat_point(norm, band, flat_windows, points, 3 * radius, rng))
    bands_of_labels = rng.permutation(3)
    picture = Image.fromarray(image.rgb)
    pen = ImageDraw.Draw(picture)
    for label, band in enumerate(bands_of_labels.tolist(), start=1):
        _marker(pen, *points[band], str(label), radius)
    order = [int(i) + 1 for i in np.argsort(bands_of_labels)]
    question = (f"{IMG}Three points are marked 1, 2 and 3 in the image. Order them from the nearest to the "
                f"farthest from the camera. Answer with the three labels separated by commas.")
    if terse:
        question = f"{IMG}Order points 1, 2, 3 from near to far."
    marks = tuple((str(label), *points[band]) for label, band in enumerate(bands_of_labels.tolist(), start=1))
    return Puzzle(question, (picture,), ",".join(map(str, order)),
                  f"Point {order[0]} is nearest and point {order[2]} is farthest.", marks)
