"""Hook contracts: how a paper variant changes a training step without a branch in the trainer.

The trainer's step is collect → score → advantages → update. Variants that only change a formula
are registered functions on one axis (an estimator, an objective, a shaping hook). Variants that
change *how rows are drawn* or *add a loss term with data of its own* are hooks, registered here:

- :data:`ROLLOUT_HOOKS` — a :class:`RolloutHook` changes how a step's rollouts are drawn
  (per-prompt temperatures, parameter noise, injected reference rows, extra samples, extra rounds);
- :data:`LOSS_HOOKS` — a :class:`LossHook` adds loss terms computed from its own data
  (a behaviour-cloning set, a rehearsal set, expert rows).

Each entry is a :class:`HookSpec`: ``selected(cfg)`` says whether the run's config turns the hook
on (from the config fields the variant documents), ``build(ctx)`` makes it for one run. The trainer
builds every selected hook, in registration order, at start-up; hooks that wrap (``draw``) nest in
that order, the first registered outermost. A hook's mutable state (rollout and loss hooks alike) is
checkpointed through ``state_dict`` / ``load_state_dict``.

Adding a variant is adding a hook class and one ``register`` call (``docs/architecture.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from mmrl.core.registry import Registry
from mmrl.core.rollout import Rollout, SamplingParams
from mmrl.core.scored import Scored

Draw = Callable[[Sequence[Any], int, SamplingParams, int], Rollout]
"""``draw(examples, group_size, sampling, seed) -> Rollout``: the policy's sampler, as wrapped by the hooks."""


@dataclass(frozen=True)
class HookContext:
    """What a hook may use. ``cfg`` is the run's ``TrainConfig``; hooks read only their own fields."""

    cfg: Any
    policy: Any  # the Policy (sampling, ``rollout_from_outputs``, ``sft_loss``)
    model: Any  # the same policy as prepared by the engine (DDP/FSDP wrapper): forwards that need gradients
    task: Any  # the Task (``sample_batch``, ``reference_output``)
    engine: Any  # the Engine: rank / world_size, collectives (any, sum, mean, gather_objects), autocast, no_sync
    score: Callable[[Rollout, Sequence[Any]], Scored]  # verify + reward shaping, as the trainer scores rows
    warm_start_examples: Callable[[], list[Any]]  # the warm start's own examples, drawn again (no new data)
    out: Path | None = None  # the run folder: hooks that keep data of their own write it under here
    warm_start_dir: Path | None = None  # where the run's cached warm start lives (or would): data kept beside it


@dataclass(frozen=True)
class Round:
    """One generation round of a step, as a rollout hook's ``refine`` sees it."""

    index: int  # 0 for the step's first round (more with dynamic sampling)
    sampling: SamplingParams
    seed: int  # the round's sampling seed; hooks derive theirs from it
    draw: Draw  # the sampler with every hook's ``draw`` applied


class RolloutHook:
    """Changes how a step's rollouts are drawn. Every method passes through unless overridden."""

    drives_rounds: bool = False
    """True for the (at most one) hook whose :meth:`rounds` decides how many rounds a step takes."""

    candidates_per_prompt: int = 0
    """> 0 for the (at most one) hook that chooses a round's prompts: the trainer draws this many candidates
    per prompt (the same on every process) and :meth:`select_prompts` keeps ``prompts_per_step`` of them."""

    def select_prompts(self, candidates: Sequence[Any], n: int) -> list[Any]:
        """``n`` of ``candidates`` for the round (prompt selection / curricula); identical on every process."""
        return list(candidates[:n])

    def begin_round(self, examples: Sequence[Any]) -> None:
        """A new round draws groups for ``examples`` (called before its first ``draw``)."""

    def draw(self, examples: Sequence[Any], group_size: int, sampling: SamplingParams, seed: int,
             inner: Draw) -> Rollout:
        """Draw ``group_size`` rows per example, through ``inner`` (the hooks registered after this one)."""
        return inner(examples, group_size, sampling, seed)

    def refine(self, part: Scored, round_: Round) -> Scored:
        """A round's scored rows → the rows to keep (add rows, draw more through ``round_.draw``, drop some)."""
        return part

    def rounds(self, one_round: Callable[[int], Scored]) -> Scored:
        """The step's rows from ``one_round(i)`` (new examples each call); one round by default."""
        return one_round(0)

    def finish(self, batch: Scored) -> Scored:
        """The step's final rows, before advantages (e.g. attach per-row estimator inputs)."""
        return batch

    def metrics(self) -> dict[str, float]:
        """Metrics of the step just collected (``rollout/...``), logged with it."""
        return {}

    def eval_metrics(self) -> dict[str, float | None]:
        """Counters logged with every evaluation (``eval/...``, step 0's included), e.g. the real simulator
        steps the run has taken so far (:mod:`mmrl.algos.real_steps`); called on every process."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (exact resume)."""


@dataclass(frozen=True)
class UpdateIndex:
    """Which optimizer step of the run an update term belongs to (hooks derive their seeds from it)."""

    step: int
    epoch: int
    minibatch: int


@dataclass(frozen=True)
class MicroBatch:
    """What a loss hook sees of one micro-batch of n rows, T decisions."""

    index: UpdateIndex
    rows: Tensor  # [n] long: positions of the rows in the step's batch
    logp: Tensor  # [n, T] log π_θ, with gradient
    logp_old: Tensor  # [n, T]
    advantages: Tensor  # [n, T]
    mask: Tensor  # [n, T] float {0, 1}
    denominators: dict[str, float]  # global minibatch counts for ``aggregate`` (num_tokens, num_seqs, norm_len)
    kl_ref: float | None  # token-mean KL to the reference on these rows (None without a reference)


class LossHook:
    """Adds loss terms computed from data of its own. Every method adds nothing unless overridden.

    Returned metrics follow the trainer's convention: ``loss/*`` values are summed over micro-batches and
    averaged over optimizer steps; other keys are token-weighted means.
    """

    def prepare(self, batch: Scored) -> None:
        """Once per step, before the update: compute what the terms need from the step's rows."""

    def update_term(self, index: UpdateIndex) -> tuple[Tensor, dict[str, float]] | None:
        """Once per optimizer step: a loss backpropagated on its own, the same on every process (so not
        reduced across processes), or None."""
        return None

    def micro_term(self, micro: MicroBatch) -> tuple[Tensor | None, dict[str, float]]:
        """A term added to the micro-batch's loss (already weighted), or None; and its metrics."""
        return None, {}

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state saved with each checkpoint (hooks with large state write a file of their own under
        the run folder and return its name)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (exact resume); checkpoints from before loss hooks kept state give {}."""


@dataclass(frozen=True)
class HookSpec:
    selected: Callable[[Any], bool]  # cfg → is the hook on for this run
    build: Callable[[HookContext], Any]  # ctx → a RolloutHook / LossHook


ROLLOUT_HOOKS: Registry[HookSpec] = Registry("rollout hook")
LOSS_HOOKS: Registry[HookSpec] = Registry("loss hook")


def build_hooks(registry: Registry[HookSpec], ctx: HookContext) -> list[tuple[str, Any]]:
    """The hooks ``ctx.cfg`` selects, built, in registration order, with their names."""
    return [(name, spec.build(ctx)) for name, spec in registry.entries() if spec.selected(ctx.cfg)]


def round_driver(hooks: Sequence[tuple[str, RolloutHook]]) -> RolloutHook:
    """The hook whose ``rounds`` decides a step's rounds (a pass-through one when none does)."""
    return at_most_one(hooks, lambda hook: hook.drives_rounds, "decide a step's rounds") or RolloutHook()


def prompt_selector(hooks: Sequence[tuple[str, RolloutHook]]) -> RolloutHook | None:
    """The hook that chooses a round's prompts (None: the task's own draw)."""
    return at_most_one(hooks, lambda hook: hook.candidates_per_prompt > 0, "choose a round's prompts")


def at_most_one(hooks: Sequence[tuple[str, RolloutHook]], takes_part: Callable[[RolloutHook], bool],
                role: str) -> RolloutHook | None:
    """The one hook that ``takes_part`` (None when none does); two or more is a configuration error."""
    found = [(name, hook) for name, hook in hooks if takes_part(hook)]
    if len(found) > 1:
        raise ValueError(f"rollout hooks {[n for n, _ in found]} each {role}: select at most one")
    return found[0][1] if found else None


def compose_draw(hooks: Sequence[RolloutHook], sample: Draw) -> Draw:
    """``sample`` wrapped by every hook's ``draw``, the first hook outermost."""
    draw = sample
    for hook in reversed(hooks):
        draw = _wrapped(hook, draw)
    return draw


def _wrapped(hook: RolloutHook, inner: Draw) -> Draw:
    return lambda examples, group_size, sampling, seed: hook.draw(examples, group_size, sampling, seed, inner)
