"""What keeps a run honest when numbers stop being numbers.

- A non-finite reward is replaced by its group's finite mean (:func:`mmrl.core.scored.finite_outcomes`):
  that row carries no signal, the rest of its group still trains, and the count is logged.
- A non-finite token log-prob (a diverged forward pass), a non-finite loss or a non-finite gradient norm
  skips the minibatch's update (the optimizer never sees it; on every process), and the count is logged.
- Each kind is said once on the console; when more than ``trainer.max_skipped_frac`` of the updates so
  far were skipped, the run stops with :class:`TrainingDiverged` instead of running on without learning.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import torch

NONFINITE_KINDS = {"train/nonfinite_rewards": "rewards", "train/nonfinite_logp": "token log-probs"}
MIN_STEPS = 4  # steps before the skipped share can stop a run


class TrainingDiverged(RuntimeError):
    """Too many updates were skipped for non-finite gradients: nothing is being learned."""


class NonFiniteGuard:
    """The run's counts of non-finite rewards, log-probs and skipped updates, and what is done about them."""

    def __init__(self, engine: Any, max_skipped_frac: float):
        self.engine, self.max_skipped_frac = engine, max_skipped_frac
        self.counts = dict.fromkeys(NONFINITE_KINDS, 0)  # this step's, this process's
        self.skipped_updates = 0  # the run's (checkpointed)
        self.warned: set[str] = set()
        self.poisoned = False  # the current minibatch met a non-finite log-prob or loss

    def new_step(self) -> None:
        self.counts = dict.fromkeys(NONFINITE_KINDS, 0)

    def add(self, kind: str, count: int) -> None:
        self.counts[kind] += count

    def check_loss(self, logp_nonfinite: int, loss: float) -> None:
        """Count a micro-batch's non-finite log-probs; one of them, or a non-finite loss, poisons the
        minibatch's update (its gradient may still look finite: a NaN entry can carry no gradient)."""
        self.add("train/nonfinite_logp", logp_nonfinite)
        self.poisoned |= bool(logp_nonfinite) or not math.isfinite(loss)

    def step_metrics(self, step: int) -> dict[str, float]:
        """This step's counts over all processes (``train/nonfinite_*``); the first of each kind is said."""
        counts = {key: self.engine.sum(value) for key, value in self.counts.items()}
        for key in (k for k, v in counts.items() if v and k not in self.warned):
            self.warned.add(key)
            if self.engine.is_main:
                print(f"mmrl: warning: step {step}: {counts[key]:g} non-finite {NONFINITE_KINDS[key]} "
                      f"(logged as {key}; see mmrl/core/guards.py for what is done with them)", file=sys.stderr)
        return counts | {"train/skipped_updates": self.skipped_updates}

    def optimizer_step(self, model: Any, optimizer: torch.optim.Optimizer, scheduler: Any,
                       grad_clip: float) -> tuple[float, bool]:
        """Clip, then step, unless the gradient is not finite or the minibatch was poisoned (on any
        process): then skip and count it. Returns the gradient norm (NaN when unknown or skipped) and
        whether the optimizer stepped."""
        norm = self.engine.clip_grad_norm(model.parameters(), grad_clip)
        poisoned, self.poisoned = self.engine.any(self.poisoned), False
        stepped = not poisoned and (norm is None or math.isfinite(norm))  # None: the backend guards the step
        if stepped:
            optimizer.step()
            scheduler.step()
        else:
            self.skipped_updates += 1
        optimizer.zero_grad(set_to_none=True)
        return (norm if norm is not None and math.isfinite(norm) else float("nan")), stepped

    def check(self, step: int, updates: int, metrics_file: Path) -> None:
        """Raise :class:`TrainingDiverged` when too many of the ``updates`` so far were skipped."""
        if step >= MIN_STEPS and self.skipped_updates > self.max_skipped_frac * updates:
            raise TrainingDiverged(f"{self.skipped_updates} of {updates} updates were skipped for a non-finite "
                                   f"gradient (train/nonfinite_logp in {metrics_file}); lower trainer.lr, or "
                                   f"raise trainer.max_skipped_frac to go on")
