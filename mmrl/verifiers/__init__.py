"""Temporary minimal verifiers: the ``exact`` verifier and user functions, behind the package's API.

Replaced by the full verifier package (math, choice, number, iou, json_f1, format, model-based); only
the API the data tasks call is kept: :func:`build_reward` → :class:`Reward` → :class:`RewardBatch`.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_CHARS = 16_384
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


class RewardSpecError(ValueError):
    """A reward spec that cannot be built (unknown verifier, missing file or function)."""


@dataclass
class RewardBatch:
    scores: list[float]
    components: dict[str, list[float]]
    errors: list[str | None]


def extract_answer(text: str) -> str:
    """The last ``<answer>…</answer>`` block, else the last ``\\boxed{…}``, else the text."""
    text = text[:MAX_CHARS]
    end = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, end) if end >= 0 else -1
    if start >= 0:
        return text[start + len("<answer>"):end]
    boxed = BOXED.findall(text)
    return boxed[-1] if boxed else text


def _normalise(value: Any) -> str:
    return " ".join(str(value).lower().split()).strip(" .,;:!?")


def exact(completions: list[str], answer: list[Any], **_: Any) -> list[float]:
    """1.0 when the extracted answer equals the reference (case, whitespace and end punctuation aside)."""
    return [float(isinstance(c, str) and a is not None and _normalise(extract_answer(c)) == _normalise(a))
            for c, a in zip(completions, answer)]


BUILT_IN: dict[str, Callable[..., list[float]]] = {"exact": lambda prompts, completions, **cols: exact(completions, **cols)}


def _load_function(spec: str, base_dir: Path | None) -> Callable[..., Any]:
    target, _, name = spec.rpartition(":")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_absolute() and base_dir is not None and (base_dir / path).is_file():
            path = base_dir / path
        if not path.is_file():
            raise RewardSpecError(f"reward {spec!r}: no file {target}")
        module_spec = importlib.util.spec_from_file_location(f"mmrl_user_reward_{abs(hash(str(path)))}", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as err:
            raise RewardSpecError(f"reward {spec!r}: cannot import {target}: {err}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise RewardSpecError(f"reward {spec!r}: {target} has no function {name!r}")
    return fn


class Reward:
    """Weighted sum of named components; each component is a TRL-style batched function."""

    def __init__(self, functions: dict[str, Callable[..., Any]], weights: dict[str, float], strict: bool):
        self.names = tuple(functions)
        self.weights = tuple(weights[n] for n in self.names)
        self.reward_range = (sum(min(w, 0.0) for w in self.weights), sum(max(w, 0.0) for w in self.weights))
        self._functions, self._strict = functions, strict

    def __call__(self, prompts: list[str], completions: list[str], columns: dict[str, list]) -> RewardBatch:
        n = len(completions)
        components: dict[str, list[float]] = {}
        errors: list[str | None] = [None] * n
        for name, fn in self._functions.items():
            try:
                values = list(fn(prompts, completions, **columns))
                if len(values) != n:
                    raise ValueError(f"returned {len(values)} values for {n} completions")
            except Exception as err:
                if self._strict:
                    raise
                values = [0.0] * n
                errors = [e or f"{name}: {err}" for e in errors]
            clean = []
            for i, v in enumerate(values):
                ok = isinstance(v, (int, float)) and math.isfinite(v)
                if v is not None and not ok:
                    errors[i] = errors[i] or f"{name}: not a finite number ({v!r})"
                clean.append(min(max(float(v), 0.0), 1.0) if ok else 0.0)
            components[name] = clean
        scores = [sum(w * components[name][i] for name, w in zip(self.names, self.weights)) for i in range(n)]
        return RewardBatch(scores, components, errors)


def build_reward(spec: str | Mapping[str, Any], *, strict: bool = False, base_dir: Path | None = None) -> Reward:
    """A :class:`Reward` from ``"exact"``, ``"file.py:fn"``, ``"pkg.mod:fn"`` or ``{name: weight}``."""
    items = {spec: 1.0} if isinstance(spec, str) else dict(spec)
    functions, weights = {}, {}
    for key, weight in items.items():
        if isinstance(weight, Mapping):
            weight = weight.get("weight", 1.0)
        if key in BUILT_IN:
            functions[key] = BUILT_IN[key]
        elif ":" in key:
            functions[key.rpartition(":")[2]] = _load_function(key, base_dir)
        else:
            raise RewardSpecError(f"unknown verifier {key!r}; known: {', '.join(BUILT_IN)} or 'file.py:function'")
        weights[list(functions)[-1]] = float(weight)
    return Reward(functions, weights, strict)


__all__ = ["Reward", "RewardBatch", "RewardSpecError", "build_reward"]
