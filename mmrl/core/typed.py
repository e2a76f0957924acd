"""Plain recipe data → typed, frozen dataclasses, with errors that say how to fix the input.

:func:`build` checks keys (unknown ones get a "did you mean") and coerces values to the field's
type recursively (nested dataclasses, unions, ``Literal``, tuples, mappings). Everything that reads
a recipe section into a dataclass uses it: the run config, component args, variant hyper-parameters.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import fields, is_dataclass
from typing import Any, Literal


class ConfigError(ValueError):
    """A recipe or override that cannot be used; the message says how to fix it."""


def build(cls: type, data: Any, path: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, checking keys and types recursively."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'config'} must be a mapping, got {type(data).__name__}: {data!r}")
    hints = typing.get_type_hints(cls)
    valid = [f.name for f in fields(cls) if f.init]
    unknown = [k for k in data if k not in valid]
    if unknown:
        where = f" in {path}" if path else ""
        close = difflib.get_close_matches(str(unknown[0]), valid, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}{where}{hint}; "
                          f"valid keys: {', '.join(valid)}")
    kwargs = {}
    for f in fields(cls):
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"missing required key {_join(path, f.name)!r}")
            continue
        kwargs[f.name] = _coerce(data[f.name], hints[f.name], _join(path, f.name))
    return cls(**kwargs)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _coerce(value: Any, hint: Any, path: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if is_dataclass(hint):
        return build(hint, value, path)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        sections = [a for a in args if is_dataclass(a)]
        if isinstance(value, dict) and len(sections) == 1:  # a mapping fills the section: report its own errors
            return build(sections[0], value, path)
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, option, path)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{path}: {value!r} fits none of {hint}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{path} must be one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path} expects a list, got {value!r}")
        return tuple(_coerce(v, args[0], f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path} expects a mapping, got {value!r}")
        return dict(value)
    if hint is float:
        if isinstance(value, str):  # YAML 1.1 reads "3e-4" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path} expects a number, got {value!r}")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path} expects an integer, got {value!r}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path} expects true or false, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path} expects a string, got {value!r}")
        return value
    raise ConfigError(f"{path}: unsupported type {hint}")


def to_dict(cfg: Any) -> Any:
    """Plain data (for YAML) from a config, nested dataclasses and tuples included."""
    if is_dataclass(cfg):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in fields(cfg)}
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: to_dict(v) for k, v in cfg.items()}
    return cfg
