"""Per-prompt history across steps: success / failure pseudo-counts per training prompt.

Used by estimators that declare the ``"prompt_history"`` need (MSSR's per-prompt Beta posterior,
``beta_posterior`` with ``count_history``). The trainer reads the counts *before* a step's update
(so a prompt's own rollouts never enter its baseline twice) and adds the step's outcomes after.

Key contract: an example is keyed by :func:`prompt_key`, which requires a frozen dataclass whose
compared fields are plain values (str, int, float, bool, None, tuples of them, or frozen dataclasses keyed the
same way, e.g. vlm_sanity's tuple of shapes); fields declared with
``compare=False`` (images, raw data riding along) are not part of the example's identity, nor of its key. The key is a digest of
its type name and fields, stable across processes and runs (Python's ``hash`` of a str is not),
so the history survives a checkpoint / ``--resume``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

PLAIN = (str, int, float, bool, type(None))


def _frozen_dataclass(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type) and type(value).__dataclass_params__.frozen


class _Unkeyable(TypeError):
    """A compared field holds a value with no stable identity (an image, an array, ...)."""


def _key_value(value: Any) -> Any:
    """The JSON identity of a compared field's value: plain values as they are, tuples as lists, frozen
    dataclasses as [type name, their compared fields]."""
    if isinstance(value, PLAIN):
        return value
    if isinstance(value, tuple):
        return [_key_value(v) for v in value]
    if _frozen_dataclass(value):
        return [type(value).__qualname__,
                {f.name: _key_value(getattr(value, f.name)) for f in dataclasses.fields(value) if f.compare}]
    raise _Unkeyable(type(value).__name__)


def prompt_key(example: Any) -> str:
    """A stable digest identifying ``example`` (see the key contract above)."""
    if not _frozen_dataclass(example):
        raise TypeError(f"per-prompt history needs examples that are frozen dataclasses, got "
                        f"{type(example).__name__}; make the task's example a @dataclass(frozen=True)")
    values = {}
    for f in dataclasses.fields(example):
        if not f.compare:
            continue
        try:
            values[f.name] = _key_value(getattr(example, f.name))
        except _Unkeyable as err:
            raise TypeError(f"per-prompt history keys examples by their plain fields; {type(example).__name__}."
                            f"{f.name} holds a {err}. Add an id field (str/int) to the example and keep large "
                            f"data (images, arrays) out of the key (a field with compare=False)") from None
    text = json.dumps([type(example).__qualname__, values], sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:20]


class PromptHistory:
    """Success / failure pseudo-counts per prompt key (a soft score r adds r and 1 − r)."""

    def __init__(self) -> None:
        self.counts: dict[str, list[float]] = {}

    def __len__(self) -> int:
        return len(self.counts)

    def lookup(self, keys: Sequence[str]) -> tuple[Tensor, Tensor]:
        """([N] successes, [N] failures) of the rows' prompts (0 for unseen ones)."""
        pairs = [self.counts.get(k, (0.0, 0.0)) for k in keys]
        successes = torch.tensor([p[0] for p in pairs], dtype=torch.float32)
        failures = torch.tensor([p[1] for p in pairs], dtype=torch.float32)
        return successes, failures

    def update(self, keys: Sequence[str], outcome: Sequence[float]) -> None:
        """Add each row's outcome (in [0, 1]) to its prompt's counts."""
        if len(keys) != len(outcome):
            raise ValueError(f"{len(keys)} keys for {len(outcome)} outcomes")
        for key, r in zip(keys, outcome):
            entry = self.counts.setdefault(key, [0.0, 0.0])
            entry[0] += r
            entry[1] += 1.0 - r

    def state_dict(self) -> dict[str, list[float]]:
        return {k: list(v) for k, v in self.counts.items()}

    def load_state_dict(self, state: dict[str, list[float]]) -> None:
        self.counts = {k: [float(v[0]), float(v[1])] for k, v in state.items()}
