"""Explicit, versioned registries with "did you mean" errors.

Everything a recipe names by string (tasks, policies, advantage estimators, losses, ...) lives in a
:class:`Registry`. Registration is explicit (a decorator or a call at import of the defining
module); the modules that register come from one entry-point group (:data:`PLUGIN_GROUP`), loaded
once, the first time a component is made or listed, and from a user's own modules or files named by
``--import`` or a recipe's ``imports:`` (:func:`import_plugins`). Tasks and policies remember which of
these registered them (``ComponentSpec.origin``, shown by ``mmrl list``).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.metadata
import importlib.util
import re
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
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


BUILT_IN = "built-in"
"""Origin of mmrl's own components."""


@dataclass(frozen=True)
class ComponentSpec:
    """How to build a registered component: ``factory(config)`` with ``config`` an instance of
    the ``config`` dataclass (its fields are the recipe's ``args``). ``origin`` says what registered
    it: :data:`BUILT_IN`, ``plugin <entry point> (<distribution>)``, ``--import <spec>``,
    ``imports: <spec>``, or ``module <name>`` for a call outside any of these."""

    factory: Callable[[Any], Any]
    config: type
    origin: str = BUILT_IN


TASKS: Registry[ComponentSpec] = Registry("task")
POLICIES: Registry[ComponentSpec] = Registry("policy")


def register_task(task_id: str, factory: Callable[[Any], Any], config: type) -> None:
    """Register a task under a versioned id ``family/name-vK`` (bump K when the reward changes)."""
    if not TASK_ID.match(task_id):
        raise ValueError(f"task id {task_id!r} must look like 'family/name-v0'")
    TASKS.register(task_id, ComponentSpec(factory, config, _origin_of(factory)))


def register_task_alias(alias: str, task_id: str) -> None:
    """A short literal recipe name (``mixture``) for a registered versioned task (``data/mixture-v0``): the
    same entry under a second key, so ``task: mixture`` builds the versioned task."""
    if not TASK_ALIAS.match(alias):
        raise ValueError(f"task alias {alias!r} must be one lower-case word (letters, digits, '_')")
    TASKS.register(alias, TASKS.get(task_id))


def register_policy(name: str, factory: Callable[[Any], Any], config: type) -> None:
    POLICIES.register(name, ComponentSpec(factory, config, _origin_of(factory)))


_loading: list[str] = []
"""Origins of the plugins being imported, innermost last."""


@contextlib.contextmanager
def _origin(label: str) -> Iterator[None]:
    """Components registered inside this block get ``label`` as their origin."""
    _loading.append(label)
    try:
        yield
    finally:
        _loading.pop()


def _origin_of(factory: Callable[[Any], Any]) -> str:
    if _loading:
        return _loading[-1]
    module = getattr(factory, "__module__", None) or "?"
    return BUILT_IN if module == "mmrl" or module.startswith("mmrl.") else f"module {module}"


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
        dist = ep.dist.name if ep.dist is not None else None
        with _origin(BUILT_IN if dist == "mmrl" else f"plugin {ep.name} ({dist or ep.value})"):
            try:
                loaded = ep.load()
                if callable(loaded):
                    loaded()
            except Exception as err:
                raise RuntimeError(f"{PLUGIN_GROUP} entry point {ep.name!r} ({ep.value}) failed to load: "
                                   f"{_describe(err)}") from err
        _loaded_plugins.append(ep.name)
    return list(_loaded_plugins)


# ------------------------------------------------------------------------------------------------
# A user's own modules: ``--import my_package`` / ``--import ./my_tasks.py``, a recipe's ``imports:``.

_imported: dict[str, str] = {}
"""User plugins imported in this process: module name or absolute file path → the module's name."""


def is_plugin_file(spec: str) -> bool:
    """A plugin named by path (``./my_tasks.py``, ``plugins/tasks.py``) rather than by module name."""
    return spec.endswith(".py") or "/" in spec or "\\" in spec


def absolute_plugin(spec: str, base: Path) -> str:
    """``spec`` with a relative file path made absolute against ``base``; module names unchanged."""
    if not is_plugin_file(spec) or Path(spec).is_absolute():
        return spec
    return str((base / spec).resolve())


def import_plugins(specs: Sequence[str], source: str) -> list[str]:
    """Import a user's modules (``my_package.tasks``) or ``.py`` files (relative to the working directory)
    so that they register their components, after the entry points (:func:`load_plugins`). ``source``
    (``--import``, ``imports:``) names where they were given, in errors and in the components' origin.
    Each is imported once per process; a file is imported as a module named after its stem.
    A plugin that fails to import raises one ``ConfigError`` naming it and the error. Returns the modules'
    names."""
    from mmrl.core.typed import ConfigError

    load_plugins()
    names = []
    for spec in specs:
        key = str(Path(spec).resolve()) if is_plugin_file(spec) else spec
        if key not in _imported:
            with _origin(f"{source} {spec}"):
                try:
                    _imported[key] = _import_file(Path(key)) if is_plugin_file(spec) else _import_module(key)
                except Exception as err:
                    raise ConfigError(f"{source} {spec}: {_describe(err)}") from err
        names.append(_imported[key])
    return names


def _import_module(name: str) -> str:
    if not all(part.isidentifier() for part in name.split(".")):
        raise ValueError(f"{name!r} is neither a module name (my_package.tasks) nor a .py file")
    return importlib.import_module(name).__name__


def _import_file(path: Path) -> str:
    if not path.is_file():
        raise FileNotFoundError(f"no such file {path}")
    name = path.stem
    if name in sys.modules:
        raise ImportError(f"a module named {name!r} is already imported ({getattr(sys.modules[name], '__file__', '?')}); "
                          f"rename {path.name}")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before executing: dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return name


def _describe(err: Exception) -> str:
    """``Type: message``, and where in the plugin's own code it was raised."""
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if not f.filename.startswith("<frozen") and f.filename != __file__ and "importlib" not in f.filename]
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames and not isinstance(err, SyntaxError) else ""
    return f"{type(err).__name__}: {err}{where}"


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
