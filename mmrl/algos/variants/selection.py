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
from mmrl.core.registry import Registry
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


PROMPT_SELECTORS.register("hard_focus", HardFocus)
PROMPT_SELECTORS.register("low_likelihood", LowLikelihood)
PROMPT_SELECTORS.register("pos_neg_pairing", PosNegPairing)
ROLLOUT_HOOKS.register("prompt_selection", HookSpec(lambda cfg: cfg.algo.prompt_selection != "uniform",
                                                    lambda ctx: PROMPT_SELECTORS.get(ctx.cfg.algo.prompt_selection)(ctx)))
