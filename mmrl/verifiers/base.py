"""Rewards built from a recipe spec: registered verifiers and user functions, combined with weights.

``build_reward(spec)`` turns a recipe's ``reward`` value into a :class:`Reward`:

- ``"math"``: one registered verifier (:data:`VERIFIERS`), weight 1;
- ``"path/to/file.py:fn"`` or ``"package.module:fn"``: one user function (:mod:`mmrl.verifiers.user`);
- ``{"math": 0.9, "format": 0.1}``: a weighted sum; a value is a weight or a mapping with an optional
  ``weight`` (default 1.0) and the component's options.

Every mistake in the spec raises :class:`RewardSpecError` while building, before any training.
Calling the reward on a batch never raises for bad *model output*: a component that fails on a row
scores 0 there and ``RewardBatch.errors[row]`` says why (``strict=True`` raises :class:`RewardError`).
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mmrl.core.registry import Registry

log = logging.getLogger("mmrl.verifiers")

ANSWER_COLUMN = "answer"
"""The dataset column a verifier compares against unless its options name another (``column``)."""
DEFAULT_RANGE = (0.0, 1.0)


class RewardSpecError(ValueError):
    """A reward spec that cannot be built (unknown verifier, missing file or function, bad option)."""


class RewardError(RuntimeError):
    """A reward component failed on a row while ``strict=True`` (the message names both)."""


@dataclass(frozen=True)
class Failure:
    """A component's failure on one row: ``reason`` for ``RewardBatch.errors``, the exception if one was raised."""

    reason: str
    exception: BaseException | None = None


RowValue = Any
"""What a component yields for a row before checking: a number, None (not applicable), a mapping of
sub-scores (per-example user functions), a :class:`Failure`, or anything else (then a failure)."""
BatchScorer = Callable[[Sequence[Any], Sequence[Any], Mapping[str, Sequence[Any]]], list[RowValue]]


@dataclass(frozen=True)
class Verifier:
    """A registered verifier.

    - row verifier (``batched=False``): ``fn(completion, answer, **options) -> float`` in ``reward_range``,
      pure and total in ``completion`` and ``answer``; it raises ValueError only for invalid options (which
      :func:`build_reward` detects by calling it once on an empty completion).
    - batched verifier (``batched=True``): ``fn(**options)`` loads what it needs (a model) and returns
      ``scorer(prompts, completions, answers) -> list[float]``; errors while loading are spec errors.

    ``uses_answer``: reads the reference column (``answer`` unless the options set ``column``).
    ``row_columns``: options that, when the recipe leaves them unset, take the row's value of the dataset
    column of the same name (``choice`` reads its options from a ``choices`` column).
    """

    name: str
    fn: Callable[..., Any]
    reward_range: tuple[float, float] = DEFAULT_RANGE
    uses_answer: bool = True
    row_columns: tuple[str, ...] = ()
    batched: bool = False


VERIFIERS: Registry[Verifier] = Registry("verifier")
"""Verifiers by name. The built-ins register when :mod:`mmrl.verifiers` is imported; other packages
register theirs in a module named by an ``mmrl.plugins`` entry point, loaded on the first unknown name."""


def register_verifier(name: str, fn: Callable[..., Any] | None = None, *,
                      reward_range: tuple[float, float] = DEFAULT_RANGE, uses_answer: bool = True,
                      row_columns: tuple[str, ...] = (), batched: bool = False) -> Any:
    """Register ``fn`` as verifier ``name`` (see :class:`Verifier`); usable as ``@register_verifier("name")``."""

    def add(item: Callable[..., Any]) -> Callable[..., Any]:
        VERIFIERS.register(name, Verifier(name, item, reward_range, uses_answer, tuple(row_columns), batched))
        return item

    return add if fn is None else add(fn)


@dataclass(frozen=True)
class Component:
    """One weighted term of a :class:`Reward`: ``score`` maps a batch to one raw value per row."""

    name: str
    weight: float
    reward_range: tuple[float, float]
    score: BatchScorer
    columns: tuple[str, ...]
    """Dataset columns this component cannot do without."""
    allows_mapping: bool = False
    """Rows may be mappings of sub-scores (per-example user functions): their sum is the score."""


@dataclass(frozen=True)
class RewardBatch:
    """Scores of one batch: the weighted total, each component, and why a component failed on a row."""

    scores: list[float]
    """Σ weight·component per row; always finite."""
    components: dict[str, list[float]]
    """Per component (and ``name/key`` for the sub-scores of mapping-valued user functions), per row."""
    errors: list[str | None]
    """Per row: None, or ``"<component>: <reason>"`` for each component that failed there (joined by "; ")."""


class Reward:
    """A weighted sum of components, called on a batch: ``reward(prompts, completions, columns)``.

    ``columns`` holds every dataset column by name with one entry per row (the reference answer is
    ``columns["answer"]``). ``names`` / ``weights`` are the components in spec order; ``reward_range`` is
    the range of the total; ``required_columns`` are the columns the components cannot do without.
    """

    def __init__(self, components: Sequence[Component], strict: bool = False):
        if not components:
            raise RewardSpecError("a reward needs at least one component")
        self.components = tuple(components)
        self.strict = strict
        self.names = tuple(c.name for c in components)
        self.weights = tuple(c.weight for c in components)
        self.reward_range = weighted_range(components)
        self.required_columns = tuple(dict.fromkeys(col for c in components for col in c.columns))
        self._warned: set[str] = set()

    def __repr__(self) -> str:
        terms = " + ".join(f"{w:g}·{n}" for n, w in zip(self.names, self.weights))
        return f"Reward({terms}, range={self.reward_range})"

    def check_columns(self, available: Collection[str]) -> None:
        """Raise RewardSpecError naming the first component whose column is not in ``available``."""
        for component in self.components:
            missing = [col for col in component.columns if col not in available]
            if missing:
                raise RewardSpecError(f"reward component {component.name!r} needs dataset column {missing[0]!r}; "
                                      f"columns are: {', '.join(sorted(available)) or '(none)'}")

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any],
                 columns: Mapping[str, Sequence[Any]]) -> RewardBatch:
        n = len(completions)
        if len(prompts) != n:
            raise ValueError(f"{len(prompts)} prompts but {n} completions")
        for name, values in columns.items():
            if len(values) != n:
                raise ValueError(f"column {name!r} has {len(values)} entries for {n} completions")
        self.check_columns(columns)
        totals = [0.0] * n
        components: dict[str, list[float]] = {}
        errors: list[list[str]] = [[] for _ in range(n)]
        for component in self.components:
            raw = self._run(component, prompts, completions, columns)
            values, subscores = self._check_rows(component, raw, n, errors)
            components[component.name] = values
            for key, row_values in subscores.items():
                components[f"{component.name}/{key}"] = row_values
            for row, value in enumerate(values):
                totals[row] += component.weight * value
        scores = [t if math.isfinite(t) else 0.0 for t in totals]
        return RewardBatch(scores, components, ["; ".join(e) if e else None for e in errors])

    def _run(self, component: Component, prompts: Sequence[Any], completions: Sequence[Any],
             columns: Mapping[str, Sequence[Any]]) -> list[RowValue]:
        """The component's raw row values; a batch-level failure becomes the same failure on every row."""
        try:
            raw = component.score(prompts, completions, columns)
        except Exception as err:  # noqa: BLE001 — a user function's bug is a zero with a reason, not a crash
            failure = Failure(f"raised {type(err).__name__}: {short(err)}", err)
            return [failure] * len(completions)
        if isinstance(raw, (str, bytes, Mapping)) or not isinstance(raw, Sequence) and not hasattr(raw, "tolist"):
            return [Failure(f"returned {type(raw).__name__}, expected a list of {len(completions)} numbers")] \
                * len(completions)
        rows = list(raw.tolist() if hasattr(raw, "tolist") else raw)
        if len(rows) != len(completions):
            return [Failure(f"returned {len(rows)} values for {len(completions)} completions")] * len(completions)
        return rows

    def _check_rows(self, component: Component, raw: list[RowValue], n: int,
                    errors: list[list[str]]) -> tuple[list[float], dict[str, list[float]]]:
        """Clip numbers into the component's range; None → 0 (not applicable); anything else → 0 + error."""
        low, high = component.reward_range
        values = [0.0] * n
        subscores: dict[str, list[float]] = {}
        for row, value in enumerate(raw):
            if isinstance(value, Mapping) and component.allows_mapping:
                value = sum_subscores(value, row, n, subscores)
            if value is None:
                continue
            number = as_number(value)
            if number is None:
                failure = value if isinstance(value, Failure) else Failure(describe_bad_value(value))
                self._fail(component, row, failure)
                errors[row].append(f"{component.name}: {failure.reason}")
                continue
            values[row] = min(max(number, low), high)
        return values, subscores

    def _fail(self, component: Component, row: int, failure: Failure) -> None:
        message = f"reward component {component.name!r} failed on row {row}: {failure.reason}"
        if self.strict:
            raise RewardError(message) from failure.exception
        if component.name not in self._warned:
            self._warned.add(component.name)
            log.warning("%s (scored 0; later failures of this component are only counted in errors)", message,
                        exc_info=failure.exception)


def weighted_range(components: Sequence[Component]) -> tuple[float, float]:
    """Range of Σ wᵢ·sᵢ when each sᵢ spans its component's range (a negative weight flips it)."""
    low = sum(min(c.weight * c.reward_range[0], c.weight * c.reward_range[1]) for c in components)
    high = sum(max(c.weight * c.reward_range[0], c.weight * c.reward_range[1]) for c in components)
    return float(low), float(high)


def as_number(value: object) -> float | None:
    """A finite float for a real number (bools included: True is 1), else None."""
    if not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except (OverflowError, ValueError, TypeError):
        return None
    return number if math.isfinite(number) else None


def sum_subscores(value: Mapping, row: int, n: int, subscores: dict[str, list[float]]) -> object:
    """Record a mapping's sub-scores for ``row`` and return their sum, or a Failure naming the bad entry."""
    total = 0.0
    for key, sub in value.items():
        number = as_number(sub)
        if number is None or not isinstance(key, str):
            return Failure(f"returned a mapping whose entry {key!r} is {describe_value(sub)}, not a finite number")
        subscores.setdefault(key, [0.0] * n)[row] = number
        total += number
    return total


def describe_value(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{type(value).__name__} {text[:37]}..."


def describe_bad_value(value: object) -> str:
    if isinstance(value, numbers.Real):
        return f"returned {describe_value(value)}, not a finite number"
    return f"returned {describe_value(value)}, expected a number or None"


def short(err: BaseException, limit: int = 200) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    return text if len(text) <= limit else text[:limit] + "..."
