"""CurveBench tasks (arXiv 2605.14068): name the rooted containment tree of nested closed curves.

Ids: ``curvebench/easy-v0`` (≤ 5 curves, uniform over every rooted topology), one id per hard
category (``polygon``, ``topographic``, ``maze``, ``counting``) and ``curvebench/hard-v0`` (the
four hard categories in turn). Examples are drawn from integer seeds: train seeds lie in
[0, 2^31), test seeds in [2^31, 2^32), so the splits never share an image. ``train_path`` /
``test_path`` replace a split by a local copy of the published dataset (see ``local.py``).

Reward (range [0, 1]): ``(1 − f)·[(1 − c)·tree + c·node_count] + f·format`` with ``c =
node_count_weight`` (0.3 gives the paper's 0.7/0.3 weighting) and ``f = format_weight``; ``tree``
is **rooted** isomorphism (root 0 pinned). The published, unrooted check is logged as the
``tree_unrooted`` component and the ``tree_accuracy_unrooted`` metric.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from PIL import Image

from mmrl.core.contracts import RewardResult
from mmrl.tasks.curvebench.examples import CurveQuestion, LoadedExample
from mmrl.tasks.curvebench.curves import (CATEGORIES, STYLES, Curve, LayoutError, Pen, _needed_radius, _pack_radius,
                                          draw_curves, layout, layout_problem)
from mmrl.tasks.curvebench.trees import (Parents, all_topologies, answer_text, canonical_parents, children_map,
                                         depth_of, edges_of, judge, random_recursive_tree)

SYSTEM_PROMPT = (
    "Analyze this image and extract the hierarchical tree structure representing the nested regions. "
    "Each closed curve bounds a region; a region is the child of the smallest region that contains it. "
    "Return the tree structure as a list of edges. The root node is always 0 (the outer region). "
    "Format your response inside <answer>...</answer> tags. - The first line should be the number of nodes "
    "(excluding the root). - Each subsequent line should be \"u v\" meaning an edge from v to u "
    "(v is the parent, u is the child). Example: <answer>\n3\n1 0\n2 0\n3 1\n</answer> "
    "Format: <think>[reasoning]</think> followed by <answer>...</answer>")
"""The published training system prompt (examples/prompts.py, seed_tasks.md §2.2), condensed."""
HARD_CATEGORIES = ("polygon", "topographic", "maze", "counting")
SPLITS = ("train", "test")
TEST_SEED_START = 2 ** 31
LAYOUT_TRIES = 40


@dataclass(frozen=True)
class CurveBenchConfig:
    category: str = "easy"
    """easy | polygon | topographic | maze | counting | hard (the four hard ones in turn)."""
    min_curves: int = 1
    """easy: fewest curves (topologies are uniform over min_curves..max_curves curves)."""
    max_curves: int = 5
    """easy: most curves (≤ 8). The hard categories use their own sizes (see ``hard_tree``)."""
    image_size: int = 448
    """Side of the square image in pixels (strokes and gaps scale with it)."""
    node_count_weight: float = 0.0
    """c: weight of the node-count reward (0.3 = the paper's 0.7 tree / 0.3 count)."""
    format_weight: float = 0.0
    """f: weight of the <think>…</think><answer>…</answer> format term (0 as published)."""
    think: str = "I see {n} curves."
    """Think text of the reference output used by SFT warm starts ({n} = number of curves)."""
    system_prompt: bool = True
    """Send the published system prompt (False: none, for tiny models with short contexts)."""
    train_path: str | None = None
    """A local copy of the published dataset (folder or .parquet) to use as the train split."""
    test_path: str | None = None
    """The same for the test split (e.g. CurveBench-Easy ``total_test``)."""


@dataclass(frozen=True)
class CurveExample(CurveQuestion):
    """One drawn image; satisfies :class:`mmrl.core.contracts.VisualPrompt`."""

    category: str
    seed: int
    parents: Parents  # canonical containment tree, node 0 = outer region
    curves: tuple[Curve, ...]  # curve i + 1 bounds region i + 1
    image_size: int
    system: str | None = None

    @property
    def images(self) -> tuple[Image.Image, ...]:
        return (draw_curves(self.curves, self.parents, self.image_size),)


def hard_tree(category: str, rng: np.random.Generator) -> Parents:
    """Trees of the hard categories [INFERRED: the published sizes are NOT FOUND]:
    polygon 5-9 curves (depth ≤ 3); topographic 1-3 hills of 2-5 nested contours, a contour
    splitting into twin peaks with probability 0.3; maze 3-5 curves (depth ≤ 2); counting 10-20
    curves, mostly siblings, one in five holding one inner curve."""
    if category == "polygon":
        return random_recursive_tree(int(rng.integers(5, 10)), 3, rng)
    if category == "maze":
        return random_recursive_tree(int(rng.integers(3, 6)), 2, rng)
    parents: list[int] = []
    if category == "topographic":
        for _ in range(int(rng.integers(1, 4))):
            top = 0
            for _ in range(int(rng.integers(2, 6))):
                parents.append(top)
                top = len(parents)
            if rng.uniform() < 0.3:
                parents.extend([top, top])
        return canonical_parents(edges_of(tuple(parents)))
    if category == "counting":
        for _ in range(int(rng.integers(10, 21))):
            parents.append(0)
            if rng.uniform() < 0.2:
                parents.append(len(parents))
        return canonical_parents(edges_of(tuple(parents)))
    raise ValueError(f"unknown hard category {category!r}; expected one of {HARD_CATEGORIES}")


def fits(parents: Parents, category: str, size: int) -> bool:
    """Whether the tree's least layout fits in the image at all."""
    pen, style = Pen.for_size(size), dict(STYLES[category])
    style["leaf"] *= pen.width
    children = children_map(edges_of(parents))
    if not children:
        return True
    need = _pack_radius([_needed_radius(c, children, style, pen) for c in children[0]], pen)
    return need <= size / 2 - pen.margin - pen.width


class CurveBenchTask:
    def __init__(self, cfg: CurveBenchConfig, task_id: str = "curvebench/easy-v0"):
        self.cfg, self.id, self.reward_range = cfg, task_id, (0.0, 1.0)
        self._check(cfg)
        self._categories = HARD_CATEGORIES if cfg.category == "hard" else (cfg.category,)

    @staticmethod
    def _check(cfg: CurveBenchConfig) -> None:
        if cfg.category not in (*CATEGORIES, "hard"):
            raise ValueError(f"task.args.category must be one of {(*CATEGORIES, 'hard')}, got {cfg.category!r}")
        if not 1 <= cfg.min_curves <= cfg.max_curves <= 8:
            raise ValueError(f"task.args needs 1 <= min_curves <= max_curves <= 8, got {cfg.min_curves}, {cfg.max_curves}")
        if not 0 <= cfg.node_count_weight <= 1 or not 0 <= cfg.format_weight < 1:
            raise ValueError("task.args.node_count_weight must be in [0, 1] and format_weight in [0, 1), got "
                             f"{cfg.node_count_weight}, {cfg.format_weight}")
        if cfg.category == "easy":
            too_big = [t for k in range(cfg.min_curves, cfg.max_curves + 1) for t in all_topologies(k)
                       if not fits(t, "easy", cfg.image_size)]
            if too_big:
                raise ValueError(f"task.args.image_size={cfg.image_size} is too small to draw {len(too_big)} of the "
                                 f"topologies with {cfg.min_curves}..{cfg.max_curves} curves (e.g. {too_big[0]}); "
                                 "use a larger image_size or fewer curves")
        elif cfg.image_size < 256:
            raise ValueError(f"task.args.image_size must be >= 256 for the hard categories, got {cfg.image_size}")

    @cached_property
    def _topologies(self) -> tuple[Parents, ...]:
        return tuple(t for k in range(self.cfg.min_curves, self.cfg.max_curves + 1) for t in all_topologies(k))

    @cached_property
    def _local(self) -> dict[str, list[LoadedExample]]:
        from mmrl.tasks.curvebench.local import load_local

        system = SYSTEM_PROMPT if self.cfg.system_prompt else None
        paths = {"train": self.cfg.train_path, "test": self.cfg.test_path}
        return {split: load_local(path, system) for split, path in paths.items() if path}

    def example_from_seed(self, seed: int) -> CurveExample:
        """The example drawn from ``seed`` (deterministic)."""
        rng = np.random.default_rng(seed)
        category = self._categories[seed % len(self._categories)]
        size = self.cfg.image_size
        if category == "easy":  # uniform over topologies: the topology is never redrawn
            parents = self._topologies[int(rng.integers(len(self._topologies)))]
        else:
            parents = hard_tree(category, rng)
            for _ in range(LAYOUT_TRIES):
                if fits(parents, category, size):
                    break
                parents = hard_tree(category, rng)
        for _ in range(LAYOUT_TRIES):
            curves = layout(parents, category, size, rng)
            if curves is not None and not layout_problem(parents, curves, Pen.for_size(size), size):
                system = SYSTEM_PROMPT if self.cfg.system_prompt else None
                return CurveExample(category, seed, parents, curves, size, system)
        raise LayoutError(f"{self.id}: no clean {category} layout at image_size={size} in {LAYOUT_TRIES} tries "
                          f"(seed {seed}); use a larger image_size")

    def sample_batch(self, split: str, n: int, rng: np.random.Generator) -> list[Any]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; {self.id} has {SPLITS}")
        if split in self._local:
            rows = self._local[split]
            return [rows[i] for i in rng.integers(0, len(rows), n).tolist()]
        low = TEST_SEED_START if split == "test" else 0
        return [self.example_from_seed(int(s)) for s in rng.integers(low, low + TEST_SEED_START, n)]

    @property
    def vision_classes(self) -> int:
        """Classes of :meth:`vision_label`: (curve count, nesting depth) pairs, both in 1..max_curves."""
        return self.cfg.max_curves ** 2

    def vision_label(self, example: Any) -> int:
        """The image's (curve count, deepest nesting) pair as one class, for vision pretraining
        (``warm_start.vision_steps``). A perception label, not the answer: with 3 curves it does
        not tell "two siblings, one holding the third" (0, 0, 1) from "one holding two" (0, 1, 1).

        >>> task = CurveBenchTask(CurveBenchConfig(image_size=112, max_curves=3))
        >>> [(task.example_from_seed(s).parents, task.vision_label(task.example_from_seed(s))) for s in (1, 4, 5, 7)]
        [((0, 0, 0), 6), ((0, 1, 1), 7), ((0, 0, 1), 7), ((0, 1, 2), 8)]
        """
        if example.category != "easy":
            raise ValueError(f"vision_label is defined for the easy category only, got {example.category!r}")
        return self.cfg.max_curves * (len(example.parents) - 1) + depth_of(example.parents) - 1

    def reference_output(self, example: Any) -> str:
        think = self.cfg.think.format(n=len(example.parents))
        return f"<think>{think}</think><answer>\n{answer_text(example.parents)}\n</answer>"

    def reward(self, example: Any, output: object) -> RewardResult:
        v = judge(output, example.parents)
        c, f = self.cfg.node_count_weight, self.cfg.format_weight
        score = (1 - f) * ((1 - c) * v.tree + c * v.node_count) + f * v.format
        components = {"tree": v.tree, "tree_unrooted": v.tree_unrooted, "node_count": v.node_count, "format": v.format}
        return RewardResult(float(score), components, v.info)

    def metrics(self, examples: Sequence[Any], outputs: Sequence[Any],
                results: Sequence[RewardResult]) -> dict[str, float]:
        """Tree-generation accuracy (rooted; overall and per category), the published unrooted
        accuracy, node-count accuracy and format rate."""
        def mean(key: str, picked: Sequence[RewardResult]) -> float:
            return float(np.mean([r.components[key] for r in picked])) if picked else math.nan

        metrics = {"tree_accuracy": mean("tree", results), "tree_accuracy_unrooted": mean("tree_unrooted", results),
                   "node_count_accuracy": mean("node_count", results), "format_rate": mean("format", results)}
        for category in sorted({e.category for e in examples}):
            picked = [r for e, r in zip(examples, results) if e.category == category]
            metrics[f"tree_accuracy/{category}"] = mean("tree", picked)
        return metrics
