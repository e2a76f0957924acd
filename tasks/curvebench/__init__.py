"""CurveBench (arXiv 2605.14068): the rooted containment tree of nested closed curves (issue 4).

Ids: ``curvebench/easy-v0``, ``curvebench/hard-v0`` (the four hard categories in turn) and one per
hard category: ``curvebench/polygon-v0``, ``curvebench/topographic-v0``, ``curvebench/maze-v0``,
``curvebench/counting-v0``. Their ``category`` argument is fixed by the id.
"""

from __future__ import annotations

import dataclasses

from mmrl.core.registry import register_task
from mmrl.tasks.curvebench.curves import CATEGORIES, extract_tree
from mmrl.tasks.curvebench.task import CurveBenchConfig, CurveBenchTask, CurveExample, LoadedExample
from mmrl.tasks.curvebench.trees import judge, parse_answer, rooted_canonical, unrooted_isomorphic


def _factory(category: str):
    task_id = f"curvebench/{category}-v0"

    def make(cfg: CurveBenchConfig) -> CurveBenchTask:
        if cfg.category not in ("easy", category):  # "easy" is the dataclass default
            raise ValueError(f"{task_id} fixes task.args.category to {category!r}, got {cfg.category!r}")
        return CurveBenchTask(dataclasses.replace(cfg, category=category), task_id)

    return task_id, make


for _category in (*CATEGORIES, "hard"):
    register_task(*_factory(_category), CurveBenchConfig)

__all__ = ["CurveBenchConfig", "CurveBenchTask", "CurveExample", "LoadedExample", "extract_tree", "judge",
           "parse_answer", "rooted_canonical", "unrooted_isomorphic"]
