"""Explicit, versioned registries with "did you mean" errors.

Everything a recipe names by string (tasks, policies, advantage estimators, losses, ...) lives in a
:class:`Registry`. Registration is explicit (a decorator or a call at import of the defining
module); the modules that register come from one entry-point group (:data:`PLUGIN_GROUP`), loaded
once, the first time a component is made or listed.
"""

from __future__ import annotations

import difflib
import importlib.metadata
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

    def entries(self) -> list[tuple[str, T]]:
        """(name, entry) pairs in registration order."""
        return list(self._entries.items())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)


# ------------------------------------------------------------------------------------------------
# Tasks and policies: the components a recipe names.

TASK_ID = re.compile(r"^[a-z0-9_]+/[a-z0-9_.\-]+-v\d+$")
TASK_ALIAS = re.compile(r"^[a-z0-9_]+$")


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


def register_task_alias(alias: str, task_id: str) -> None:
    """A short literal recipe name (``mixture``) for a registered versioned task (``data/mixture-v0``): the
    same entry under a second key, so ``task: mixture`` builds the versioned task."""
    if not TASK_ALIAS.match(alias):
        raise ValueError(f"task alias {alias!r} must be one lower-case word (letters, digits, '_')")
    TASKS.register(alias, TASKS.get(task_id))


def register_policy(name: str, factory: Callable[[Any], Any], config: type) -> None:
    POLICIES.register(name, ComponentSpec(factory, config))


PLUGIN_GROUP = "mmrl.plugins"
"""Entry-point group through which packages register tasks, envs, policies and algorithm pieces. mmrl's own
families register through it too (``pyproject.toml``), so this module imports nothing above it. An entry
point names a module (importing it registers its components) or a function (called with no arguments)."""

_loaded_plugins: list[str] = []


def load_plugins() -> list[str]:
    """Load every ``mmrl.plugins`` entry point once (mmrl's built-in families among them); returns their names."""
    if _loaded_plugins:
        return list(_loaded_plugins)
    found = sorted(importlib.metadata.entry_points(group=PLUGIN_GROUP), key=lambda ep: (ep.dist is None, ep.name))
    if not any(ep.value.startswith("mmrl.") for ep in found):
        raise RuntimeError(f"no built-in {PLUGIN_GROUP} entry points: mmrl's install metadata is missing or stale; "
                           f"reinstall it (pip install -e .)")
    for ep in found:
        try:
            loaded = ep.load()
        except Exception as err:
            raise RuntimeError(f"{PLUGIN_GROUP} entry point {ep.name!r} ({ep.value}) failed to load: {err}") from err
        if callable(loaded):
            loaded()
        _loaded_plugins.append(ep.name)
    return list(_loaded_plugins)


def make_task(task_id: str, args: Any = None) -> Any:
    """Build a registered task; ``args`` is its config dataclass or a mapping of its fields."""
    load_plugins()
    spec = TASKS.get(task_id)
    return spec.factory(_as_config(spec.config, args, "task.args"))


def make_policy(name: str, args: Any = None) -> Any:
    load_plugins()
    spec = POLICIES.get(name)
    return spec.factory(_as_config(spec.config, args, "policy.args"))


def _as_config(config_cls: type, args: Any, path: str) -> Any:
    if isinstance(args, config_cls):
        return args
    from mmrl.core.typed import build

    return build(config_cls, args or {}, path)
