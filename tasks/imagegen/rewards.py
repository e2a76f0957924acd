"""Verifiable image rewards, no downloads: JPEG (in)compressibility (DDPO) and OpenCV checks of a
prompt's colour, count, shape and position (GenEval-style correctness without a detector).

Every function is total: any input (wrong shape, dtype, NaN, a corrupt PIL image) gives a
:class:`~mmrl.core.contracts.RewardResult`-friendly value or a zero with a reason, never an exception.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import cv2
import numpy as np
from PIL import Image

from mmrl.tasks.imagegen.shapes import COLOURS, ShapePrompt, half_box

JPEG_QUALITY = 95  # DDPO rewards.py
FOREGROUND_DISTANCE = 60  # L∞ distance (0..255) from the background colour that marks an object pixel
MIN_COMPONENT_AREA = 4  # connected components smaller than this are specks, not objects
MAX_FOREGROUND_FRACTION = 0.4  # more foreground than this is not "shapes on a background"
MIN_CHROMA = 60  # max − min channel: a coloured object, not a grey smear
SQUARE_EXTENT = 0.86  # area / bounding-box area: squares ≥ this, circles below (a disc is π/4 ≈ 0.79)
MIN_EXTENT = 0.5  # below this the blob is neither a disc nor a square
MAX_OBJECTS = 4  # prompts name one to four objects: more blobs are noise, not shapes
CHECKS = ("colour", "count", "shape", "position")


def as_image(output: object) -> tuple[np.ndarray | None, str]:
    """uint8 [H, W, 3] from a PIL image or an array; (None, reason) for anything else."""
    try:
        if isinstance(output, Image.Image):
            array = np.asarray(output.convert("RGB"))
        elif isinstance(output, np.ndarray):
            array = output
        else:
            return None, f"output is a {type(output).__name__}, not an image"
    except (OSError, ValueError) as err:
        return None, f"unreadable image: {err}"
    if array.ndim != 3 or array.shape[2] != 3 or min(array.shape[:2]) < 4:
        return None, f"image must be [H, W, 3] with H, W >= 4, got shape {array.shape}"
    if array.dtype != np.uint8:
        real = np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating) or array.dtype == bool
        if not real or not np.isfinite(array).all():
            return None, "image has non-finite or non-real values"
        if array.min() < 0 or array.max() > 255:
            return None, f"image values outside 0..255 (min {array.min()}, max {array.max()})"
        array = array.round().astype(np.uint8)
    return np.ascontiguousarray(array), ""


def jpeg_size_kb(image: np.ndarray) -> float:
    """Size of the image saved as JPEG at quality 95, in kB (DDPO: incompressibility = size,
    compressibility = −size)."""
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.tell() / 1000.0


@dataclass(frozen=True)
class Blob:
    area: int
    centroid: tuple[float, float]  # (x, y)
    extent: float  # area / bounding-box area
    colour: str | None  # nearest palette colour, None when unsaturated
    chroma: float


def find_objects(image: np.ndarray) -> tuple[list[Blob], float, int]:
    """Objects = 8-connected components of pixels far from the background (the per-channel median),
    at least ``MIN_COMPONENT_AREA`` pixels. Returns (blobs, foreground fraction, number of objects).

    The blobs are only measured when the image can pass (foreground ≤ ``MAX_FOREGROUND_FRACTION``,
    at most ``MAX_OBJECTS`` objects); otherwise the list is empty and the counts say why. The decision
    comes from the component statistics alone, so a speckled image costs one labelling pass (looping
    over its components cost 4 s at 512×512 and over 60 s at 1024×1024).
    """
    pixels = image.reshape(-1, 3).astype(np.int16)
    background = np.median(pixels, axis=0)
    foreground = (np.abs(image.astype(np.int16) - background).max(-1) > FOREGROUND_DISTANCE).astype(np.uint8)
    fraction = float(foreground.mean())
    if fraction > MAX_FOREGROUND_FRACTION:
        return [], fraction, 0
    n, labels, stats, centroids = cv2.connectedComponentsWithStats(foreground, connectivity=8)
    kept = [k for k in np.flatnonzero(stats[:, cv2.CC_STAT_AREA] >= MIN_COMPONENT_AREA).tolist() if k > 0]
    if len(kept) > MAX_OBJECTS:
        return [], fraction, len(kept)
    palette = np.array(list(COLOURS.values()), dtype=np.float64)
    names = list(COLOURS)
    blobs = []
    for k in kept:
        area = int(stats[k, cv2.CC_STAT_AREA])
        w, h = int(stats[k, cv2.CC_STAT_WIDTH]), int(stats[k, cv2.CC_STAT_HEIGHT])
        mean_rgb = image[labels == k].astype(np.float64).mean(0)
        chroma = float(mean_rgb.max() - mean_rgb.min())
        nearest = names[int(np.argmin(((palette - mean_rgb) ** 2).sum(1)))]
        blobs.append(Blob(area, (float(centroids[k][0]), float(centroids[k][1])), area / (w * h),
                          nearest if chroma >= MIN_CHROMA else None, chroma))
    return blobs, fraction, len(kept)


def shape_of(blob: Blob) -> str | None:
    if blob.extent >= SQUARE_EXTENT:
        return "square"
    return "circle" if blob.extent >= MIN_EXTENT else None


def in_half(centroid: tuple[float, float], position: str, size: tuple[int, int]) -> bool:
    h, w = size
    x0, y0, x1, y1 = half_box(position, w) if h == w else (0, 0, 0, 0)
    if h != w:  # non-square images: halves by the image's own extent
        x0, y0, x1, y1 = {"left": (0, 0, w / 2, h), "right": (w / 2, 0, w, h),
                          "top": (0, 0, w, h / 2), "bottom": (0, h / 2, w, h)}[position]
    x, y = centroid
    return x0 <= x < x1 and y0 <= y < y1


def prompt_checks(image: np.ndarray, prompt: ShapePrompt) -> tuple[dict[str, float], str]:
    """Each check in {0, 1}: ``object`` (1..4 objects on a visible background), then — only when
    there are objects — ``colour`` (every object has the prompt's colour), ``count``, ``shape``
    (every object), ``position`` (every object's centroid in the named half).

    A blank, saturated or noise image has no valid object and scores 0 on every check.
    """
    blobs, fraction, count = find_objects(image)
    zeros = {"object": 0.0, **{c: 0.0 for c in CHECKS}}
    if fraction > MAX_FOREGROUND_FRACTION:
        return zeros, f"foreground covers {fraction:.0%} of the image (no background)"
    if count > MAX_OBJECTS:
        return zeros, f"{count} blobs: noise, not shapes"
    if not blobs:
        return zeros, "no object found"
    checks = {
        "object": 1.0,
        "colour": float(all(b.colour == prompt.colour for b in blobs)),
        "count": float(len(blobs) == prompt.num_objects),
        "shape": float(all(shape_of(b) == prompt.shape for b in blobs)),
        "position": float(all(in_half(b.centroid, prompt.position, image.shape[:2]) for b in blobs)),
    }
    failed = [c for c in CHECKS if not checks[c]]
    return checks, ("failed: " + ", ".join(failed)) if failed else ""


def correctness(checks: dict[str, float]) -> float:
    """Mean of the colour / count / shape / position checks (0 without an object)."""
    return float(np.mean([checks[c] for c in CHECKS])) if checks["object"] else 0.0
