"""Prompt selection: which training prompts a round draws (``algo.prompt_selection``).

A selector is a rollout hook with ``candidates_per_prompt`` = k > 0: the trainer draws k × ``prompts_per_step``
candidates from the task (the same on every process) and the hook's ``select_prompts`` keeps
``prompts_per_step`` of them, identically on every process (docs/algorithms.md, "Prompt selection").

- ``hard_focus`` (seed #45, a hard-focus curriculum): the candidates whose posterior failure rate, from
  their earlier groups, is highest; prompts never solved after ``give_up_after`` samples go last.
- ``pos_neg_pairing`` (seed #65): half the prompts hard-but-solvable (lowest success rate above 0), half
  easy-but-brittle (highest success rate below 1), from their earlier groups;
- ``low_likelihood`` (SELF, seed #102: RLVR's winner-take-all reinforces high-likelihood problems, so
  focus on low-likelihood ones): the candidates whose reference answer has the lowest mean log-probability
  under the current policy.
- ``erpo_reactivate`` (ERPO's "reactivate training signal", seed #113): prompts whose last group was all-correct
  (residual prompts, no GRPO signal) are tracked and drawn again in later rounds, up to a share of each round,
  so that they can revive their signal (with ``algo.temperature_schedule: erpo`` they are drawn hotter).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mmrl.algos.hooks import ROLLOUT_HOOKS, HookContext, HookSpec, RolloutHook
from mmrl.algos.variants.history import PromptHistory, prompt_key
from mmrl.algos.variants.params import declare_variant, variant_params
from mmrl.algos.variants.prompt_temperature import all_correct_groups
from mmrl.algos.variants.replay import HOOK_STATE_DIR, load_state_file, save_state_file
from mmrl.core.registry import Registry
from mmrl.core.typed import ConfigError
from mmrl.core.rollout import SamplingParams
from mmrl.core.scored import Scored

PROMPT_SELECTORS: Registry[type] = Registry("prompt selection")


@dataclass(frozen=True)
class HardFocusParams:
    candidates_per_prompt: int = 4
    """Candidates drawn per prompt kept (k)."""
    give_up_after: float = 16.0
    """A prompt with this many samples and no success is deprioritised (always-failing prompts would
    otherwise hold the curriculum forever). INFERRED."""


declare_variant("hard_focus", HardFocusParams)


class HardFocus(RolloutHook):
    """Keeps the candidates with the highest posterior failure rate (f + 1) / (s + f + 2) from the prompt's
    earlier samples (s successes, f failures; a success scores ≥ ``eval.pass_threshold``); unseen prompts
    score 0.5. Ties keep the task's random draw order. INFERRED (the abstract names a hard-focus curriculum;
    the Beta(1, 1) posterior and the give-up rule are ours)."""

    def __init__(self, ctx: HookContext):
        self.params = variant_params(ctx.cfg.algo, "hard_focus")
        self.candidates_per_prompt = self.params.candidates_per_prompt
        self.engine, self.threshold, self.history = ctx.engine, ctx.cfg.eval.pass_threshold, PromptHistory()

    def select_prompts(self, candidates: Sequence[Any], n: int) -> list[Any]:
        successes, failures = self.history.lookup([prompt_key(c) for c in candidates])
        score = (failures + 1.0) / (successes + failures + 2.0)
        score = torch.where((successes == 0) & (failures >= self.params.give_up_after), -1.0, score)
        order = sorted(range(len(candidates)), key=lambda i: -float(score[i]))  # stable: ties keep draw order
        return [candidates[i] for i in order[:n]]

    def finish(self, batch: Scored) -> Scored:
        keys = [prompt_key(batch.examples[i]) for i in batch.rollout.example_index.tolist()]
        successes = (batch.outcome >= self.threshold).float().tolist()
        keys, successes = self.engine.gather_objects(keys, successes)
        self.history.update(keys, successes)
        return batch

    def metrics(self) -> dict[str, float]:
        return {"rollout/selection_seen_prompts": float(len(self.history))}

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history.load_state_dict(state["history"])


@dataclass(frozen=True)
class PairingParams:
    candidates_per_prompt: int = 4
    """Candidates drawn per prompt kept (k)."""


declare_variant("pos_neg_pairing", PairingParams)


class PosNegPairing(HardFocus):
    """Positive–negative pairing (seed #65): every round keeps n/2 *hard-but-solvable* prompts q⁺ (the lowest
    empirical success rate s / (s + f) above 0) and n/2 *easy-but-brittle* prompts q⁻ (the highest rate below
    1), from the prompts' earlier samples (a success scores ≥ ``eval.pass_threshold``). Candidates that fit
    neither (unseen, never or always solved) fill what is left, in the task's random order. Combine with
    ``algo.advantage: weighted_grpo`` for the paper's Weighted GRPO. INFERRED: n/2 of each per round (the
    paper pairs one q⁺ with one q⁻ per update)."""

    def __init__(self, ctx: HookContext):
        super().__init__(ctx)
        self.candidates_per_prompt = variant_params(ctx.cfg.algo, "pos_neg_pairing").candidates_per_prompt

    def select_prompts(self, candidates: Sequence[Any], n: int) -> list[Any]:
        successes, failures = self.history.lookup([prompt_key(c) for c in candidates])
        rate = (successes / (successes + failures).clamp(min=1e-9)).tolist()
        seen = (successes + failures > 0).tolist()
        hard = sorted((i for i in range(len(candidates)) if seen[i] and 0 < rate[i] < 0.5), key=lambda i: rate[i])
        easy = sorted((i for i in range(len(candidates)) if seen[i] and 0.5 <= rate[i] < 1), key=lambda i: -rate[i])
        chosen = hard[:n // 2] + easy[:n - n // 2]
        chosen += [i for i in range(len(candidates)) if i not in chosen][:n - len(chosen)]
        return [candidates[i] for i in chosen]


@dataclass(frozen=True)
class LowLikelihoodParams:
    candidates_per_prompt: int = 4
    """Candidates drawn per prompt kept (k)."""


declare_variant("low_likelihood", LowLikelihoodParams)


class LowLikelihood(RolloutHook):
    """SELF's curation (seed #102): scores each candidate by the current policy's mean log-probability of the
    task's reference answer (``rollout_from_outputs`` at the training temperature) and keeps the lowest. The
    main process's choice is used on every process. INFERRED: the reference answer stands for "a correct
    solution" (the paper scores problems by the likelihood of their correct solutions)."""

    def __init__(self, ctx: HookContext):
        self.ctx = ctx
        self.candidates_per_prompt = variant_params(ctx.cfg.algo, "low_likelihood").candidates_per_prompt
        self.mean_logp = float("nan")

    def select_prompts(self, candidates: Sequence[Any], n: int) -> list[Any]:
        task, cfg = self.ctx.task, self.ctx.cfg
        rows = self.ctx.policy.rollout_from_outputs(list(candidates), [task.reference_output(c) for c in candidates],
                                                    SamplingParams(cfg.rollout.temperature))
        mean = (rows.logp.sum(1) / rows.mask.sum(1).clamp(min=1)).tolist()
        order = sorted(range(len(candidates)), key=lambda i: mean[i])[:n]
        chosen = self.ctx.engine.gather_objects([order])[0][0]  # every process takes the main process's choice
        self.mean_logp = float(np.mean([mean[i] for i in chosen]))
        return [candidates[i] for i in chosen]

    def metrics(self) -> dict[str, float]:
        return {"rollout/selected_reference_logp": self.mean_logp}


@dataclass(frozen=True)
class ReactivateParams:
    share: float = 0.25
    """At most this share of a round's prompts are residual prompts drawn again (INFERRED)."""
    max_reactivations: int = 4
    """A residual prompt still all-correct after this many re-draws leaves the tracker: solved for good
    (INFERRED)."""
    max_prompts: int = 1024
    """Residual prompts tracked at most; the oldest leave first."""
    success_threshold: float = 1.0
    """A row is correct when its outcome is ≥ this (1.0: fully correct), as ``extra.erpo``'s."""


declare_variant("erpo_reactivate", ReactivateParams)


def reactivation_count(queue_size: int, n: int, share: float) -> int:
    """How many of a round's n prompts are residual prompts drawn again: min(queue, ⌊share · n⌋)."""
    return min(queue_size, int(share * n))


class ResidualTracker:
    """ERPO's history tracker of residual prompts: key → (example, re-draws so far), least recently drawn first."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.entries: dict[str, tuple[Any, int]] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def take(self, m: int) -> list[Any]:
        """The m least recently drawn residual prompts; each moves to the back with one more re-draw."""
        keys = list(self.entries)[:m]
        taken = []
        for key in keys:
            example, count = self.entries.pop(key)
            self.entries[key] = (example, count + 1)
            taken.append(example)
        return taken

    def observe(self, key: str, example: Any, all_correct: bool, max_reactivations: int) -> str:
        """A group of the prompt was just trained: an all-correct one enters (or stays, until it was re-drawn
        ``max_reactivations`` times); a mixed or failed one leaves. Returns what happened: "entered", "kept",
        "retired", "revived" (a tracked prompt's group is no longer all-correct) or "none"."""
        if key in self.entries:
            if not all_correct:
                del self.entries[key]
                return "revived"
            if self.entries[key][1] >= max_reactivations:
                del self.entries[key]
                return "retired"
            return "kept"
        if not all_correct:
            return "none"
        self.entries[key] = (example, 0)
        while len(self.entries) > self.capacity:
            del self.entries[next(iter(self.entries))]
        return "entered"


class ErpoReactivate(RolloutHook):
    """ERPO's "Reactivate Training Signal" (seed #113, arXiv 2511.04800). A history tracker keeps every training
    prompt whose last group was all-correct (every row ≥ ``success_threshold``): a *residual* prompt, which GRPO
    gives no signal. Each round, the trainer draws ``prompts_per_step`` candidates and this selector replaces
    m = min(tracked, ⌊``share`` · n⌋) of them by the least recently drawn residual prompts, so residual prompts
    are trained again instead of being left behind. A reactivated prompt whose group is now mixed has its signal
    back and leaves the tracker; one still all-correct after ``max_reactivations`` re-draws is retired. With
    ``algo.temperature_schedule: erpo`` (the sweep arm ``erpo_full``) each residual prompt is drawn at its raised
    temperature, ERPO's exploration, which is what makes a re-draw likely to fail somewhere. The tracker (the
    examples themselves) is gathered over processes and checkpointed (pickled under
    ``<run>/hook_state/erpo_reactivate``).

    INFERRED (the abstract and the paper's summaries name the component, not its form): re-drawing tracked
    prompts into later rounds, the share per round, the least-recently-drawn order, the retirement rule."""

    candidates_per_prompt = 1

    def __init__(self, ctx: HookContext):
        self.ctx, self.params = ctx, variant_params(ctx.cfg.algo, "erpo_reactivate")
        p = self.params
        if not 0 <= p.share <= 1 or p.max_reactivations < 1 or p.max_prompts < 1:
            raise ConfigError(f"algo.extra.erpo_reactivate: need 0 <= share <= 1, max_reactivations >= 1 and "
                              f"max_prompts >= 1; got {p}")
        if ctx.out is None:
            raise ValueError("algo.prompt_selection: erpo_reactivate keeps its tracker in the run folder: it needs one")
        self.folder = ctx.out / HOOK_STATE_DIR / "erpo_reactivate"
        self.tracker = ResidualTracker(p.max_prompts)
        self.steps = 0
        self.counts: dict[str, int] = {}

    def select_prompts(self, candidates: Sequence[Any], n: int) -> list[Any]:
        residual = self.tracker.take(reactivation_count(len(self.tracker), n, self.params.share))
        keys = {prompt_key(e) for e in residual}
        fresh = [c for c in candidates if prompt_key(c) not in keys]
        self.counts["reactivated"] = self.counts.get("reactivated", 0) + len(residual)
        return residual + fresh[:n - len(residual)]

    def finish(self, batch: Scored) -> Scored:
        self.steps += 1
        p = self.params
        correct = all_correct_groups(batch.outcome, batch.rollout.example_index, len(batch.examples),
                                     p.success_threshold).tolist()
        keys, examples, correct = self.ctx.engine.gather_objects([prompt_key(e) for e in batch.examples],
                                                                 list(batch.examples), correct)
        for key, example, flag in zip(keys, examples, correct):
            what = self.tracker.observe(key, example, flag, p.max_reactivations)
            self.counts[what] = self.counts.get(what, 0) + 1
        return batch

    def metrics(self) -> dict[str, float]:
        out = {"rollout/residual_prompts": float(len(self.tracker)),
               "rollout/reactivated_prompts": float(self.counts.get("reactivated", 0)),
               "rollout/reactivated_revived": float(self.counts.get("revived", 0))}
        self.counts = {}
        return out

    def state_dict(self) -> dict[str, Any]:
        return save_state_file(self.folder, self.steps, self.ctx.engine.rank,
                               {"steps": self.steps, "entries": self.tracker.entries}, self.ctx.cfg.checkpoint.keep_last)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = load_state_file(self.folder, state, self.ctx.engine.rank, "algo.prompt_selection: erpo_reactivate")
        self.steps, self.tracker.entries = saved["steps"], saved["entries"]


PROMPT_SELECTORS.register("erpo_reactivate", ErpoReactivate)
PROMPT_SELECTORS.register("hard_focus", HardFocus)
PROMPT_SELECTORS.register("low_likelihood", LowLikelihood)
PROMPT_SELECTORS.register("pos_neg_pairing", PosNegPairing)
ROLLOUT_HOOKS.register("prompt_selection", HookSpec(lambda cfg: cfg.algo.prompt_selection != "uniform",
                                                    lambda ctx: PROMPT_SELECTORS.get(ctx.cfg.algo.prompt_selection)(ctx)))
