"""A recipe's reward spec → a :class:`~mmrl.verifiers.base.Reward`: built-in verifiers by name, user
functions by import path (:mod:`mmrl.verifiers.user`), weighted and named."""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mmrl.core.registry import UnknownNameError, load_plugins
from mmrl.core.typed import ConfigError, build
from mmrl.verifiers.base import (ANSWER_COLUMN, VERIFIERS, BatchScorer, Component, Failure, Reward, RewardSpecError,
                                 RowValue, Verifier, describe_value, short)
from mmrl.verifiers.user import user_component

# ------------------------------------------------------------------------------------------------
# Spec → components.

RESERVED = ("weight", "name")
"""Option keys every component accepts: its weight and the name it is reported under."""


def build_reward(spec: Any, *, strict: bool = False, base_dir: Path | None = None) -> Reward:
    """The :class:`Reward` of a recipe's ``reward`` spec (see the module docstring).

    Relative file paths resolve against ``base_dir`` (the recipe's folder), then the working directory.

    >>> reward = build_reward({"exact": 0.9, "format": 0.1})
    >>> reward.names, reward.reward_range
    (('exact', 'format'), (0.0, 1.0))
    >>> batch = reward(["Capital of France?"], ["<think>easy</think><answer>Paris</answer>"], {"answer": ["paris"]})
    >>> batch.scores, batch.components
    ([1.0], {'exact': [1.0], 'format': [1.0]})
    """
    if isinstance(spec, str):
        entries: list[tuple[str, Any]] = [(spec, 1.0)]
    elif isinstance(spec, Mapping):
        entries = list(spec.items())
    else:
        raise RewardSpecError(f"reward must be a verifier name, 'file.py:function', 'package.module:function' or a "
                              f"mapping of those to weights; got {type(spec).__name__}: {describe_value(spec)}")
    if not entries:
        raise RewardSpecError("reward mapping is empty: name at least one verifier or function")
    components = []
    for key, value in entries:
        if not isinstance(key, str) or not key.strip():
            raise RewardSpecError(f"reward keys are verifier names or 'file.py:function'; got {key!r}")
        weight, options, name = split_options(key, value)
        if ":" in key:
            component = user_component(key, weight, options, name, base_dir)
        else:
            component = verifier_component(key, weight, options, name)
        components.append(component)
    seen: dict[str, str] = {}
    for component, (key, _) in zip(components, entries):
        if component.name in seen:
            raise RewardSpecError(f"reward components {seen[component.name]!r} and {key!r} are both named "
                                  f"{component.name!r}; give one another name: {{{key!r}: {{name: ...}}}}")
        seen[component.name] = key
    return Reward(components, strict=strict)


def split_options(key: str, value: Any) -> tuple[float, dict[str, Any], str | None]:
    """(weight, remaining options, explicit name) of one spec entry."""
    if isinstance(value, Mapping):
        options = dict(value)
        weight = options.pop("weight", 1.0)
        name = options.pop("name", None)
        if name is not None and (not isinstance(name, str) or not name.strip() or "/" in name):
            raise RewardSpecError(f"reward {key!r}: name must be a non-empty string without '/', got {name!r}")
    else:
        options, weight, name = {}, value, None
    if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(float(weight)):
        raise RewardSpecError(f"reward {key!r}: the weight must be a finite number (or a mapping with 'weight' "
                              f"and options), got {describe_value(weight)}")
    return float(weight), options, name


def verifier_component(key: str, weight: float, options: dict[str, Any], name: str | None) -> Component:
    """A component of a registered verifier, its options checked now."""
    verifier = lookup_verifier(key)
    column = options.pop("column", ANSWER_COLUMN)
    if "column" in options or not isinstance(column, str):
        raise RewardSpecError(f"reward {key!r}: column must be a dataset column name, got {column!r}")
    if not verifier.uses_answer and column != ANSWER_COLUMN:
        raise RewardSpecError(f"reward {key!r}: verifier {key!r} reads no reference answer, so it takes no 'column'")
    if "range" in options:
        raise RewardSpecError(f"reward {key!r}: a built-in verifier's range is fixed ({verifier.reward_range}); "
                              f"'range' is for user functions")
    checked = check_options(verifier, options, key)
    columns = (column,) if verifier.uses_answer else ()
    if verifier.batched:
        score = batched_scorer(verifier, checked, key, column)
    else:
        score = row_scorer(verifier, checked, column)
    return Component(name or key, weight, verifier.reward_range, score, columns)


def lookup_verifier(key: str) -> Verifier:
    if key not in VERIFIERS:
        load_plugins()  # packages register their verifiers through the mmrl.plugins entry points
    try:
        return VERIFIERS.get(key)
    except UnknownNameError as err:
        raise RewardSpecError(f"{err}. (User functions are written 'file.py:function' or "
                              f"'package.module:function'.)") from None


def check_options(verifier: Verifier, options: dict[str, Any], key: str) -> dict[str, Any]:
    """Options coerced to the verifier's annotated keyword types; unknown / mistyped ones are spec errors.

    A row verifier is then called once on an empty completion, so that it can reject invalid values
    (a negative tolerance, an empty tag) now rather than on every row.
    """
    params = [p for p in inspect.signature(verifier.fn).parameters.values() if p.kind == p.KEYWORD_ONLY]
    hints = typing.get_type_hints(verifier.fn)
    required = [(p.name, hints.get(p.name, Any)) for p in params if p.default is p.empty]
    optional = [(p.name, hints.get(p.name, Any), dataclasses.field(default=p.default))
                for p in params if p.default is not p.empty]
    fields = required + optional  # a dataclass lists fields without defaults first
    options_type = dataclasses.make_dataclass(f"{key}_options", fields, frozen=True)
    try:
        checked = build(options_type, options, f"reward.{key}")
    except ConfigError as err:
        raise RewardSpecError(str(err)) from None
    values = {f.name: getattr(checked, f.name) for f in dataclasses.fields(checked)}
    given = {k: v for k, v in values.items() if k in options}
    if not verifier.batched:
        try:
            verifier.fn("", None, **given)
        except ValueError as err:
            raise RewardSpecError(f"reward.{key}: {err}") from None
    return given


def row_scorer(verifier: Verifier, options: dict[str, Any], column: str) -> BatchScorer:
    """Score each row with the verifier; an exception (a bug: verifiers are total) fails that row only."""
    from_rows = [c for c in verifier.row_columns if c not in options]

    def score(prompts: Sequence[Any], completions: Sequence[Any], columns: Mapping[str, Sequence[Any]]) -> list:
        answers = columns[column] if verifier.uses_answer else [None] * len(completions)
        extra = {c: columns[c] for c in from_rows if c in columns}
        rows: list[RowValue] = []
        for row, (completion, answer) in enumerate(zip(completions, answers)):
            try:
                rows.append(verifier.fn(completion, answer, **options, **{c: v[row] for c, v in extra.items()}))
            except Exception as err:  # noqa: BLE001
                rows.append(Failure(f"raised {type(err).__name__}: {short(err)}", err))
        return rows

    return score


def batched_scorer(verifier: Verifier, options: dict[str, Any], key: str, column: str) -> BatchScorer:
    """Load the batched verifier now (a loading error is a spec error) and score whole batches with it."""
    try:
        scorer = verifier.fn(**options)
    except Exception as err:  # noqa: BLE001 — any failure to load a model folder is a fault of the spec
        raise RewardSpecError(f"reward.{key}: {short(err, 400)}") from err

    def score(prompts: Sequence[Any], completions: Sequence[Any], columns: Mapping[str, Sequence[Any]]) -> list:
        answers = columns[column] if verifier.uses_answer else [None] * len(completions)
        return scorer(list(prompts), list(completions), list(answers))

    return score
