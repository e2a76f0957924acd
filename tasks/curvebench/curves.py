"""Drawing a containment tree as pairwise non-intersecting closed curves, and reading it back.

How the CurveBench images were drawn is NOT FOUND in the published repository (seed_tasks.md §2.1),
so the generator is ours [INFERRED]: every region gets a disc; a node's curve is a closed curve in
the outer band of its disc and its children's discs are packed, disjoint, inside the curve's inner
clearance. Curve shapes per category:

- ``easy``: radial-Fourier blobs (≤ 5 curves, every topology);
- ``polygon``: random star-shaped polygons;
- ``topographic``: smooth, nearly concentric contours (chains of "hills", some twin peaks);
- ``maze``: deeply notched gear shapes (thin radial corridors) and, for leaves, spiral corridors;
- ``counting``: many small blobs, mostly siblings.

Every layout is checked with shapely before drawing: each curve is simple, its inside and the
outside next to it stay open after the stroke is drawn, children lie inside their parent and
siblings apart, and the strokes of any two curves are at least ``gap`` pixels apart. A failed
layout is redrawn (bounded tries; then a clear error).

:func:`extract_tree` re-derives the tree from the pixels with the published pipeline
(create_dataset.py, seed_tasks.md §2.1): Otsu inverse threshold, one 3×3 erosion, OpenCV
``RETR_TREE`` contours, each stroke's outer contour merged with its hole, virtual root 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np
from PIL import Image, ImageDraw
from shapely.geometry import Point, Polygon

from mmrl.tasks.curvebench.trees import Edge, Parents, canonical_parents, children_map, edges_of

Curve = tuple[tuple[float, float], ...]  # closed polyline (last point joins the first), pixels
CATEGORIES = ("easy", "polygon", "topographic", "maze", "counting")


class LayoutError(RuntimeError):
    """A tree could not be drawn at this image size."""


@dataclass(frozen=True)
class Pen:
    """Stroke geometry in pixels (scaled from the image size)."""

    width: int  # stroke width (≥ 5 so that one 3×3 erosion leaves a closed line)
    gap: int  # least distance between two strokes' edges
    margin: int  # least distance from a stroke to the image border

    @classmethod
    def for_size(cls, image_size: int) -> Pen:
        width = max(5, round(image_size / 90))
        return cls(width=width, gap=max(3, round(image_size / 90)), margin=max(2, image_size // 100))

    @property
    def clearance(self) -> float:
        """Least distance between two curves' centre lines."""
        return self.width + self.gap


# ------------------------------------------------------------------------------------------------
# Shapes: each returns a closed curve inside the disc (centre, radius); children go inside
# ``inner_clearance`` of the centre.


def _polar(center: tuple[float, float], radii: np.ndarray, angles: np.ndarray) -> Curve:
    cx, cy = center
    return tuple((float(cx + r * math.cos(a)), float(cy + r * math.sin(a))) for r, a in zip(radii, angles))


def blob(center, radius, band, rng, harmonics=4, points=96) -> Curve:
    """Radial Fourier curve r(θ) = radius − band/2 + band/2 · Σ a_k cos(kθ + φ_k), |Σ| ≤ 1."""
    theta = np.linspace(0, 2 * math.pi, points, endpoint=False)
    amps = rng.uniform(0, 1, harmonics) / np.arange(1, harmonics + 1)
    phases = rng.uniform(0, 2 * math.pi, harmonics)
    wave = sum(a * np.cos((k + 1) * theta + p) for k, (a, p) in enumerate(zip(amps, phases)))
    wave = wave / max(float(np.abs(wave).max()), 1e-9)
    return _polar(center, radius - band / 2 + band / 2 * wave, theta)


def star_polygon(center, radius, band, rng, min_vertices=5, max_vertices=10) -> Curve:
    """Vertices at jittered, evenly spread angles and radii in [radius − band, radius]."""
    n = int(rng.integers(min_vertices, max_vertices + 1))
    step = 2 * math.pi / n
    theta = rng.uniform(0, 2 * math.pi) + step * (np.arange(n) + rng.uniform(-0.3, 0.3, n))
    return _polar(center, rng.uniform(radius - band, radius, n), theta)


def gear(center, radius, band, rng) -> Curve:
    """A notched disc: teeth at ``radius`` and notches ``band`` deep, i.e. thin radial corridors."""
    teeth = int(rng.integers(6, 13))
    duty = rng.uniform(0.35, 0.6)
    theta = np.linspace(0, 2 * math.pi, teeth * 16, endpoint=False) + rng.uniform(0, 2 * math.pi)
    phase = (np.arange(teeth * 16) % 16) / 16
    radii = np.where(phase < duty, radius, radius - band)
    return _polar(center, radii, theta)


def spiral(center, radius, pen: Pen, rng) -> Curve | None:
    """A closed spiral corridor: out along one wall of the spiral, back along the other; None when
    the disc is too small for more than one turn."""
    half = pen.width + pen.gap / 2  # corridor half-width (centre line to wall)
    pitch = 2 * half + pen.clearance  # radial distance between neighbouring turns' centre lines
    inner = 1.5 * half
    turns = min(rng.uniform(1.2, 2.5), (radius - half - inner) / pitch)
    if turns < 1.0:
        return None
    start = rng.uniform(0, 2 * math.pi)
    t = np.linspace(0, 1, max(48, int(90 * turns)))
    theta = start + 2 * math.pi * turns * t
    middle = inner + (radius - half - inner) * t
    out = _polar(center, middle + half, theta)
    back = _polar(center, (middle - half)[::-1], theta[::-1])
    return out + back


# ------------------------------------------------------------------------------------------------
# Layout: discs for every node, then a shape in each disc.


def _pack_radius(radii: Sequence[float], pen: Pen) -> float:
    """A container radius that packs discs of these radii: exact for one or two discs, else by
    an area estimate at density 0.5 (random placement then succeeds in a few hundred tries)."""
    big = sorted(radii, reverse=True)
    if len(big) == 1:
        return big[0]
    two = big[0] + big[1] + pen.clearance
    if len(big) == 2:
        return two
    return max(two, math.sqrt(sum((r + pen.clearance / 2) ** 2 for r in big) / 0.5))


def _needed_radius(node: int, children: dict[int, list[int]], style: dict, pen: Pen) -> float:
    kids = children.get(node, [])
    if not kids:
        return style["leaf"]
    inner = _pack_radius([_needed_radius(c, children, style, pen) for c in kids], pen) + pen.clearance
    # the least r with r - band(r) >= inner
    return 1.03 * min(inner / (1 - style["band"]), inner + style["band_cap"] * pen.width)


def _band(category: str, radius: float, pen: Pen) -> float:
    """How far a curve may wiggle inside its disc: a share of the radius, capped in stroke widths."""
    style = STYLES[category]
    return min(style["band"] * radius, style["band_cap"] * pen.width)


def _place_discs(radii: list[float], room: tuple[float, float, float] | None, size: int, pen: Pen,
                 rng: np.random.Generator) -> list[tuple[float, float]] | None:
    """Centres for disjoint discs inside a disc ``room`` = (cx, cy, r), or inside the image when
    ``room`` is None; None when rejection sampling fails."""
    centres: list[tuple[float, float]] = []
    for r in radii:
        for _ in range(300):
            if room is None:
                lo, hi = r + pen.margin + pen.width, size - r - pen.margin - pen.width
                if lo > hi:
                    return None
                x, y = rng.uniform(lo, hi, 2)
            else:
                cx, cy, big = room
                if r > big:
                    return None
                angle, dist = rng.uniform(0, 2 * math.pi), (big - r) * math.sqrt(rng.uniform())
                x, y = cx + dist * math.cos(angle), cy + dist * math.sin(angle)
            if all(math.hypot(x - a, y - b) >= r + radii[j] + pen.clearance for j, (a, b) in enumerate(centres)):
                centres.append((float(x), float(y)))
                break
        else:
            return None
    return centres


STYLES = {  # band: share of a disc's radius that its curve may wiggle in, at most band_cap stroke
    # widths; leaf: least leaf radius in stroke widths
    "easy": {"band": 0.25, "band_cap": 2.0, "leaf": 2.0},
    "polygon": {"band": 0.3, "band_cap": 3.0, "leaf": 2.0},
    "topographic": {"band": 0.15, "band_cap": 1.5, "leaf": 2.0},
    "maze": {"band": 0.4, "band_cap": 5.0, "leaf": 9.0},
    "counting": {"band": 0.25, "band_cap": 1.5, "leaf": 1.6},
}


def _shape(category: str, center, radius: float, has_children: bool, pen: Pen, rng) -> Curve:
    band = _band(category, radius, pen)
    if category == "polygon":
        return star_polygon(center, radius, band, rng, *((8, 12) if has_children else (3, 9)))
    if category == "maze":
        if not has_children and (curve := spiral(center, radius, pen, rng)) is not None:
            return curve
        if has_children:
            return gear(center, radius, band, rng)
    harmonics = {"topographic": 3, "counting": 2}.get(category, 4)
    return blob(center, radius, band, rng, harmonics)


def layout(parents: Parents, category: str, size: int, rng: np.random.Generator) -> tuple[Curve, ...] | None:
    """Curves for nodes 1..n (in ``parents`` order), or None when this random layout failed."""
    pen, style = Pen.for_size(size), dict(STYLES[category])
    style["leaf"] *= pen.width
    children = children_map(edges_of(parents))
    curves: dict[int, Curve] = {}
    queue: list[tuple[int, tuple[float, float, float] | None]] = [(0, None)]
    while queue:
        node, room = queue.pop()
        kids = children.get(node, [])
        if not kids:
            continue
        need = [_needed_radius(c, children, style, pen) for c in kids]
        space = (size / 2 - pen.margin - pen.width) if room is None else room[2]
        grow = space / _pack_radius(need, pen)
        if grow < 1:
            return None
        if len(kids) == 1:  # nearly concentric: the only child fills most of the room
            radii = [max(need[0], space * rng.uniform(0.6, 0.95))]
        else:
            radii = [max(n, n * min(grow, 4.0) * rng.uniform(0.7, 1.0)) for n in need]
        centres = _place_discs(radii, room, size, pen, rng)
        if centres is None:
            return None
        for child, centre, radius in zip(kids, centres, radii):
            curve = _shape(category, centre, radius, child in children, pen, rng)
            curves[child] = curve
            clearance = Polygon(curve).exterior.distance(Point(centre)) - pen.clearance
            queue.append((child, (centre[0], centre[1], clearance)))
    return tuple(curves[i] for i in range(1, len(parents) + 1))


def layout_problem(parents: Parents, curves: Sequence[Curve], pen: Pen, size: int) -> str:
    """Why these curves do not draw ``parents`` cleanly, or "" (shapely checks, see module doc)."""
    polygons = [Polygon(c) for c in curves]
    stroke = pen.width / 2 + 1.0
    for i, poly in enumerate(polygons, start=1):
        if not poly.is_valid:
            return f"curve {i} intersects itself"
        inside = poly.buffer(-stroke)
        if inside.is_empty or inside.geom_type != "Polygon":
            return f"curve {i}'s inside closes up under the stroke"
        if poly.buffer(stroke).interiors:
            return f"curve {i} pinches its outside under the stroke"
        x0, y0, x1, y1 = poly.bounds
        if min(x0, y0) < pen.margin + pen.width / 2 or max(x1, y1) > size - 1 - pen.margin - pen.width / 2:
            return f"curve {i} leaves the image"
    ancestors = {0: set()} | {}
    for i, p in enumerate(parents, start=1):
        ancestors[i] = ancestors[p] | {p}
    for i in range(1, len(curves) + 1):
        for j in range(i + 1, len(curves) + 1):
            a, b = polygons[i - 1], polygons[j - 1]
            nested = i in ancestors[j] or j in ancestors[i]
            outer, inner = (a, b) if i in ancestors[j] else (b, a)
            if nested and not outer.contains(inner):
                return f"curves {i} and {j} should nest"
            if not nested and a.intersects(b):
                return f"curves {i} and {j} overlap"
            if a.exterior.distance(b.exterior) < pen.clearance:
                return f"curves {i} and {j} are closer than {pen.clearance} px"
    return ""


def draw_curves(curves: Sequence[Curve], parents: Parents, size: int) -> Image.Image:
    """Black strokes of ``Pen.width`` on white (RGB). Each stroke is the ring between the curve
    grown and shrunk by half the width, filled black then its inside filled white; parents are
    drawn before their children, so no stroke is erased."""
    pen = Pen.for_size(size)
    image = Image.new("RGB", (size, size), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    depth = [0]
    for i, p in enumerate(parents, start=1):
        depth.append(depth[p] + 1)
    for i in sorted(range(1, len(curves) + 1), key=lambda n: depth[n]):
        poly = Polygon(curves[i - 1])
        draw.polygon(list(poly.buffer(pen.width / 2, join_style="round").exterior.coords), fill=(0, 0, 0))
        draw.polygon(list(poly.buffer(-pen.width / 2, join_style="round").exterior.coords), fill=(255, 255, 255))
    return image


# ------------------------------------------------------------------------------------------------
# Reading the tree back from pixels (the published ground-truth pipeline)


def extract_tree(image: Image.Image) -> Parents:
    """The containment tree of the strokes in ``image`` (create_dataset.py's pipeline), canonical.

    Contours alternate in depth: a stroke's outer contour (even depth) has one hole (odd depth)
    inside which the next strokes' outer contours lie. Each outer contour is one region; its
    parent region is the outer contour two levels up, or the virtual root 0.
    """
    gray = np.asarray(image.convert("L"))
    _, binary = cv2.threshold(gray, 0, 255, cv2.THRESH_BINARY_INV + cv2.THRESH_OTSU)
    binary = cv2.erode(binary, np.ones((3, 3), np.uint8), iterations=1)
    contours, hierarchy = cv2.findContours(binary, cv2.RETR_TREE, cv2.CHAIN_APPROX_SIMPLE)
    if hierarchy is None:
        return ()
    parent_of = hierarchy[0][:, 3].tolist()

    def depth(i: int) -> int:
        d = 0
        while parent_of[i] >= 0:
            i, d = parent_of[i], d + 1
        return d

    outers = [i for i in range(len(contours)) if depth(i) % 2 == 0]
    region = {contour: k for k, contour in enumerate(outers, start=1)}
    edges: list[Edge] = []
    for contour in outers:
        hole = parent_of[contour]
        edges.append((0 if hole < 0 else region[parent_of[hole]], region[contour]))
    return canonical_parents(edges)
