"""Typed hyper-parameters and trainer requirements of the paper variants.

A variant's hyper-parameters live in the recipe under ``algo.extra.<name>`` (``<name>`` is the
registered estimator / hook / term name). Each variant declares a frozen dataclass whose fields
are documented with the paper behind each default; :func:`variant_params` builds it (unknown keys
and wrong types raise :class:`mmrl.core.config.ConfigError` with the valid keys). ``config.validate``
builds every section once, so a typo fails before any work.

A variant may also need information the trainer only computes on request (``needs``):

- ``"entropy"``: the behaviour policy's per-token entropy in ``ShapingContext.entropy``
  (one extra no-grad forward per step);
- ``"prompt_history"``: per-prompt success / failure pseudo-counts from earlier steps in
  ``AdvantageInputs.prompt_successes`` / ``prompt_failures`` (kept by the trainer in a
  :class:`~mmrl.algos.variants.history.PromptHistory`, checkpointed);
- ``"ref_logp"``: reference log-probs (``trainer.ref_model`` must not be ``none``);
- ``"expert_rows"``: the current policy's log-probs of the task's reference output for each prompt
  (``Policy.rollout_from_outputs``), given to the loss terms in ``LossTermRows`` (CalibRL);
- ``"output_classes"``: which rows of a group decoded to equal outputs, in ``AdvantageInputs.output_class``
  (Polychromic PPO's set diversity);
- ``"whole_groups"``: every micro-batch holds whole groups (``trainer.micro_batch_size`` a multiple of
  ``rollout.group_size``), for loss terms that compare a row with its whole group (PACS, FRPO).
- ``"teacher_shift"``: a teacher checkpoint pair's per-token log-ratio on the rows,
  ``AdvantageInputs.implicit_rewards`` (Direct-OPD; computed by the ``teacher_shift`` rollout hook).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mmrl.algos.config import AlgoConfig

NEEDS_KINDS = frozenset({"entropy", "prompt_history", "ref_logp", "expert_rows", "output_classes", "whole_groups",
                         "teacher_shift"})


Needs = tuple[str, ...] | Callable[[Any], tuple[str, ...]]


@dataclass(frozen=True)
class VariantSpec:
    params: type | None  # the hyper-parameter dataclass (None: the variant has none)
    needs: Needs  # fixed, or a function of the built hyper-parameters (e.g. only when a flag is on)


VARIANTS: dict[str, VariantSpec] = {}


def declare_variant(name: str, params: type | None = None, needs: Needs = ()) -> None:
    """Declare ``name``'s hyper-parameter dataclass and what it needs from the trainer."""
    if not callable(needs):
        unknown = set(needs) - NEEDS_KINDS
        if unknown:
            raise ValueError(f"variant {name!r}: unknown needs {sorted(unknown)}; known: {sorted(NEEDS_KINDS)}")
    spec = VariantSpec(params, needs)
    if name in VARIANTS and VARIANTS[name] != spec:
        raise ValueError(f"variant {name!r} is already declared")
    VARIANTS[name] = spec


def variant_params(cfg: AlgoConfig, name: str) -> Any:
    """``algo.extra[name]`` as the variant's typed dataclass (absent section: the documented defaults)."""
    from mmrl.core.typed import ConfigError, build

    spec = VARIANTS.get(name)
    if spec is None or spec.params is None:
        raise ConfigError(f"algo.extra.{name}: {name!r} takes no hyper-parameters "
                          f"(variants with some: {', '.join(sorted(n for n, s in VARIANTS.items() if s.params))})")
    section = cfg.extra[name] if name in cfg.extra else {}
    if section is None:
        section = {}
    return build(spec.params, section, f"algo.extra.{name}")


def selected_variants(cfg: AlgoConfig) -> list[str]:
    """The declared variants this recipe selects (estimator, shaping hooks, rollout strategy, rehearsal term,
    extra loss terms, temperature schedule)."""
    names = [cfg.advantage, *cfg.shaping, cfg.rollout_strategy, *cfg.loss_terms, cfg.temperature_schedule]
    if cfg.rehearsal_divergence is not None:
        names.append("dph_rl")
    return [n for n in names if n in VARIANTS]


def algo_needs(cfg: AlgoConfig) -> frozenset[str]:
    """Union of what the selected variants need from the trainer."""
    needs: set[str] = set()
    for name in selected_variants(cfg):
        spec = VARIANTS[name]
        needs |= set(spec.needs(variant_params(cfg, name)) if callable(spec.needs) else spec.needs)
    unknown = needs - NEEDS_KINDS
    if unknown:
        raise ValueError(f"unknown trainer needs {sorted(unknown)}; known: {sorted(NEEDS_KINDS)}")
    return frozenset(needs)


def validate_extra(cfg: AlgoConfig) -> None:
    """Every ``algo.extra`` section names a declared variant with parameters and builds cleanly."""
    import difflib

    from mmrl.core.typed import ConfigError

    with_params = sorted(n for n, s in VARIANTS.items() if s.params is not None)
    for name in cfg.extra:
        if name not in with_params:
            close = difflib.get_close_matches(str(name), with_params, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"algo.extra.{name}: no variant of that name takes hyper-parameters{hint}; "
                              f"variants with hyper-parameters: {', '.join(with_params)}")
        variant_params(cfg, name)
