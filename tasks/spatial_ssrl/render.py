"""A small vectorised numpy ray caster: random boxes, spheres and cylinders on a checkered ground
plane, seen by a pinhole camera. It yields an RGB image and the exact per-pixel depth (the
camera-frame z of the first hit, in metres; NaN where a ray sees only sky), so the depth-based
Spatial-SSRL pretext tasks (seed_tasks.md §1.5) need no RGB-D files.

World frame: x right, y up, z forward; the ground is the plane y = 0. The camera sits at
``(0, camera_height, 0)`` and is pitched down by ``pitch_deg`` about its x axis.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KINDS = ("box", "sphere", "cylinder")


@dataclass(frozen=True)
class Camera:
    size: int  # square image side, pixels
    fov_deg: float = 60.0  # horizontal field of view
    height: float = 1.6  # metres above the ground
    pitch_deg: float = 15.0  # downward tilt; 90 looks straight down

    def rays(self) -> tuple[np.ndarray, np.ndarray]:
        """Origin [3] and world ray directions [H, W, 3] scaled so their camera-frame z is 1."""
        f = 0.5 * self.size / np.tan(np.radians(self.fov_deg) / 2)
        centre = (self.size - 1) / 2
        v, u = np.mgrid[0:self.size, 0:self.size].astype(np.float64)
        cam = np.stack([(u - centre) / f, -(v - centre) / f, np.ones_like(u)], axis=-1)  # [H, W, 3]
        p = np.radians(self.pitch_deg)  # rotate about x: forward tilts down by p
        rot = np.array([[1, 0, 0], [0, np.cos(p), -np.sin(p)], [0, np.sin(p), np.cos(p)]])
        return np.array([0.0, self.height, 0.0]), cam @ rot.T


@dataclass(frozen=True)
class Primitive:
    kind: str  # one of KINDS
    centre: tuple[float, float, float]  # x, y (of the base for boxes/cylinders; of the centre for spheres), z
    size: tuple[float, float, float]  # box: half extents; sphere: (r, r, r); cylinder: (r, height, r)
    color: tuple[int, int, int]


def _hit_plane(o: np.ndarray, d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        t = -o[1] / d[..., 1]
    return np.where(t > 1e-9, t, np.inf)


def _hit_sphere(o, d, prim: Primitive) -> np.ndarray:
    c, r = np.asarray(prim.centre), prim.size[0]
    oc = o - c
    a = np.einsum("...i,...i->...", d, d)
    b = 2 * d @ oc
    disc = b * b - 4 * a * (oc @ oc - r * r)
    sq = np.sqrt(np.maximum(disc, 0))
    t = (-b - sq) / (2 * a)
    return np.where((disc >= 0) & (t > 1e-9), t, np.inf)


def _hit_box(o, d, prim: Primitive) -> np.ndarray:
    cx, y0, cz = prim.centre
    hx, hy, hz = prim.size
    lo, hi = np.array([cx - hx, y0, cz - hz]), np.array([cx + hx, y0 + 2 * hy, cz + hz])
    with np.errstate(divide="ignore", invalid="ignore"):
        t1, t2 = (lo - o) / d, (hi - o) / d
    near = np.nanmax(np.minimum(t1, t2), axis=-1)
    far = np.nanmin(np.maximum(t1, t2), axis=-1)
    return np.where((near <= far) & (near > 1e-9), near, np.inf)


def _hit_cylinder(o, d, prim: Primitive) -> np.ndarray:
    cx, y0, cz = prim.centre
    r, h = prim.size[0], prim.size[1]
    ox, oz = o[0] - cx, o[2] - cz
    dx, dz = d[..., 0], d[..., 2]
    a = dx * dx + dz * dz
    b = 2 * (ox * dx + oz * dz)
    disc = b * b - 4 * a * (ox * ox + oz * oz - r * r)
    with np.errstate(divide="ignore", invalid="ignore"):
        t_side = (-b - np.sqrt(np.maximum(disc, 0))) / (2 * a)
        y_side = o[1] + t_side * d[..., 1]
        side = np.where((disc >= 0) & (t_side > 1e-9) & (y_side >= y0) & (y_side <= y0 + h), t_side, np.inf)
        t_cap = (y0 + h - o[1]) / d[..., 1]
    inside = (ox + t_cap * dx) ** 2 + (oz + t_cap * dz) ** 2 <= r * r
    cap = np.where((t_cap > 1e-9) & inside, t_cap, np.inf)
    return np.minimum(side, cap)


@dataclass(frozen=True)
class Backdrop:
    """A vertical wall facing the camera at world depth ``z``, from the ground up to ``height``."""

    z: float
    height: float
    colors: tuple[tuple[int, int, int], tuple[int, int, int]] = ((175, 165, 150), (145, 135, 125))
    stripe: float = 1.0  # width of its vertical stripes, metres


HITTERS = {"box": _hit_box, "sphere": _hit_sphere, "cylinder": _hit_cylinder}


def render(camera: Camera, primitives: tuple[Primitive, ...], ground_colors=((200, 190, 170), (120, 110, 100)),
           sky=(150, 190, 235), checker: float = 1.0,
           backdrop: Backdrop | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Z-buffer the ground, the backdrop wall and the primitives: (RGB uint8 [H, W, 3], depth float
    [H, W], NaN = sky).

    With a ``backdrop`` the ground ends at the wall, so a scene's depth range is bounded (and its far
    end is a large, nearly flat surface) rather than running to the horizon. Shading is flat colour
    × a depth fog so that near and far surfaces differ (no lighting model).
    """
    o, d = camera.rays()
    t_best = _hit_plane(o, d)
    points = o + np.where(np.isfinite(t_best), t_best, 0.0)[..., None] * d
    cell = (np.floor(points[..., 0] / checker) + np.floor(points[..., 2] / checker)).astype(np.int64) % 2
    rgb = np.where(cell[..., None] == 0, np.array(ground_colors[0]), np.array(ground_colors[1])).astype(np.float64)
    if backdrop is not None:
        t_best = np.where(points[..., 2] <= backdrop.z, t_best, np.inf)  # no ground behind the wall
        with np.errstate(divide="ignore", invalid="ignore"):
            t_wall = (backdrop.z - o[2]) / d[..., 2]
        y_wall = o[1] + t_wall * d[..., 1]
        wall = (d[..., 2] > 0) & (y_wall >= 0) & (y_wall <= backdrop.height) & (t_wall < t_best)
        stripe = (np.floor((o[0] + t_wall * d[..., 0]) / backdrop.stripe).astype(np.int64) % 2)[..., None]
        rgb = np.where(wall[..., None], np.where(stripe == 0, np.array(backdrop.colors[0]),
                                                 np.array(backdrop.colors[1])), rgb)
        t_best = np.where(wall, t_wall, t_best)
    for prim in primitives:
        t = HITTERS[prim.kind](o, d, prim)
        closer = t < t_best
        rgb[closer] = prim.color
        t_best = np.where(closer, t, t_best)
    depth = np.where(np.isfinite(t_best), t_best, np.nan)  # camera-frame z: rays have z_cam = 1
    fog = np.exp(-np.nan_to_num(depth, nan=0.0) / 40.0)[..., None]
    rgb = np.where(np.isnan(depth)[..., None], np.array(sky, dtype=np.float64), rgb * (0.55 + 0.45 * fog))
    return rgb.clip(0, 255).astype(np.uint8), depth


def random_scene(rng: np.random.Generator, size: int, min_objects: int = 3,
                 max_objects: int = 7, far: float = 18.0) -> tuple[np.ndarray, np.ndarray]:
    """A random scene: a camera of random height/pitch/fov, primitives spread in depth (2.5–14 m) on
    the ground, and a backdrop wall at world depth ``far``."""
    camera = Camera(size, fov_deg=float(rng.uniform(50, 70)), height=float(rng.uniform(1.2, 2.2)),
                    pitch_deg=float(rng.uniform(8, 20)))
    prims = []
    for _ in range(int(rng.integers(min_objects, max_objects + 1))):
        kind = KINDS[int(rng.integers(len(KINDS)))]
        z = float(rng.uniform(2.5, 14.0))
        x = float(rng.uniform(-0.45, 0.45)) * z
        s = float(rng.uniform(0.3, 0.9))
        color = tuple(int(c) for c in rng.integers(20, 256, size=3))
        if kind == "box":
            prims.append(Primitive(kind, (x, 0.0, z), (s, float(rng.uniform(0.3, 1.0)), s), color))
        elif kind == "sphere":
            prims.append(Primitive(kind, (x, s, z), (s, s, s), color))
        else:
            prims.append(Primitive(kind, (x, 0.0, z), (s * 0.7, float(rng.uniform(0.6, 2.0)), s * 0.7), color))
    wall = Backdrop(far, float(rng.uniform(3.0, 8.0)), tuple(tuple(int(c) for c in rng.integers(90, 220, size=3))
                                                          for _ in range(2)), float(rng.uniform(0.5, 2.0)))
    return render(camera, tuple(prims), checker=float(rng.uniform(0.5, 1.5)), backdrop=wall)
