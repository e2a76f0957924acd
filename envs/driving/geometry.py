"""Small, vectorised 2-D geometry for the driving world: polylines, oriented boxes, frames.

Conventions (used everywhere in ``mmrl.envs.driving``): world frame in metres, x east, y north,
heading in radians counter-clockwise from +x. The *ego frame* is centred on the ego vehicle's
centre, x forward (along its heading), y to its left.
"""

from __future__ import annotations

import numpy as np


def polyline_arclength(line: np.ndarray) -> np.ndarray:
    """Cumulative arclength [K] of a polyline [K, 2] (first entry 0)."""
    seg = np.linalg.norm(np.diff(line, axis=0), axis=1)
    return np.concatenate([[0.0], np.cumsum(seg)])


def resample_polyline(line: np.ndarray, step: float = 1.0) -> np.ndarray:
    """The polyline resampled at (about) ``step`` metres, endpoints kept."""
    s = polyline_arclength(line)
    n = max(2, int(np.ceil(s[-1] / step)) + 1)
    grid = np.linspace(0.0, s[-1], n)
    return np.stack([np.interp(grid, s, line[:, 0]), np.interp(grid, s, line[:, 1])], axis=1)


def polyline_tangents(line: np.ndarray) -> np.ndarray:
    """Unit tangent headings [K] (radians) of a polyline, by central differences."""
    d = np.gradient(line, axis=0)
    return np.arctan2(d[:, 1], d[:, 0])


def project_to_polyline(points: np.ndarray, line: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Project points [P, 2] onto a polyline [K, 2].

    Returns ``(s, lateral, tangent_heading)``, each [P]: arclength of the closest point, signed
    lateral offset (positive = left of the direction of travel) and the segment's heading.
    """
    a, b = line[:-1], line[1:]  # [K-1, 2]
    ab = b - a
    seg_len2 = np.maximum((ab ** 2).sum(1), 1e-12)
    ap = points[:, None, :] - a[None]  # [P, K-1, 2]
    t = np.clip((ap * ab[None]).sum(-1) / seg_len2[None], 0.0, 1.0)  # [P, K-1]
    closest = a[None] + t[..., None] * ab[None]
    dist2 = ((points[:, None, :] - closest) ** 2).sum(-1)
    k = dist2.argmin(1)  # [P]
    rows = np.arange(len(points))
    s_cum = polyline_arclength(line)
    seg_len = np.sqrt(seg_len2)
    s = s_cum[k] + t[rows, k] * seg_len[k]
    heading = np.arctan2(ab[k, 1], ab[k, 0])
    rel = points - closest[rows, k]
    lateral = np.cos(heading) * rel[:, 1] - np.sin(heading) * rel[:, 0]
    return s, lateral, heading


def point_at_arclength(line: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Points [*, 2] at arclengths ``s`` [*] along the polyline (clamped to its ends)."""
    s_cum = polyline_arclength(line)
    s = np.clip(s, 0.0, s_cum[-1])
    return np.stack([np.interp(s, s_cum, line[:, 0]), np.interp(s, s_cum, line[:, 1])], axis=-1)


def offset_polyline(line: np.ndarray, offset: np.ndarray | float) -> np.ndarray:
    """The polyline shifted by ``offset`` metres to its left (per point [K] or a scalar)."""
    h = polyline_tangents(line)
    normal = np.stack([-np.sin(h), np.cos(h)], axis=1)
    return line + np.asarray(offset, dtype=float).reshape(-1, 1) * normal


def smoothstep(u: np.ndarray) -> np.ndarray:
    """C1 ramp 0→1 on [0, 1] (3u² − 2u³), clamped outside."""
    u = np.clip(u, 0.0, 1.0)
    return u * u * (3.0 - 2.0 * u)


def arc(center: tuple[float, float], radius: float, start: float, end: float, step: float = 1.0) -> np.ndarray:
    """A circular arc polyline from angle ``start`` to ``end`` (radians) about ``center``."""
    n = max(2, int(np.ceil(abs(end - start) * radius / step)) + 1)
    ang = np.linspace(start, end, n)
    return np.stack([center[0] + radius * np.cos(ang), center[1] + radius * np.sin(ang)], axis=1)


def box_corners(x: np.ndarray, y: np.ndarray, heading: np.ndarray, length: np.ndarray,
                width: np.ndarray) -> np.ndarray:
    """Corners [..., 4, 2] of oriented boxes (centre, heading, length along heading, width)."""
    c, s = np.cos(heading)[..., None], np.sin(heading)[..., None]
    lx = np.array([0.5, 0.5, -0.5, -0.5]) * np.asarray(length)[..., None]
    ly = np.array([0.5, -0.5, -0.5, 0.5]) * np.asarray(width)[..., None]
    cx = np.asarray(x)[..., None] + c * lx - s * ly
    cy = np.asarray(y)[..., None] + s * lx + c * ly
    return np.stack([cx, cy], axis=-1)


def boxes_overlap(corners_a: np.ndarray, corners_b: np.ndarray) -> np.ndarray:
    """Separating-axis test for oriented rectangles; broadcasts over leading dims. Returns bool [...].

    ``corners_*`` are [..., 4, 2] in the order :func:`box_corners` produces (edges 0→1 and 1→2
    are the two axes of each rectangle).
    """
    a, b = np.broadcast_arrays(corners_a, corners_b)
    overlap = np.ones(a.shape[:-2], dtype=bool)
    for box in (a, b):
        for i0, i1 in ((0, 1), (1, 2)):
            axis = box[..., i1, :] - box[..., i0, :]
            axis = axis / np.maximum(np.linalg.norm(axis, axis=-1, keepdims=True), 1e-12)
            pa = (a * axis[..., None, :]).sum(-1)  # [..., 4]
            pb = (b * axis[..., None, :]).sum(-1)
            overlap &= (pa.max(-1) >= pb.min(-1)) & (pb.max(-1) >= pa.min(-1))
    return overlap


def world_to_ego(points: np.ndarray, ego_xy: np.ndarray, ego_heading: float) -> np.ndarray:
    """World points [..., 2] → ego frame (x forward, y left), metres."""
    c, s = np.cos(ego_heading), np.sin(ego_heading)
    d = np.asarray(points, dtype=float) - np.asarray(ego_xy, dtype=float)
    return np.stack([c * d[..., 0] + s * d[..., 1], -s * d[..., 0] + c * d[..., 1]], axis=-1)


def ego_to_world(points: np.ndarray, ego_xy: np.ndarray, ego_heading: float) -> np.ndarray:
    """Ego-frame points [..., 2] (x forward, y left) → world frame."""
    c, s = np.cos(ego_heading), np.sin(ego_heading)
    p = np.asarray(points, dtype=float)
    return np.stack([ego_xy[0] + c * p[..., 0] - s * p[..., 1], ego_xy[1] + s * p[..., 0] + c * p[..., 1]], axis=-1)


def wrap_angle(a: np.ndarray) -> np.ndarray:
    """Angles wrapped to [-π, π)."""
    return (np.asarray(a) + np.pi) % (2 * np.pi) - np.pi
