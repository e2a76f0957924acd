"""User reward functions named in a recipe as ``"path/to/file.py:fn"`` or ``"package.module:fn"``.

Two forms, told apart by the signature:

- **TRL form** (batched, the default): ``fn(prompts, completions, **columns) -> list[float | None]``,
  called with keywords. A function with ``**kwargs`` receives every dataset column; one with named
  parameters receives the columns it names (``prompts`` only if it asks for it). ``None`` means "not
  applicable": that row scores 0 for this component and is not an error.
- **Per-example form**: ``fn(example, output) -> float | dict``, when the function's first two positional
  parameters are named ``example`` and ``output`` (any others have defaults), or when it has the
  attribute ``per_example = True``. ``example`` is ``{"prompt": ..., **the row's columns}``; a returned
  dict holds sub-scores, whose sum is the score (each is also reported as ``<name>/<key>``).

Options in the spec: ``weight``, ``name`` (reported name; default the function's name), ``range``
(declared ``[low, high]``, default ``[0, 1]``: values outside are clipped) and ``conversational``
(true: prompts and completions arrive as chat messages, ``[{"role": "user" | "assistant", "content": ...}]``).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import math
import numbers
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mmrl.verifiers.base import DEFAULT_RANGE, BatchScorer, Component, Failure, RewardSpecError, RowValue, short

USER_OPTIONS = ("range", "conversational")


def user_component(key: str, weight: float, options: dict[str, Any], name: str | None,
                   base_dir: Path | None) -> Component:
    """A component calling the user function ``key`` ("file.py:fn" or "package.module:fn")."""
    unknown = [k for k in options if k not in USER_OPTIONS]
    if unknown:
        raise RewardSpecError(f"reward {key!r}: unknown option {unknown[0]!r}; a user function takes weight, "
                              f"name, {', '.join(USER_OPTIONS)}")
    reward_range = check_range(key, options.get("range", list(DEFAULT_RANGE)))
    conversational = options.get("conversational", False)
    if not isinstance(conversational, bool):
        raise RewardSpecError(f"reward {key!r}: conversational must be true or false, got {conversational!r}")
    fn = load_function(key, base_dir)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as err:
        raise RewardSpecError(f"reward {key!r}: cannot read the signature of {fn!r}: {err}") from None
    label = name or getattr(fn, "__name__", key.rsplit(":", 1)[1])
    if is_per_example(fn, signature):
        return Component(label, weight, reward_range, per_example_scorer(fn, conversational), (),
                         allows_mapping=True)
    columns = trl_columns(key, signature)
    return Component(label, weight, reward_range, trl_scorer(fn, signature, conversational), columns)


def check_range(key: str, value: Any) -> tuple[float, float]:
    ok = isinstance(value, (list, tuple)) and len(value) == 2 and all(
        isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v)) for v in value)
    if not ok or float(value[0]) > float(value[1]):
        raise RewardSpecError(f"reward {key!r}: range must be [low, high] with finite low <= high, got {value!r}")
    return float(value[0]), float(value[1])


# ------------------------------------------------------------------------------------------------
# Loading


def load_function(key: str, base_dir: Path | None) -> Callable[..., Any]:
    """The callable ``key`` names; every way it can fail is a RewardSpecError naming the file or module."""
    where, _, attribute = key.rpartition(":")
    if not where or not attribute.isidentifier():
        raise RewardSpecError(f"reward {key!r}: write 'path/to/file.py:function' or 'package.module:function'")
    if where.endswith(".py") or "/" in where or "\\" in where:
        module = import_file(resolve_file(where, base_dir), key)
        origin = f"file {where!r}"
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as err:
            raise RewardSpecError(f"reward {key!r}: cannot import module {where!r}: {err}") from err
        except Exception as err:  # noqa: BLE001 — the module's own code failed while importing
            raise RewardSpecError(f"reward {key!r}: importing module {where!r} raised "
                                  f"{type(err).__name__}: {short(err)}") from err
        origin = f"module {where!r}"
    if not hasattr(module, attribute):
        defined = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        close = difflib.get_close_matches(attribute, defined, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise RewardSpecError(f"reward {key!r}: {origin} has no {attribute!r}.{hint} "
                              f"Callables there: {', '.join(sorted(defined)) or '(none)'}")
    fn = getattr(module, attribute)
    if not callable(fn):
        raise RewardSpecError(f"reward {key!r}: {attribute!r} in {origin} is a {type(fn).__name__}, not a function")
    return fn


def resolve_file(where: str, base_dir: Path | None) -> Path:
    """An absolute path as is; a relative one against ``base_dir`` (the recipe's folder), then the cwd."""
    path = Path(where).expanduser()
    candidates = [path] if path.is_absolute() else [*([Path(base_dir) / path] if base_dir else []), Path.cwd() / path]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    looked = ", ".join(str(c) for c in candidates)
    raise RewardSpecError(f"reward file {where!r} not found (looked at {looked})")


def import_file(path: Path, key: str) -> Any:
    """Import a Python file under a module name unique to its path (two ``rewards.py`` never collide)."""
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    module_name = f"mmrl_user_reward_{path.stem if path.stem.isidentifier() else 'file'}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise RewardSpecError(f"reward {key!r}: {path} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 — report the user's error with its file and line
        del sys.modules[module_name]
        line = f" (line {err.lineno})" if isinstance(err, SyntaxError) and err.lineno else ""
        raise RewardSpecError(f"reward {key!r}: importing {path} raised {type(err).__name__}{line}: "
                              f"{short(err)}") from err
    return module


# ------------------------------------------------------------------------------------------------
# Calling


def is_per_example(fn: Callable[..., Any], signature: inspect.Signature) -> bool:
    """Per-example form: ``per_example = True`` on the function, or positional parameters that start with
    ``(example, output)`` and require nothing else."""
    if getattr(fn, "per_example", False) is True:
        return True
    positional = [p for p in signature.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = [p.name for p in positional[:2]]
    rest_required = [p for p in positional[2:] if p.default is p.empty]
    return names == ["example", "output"] and not rest_required


def accepts_all(signature: inspect.Signature) -> bool:
    return any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values())


def trl_columns(key: str, signature: inspect.Signature) -> tuple[str, ...]:
    """Columns a TRL-form function requires (its parameters without defaults besides prompts/completions)."""
    params = signature.parameters
    if "completions" not in params and not accepts_all(signature):
        raise RewardSpecError(f"reward {key!r}: a batched reward function takes `completions` (TRL's signature "
                              f"fn(prompts, completions, **kwargs)); for one example at a time name its "
                              f"parameters (example, output)")
    if any(p.kind == p.POSITIONAL_ONLY for p in params.values()):
        raise RewardSpecError(f"reward {key!r}: parameters are passed by keyword; remove the positional-only '/'")
    return tuple(name for name, p in params.items()
                 if name not in ("prompts", "completions") and p.default is p.empty
                 and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def as_messages(texts: Sequence[Any], role: str) -> list[Any]:
    return [[{"role": role, "content": text}] for text in texts]


def trl_scorer(fn: Callable[..., Any], signature: inspect.Signature, conversational: bool) -> BatchScorer:
    """Call ``fn`` once per batch with keyword arguments, as TRL's trainers do."""
    takes_all = accepts_all(signature)
    named = set(signature.parameters)

    def score(prompts: Sequence[Any], completions: Sequence[Any], columns: Mapping[str, Sequence[Any]]) -> list:
        kwargs: dict[str, Any] = {name: list(values) for name, values in columns.items()
                                  if takes_all or name in named}
        kwargs["completions"] = as_messages(completions, "assistant") if conversational else list(completions)
        if takes_all or "prompts" in named:
            kwargs["prompts"] = as_messages(prompts, "user") if conversational else list(prompts)
        return fn(**kwargs)

    return score


def per_example_scorer(fn: Callable[..., Any], conversational: bool) -> BatchScorer:
    """Call ``fn(example, output)`` row by row; an exception fails only its row."""

    def score(prompts: Sequence[Any], completions: Sequence[Any], columns: Mapping[str, Sequence[Any]]) -> list:
        rows: list[RowValue] = []
        for row, (prompt, completion) in enumerate(zip(prompts, completions)):
            example = {"prompt": as_messages([prompt], "user")[0] if conversational else prompt,
                       **{name: values[row] for name, values in columns.items()}}
            output = as_messages([completion], "assistant")[0] if conversational else completion
            try:
                rows.append(fn(example, output))
            except Exception as err:  # noqa: BLE001 — the user's bug on one row is a zero with a reason
                rows.append(Failure(f"raised {type(err).__name__}: {short(err)}", err))
        return rows

    return score
