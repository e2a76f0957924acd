"""Spatial-SSRL tasks (arXiv 2510.27606): the five self-supervised pretext tasks as verifiable-reward
VLM tasks, one id each (``spatial_ssrl/{shuffle,flip,crop,depth,position}-v0``) and a mixture
(``spatial_ssrl/mixture-v0``) that samples all five with configurable weights.

Pictures come from the procedural renderer (RGB + exact depth; the default) or a local folder of
RGB / RGB-D images (:mod:`.sources`). The reward is the paper's ``0.9·accuracy + 0.1·format``
(:mod:`.reward`); the prompt ends with the paper's format instruction (``math.jinja``) unless
``format_prompt`` is off (short prompts for the tiny CPU model).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from PIL import Image

from mmrl.core.contracts import RewardResult
from mmrl.tasks.spatial_ssrl.position import PositionSettings, position_puzzle
from mmrl.tasks.spatial_ssrl.pretext import (PRETEXTS, Puzzle, Unsuitable, crop_puzzle, depth_puzzle, flip_puzzle,
                                             shuffle_puzzle)
from mmrl.tasks.spatial_ssrl.reward import ssrl_reward
from mmrl.tasks.spatial_ssrl.sources import SPLITS, FolderSource, RenderSource

FORMAT_SUFFIX = (" You FIRST think about the reasoning process as an internal monologue and then provide the final "
                 "answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST "
                 "BE put in \\boxed{}.")  # the paper's format prompt (training/GRPO/examples/format_prompt/math.jinja)
NEEDS_DEPTH = ("depth", "position")
FLIP_DIRECTIONS = ("vertical", "horizontal")


@dataclass(frozen=True)
class SpatialSSRLConfig:
    source: Literal["render", "folder"] = "render"
    """Where pictures come from: the procedural renderer (exact depth) or ``image_dir``."""
    image_dir: str | None = None
    """Folder of ``name.png|jpg`` (+ ``name.npy`` depth, + optional ``name_mask.npy``), for ``source: folder``."""
    image_size: int = 224
    """Rendered image side in pixels; folder images are downscaled so their longer side is at most this."""
    test_fraction: float = 0.2
    """Share of folder images (by a hash of the file name) held out as the test split."""
    weights: tuple[float, float, float, float, float] = (1.0, 1.0, 1.0, 1.0, 1.0)
    """Mixture weights of shuffle, flip, crop, depth, position (``mixture-v0`` only)."""
    grid: tuple[int, int] = (2, 2)
    """Shuffle: rows, columns of the tile grid (the paper's default 2×2)."""
    blank_tile: bool = False
    """Shuffle: blank one displayed tile in white (the paper's ``mosaic`` option)."""
    flip_directions: tuple[str, ...] = FLIP_DIRECTIONS
    """Flip: the directions drawn from (vertical = upside down, horizontal = mirrored)."""
    ask_direction: bool = False
    """Flip: the harder variant — answer the tile and the direction ("2, vertical")."""
    label_tiles: bool = True
    """Shuffle / flip: draw each tile's red border and 0-based index (as the paper does)."""
    depth_window_sizes: tuple[int, ...] = (25, 11)
    """Depth: window sides (px) tried in order around a marked point (Depth.py: 25, then 11)."""
    depth_window_ranges: tuple[float, ...] = (0.15, 0.2)
    """Depth: the largest normalised depth range allowed in each of those windows (Depth.py)."""
    position: PositionSettings = PositionSettings()
    """Relative position: region size, flatness, near / far / diagonal thresholds, facing weights."""
    terse_prompts: bool = False
    """Shuffle / flip / crop / depth: a few-word question instead of the full one (same answers; for the
    tiny CPU model, whose context must stay short). Relative position always uses the paper's template."""
    format_prompt: bool = True
    """Append the paper's format instruction (<think> … </think>, \\boxed{}) to every prompt."""
    format_weight: float = 0.1
    """Weight w of the format term: reward = (1 − w)·accuracy + w·format (paper: 0.1)."""
    max_tries: int = 50
    """Pictures tried per example before giving up (a picture can be unsuitable, e.g. no flat region)."""


@dataclass(frozen=True)
class SSRLExample:
    """One pretext question; satisfies :class:`mmrl.core.contracts.VisualPrompt`."""

    pretext: str  # one of PRETEXTS
    source_key: str  # the scene seed or file name it was made from
    prompt: str
    images: tuple[Image.Image, ...]
    answer: str
    think: str
    system: str | None = None


class SpatialSSRLTask:
    """A Spatial-SSRL task over ``pretexts`` (one of them, or all five for the mixture)."""

    def __init__(self, cfg: SpatialSSRLConfig, pretexts: tuple[str, ...] = PRETEXTS, task_id: str = ""):
        self.cfg, self.pretexts = cfg, pretexts
        self.id = task_id or f"spatial_ssrl/{pretexts[0] if len(pretexts) == 1 else 'mixture'}-v0"
        self.reward_range = (0.0, 1.0)
        weights = np.asarray(cfg.weights if len(pretexts) > 1 else (1.0,), dtype=np.float64)
        _check(cfg, weights)
        self.weights = weights / weights.sum()
        needs_depth = any(p in NEEDS_DEPTH and w > 0 for p, w in zip(pretexts, self.weights))
        if cfg.source == "render":
            self.source = RenderSource(cfg.image_size)
        else:
            if cfg.image_dir is None:
                raise ValueError("task.args.image_dir is required with task.args.source: folder")
            self.source = FolderSource(cfg.image_dir, cfg.image_size, cfg.test_fraction, needs_depth)

    def _puzzle(self, pretext: str, split: str, rng: np.random.Generator) -> tuple[str, Puzzle]:
        cfg, last = self.cfg, ""
        windows = tuple(zip(cfg.depth_window_sizes, cfg.depth_window_ranges))
        for _ in range(cfg.max_tries):
            image = self.source.draw(split, rng)
            try:
                if pretext == "shuffle":
                    return image.key, shuffle_puzzle(image, rng, cfg.grid, cfg.blank_tile, cfg.label_tiles,
                                                      cfg.terse_prompts)
                if pretext == "flip":
                    return image.key, flip_puzzle(image, rng, cfg.flip_directions, cfg.ask_direction, cfg.label_tiles,
                                                   cfg.terse_prompts)
                if pretext == "crop":
                    return image.key, crop_puzzle(image, rng, cfg.terse_prompts)
                if pretext == "depth":
                    return image.key, depth_puzzle(image, rng, windows, cfg.terse_prompts)
                return image.key, position_puzzle(image, rng, cfg.position)
            except Unsuitable as reason:
                last = f"{image.key}: {reason}"
        raise RuntimeError(f"{self.id}: no usable {split} picture for the {pretext} task in {cfg.max_tries} tries "
                           f"(last: {last}); check task.args or the image folder")

    def sample_batch(self, split: str, n: int, rng: np.random.Generator) -> list[SSRLExample]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; {self.id} has {SPLITS}")
        examples = []
        for _ in range(n):
            pretext = self.pretexts[int(rng.choice(len(self.pretexts), p=self.weights))]
            key, puzzle = self._puzzle(pretext, split, rng)
            prompt = puzzle.question + (FORMAT_SUFFIX if self.cfg.format_prompt else "")
            examples.append(SSRLExample(pretext, key, prompt, puzzle.images, puzzle.answer, puzzle.think))
        return examples

    def reward(self, example: SSRLExample, output: object) -> RewardResult:
        return ssrl_reward(output, example.answer, self.cfg.format_weight)

    def reference_output(self, example: SSRLExample) -> str:
        return f"<think>{example.think}</think>\\boxed{{{example.answer}}}"

    def metrics(self, examples: Sequence[SSRLExample], outputs: Sequence[str],
                results: Sequence[RewardResult]) -> dict[str, float]:
        """``accuracy``, ``format_rate`` and ``accuracy/<pretext>`` for each pretext of the task."""
        metrics = {"accuracy": float(np.mean([r.components["accuracy"] for r in results])),
                   "format_rate": float(np.mean([r.components["format"] for r in results]))}
        for pretext in self.pretexts:
            picked = [r.components["accuracy"] for e, r in zip(examples, results) if e.pretext == pretext]
            metrics[f"accuracy/{pretext}"] = float(np.mean(picked)) if picked else float("nan")
        return metrics


def _check(cfg: SpatialSSRLConfig, weights: np.ndarray) -> None:
    if len(weights) not in (1, len(PRETEXTS)) or (weights < 0).any() or not weights.sum() > 0:
        raise ValueError(f"task.args.weights must be {len(PRETEXTS)} non-negative numbers (shuffle, flip, crop, "
                         f"depth, position) with a positive sum, got {list(cfg.weights)}")
    if cfg.image_size < 28:
        raise ValueError(f"task.args.image_size must be >= 28 pixels, got {cfg.image_size}")
    if len(cfg.grid) != 2 or min(cfg.grid) < 1 or cfg.grid[0] * cfg.grid[1] < 2:
        raise ValueError(f"task.args.grid must be [rows, columns] with at least 2 tiles, got {list(cfg.grid)}")
    if not cfg.flip_directions or any(d not in FLIP_DIRECTIONS for d in cfg.flip_directions):
        raise ValueError(f"task.args.flip_directions must be a non-empty subset of {FLIP_DIRECTIONS}, "
                         f"got {list(cfg.flip_directions)}")
    if not 0 < cfg.test_fraction < 1:
        raise ValueError(f"task.args.test_fraction must be in (0, 1), got {cfg.test_fraction}")
    if not 0 <= cfg.format_weight < 1:
        raise ValueError(f"task.args.format_weight must be in [0, 1), got {cfg.format_weight}")
    if len(cfg.depth_window_sizes) != len(cfg.depth_window_ranges) or not cfg.depth_window_sizes \
            or min(cfg.depth_window_sizes) < 1:
        raise ValueError("task.args.depth_window_sizes and depth_window_ranges must be equally long, non-empty, "
                         f"with sizes >= 1; got {list(cfg.depth_window_sizes)} / {list(cfg.depth_window_ranges)}")
    if cfg.max_tries < 1:
        raise ValueError(f"task.args.max_tries must be >= 1, got {cfg.max_tries}")
    if len(cfg.position.facing_weights) != 4 or min(cfg.position.facing_weights) < 0 \
            or not sum(cfg.position.facing_weights) > 0:
        raise ValueError("task.args.position.facing_weights must be 4 non-negative numbers with a positive sum")
