"""Relative 3D position (the paper's ``Position.py``, seed_tasks.md §1.3 item 5).

Two flat regions are marked 1 and 2. A camera stands at region ``a`` facing one of four directions
(the left of the image, the right of the image, me = towards the viewer, away from me; weights
30/30/30/10); where is region ``b`` seen from it? With Δx = x_b − x_a (image pixels, + = right) and
Δz = z_b − z_a (normalised depth, + = farther), the answer follows the sign table of the camera's
axes in the viewer's frame (:data:`~.pretext.CAMERA_AXES`): a *near* pair (similar depth, side by
side) is decided by Δx alone, a *far* pair by Δz alone when |Δx| ≤ ``diagonal_dx``, and by both
otherwise (options Left-Front / Right-Front / Right-Back / Left-Back). Zero counts as positive
(the paper's ``Δx >= 0``). Position.py itself was not retrievable: the full tables are derived
from this geometry and agree with the rows quoted in seed_tasks.md (docs/tasks.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from mmrl.core.contracts import IMAGE_PLACEHOLDER as IMG
from mmrl.tasks.spatial_ssrl.pretext import (CAMERA_AXES, DIAGONAL, FACINGS, FOUR_WAY, LETTERS, Puzzle, Unsuitable,
                                             _marker)
from mmrl.tasks.spatial_ssrl.sources import SourceImage


@dataclass(frozen=True)
class PositionSettings:
    block: int = 15  # side of a candidate region, pixels
    flatness: float = 0.15  # largest depth range inside a region (normalised depth)
    far_gap: float = 0.25  # a far pair differs by at least this much depth; a near pair by at most
    near_dy: int = 30  # a near pair's vertical offset is below this, pixels
    diagonal_dx: int = 150  # a far pair with |Δx| above this gets the diagonal options, pixels
    facing_weights: tuple[float, float, float, float] = (30.0, 30.0, 30.0, 10.0)  # over FACINGS


def relation(facing: str, dx: float, dz: float, kind: str, diagonal: bool) -> str:
    """Where the target is, seen from the camera (the sign tables).

    >>> relation("the left of the image", 40, 0.0, "near", False), relation("me", 0, 0.5, "far", False)
    ('Back', 'Back')
    >>> relation("away from me", 200, 0.4, "far", True), relation("the right of the image", -1, 0.3, "far", False)
    ('Right-Front', 'Left')
    """
    sx, sz = (1 if dx >= 0 else -1), (1 if dz >= 0 else -1)
    v = (sx, 0) if kind == "near" else ((sx, sz) if diagonal else (0, sz))
    front, right = CAMERA_AXES[facing]
    ahead = front[0] * v[0] + front[1] * v[1]
    aside = right[0] * v[0] + right[1] * v[1]
    if diagonal:
        return f"{'Right' if aside > 0 else 'Left'}-{'Front' if ahead > 0 else 'Back'}"
    return ("Front" if ahead > 0 else "Back") if ahead else ("Right" if aside > 0 else "Left")


def flat_blocks(depth: np.ndarray, settings: PositionSettings) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Centres (y, x) and mean normalised depth of the flat, fully valid blocks of a non-overlapping
    grid whose centres lie within ±45% of the image centre."""
    valid = np.isfinite(depth)
    if valid.sum() < 16 or not np.nanmax(depth) > np.nanmin(depth):
        raise Unsuitable("too little depth range")
    norm = (depth - np.nanmin(depth)) / (np.nanmax(depth) - np.nanmin(depth))  # min-max (Position.py)
    b = settings.block
    gh, gw = norm.shape[0] // b, norm.shape[1] // b
    blocks = norm[:gh * b, :gw * b].reshape(gh, b, gw, b).transpose(0, 2, 1, 3).reshape(gh, gw, b * b)
    spread = blocks.max(-1) - blocks.min(-1)  # NaN if any pixel is invalid
    cy, cx = np.mgrid[0:gh, 0:gw] * b + b // 2
    h, w = norm.shape
    central = (np.abs(cy - h / 2) <= 0.45 * h) & (np.abs(cx - w / 2) <= 0.45 * w)
    with np.errstate(invalid="ignore"):
        ok = central & (spread <= settings.flatness)
    return cy[ok], cx[ok], blocks.mean(-1)[ok]


def _pick_pair(cy, cx, z, min_side: int, settings: PositionSettings, rng) -> tuple[int, int, str]:
    i, j = np.triu_indices(len(z), k=1)
    dz, dy, dx = np.abs(z[j] - z[i]), np.abs(cy[j] - cy[i]), np.abs(cx[j] - cx[i])
    far = (dz >= settings.far_gap) & (np.hypot(dy, dx) >= min_side // 8)
    near = (dz <= settings.far_gap) & (dy < settings.near_dy) & (dx >= min_side // 8)
    kinds = [("far", far), ("near", near)]
    if rng.integers(2):
        kinds.reverse()
    for kind, mask in kinds:
        (choices,) = np.nonzero(mask)
        if len(choices):
            k = int(choices[int(rng.integers(len(choices)))])
            return int(i[k]), int(j[k]), kind
    raise Unsuitable("no near or far pair of flat regions")


def _mark_region(pen: ImageDraw.ImageDraw, y: int, x: int, label: str, block: int, radius: int) -> None:
    half = block // 2
    pen.rectangle((x - half, y - half, x + half, y + half), outline=(255, 0, 0), width=max(1, block // 8))
    _marker(pen, max(radius, y - half - radius), x, label, radius)


def position_puzzle(image: SourceImage, rng: np.random.Generator,
                    settings: PositionSettings = PositionSettings()) -> Puzzle:
    """One relative-position question with the paper's prompt template; options in random order."""
    if image.depth is None:
        raise ValueError(f"{image.key}: the position pretext task needs a depth map")
    cy, cx, z = flat_blocks(image.depth, settings)
    first, second, kind = _pick_pair(cy, cx, z, min(image.depth.shape), settings, rng)
    regions = {"1": first, "2": second} if rng.integers(2) else {"1": second, "2": first}
    a = "1" if rng.integers(2) else "2"
    b = "2" if a == "1" else "1"
    weights = np.asarray(settings.facing_weights, dtype=np.float64)
    facing = FACINGS[int(rng.choice(4, p=weights / weights.sum()))]
    dx, dz = float(cx[regions[b]] - cx[regions[a]]), float(z[regions[b]] - z[regions[a]])
    diagonal = kind == "far" and abs(dx) > settings.diagonal_dx
    truth = relation(facing, dx, dz, kind, diagonal)
    options = [(DIAGONAL if diagonal else FOUR_WAY)[k] for k in rng.permutation(4)]
    picture = Image.fromarray(image.rgb)
    pen = ImageDraw.Draw(picture)
    radius = max(4, round(min(image.depth.shape) / 32))
    for label, index in regions.items():
        _mark_region(pen, int(cy[index]), int(cx[index]), label, settings.block, radius)
    listed = " ".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(options))
    height = " and ignore the height difference between the two regions" if kind == "far" else ""
    question = (f"{IMG}I've taken an image and there are two regions marked as 1, and 2 on the image. Assume that "
                f"there is a camera at position '{a}' and it's facing to {facing}. According to the camera, where "
                f"is the region marker '{b}'? {listed}. Consider cues such as depth, orientation, and 3D spatial "
                f"relationship{height}. The final answer should be chosen from 'A', 'B', 'C', and 'D'.")
    marks = tuple((label, int(cy[i]), int(cx[i])) for label, i in sorted(regions.items()))
    return Puzzle(question, (picture,), LETTERS[options.index(truth)],
                  f"Seen from region {a} facing {facing}, region {b} is {truth}.", marks)
