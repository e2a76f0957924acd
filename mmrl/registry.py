"""Explicit, versioned registries with "did you mean" errors.

Everything a recipe names by string (tasks, policies, advantage estimators, losses, ...) lives in a
:class:`Registry`. Registration is explicit (a decorator or a call at import of the defining
module); nothing is discovered by import-time magic.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """Raised for a name that no registry entry has; the message lists close matches."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly
        return str(self.args[0])


class Registry(Generic[T]):
    """A name → object table for one kind of component (``kind`` is used in error messages)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, obj: T | None = None) -> Callable[[T], T] | T:
        """Register ``obj`` under ``name``; usable as ``@registry.register("name")``."""

        def add(item: T) -> T:
            if name in self._entries and self._entries[name] is not item:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = item
            return item

        return add if obj is None else add(obj)

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(self._unknown_message(name)) from None

    def _unknown_message(self, name: str) -> str:
        close = difflib.get_close_matches(name, self._entries, n=3, cutoff=0.5)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        known = ", ".join(sorted(self._entries)) or "(none registered)"
        return f"unknown {self.kind} {name!r}.{hint} Registered: {known}"

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)


# ------------------------------------------------------------------------------------------------
# Tasks and policies: the components a recipe names.

TASK_ID = re.compile(r"^[a-z0-9_]+/[a-z0-9_.\-]+-v\d+$")


@dataclass(frozen=True)
class ComponentSpec:
    """How to build a registered component: ``factory(config)`` with ``config`` an instance of
    the ``config`` dataclass (its fields are the recipe's ``args``)."""

    factory: Callable[[Any], Any]
    config: type


TASKS: Registry[ComponentSpec] = Registry("task")
POLICIES: Registry[ComponentSpec] = Registry("policy")


def register_task(task_id: str, factory: Callable[[Any], Any], config: type) -> None:
    """Register a task under a versioned id ``family/name-vK`` (bump K when the reward changes)."""
    if not TASK_ID.match(task_id):
        raise ValueError(f"task id {task_id!r} must look like 'family/name-v0'")
    TASKS.register(task_id, ComponentSpec(factory, config))


def register_policy(name: str, factory: Callable[[Any], Any], config: type) -> None:
    POLICIES.register(name, ComponentSpec(factory, config))


def load_builtins() -> None:
    """Import the packages whose modules register the built-in tasks, envs and policies."""
    import mmrl.envs  # noqa: F401
    import mmrl.policies  # noqa: F401
    import mmrl.tasks  # noqa: F401


def make_task(task_id: str, args: Any = None) -> Any:
    """Build a registered task; ``args`` is its config dataclass or a mapping of its fields."""
    load_builtins()
    spec = TASKS.get(task_id)
    return spec.factory(_as_config(spec.config, args, "task.args"))


def make_policy(name: str, args: Any = None) -> Any:
    load_builtins()
    spec = POLICIES.get(name)
    return spec.factory(_as_config(spec.config, args, "policy.args"))


def _as_config(config_cls: type, args: Any, path: str) -> Any:
    if isinstance(args, config_cls):
        return args
    from mmrl.config import build

    return build(config_cls, args or {}, path)
