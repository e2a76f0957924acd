"""``data/mixture-v0`` (recipe name ``mixture``): several registered tasks sampled with weights.

    task:
      name: mixture
      args:
        sources:
          - {name: arith, task: data/rows-v0, args: {train_files: a.jsonl, test_size: 0.2}, weight: 0.7}
          - {name: reverse, task: sanity/reverse-v0, weight: 0.3}

Each example of a batch picks its source with probability ∝ ``weight`` (from the trainer's generator)
and remembers it (:class:`SourcedExample`); the reward, the reference output and the metrics go to that
source's task. Held-out metrics are reported per source (``eval/<name>/reward_mean``,
``eval/<name>/<metric>``) beside the overall ``eval/reward_mean`` the trainer computes.

All sources must suit one kind of policy: all VLM prompts (:class:`~mmrl.core.contracts.VisualPrompt`,
``policy: vlm``) or all text prompts (``prompt: str`` and no images, ``policy: causal_lm``); data rows
without images suit both. Building the mixture checks this on a few examples of each source.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from mmrl.core.contracts import RewardResult, VisualPrompt
from mmrl.core.registry import UnknownNameError, make_task
from mmrl.core.typed import ConfigError

TASK_ID = "data/mixture-v0"
SOURCE_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
PROBE_EXAMPLES = 4
"""Training examples of each source drawn (seed 0) to check which policies can take them."""
POLICY_KINDS = {"vlm": "VLM prompts (policy: vlm)", "text": "text prompts (policy: causal_lm)"}


@dataclass(frozen=True)
class SourceConfig:
    name: str
    """The source's name in metrics (``eval/<name>/...``); letters, digits, ``_.-``."""
    task: str
    """A registered task id (``data/rows-v0``, ``vlm_sanity/shape_color-v0``, ...)."""
    args: dict = field(default_factory=dict)
    """The task's arguments, as ``task.args`` of a recipe."""
    weight: float = 1.0
    """Sampling weight (> 0); probabilities are the weights over their sum."""


@dataclass(frozen=True)
class MixtureConfig:
    sources: tuple[SourceConfig, ...]
    """The tasks mixed, with their sampling weights."""


@runtime_checkable
class TextPrompt(Protocol):
    """What a text policy (``causal_lm``) reads from an example."""

    prompt: str


@dataclass(frozen=True)
class SourcedExample:
    """A source's example and the source's name; exposes the example's prompt, images and system."""

    source: str
    example: Any

    @property
    def prompt(self) -> str:
        return self.example.prompt

    @property
    def images(self) -> tuple[Any, ...]:
        return tuple(self.example.images) if isinstance(self.example, VisualPrompt) else ()

    @property
    def system(self) -> str | None:
        return self.example.system if isinstance(self.example, VisualPrompt) else None


def policy_kinds(examples: Sequence[Any]) -> set[str]:
    """The policy kinds (:data:`POLICY_KINDS`) that can take every one of ``examples``."""
    kinds = set(POLICY_KINDS)
    for ex in examples:
        visual = isinstance(ex, VisualPrompt)
        if not visual:
            kinds.discard("vlm")
        if not isinstance(ex, TextPrompt) or (visual and len(tuple(ex.images)) > 0):
            kinds.discard("text")
    return kinds


def child_verdicts(task: Any, examples: Sequence[Any], outputs: Sequence[Any]) -> list[RewardResult]:
    """A child task's verdicts, batched when it defines ``reward_batch`` (as the trainer asks it)."""
    batched = getattr(task, "reward_batch", None)
    if batched is not None:
        return list(batched(examples, outputs))
    return [task.reward(ex, out) for ex, out in zip(examples, outputs)]


class MixtureTask:
    """Weighted sources (see the module docstring)."""

    def __init__(self, cfg: MixtureConfig):
        self.cfg = cfg
        self.id = TASK_ID
        check_sources(cfg.sources)
        self.names = [s.name for s in cfg.sources]
        self.children = {s.name: build_child(k, s) for k, s in enumerate(cfg.sources)}
        weights = np.array([s.weight for s in cfg.sources], dtype=np.float64)
        self.probabilities = weights / weights.sum()
        lows, highs = zip(*(child.reward_range for child in self.children.values()))
        self.reward_range = (float(min(lows)), float(max(highs)))
        self.policy_kinds = check_policy_kinds(self.children)

    def sample_batch(self, split: str, n: int, rng: np.random.Generator) -> list[SourcedExample]:
        """Each of ``n`` examples picks a source with probability ∝ weight; each source then draws its
        share with its own generator seeded from ``rng`` (so a source's draws do not depend on the others')."""
        picks = rng.choice(len(self.names), size=n, p=self.probabilities)
        seeds = rng.integers(2 ** 63, size=len(self.names))
        batch: list[SourcedExample | None] = [None] * n
        for k, name in enumerate(self.names):
            slots = np.flatnonzero(picks == k)
            if len(slots):
                drawn = self.children[name].sample_batch(split, len(slots), np.random.default_rng(seeds[k]))
                for slot, example in zip(slots.tolist(), drawn):
                    batch[slot] = SourcedExample(name, example)
        return batch  # type: ignore[return-value]  # every slot is filled: picks covers 0..n-1

    def reward(self, example: SourcedExample, output: Any) -> RewardResult:
        return self.children[example.source].reward(example.example, output)

    def reward_batch(self, examples: Sequence[SourcedExample], outputs: Sequence[Any]) -> list[RewardResult]:
        """One call per source over its rows (batched where the source's task is)."""
        results: list[RewardResult | None] = [None] * len(outputs)
        for name in self.names:
            rows = [i for i, ex in enumerate(examples) if ex.source == name]
            if rows:
                verdicts = child_verdicts(self.children[name], [examples[i].example for i in rows],
                                          [outputs[i] for i in rows])
                for i, verdict in zip(rows, verdicts):
                    results[i] = verdict
        return results  # type: ignore[return-value]

    def metrics(self, examples: Sequence[SourcedExample], outputs: Sequence[Any],
                results: Sequence[RewardResult]) -> dict[str, float]:
        """Per source present: ``<name>/reward_mean``, ``<name>/share`` and the source task's metrics as
        ``<name>/<metric>``."""
        metrics: dict[str, float] = {}
        for name in self.names:
            rows = [i for i, ex in enumerate(examples) if ex.source == name]
            if not rows:
                continue
            picked = [results[i] for i in rows]
            metrics[f"{name}/reward_mean"] = float(np.mean([r.score for r in picked]))
            metrics[f"{name}/share"] = len(rows) / len(examples)
            own = self.children[name].metrics([examples[i].example for i in rows], [outputs[i] for i in rows], picked)
            metrics |= {f"{name}/{key}": value for key, value in own.items()}
        return metrics

    def reference_output(self, example: SourcedExample) -> Any:
        return self.children[example.source].reference_output(example.example)


def check_sources(sources: Sequence[SourceConfig]) -> None:
    if not sources:
        raise ConfigError("task.args.sources is empty: list the tasks to mix ({name, task, args, weight} each)")
    seen: set[str] = set()
    for k, s in enumerate(sources):
        if not SOURCE_NAME.match(s.name):
            raise ConfigError(f"task.args.sources[{k}].name {s.name!r} must be letters, digits, '_', '.' or '-' "
                              f"(it names metrics: eval/<name>/...)")
        if s.name in seen:
            raise ConfigError(f"task.args.sources[{k}].name {s.name!r} is used twice; source names must differ")
        seen.add(s.name)
        if not (math.isfinite(s.weight) and s.weight > 0):
            raise ConfigError(f"task.args.sources[{k}].weight must be a positive number, got {s.weight}")


def build_child(k: int, source: SourceConfig) -> Any:
    """The source's task; its errors say which source they are about."""
    where = f"task.args.sources[{k}] ({source.name})"
    try:
        return make_task(source.task, source.args)
    except UnknownNameError as err:
        raise UnknownNameError(f"{where}.task: {err}") from None
    except ConfigError as err:
        raise type(err)(f"{where}: {err}") from None


def check_policy_kinds(children: dict[str, Any]) -> set[str]:
    """The policy kinds every source suits; a ConfigError when the sources need different policies."""
    kinds = {name: policy_kinds(child.sample_batch("train", PROBE_EXAMPLES, np.random.default_rng(0)))
             for name, child in children.items()}
    common = set.intersection(*kinds.values())
    if not common:
        described = "; ".join(f"{name!r} suits " + (" or ".join(POLICY_KINDS[k] for k in sorted(ks)) or
                                                      "neither text nor VLM policies")
                              for name, ks in kinds.items())
        raise ConfigError(f"task.args.sources need one kind of policy, but {described}. Mix only VLM tasks "
                          f"or only text tasks")
    return common
