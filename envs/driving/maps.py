"""Procedural road layouts: lanes as centre polylines with widths, drivable area as a shapely polygon.

Layouts (world frame, metres, right-hand traffic): ``straight`` (2–3 parallel lanes, one
direction), ``curve`` (2 concentric lanes on an arc), ``intersection`` (4-way, one lane per
direction), ``merge`` (an on-ramp joining a 2-lane road). Unseen layouts for the ``ood_layout``
split: ``s_curve`` (two opposite arcs) and ``t_junction`` (no straight-through arm).

Each layout also names its *routes*: the lane sequences a vehicle can follow, used both for
the ego's instruction and for background agents' paths.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import shapely
from shapely.geometry import LineString, Polygon, box
from shapely.ops import unary_union

from mmrl.envs.driving.geometry import arc, offset_polyline, resample_polyline, smoothstep

LANE_WIDTH = 3.5
TRAIN_LAYOUTS = ("straight", "curve", "intersection", "merge")
OOD_LAYOUTS = ("s_curve", "t_junction")


@dataclass(frozen=True, eq=False)
class Lane:
    """One lane: centre polyline [K, 2] (1 m spacing, in the direction of travel) and width (m)."""

    name: str
    centre: np.ndarray
    width: float = LANE_WIDTH


@dataclass(frozen=True, eq=False)
class RoadMap:
    """Lanes, the drivable-area polygon, and the named routes (polylines a vehicle may follow)."""

    layout: str
    lanes: tuple[Lane, ...]
    drivable: Polygon
    routes: dict[str, np.ndarray]  # name → polyline [K, 2], 1 m spacing
    lane_change_pairs: tuple[tuple[str, str, str], ...] = ()  # (route, left-neighbour route, right-neighbour)


def lane_area(line: np.ndarray, width: float) -> Polygon:
    """The area a lane covers: its centre polyline buffered by half its width (flat ends)."""
    return LineString(line).buffer(width / 2.0, cap_style="flat", join_style="round")


def road_map(layout: str, lanes: list[Lane], extra_areas: list, routes: dict[str, np.ndarray],
             pairs: tuple = ()) -> RoadMap:
    """A RoadMap of ``lanes`` (drawn with their side lines) whose drivable area is their union with
    ``extra_areas`` (junction boxes, unmarked lanes), slivers closed; the largest part if it falls apart."""
    area = unary_union([lane_area(l.centre, l.width) for l in lanes] + extra_areas)
    area = area.buffer(0.05).buffer(-0.05)  # close slivers between adjacent lane buffers
    if area.geom_type != "Polygon":
        area = max(area.geoms, key=lambda g: g.area)
    shapely.prepare(area)
    routes = {k: resample_polyline(v) for k, v in routes.items()}
    return RoadMap(layout, tuple(lanes), area, routes, pairs)


def _parallel_road(name: str, reference: np.ndarray, n_lanes: int) -> RoadMap:
    lanes = [Lane(f"lane{i}", resample_polyline(offset_polyline(reference, i * LANE_WIDTH))) for i in range(n_lanes)]
    routes = {l.name: l.centre for l in lanes}
    pairs = tuple((f"lane{i}", f"lane{i + 1}" if i + 1 < n_lanes else "", f"lane{i - 1}" if i > 0 else "")
                  for i in range(n_lanes))
    return road_map(name, lanes, [], routes, pairs)


def straight_road(rng: np.random.Generator) -> RoadMap:
    n_lanes = int(rng.integers(2, 4))
    ref = np.stack([np.linspace(-20, 220, 241), np.zeros(241)], axis=1)
    return _parallel_road("straight", ref, n_lanes)


def curve_road(rng: np.random.Generator) -> RoadMap:
    radius = float(rng.uniform(50, 120)) * (1 if rng.random() < 0.5 else -1)
    lead = np.stack([np.linspace(-20, 30, 51), np.zeros(51)], axis=1)
    sweep = 180.0 / abs(radius)  # about 180 m of arc
    if radius > 0:  # left curve, centre to the left of the road
        bend = arc((30.0, radius), radius, -np.pi / 2, -np.pi / 2 + sweep)
    else:
        bend = arc((30.0, radius), -radius, np.pi / 2, np.pi / 2 - sweep)
    ref = np.concatenate([lead, bend[1:]])
    # lanes are left offsets of the reference (3.5 m << |radius|, so the offset curves stay valid)
    return _parallel_road("curve", ref, 2)


def s_curve_road(rng: np.random.Generator) -> RoadMap:
    r = float(rng.uniform(40, 70))
    lead = np.stack([np.linspace(-20, 20, 41), np.zeros(41)], axis=1)
    sweep = 70.0 / r
    first = arc((20.0, r), r, -np.pi / 2, -np.pi / 2 + sweep)
    end = first[-1]
    heading = sweep
    c2 = end + r * np.array([np.sin(heading), -np.cos(heading)])
    a0 = np.arctan2(end[1] - c2[1], end[0] - c2[0])
    second = arc(tuple(c2), r, a0, a0 - sweep)
    tail_dir = np.array([1.0, 0.0])
    tail = second[-1] + np.linspace(1, 60, 60)[:, None] * tail_dir
    ref = np.concatenate([lead, first[1:], second[1:], tail])
    return _parallel_road("s_curve", ref, 2)


def _junction(layout: str, arms: tuple[str, ...]) -> RoadMap:
    """A junction at the origin; square core [-8, 8]²; one lane per direction on each arm."""
    half, core, arm_len = LANE_WIDTH / 2, 8.0, 90.0
    lin = lambda a, b: np.stack([np.linspace(a[0], b[0], 91), np.linspace(a[1], b[1], 91)], axis=1)
    # incoming lanes end at the core edge; outgoing lanes start at it (right-hand traffic)
    incoming = {"south": lin((half, -arm_len), (half, -core)), "north": lin((-half, arm_len), (-half, core)),
                "west": lin((-arm_len, -half), (-core, -half)), "east": lin((arm_len, half), (core, half))}
    outgoing = {"north": lin((half, core), (half, arm_len)), "south": lin((-half, -core), (-half, -arm_len)),
                "east": lin((core, -half), (arm_len, -half)), "west": lin((-core, half), (-arm_len, half))}
    # headings into the core for each incoming arm, and (left, straight, right) exits
    exits = {"south": ("west", "north", "east"), "north": ("east", "south", "west"),
             "west": ("north", "east", "south"), "east": ("south", "west", "north")}
    routes, lanes = {}, []
    for a in arms:
        lanes += [Lane(f"in_{a}", incoming[a]), Lane(f"out_{a}", outgoing[a])]
        for turn, b in zip(("left", "straight", "right"), exits[a]):
            if b not in arms:
                continue
            p0, p1 = incoming[a][-1], outgoing[b][0]
            d0 = incoming[a][-1] - incoming[a][-2]
            d0 = d0 / np.linalg.norm(d0)
            d1 = outgoing[b][1] - outgoing[b][0]
            d1 = d1 / np.linalg.norm(d1)
            routes[f"{a}_{turn}"] = np.concatenate([incoming[a], _bezier(p0, p0 + d0 * 6, p1 - d1 * 6, p1)[1:-1], outgoing[b]])
    extra = [box(-core, -core, core, core)]
    arm_boxes = {"south": box(-LANE_WIDTH, -arm_len, LANE_WIDTH, -core + 0.1),
                 "north": box(-LANE_WIDTH, core - 0.1, LANE_WIDTH, arm_len),
                 "west": box(-arm_len, -LANE_WIDTH, -core + 0.1, LANE_WIDTH),
                 "east": box(core - 0.1, -LANE_WIDTH, arm_len, LANE_WIDTH)}
    extra += [arm_boxes[a] for a in arms]
    return road_map(layout, lanes, extra, routes)


def _bezier(p0, p1, p2, p3, n: int = 20) -> np.ndarray:
    t = np.linspace(0, 1, n)[:, None]
    return (1 - t) ** 3 * p0 + 3 * (1 - t) ** 2 * t * p1 + 3 * (1 - t) * t ** 2 * p2 + t ** 3 * p3


def intersection_road(rng: np.random.Generator) -> RoadMap:
    return _junction("intersection", ("south", "north", "west", "east"))


def t_junction_road(rng: np.random.Generator) -> RoadMap:
    return _junction("t_junction", ("south", "west", "east"))


def merge_road(rng: np.random.Generator) -> RoadMap:
    main = np.stack([np.linspace(-20, 220, 241), np.zeros(241)], axis=1)
    lanes = [Lane("lane0", main), Lane("lane1", offset_polyline(main, LANE_WIDTH))]
    join = float(rng.uniform(70, 100))
    x = np.linspace(0, join, int(join) + 1)
    ramp_head = np.stack([x, -12.0 * (1 - smoothstep(x / join))], axis=1)
    ramp = np.concatenate([ramp_head, main[main[:, 0] > join + 0.5]])
    lanes.append(Lane("ramp", ramp_head))
    routes = {"lane0": lanes[0].centre, "lane1": lanes[1].centre, "ramp": ramp}
    pairs = (("lane0", "lane1", ""), ("lane1", "", "lane0"))
    return road_map("merge", lanes, [], routes, pairs)


LAYOUT_BUILDERS = {"straight": straight_road, "curve": curve_road, "intersection": intersection_road,
                   "merge": merge_road, "s_curve": s_curve_road, "t_junction": t_junction_road}
