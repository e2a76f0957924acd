"""Where Spatial-SSRL's pictures come from (seed_tasks.md §1.1, §1.5).

- :class:`RenderSource`: the procedural renderer of :mod:`.render` (RGB + exact depth, no files).
  Train scenes use seeds in ``[0, 2**31)``, test scenes seeds in ``[2**31, 2**32)``: the splits can
  never share a scene.
- :class:`FolderSource`: a folder of RGB images (``.png`` / ``.jpg`` / ``.jpeg``), optionally RGB-D:
  ``name.png`` + ``name.npy`` (float depth, H×W, larger = farther) + optional ``name_mask.npy``
  (H×W, nonzero = valid depth; DIODE's layout). Non-finite or non-positive depth is invalid too.
  A hash (crc32) of the file name assigns each image to train or test, so the splits never share
  an image. Every file is checked when the folder is opened: an unreadable image or a depth map of
  the wrong shape is a ``ValueError`` naming the file (nothing is skipped silently).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from mmrl.core.contracts import DataError
from mmrl.tasks.spatial_ssrl.render import random_scene

SPLITS = ("train", "test")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
SPLIT_SEEDS = {"train": (0, 2**31), "test": (2**31, 2**32)}


@dataclass(frozen=True, eq=False)
class SourceImage:
    key: str  # "scene:<seed>" or the file name: what the split is decided on
    rgb: np.ndarray  # [H, W, 3] uint8
    depth: np.ndarray | None  # [H, W] float, NaN where invalid; None for RGB-only sources


class RenderSource:
    """Random rendered scenes; every image has exact depth."""

    has_depth = True

    def __init__(self, image_size: int):
        self.image_size = image_size

    def draw(self, split: str, rng: np.random.Generator) -> SourceImage:
        low, high = SPLIT_SEEDS[split]
        seed = int(rng.integers(low, high))
        rgb, depth = random_scene(np.random.default_rng(seed), self.image_size)
        return SourceImage(f"scene:{seed}", rgb, depth)


def split_of_name(name: str, test_fraction: float) -> str:
    """Deterministic hash split of a file name."""
    return "test" if zlib.crc32(name.encode()) % 1000 < 1000 * test_fraction else "train"


def _load_rgb(path: Path, max_side: int) -> tuple[np.ndarray, tuple[int, int]]:
    """The image, downscaled so its longer side is at most ``max_side``, and its original (H, W)."""
    try:
        with Image.open(path) as image:
            image = image.convert("RGB")
    except (OSError, ValueError, SyntaxError) as error:
        raise DataError(f"{path}: not a readable image ({error})") from error
    original = (image.height, image.width)
    scale = max_side / max(image.size)
    if scale < 1:
        image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                             Image.BILINEAR)
    return np.asarray(image), original


def _load_depth(path: Path, original: tuple[int, int], shape: tuple[int, int]) -> np.ndarray:
    """``name.npy`` (+ ``name_mask.npy``), of the image's ``original`` shape → float depth at the
    image's (resized) ``shape``, NaN = invalid."""
    try:
        depth = np.load(path).astype(np.float64).squeeze()
        mask_path = path.with_name(path.stem + "_mask.npy")
        mask = np.load(mask_path).squeeze().astype(bool) if mask_path.is_file() else np.ones(depth.shape, bool)
    except (OSError, ValueError) as error:
        raise DataError(f"{path}: not a readable depth array ({error})") from error
    if depth.ndim != 2 or mask.shape != depth.shape:
        raise DataError(f"{path}: depth must be H×W (with a mask of the same shape), got {depth.shape} / {mask.shape}")
    if depth.shape != original:
        raise DataError(f"{path}: depth shape {depth.shape} differs from its image's {original}")
    depth = np.where(mask & np.isfinite(depth) & (depth > 0), depth, np.nan)
    if depth.shape != shape:  # the image was downscaled: nearest-neighbour keeps depth edges
        rows = (np.arange(shape[0]) * depth.shape[0] // shape[0])
        cols = (np.arange(shape[1]) * depth.shape[1] // shape[1])
        depth = depth[rows][:, cols]
    return depth


class FolderSource:
    """Images (and depth maps, where present) of a local folder, checked when opened."""

    def __init__(self, folder: str, max_side: int, test_fraction: float, need_depth: bool):
        root = Path(folder)
        if not root.is_dir():
            raise FileNotFoundError(f"task.args.image_dir: {folder} is not a folder")
        paths = sorted(p for p in root.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not paths:
            raise DataError(f"task.args.image_dir: no {'/'.join(IMAGE_SUFFIXES)} images in {folder}")
        self.max_side = max_side
        self.images: dict[str, list[Path]] = {"train": [], "test": []}
        with_depth = 0
        for path in paths:
            rgb, original = _load_rgb(path, max_side)  # raises, naming the file, if it is corrupt
            depth_path = path.with_suffix(".npy")
            if depth_path.is_file():
                _load_depth(depth_path, original, rgb.shape[:2])
                with_depth += 1
            elif need_depth:
                raise DataError(f"{path}: the depth pretext tasks need {depth_path.name} beside it")
            self.images[split_of_name(path.name, test_fraction)].append(path)
        self.has_depth = with_depth == len(paths)
        for split, files in self.images.items():
            if not files:
                raise DataError(f"task.args.image_dir: the hash split leaves no {split} image among the "
                                 f"{len(paths)} in {folder}; add images or change task.args.test_fraction")

    def draw(self, split: str, rng: np.random.Generator) -> SourceImage:
        files = self.images[split]
        path = files[int(rng.integers(len(files)))]
        rgb, original = _load_rgb(path, self.max_side)
        depth_path = path.with_suffix(".npy")
        depth = _load_depth(depth_path, original, rgb.shape[:2]) if depth_path.is_file() else None
        return SourceImage(path.name, rgb, depth)
