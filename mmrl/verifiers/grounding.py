"""``iou``: the grounding reward of Visual-RFT (arXiv 2503.01785) and VLM-R1 (arXiv 2504.07615): the IoU of
predicted bounding boxes ``[x1, y1, x2, y2]`` with the reference boxes.

Boxes are read from the answer (:func:`mmrl.verifiers.text.answer_region`): first as JSON (the first
``[`` or ``{`` that decodes; every list of exactly four numbers in it is a box, so Qwen2.5-VL's
``[{"bbox_2d": [x1, y1, x2, y2], "label": "cat"}]`` works), else as the plain numbers of the text taken
four at a time (``(10, 20), (30, 40)``; a count that is not a multiple of four is malformed: 0). The
reference is one box, a list of boxes, or the same JSON / text forms.

Several boxes are matched one-to-one, greedily by decreasing IoU (as COCO's evaluation matches); the
score is Σ matched IoU / max(#reference, #predicted), so missed boxes and extra predictions both cost.
A box that is degenerate (x2 ≤ x1 or y2 ≤ y1, corners swapped included), non-finite or beyond
:data:`MAX_COORDINATE` overlaps nothing.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from collections.abc import Mapping

from mmrl.verifiers.base import register_verifier
from mmrl.verifiers.text import answer_region

Box = tuple[float, float, float, float]
MAX_BOXES = 64
"""More boxes than this (predicted or reference) are not an answer: 0."""
MAX_COORDINATE = 1e7
"""Coordinates beyond ±1e7 (pixels or normalised units) are not boxes; keeps areas finite."""
MAX_JSON_STARTS = 16
MAX_DEPTH = 8
JSON_START = re.compile(r"[\[{]")
PLAIN_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def boxes_in(value: object, depth: int = 0) -> list[list] | None:
    """Every list of exactly four real numbers in a decoded JSON value, depth first; None past the limits."""
    if depth > MAX_DEPTH:
        return None
    if isinstance(value, Mapping):
        value = list(value.values())
    if not isinstance(value, (list, tuple)):
        return []
    if len(value) == 4 and all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value):
        return [list(value)]
    found: list[list] = []
    for item in value:
        inner = boxes_in(item, depth + 1)
        if inner is None:
            return None
        found += inner
        if len(found) > MAX_BOXES:
            return None
    return found


def boxes_from_text(text: str) -> list[list] | None:
    """Boxes of a text answer: those of its JSON values (every ``[`` / ``{`` that starts one, left to right:
    ``[0,0,2,2], [5,5,6,6]`` is two boxes), else its plain numbers four at a time."""
    decoder, found, failures = json.JSONDecoder(), [], 0
    start = JSON_START.search(text)
    while start is not None and failures < MAX_JSON_STARTS:
        try:
            value, end = decoder.raw_decode(text, start.start())
            boxes = boxes_in(value)
        except (ValueError, RecursionError):
            failures += 1
            start = JSON_START.search(text, start.start() + 1)
            continue
        if boxes is None or len(found) + len(boxes) > MAX_BOXES:
            return None
        found += boxes
        start = JSON_START.search(text, end)
    if found:
        return found
    values = []
    for match in PLAIN_NUMBER.finditer(text):
        values.append(float(match.group()))
        if len(values) > 4 * MAX_BOXES:
            return None
    if not values or len(values) % 4:
        return None
    return [values[i:i + 4] for i in range(0, len(values), 4)]


def read_boxes(value: object) -> list[Box] | None:
    """Boxes of a reference (a box, a list of boxes, JSON or text) as float tuples; None when unreadable."""
    if isinstance(value, str):
        found = boxes_from_text(value[:4 * MAX_BOXES * 32])
    else:
        try:
            found = boxes_in(value)
        except RecursionError:
            return None
    if not found or len(found) > MAX_BOXES:
        return None
    try:
        return [tuple(float(v) for v in box) for box in found]  # type: ignore[misc]
    except (OverflowError, ValueError):
        return None


def valid(box: Box) -> bool:
    x1, y1, x2, y2 = box
    return all(math.isfinite(v) and abs(v) <= MAX_COORDINATE for v in box) and x2 > x1 and y2 > y1


def box_iou(a: Box, b: Box) -> float:
    """Intersection over union of two boxes; 0 when either is not :func:`valid`.

    >>> box_iou((0, 0, 2, 2), (1, 1, 3, 3)), box_iou((0, 0, 2, 2), (0, 0, 2, 2)), box_iou((2, 2, 0, 0), (0, 0, 2, 2))
    (0.14285714285714285, 1.0, 0.0)
    """
    if not (valid(a) and valid(b)):
        return 0.0
    width = min(a[2], b[2]) - max(a[0], b[0])
    height = min(a[3], b[3]) - max(a[1], b[1])
    if width <= 0 or height <= 0:
        return 0.0
    intersection = width * height
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - intersection
    return min(intersection / union, 1.0) if union > 0 else 0.0


def matched_iou(predicted: list[Box], reference: list[Box], threshold: float | None) -> float:
    """Σ IoU (or, with ``threshold``, the count with IoU ≥ threshold) of a greedy one-to-one matching by
    decreasing IoU, over max(#reference, #predicted)."""
    pairs = sorted(((box_iou(p, r), i, j) for i, p in enumerate(predicted) for j, r in enumerate(reference)),
                   key=lambda pair: -pair[0])
    used_p, used_r, total = set(), set(), 0.0
    for overlap, i, j in pairs:
        if overlap <= 0 or i in used_p or j in used_r:
            continue
        used_p.add(i)
        used_r.add(j)
        total += overlap if threshold is None else float(overlap >= threshold)
    return total / max(len(predicted), len(reference))


@register_verifier("iou")
def iou(completion: object, answer: object, *, threshold: float | None = None) -> float:
    """Matched IoU of the answer's boxes with the reference boxes, in [0, 1] (see the module docstring);
    with ``threshold`` each matched box scores 1 when its IoU ≥ threshold, else 0 (a detection rate).

    >>> iou("<answer>[0, 0, 2, 2]</answer>", [1, 1, 3, 3])
    0.14285714285714285
    >>> iou('[{"bbox_2d": [0, 0, 2, 2], "label": "cat"}]', [0, 0, 2, 2])
    1.0
    >>> iou("<answer>[0,0,2,2], [5,5,6,6]</answer>", [[0, 0, 2, 2]])  # an extra box halves the score
    0.5
    """
    if threshold is not None and not (0 < threshold <= 1):
        raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
    region = answer_region(completion)
    reference = read_boxes(answer)
    if region is None or reference is None or not all(valid(box) for box in reference):
        return 0.0
    predicted = read_boxes(region.text)
    if predicted is None:
        return 0.0
    return matched_iou(predicted, reference, threshold)
