"""Per-prompt sampling temperature schedules (``algo.temperature_schedule``).

A schedule is a pure function ``(temperature [E], outcome [N], example_index [N], base, cfg) -> [E]``:
each training prompt's next sampling temperature from its current one and the outcomes of the group
it was just sampled in; ``base`` is ``rollout.temperature`` (T_0). The trainer keeps the per-prompt table
(:class:`PromptTemperatures`, keyed by :func:`~mmrl.algos.variants.history.prompt_key`,
checkpointed in ``trainer_state.json``), draws each prompt's group at its own temperature (one
``policy.rollout`` call per distinct temperature, then ``Rollout.concat``), and updates the table
from each sampled group's outcome. ``fixed`` (default) keeps T_0 and no table.

``erpo`` — ERPO ("Explore Data Left Behind in RL for Reasoning", arXiv 2511.04800): a prompt whose
last group was all-correct (a "residual" prompt, no GRPO signal) is re-sampled hotter to induce
failures and revive its signal. The exact schedule was NOT FOUND; INFERRED (seed_tasks.md §10.5):

    all-correct:  T_x ← min(T_max, T_x + ΔT)
    otherwise:    T_x ← T_0 + decay · (T_x − T_0)        (decay 0: reset to T_0)

The paper's "Reactivate Training Signal" companion is the prompt selector ``erpo_reactivate``
(mmrl/algos/variants/selection.py): residual prompts tracked and drawn again in later rounds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mmrl.algos.config import AlgoConfig
from mmrl.algos.variants.params import declare_variant, variant_params
from mmrl.core.registry import Registry

TemperatureSchedule = Callable[[Tensor, Tensor, Tensor, float, AlgoConfig], Tensor]
TEMPERATURE_SCHEDULES: Registry[TemperatureSchedule] = Registry("temperature schedule")


@TEMPERATURE_SCHEDULES.register("fixed")
def fixed_temperature(temperature: Tensor, outcome: Tensor, example_index: Tensor, base: float,
                      cfg: AlgoConfig) -> Tensor:
    """Every prompt at ``rollout.temperature`` ([E] → [E])."""
    return torch.full_like(temperature, base)


@dataclass(frozen=True)
class ErpoParams:
    delta: float = 0.1
    """ΔT added to a residual (all-correct) prompt's temperature (INFERRED; not in any source read)."""
    max_temperature: float = 1.5
    """T_max: a prompt's temperature never exceeds this (INFERRED)."""
    decay: float = 0.0
    """Share of T_x − T_0 kept after a group that is not all-correct (0: reset to T_0; INFERRED)."""
    success_threshold: float = 1.0
    """A row is correct when its outcome is ≥ this (1.0: fully correct)."""


declare_variant("erpo", ErpoParams)


@TEMPERATURE_SCHEDULES.register("erpo")
def erpo_temperature(temperature: Tensor, outcome: Tensor, example_index: Tensor, base: float,
                     cfg: AlgoConfig) -> Tensor:
    """ERPO's residual-prompt schedule (module docstring): [E] temperatures, [N] outcomes / example
    indices of the groups just sampled → [E] next temperatures."""
    p = variant_params(cfg, "erpo")
    if p.delta <= 0 or not 0 <= p.decay <= 1 or p.max_temperature < base:
        raise ValueError(f"algo.extra.erpo: need delta > 0, 0 <= decay <= 1 and max_temperature >= "
                         f"rollout.temperature ({base}); got {p}")
    all_correct = all_correct_groups(outcome, example_index, len(temperature), p.success_threshold)
    hotter = (temperature + p.delta).clamp(max=p.max_temperature)
    cooler = base + p.decay * (temperature - base)
    return torch.where(all_correct, hotter, cooler)


def all_correct_groups(outcome: Tensor, example_index: Tensor, num_examples: int, threshold: float) -> Tensor:
    """[E] bool: every row of the example scored ≥ ``threshold`` (an example without rows: False)."""
    rows = torch.zeros(num_examples, dtype=torch.long).index_add_(0, example_index, torch.ones_like(example_index))
    wrong = torch.zeros(num_examples, dtype=torch.long).index_add_(0, example_index,
                                                                   (outcome < threshold).long())
    return (rows > 0) & (wrong == 0)


class PromptTemperatures:
    """Each training prompt's current sampling temperature (prompts never seen: T_0)."""

    def __init__(self) -> None:
        self.temperatures: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self.temperatures)

    def lookup(self, keys: Sequence[str], base: float) -> Tensor:
        """[E] float64 temperatures of the prompts ``keys``."""
        return torch.tensor([self.temperatures.get(k, base) for k in keys], dtype=torch.float64)

    def update(self, keys: Sequence[str], temperatures: Sequence[float], base: float) -> None:
        """Set the prompts' temperatures; a prompt back at T_0 leaves the table."""
        if len(keys) != len(temperatures):
            raise ValueError(f"{len(keys)} keys for {len(temperatures)} temperatures")
        for key, value in zip(keys, temperatures):
            if value == base:
                self.temperatures.pop(key, None)
            else:
                self.temperatures[key] = float(value)

    def state_dict(self) -> dict[str, float]:
        return dict(self.temperatures)

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.temperatures = {k: float(v) for k, v in state.items()}
