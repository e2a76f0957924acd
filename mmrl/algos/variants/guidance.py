"""Guidance for prompts the policy cannot solve yet (issue 24): SEELE, AMPO, EAPO and FEST.

Each is a registered hook (``mmrl.algos.hooks``), turned on by its ``algo.<name>`` flag, with typed
hyper-parameters in ``algo.extra.<name>``; the formulas they rest on are the pure functions below, which the
tests check against golden numbers (docs/algorithms.md, "Paper variants").

- ``seele`` (SEELE, seed #99), a rollout hook: every group is drawn in rounds, each with a prefix of the
  reference answer (a hint) whose length is chosen per prompt from an item-response fit of success against
  hint fraction, so that the predicted success rate is ``target``; the fits' data are checkpointed.
- ``ampo`` (AMPO, seed #108), a rollout hook: for groups whose samples all fail, answers of one or more
  teachers (another checkpoint folder, or ``reference``: the task's reference answer) replace some rows,
  the ones the student comprehends best first, trained with the teacher's probability taken as 1.
- ``eapo`` (EAPO, seed #93), a rollout hook: earlier successful answers of a prompt (a per-prompt buffer,
  checkpointed) replace rows of its groups that all fail, importance-corrected by their stored behaviour
  log-probabilities.
- ``fest`` (FEST, seed #46), a loss hook: an SFT term on a fixed handful of demonstrations, added at every
  optimizer step with a weight that decays over training.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mmrl.algos.hooks import LOSS_HOOKS, ROLLOUT_HOOKS, Draw, HookContext, HookSpec, LossHook, Round, RolloutHook, \
    UpdateIndex
from mmrl.algos.variants.history import prompt_key
from mmrl.algos.variants.params import declare_variant, variant_params
from mmrl.core.contracts import Prefixed, hint_prefix
from mmrl.core.rollout import Rollout, SamplingParams, derive_seed
from mmrl.core.scored import Scored
from mmrl.core.typed import ConfigError


# ------------------------------------------------------------------------------------------------
# Shared: which groups failed, and replacing some of a group's rows

def failed_groups(outcome: Tensor, example_index: Tensor, num_examples: int, threshold: float) -> list[int]:
    """The examples none of whose rows scores above ``threshold`` (outcome [N], example_index [N])."""
    best = torch.full((num_examples,), -torch.inf).scatter_reduce(0, example_index, outcome.float(), reduce="amax")
    return [g for g in range(num_examples) if best[g] <= threshold]


def replace_rows(part: Scored, new: Scored, counts: dict[int, int]) -> Scored:
    """``part`` with the last ``counts[g]`` rows of each group g dropped and ``new``'s rows (same examples)
    added. The rows of a group that all failed are exchangeable, so dropping the last ones is a uniform choice."""
    keep = torch.ones(part.rollout.num_rows, dtype=torch.bool)
    for group, count in counts.items():
        rows = (part.rollout.example_index == group).nonzero().squeeze(1)
        keep[rows[len(rows) - count:]] = False
    index = keep.nonzero().squeeze(1)
    kept = Scored(part.rollout.select(index), part.examples, [part.results[i] for i in index.tolist()],
                  part.outcome[index], part.rewards[index])
    return kept.extend(new)


def text_references(task: Any, example: Any, variant: str) -> str:
    """The task's reference answer for ``example``, which must be text (a hint is a prefix of it)."""
    reference = task.reference_output(example)
    if not isinstance(reference, str):
        raise ValueError(f"algo.{variant} needs text reference answers; the task's reference_output gives a "
                         f"{type(reference).__name__}")
    return reference


# ------------------------------------------------------------------------------------------------
# SEELE: hint length per prompt from an item-response fit

def irt_success(hint: Tensor, difficulty: Tensor | float, slope: float) -> Tensor:
    """P(success | hint fraction h) = σ(slope · (h − difficulty)): a two-parameter logistic item-response curve
    in the hint fraction (more hint, easier item); ``difficulty`` is the fraction at which P = 1/2."""
    return torch.sigmoid(slope * (hint - difficulty))


DIFFICULTY_GRID = torch.linspace(-2.0, 3.0, 1001, dtype=torch.float64)
"""Where :func:`fit_difficulty` searches (steps of 0.005 in hint-fraction units)."""


def fit_difficulty(hints: Tensor, successes: Tensor, slope: float, prior_mean: float, prior_std: float) -> float:
    """The MAP difficulty b of a prompt from its (hint fraction, success ∈ [0, 1]) pairs [K]:
    argmax_b Σ_k s_k log σ(a(h_k − b)) + (1 − s_k) log σ(−a(h_k − b)) − (b − μ)² / 2σ²,
    on a fixed grid
    (deterministic; the prior keeps all-success or all-failure data finite)."""
    b = DIFFICULTY_GRID[:, None]  # [G, 1]
    z = slope * (hints.double()[None, :] - b)  # [G, K]
    s = successes.double()[None, :]
    log_likelihood = (s * torch.nn.functional.logsigmoid(z) + (1 - s) * torch.nn.functional.logsigmoid(-z)).sum(1)
    log_posterior = log_likelihood - (DIFFICULTY_GRID - prior_mean) ** 2 / (2 * prior_std ** 2)
    return float(DIFFICULTY_GRID[int(torch.argmax(log_posterior))])


def hint_for_target(difficulty: float, slope: float, target: float) -> float:
    """The hint fraction whose predicted success is ``target``: b + logit(target) / a, clipped to [0, 1]."""
    return min(max(difficulty + math.log(target / (1 - target)) / slope, 0.0), 1.0)


@dataclass(frozen=True)
class SeeleParams:
    rounds: int = 2
    """Rollout rounds per group; the group's samples are split evenly over them (SEELE's multi-round sampling)."""
    target: float = 0.5
    """Success rate the hint length aims at (INFERRED: 0.5, where p(1 − p), the group's reward variance, peaks)."""
    slope: float = 8.0
    """Discrimination a of the item-response curve in hint-fraction units (INFERRED: fixed, only b is fitted)."""
    prior_mean: float = 0.0
    """Prior mean of a prompt's difficulty b: 0 = solvable half the time without a hint (INFERRED)."""
    prior_std: float = 0.5
    """Prior std of b (keeps the fit finite with few or one-sided observations; INFERRED)."""
    max_history: int = 16
    """(hint, success) pairs kept per prompt, newest first (earlier steps' pairs seed a step's first round)."""
    success_threshold: float = 1.0
    """A sample counts as a success when its score is at least this."""


declare_variant("seele", SeeleParams)


class Seele(RolloutHook):
    """SEELE (seed #99): every group is drawn in ``rounds`` rounds. A round's samples start with a hint, the
    first round(h · |y*|) characters of the reference answer y* written as the start of the answer (context,
    not decisions: ``Prefixed``), and the task scores hint + continuation. Before each round, h for a prompt is
    ``hint_for_target`` of ``fit_difficulty`` over the prompt's (h, success) pairs: those of earlier steps
    (checkpointed) and of this step's earlier rounds. The rows are trained as drawn (on-policy for the hinted
    context); evaluation draws no hints.

    INFERRED (the abstract names an item-response fit, not its form): a logistic curve in the hint fraction with
    a fixed slope and a Gaussian prior on the difficulty, character-level hints, pairs kept across steps.
    Rounds before the last are scored here to fit the next; the trainer scores the rows again (a verifier call
    per row and round, no extra generation)."""

    def __init__(self, ctx: HookContext):
        self.ctx, self.params = ctx, variant_params(ctx.cfg.algo, "seele")
        text_references(ctx.task, ctx.task.sample_batch("train", 1, np.random.default_rng(0))[0], "seele")
        self.pairs: dict[str, list[tuple[float, float]]] = {}  # prompt key → (hint, success), newest first
        self.pending: list[tuple[str, float, float]] = []  # this step's pairs, added to ``pairs`` in ``finish``
        self.hint_sum, self.rows = 0.0, 0

    def next_hint(self, pairs: Sequence[tuple[float, float]]) -> float:
        p = self.params
        if not pairs:
            return hint_for_target(p.prior_mean, p.slope, p.target)
        hints, successes = torch.tensor(pairs, dtype=torch.float64).T
        return hint_for_target(fit_difficulty(hints, successes, p.slope, p.prior_mean, p.prior_std), p.slope, p.target)

    def draw(self, examples, group_size, sampling, seed, inner: Draw) -> Rollout:
        p, task = self.params, self.ctx.task
        keys = [prompt_key(e) for e in examples]
        seen = {k: list(self.pairs.get(k, [])) for k in keys}  # newest first, this step's rounds included
        references = [text_references(task, e, "seele") for e in examples]
        rounds = min(p.rounds, group_size)
        parts = []
        for r in range(rounds):
            size = group_size // rounds + (r < group_size % rounds)
            prefixes = [hint_prefix(ref, self.next_hint(seen[k][:p.max_history])) for k, ref in zip(keys, references)]
            hinted = [Prefixed(e, h) for e, h in zip(examples, prefixes)]
            drawn = inner(hinted, size, sampling, derive_seed(seed, 99, r))
            which = drawn.example_index.tolist()
            drawn = drawn.replace(outputs=[prefixes[i] + str(o) for i, o in zip(which, drawn.outputs)])
            outcome = self.ctx.score(drawn, list(examples)).outcome
            for i, score in zip(which, outcome.tolist()):
                pair = (len(prefixes[i]) / max(len(references[i]), 1), float(score >= p.success_threshold))
                seen[keys[i]].insert(0, pair)
                self.pending.append((keys[i], *pair))
                self.hint_sum += pair[0]
            self.rows += len(which)
            parts.append(drawn)
        rollout = Rollout.concat(parts)
        return rollout.select(torch.argsort(rollout.example_index, stable=True))

    def finish(self, batch: Scored) -> Scored:
        keys, hints, successes = self.ctx.engine.gather_objects(*map(list, zip(*self.pending))) if self.pending \
            else self.ctx.engine.gather_objects([], [], [])
        for key, hint, success in zip(keys, hints, successes):
            self.pairs[key] = [(hint, success), *self.pairs.get(key, [])][:self.params.max_history]
        self.pending = []
        return batch

    def metrics(self) -> dict[str, float]:
        engine = self.ctx.engine
        out = {"rollout/seele_hint_mean": engine.sum(self.hint_sum) / max(engine.sum(self.rows), 1.0),
               "rollout/seele_prompts": len(self.pairs)}
        self.hint_sum, self.rows = 0.0, 0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"pairs": {k: [list(pair) for pair in v] for k, v in self.pairs.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pairs = {k: [tuple(pair) for pair in v] for k, v in state["pairs"].items()}


# ------------------------------------------------------------------------------------------------
# AMPO: teachers on demand, the most comprehensible first

def comprehension(logp: Tensor, mask: Tensor) -> Tensor:
    """The student's mean token probability of each given answer ([N, T] → [N]): AMPO's comprehension score
    (INFERRED: over the whole answer; the paper's code scores the probability of the answer span)."""
    return (logp.exp() * mask).sum(1) / mask.sum(1).clamp(min=1)


def select_guidance(scores: Tensor, usable: Tensor, k: int) -> list[int]:
    """Indices of the ``k`` usable candidates ([C] bool) with the highest scores ([C]), best first."""
    order = torch.argsort(scores, descending=True, stable=True).tolist()
    return [i for i in order if bool(usable[i])][:k]


REFERENCE_TEACHER = "reference"


@dataclass(frozen=True)
class AmpoParams:
    teachers: tuple[str, ...] = (REFERENCE_TEACHER,)
    """Each teacher: ``reference`` (the task's reference answer) or a folder saved by the same policy family
    (``save_pretrained``; e.g. a stronger run's ``final/policy``), which answers each failed prompt once."""
    max_rows: int = 4
    """At most this many rows of a failed group are replaced (AMPO: ``n_prefix``), one per teacher."""
    fail_threshold: float = 0.0
    """A group gets guidance when none of its samples scores above this (AMPO: complete on-policy failure)."""
    teacher_temperature: float = 0.0
    """Sampling temperature of checkpoint teachers (0: greedy; INFERRED)."""


declare_variant("ampo", AmpoParams)


class Ampo(RolloutHook):
    """AMPO (seed #108, code SII-Enigma/AMPO): every group whose samples all fail gets the answers of the
    teachers; those the verifier accepts are ranked by the student's comprehension (``comprehension``) and the
    best k = min(accepted, ``max_rows``) replace k of the group's rows. A teacher row is trained as an answer to
    the student's own prompt with π_old = 1 (log π_old = 0), as AMPO's off-policy loss takes the teacher's
    probability as 1: the PPO ratio is π_θ(y_t), at most 1, so the upper clip never binds and the gradient is
    A · ∇π_θ(y_t). Groups with any success are left alone (guidance on demand).

    Not built: AMPO's reshaping of that ratio, π_θ / (π_θ + γ) (from LUFFY), which would need a per-row
    objective; its advantage is the group's GRPO advantage as in its ``grpo`` recipe."""

    def __init__(self, ctx: HookContext):
        self.ctx, self.params = ctx, variant_params(ctx.cfg.algo, "ampo")
        if not self.params.teachers:
            raise ConfigError("algo.extra.ampo.teachers is empty: name 'reference' or checkpoint folders")
        self.models = {name: self.load_teacher(name) for name in self.params.teachers if name != REFERENCE_TEACHER}
        self.guided = self.teacher_rows = 0
        self.comprehension_sum = 0.0

    def load_teacher(self, folder: str) -> Any:
        """A copy of the student with a teacher's weights (same architecture) from ``folder``."""
        if not Path(folder).is_dir():
            raise ConfigError(f"algo.extra.ampo.teachers: {folder!r} is neither 'reference' nor a folder saved "
                              f"by save_pretrained")
        teacher = copy.deepcopy(self.ctx.policy)
        teacher.load_weights(folder)
        return teacher.eval().requires_grad_(False)

    def teacher_answers(self, examples: list[Any], seed: int) -> list[list[Any]]:
        """For each example, one answer per teacher, in ``teachers`` order."""
        sampling = SamplingParams(self.params.teacher_temperature, self.ctx.cfg.rollout.top_p,
                                  self.ctx.cfg.rollout.max_new_tokens)
        answers: list[list[Any]] = [[] for _ in examples]
        for t, name in enumerate(self.params.teachers):
            if name == REFERENCE_TEACHER:
                drawn = [self.ctx.task.reference_output(e) for e in examples]
            else:
                rollout = self.models[name].rollout(examples, 1, sampling, derive_seed(seed, 108, t))
                drawn = [rollout.outputs[i] for i in torch.argsort(rollout.example_index, stable=True).tolist()]
            for i, answer in enumerate(drawn):
                answers[i].append(answer)
        return answers

    def refine(self, part: Scored, round_: Round) -> Scored:
        p = self.params
        failed = failed_groups(part.outcome, part.rollout.example_index, len(part.examples), p.fail_threshold)
        if not failed:
            return part
        answers = self.teacher_answers([part.examples[g] for g in failed], round_.seed)
        groups = [g for g, options in zip(failed, answers) for _ in options]
        candidates = self.ctx.policy.rollout_from_outputs([part.examples[g] for g in groups],
                                                          [a for options in answers for a in options], round_.sampling)
        index = torch.tensor(groups, dtype=torch.long)
        scored = self.ctx.score(candidates.replace(logp=torch.zeros_like(candidates.logp), example_index=index,
                                                   group_id=index.clone()), part.examples)
        understood = comprehension(candidates.logp, candidates.mask)
        chosen, counts = [], {}
        for g in failed:
            mine = (index == g).nonzero().squeeze(1)
            size = int((part.rollout.example_index == g).sum())
            best = mine[select_guidance(understood[mine], scored.outcome[mine] > p.fail_threshold,
                                        min(p.max_rows, size))].tolist()
            chosen += best
            if best:
                counts[g] = len(best)
        if not chosen:
            return part
        self.guided += len(counts)
        self.teacher_rows += len(chosen)
        self.comprehension_sum += float(understood[chosen].sum())
        return replace_rows(part, subset(scored, chosen), counts)

    def metrics(self) -> dict[str, float]:
        engine = self.ctx.engine
        rows = engine.sum(self.teacher_rows)
        out = {"rollout/ampo_guided_groups": engine.sum(self.guided), "rollout/ampo_teacher_rows": rows,
               "rollout/ampo_comprehension": engine.sum(self.comprehension_sum) / max(rows, 1.0)}
        self.guided = self.teacher_rows = 0
        self.comprehension_sum = 0.0
        return out


def subset(scored: Scored, rows: list[int]) -> Scored:
    """Rows ``rows`` of ``scored``, keeping its examples and example indices (unlike ``Scored.select``)."""
    index = torch.tensor(rows, dtype=torch.long)
    return Scored(scored.rollout.select(index), scored.examples, [scored.results[i] for i in rows],
                  scored.outcome[index], scored.rewards[index])


# ------------------------------------------------------------------------------------------------
# EAPO: replay of a prompt's earlier successes, importance-corrected

@dataclass(frozen=True)
class Experience:
    """One successful answer of a prompt and its behaviour log-probs (the policy that drew it, per decision)."""

    output: str
    logp: tuple[float, ...]
    version: int  # optimizer steps of the policy that drew it


class ExperienceBuffer:
    """Per prompt, the newest ``size`` distinct successful answers; JSON-able state for exact resume."""

    def __init__(self, size: int):
        self.size, self.entries = size, {}

    def add(self, key: str, experience: Experience) -> None:
        older = [e for e in self.entries.get(key, []) if e.output != experience.output]
        self.entries[key] = [experience, *older][:self.size]

    def get(self, key: str) -> list[Experience]:
        return self.entries.get(key, [])

    def __len__(self) -> int:
        return len(self.entries)

    def state_dict(self) -> dict[str, Any]:
        return {k: [[e.output, list(e.logp), e.version] for e in v] for k, v in self.entries.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.entries = {k: [Experience(o, tuple(lp), ver) for o, lp, ver in v] for k, v in state.items()}


def behaviour_logp(experiences: Sequence[Experience], mask: Tensor) -> Tensor:
    """The stored log-probs as a [N, T] tensor aligned with ``mask`` (the answers re-tokenised now); a length
    that differs from the mask's is an error (the tokeniser changed under the buffer)."""
    out = torch.zeros_like(mask)
    for i, experience in enumerate(experiences):
        n = int(mask[i].sum())
        if n != len(experience.logp):
            raise ValueError(f"eapo: a replayed answer has {n} decisions now but {len(experience.logp)} when stored")
        out[i, :n] = torch.tensor(experience.logp, dtype=out.dtype)
    return out


@dataclass(frozen=True)
class EapoParams:
    replay_rows: int = 1
    """At most this many rows of a failed group are replaced by the prompt's stored successes."""
    buffer_size: int = 2
    """Successful answers kept per prompt (newest first, distinct)."""
    fail_threshold: float = 0.0
    """A group gets experience when none of its samples scores above this."""
    success_threshold: float = 1.0
    """A sample is stored as experience when its score is at least this."""


declare_variant("eapo", EapoParams)


class Eapo(RolloutHook):
    """EAPO (seed #93), experience replay with importance sampling: every sampled answer scoring at least
    ``success_threshold`` is stored for its prompt with its behaviour log-probs log μ(y_t) (the policy that drew
    it, scored by ``rollout_from_outputs`` so that replay re-tokenises it identically). When a later group of
    that prompt fails entirely, up to ``replay_rows`` of its rows are replaced by the stored answers, newest
    first, with π_old = μ: the PPO ratio π_θ(y_t) / μ(y_t) is the importance weight from the earlier policy to
    the current one, clipped like any other. The buffer is gathered over processes and checkpointed.

    INFERRED / not built: the abstract's experience prior is a prior RL-optimised *policy* injected at critical
    decision points during rollout; here, as the issue describes it, experience is whole earlier trajectories
    of the same prompt, replayed only where the policy now fails."""

    def __init__(self, ctx: HookContext):
        self.ctx, self.params = ctx, variant_params(ctx.cfg.algo, "eapo")
        self.buffer = ExperienceBuffer(self.params.buffer_size)
        self.replayed = self.stored = 0

    def refine(self, part: Scored, round_: Round) -> Scored:
        keys = [prompt_key(e) for e in part.examples]
        stored = self.store_successes(part, keys, round_.sampling)
        failed = failed_groups(part.outcome, part.rollout.example_index, len(part.examples),
                               self.params.fail_threshold)
        picks = [(g, e) for g in failed for e in self.buffer.get(keys[g])[:self.params.replay_rows]]
        self.add_to_buffer(stored)  # this round's successes are replayed from the next round on
        if not picks:
            return part
        groups = [g for g, _ in picks]
        rows = self.ctx.policy.rollout_from_outputs([part.examples[g] for g in groups], [e.output for _, e in picks],
                                                    round_.sampling)
        index = torch.tensor(groups, dtype=torch.long)
        rows = rows.replace(logp=behaviour_logp([e for _, e in picks], rows.mask), example_index=index,
                            group_id=index.clone())
        self.replayed += len(picks)
        return replace_rows(part, self.ctx.score(rows, part.examples), {g: groups.count(g) for g in set(groups)})

    def store_successes(self, part: Scored, keys: list[str], sampling: SamplingParams) -> list[tuple[str, Experience]]:
        """This round's successful answers with their behaviour log-probs (the weights that drew them)."""
        rows = (part.outcome >= self.params.success_threshold).nonzero().squeeze(1).tolist()
        rows = [i for i in rows if isinstance(part.rollout.outputs[i], str)]
        if not rows:
            return []
        groups = part.rollout.example_index[rows].tolist()
        scored = self.ctx.policy.rollout_from_outputs([part.examples[g] for g in groups],
                                                      [part.rollout.outputs[i] for i in rows], sampling)
        lengths = scored.mask.sum(1).long().tolist()
        return [(keys[g], Experience(scored.outputs[j], tuple(scored.logp[j, :lengths[j]].tolist()),
                                     scored.policy_version)) for j, g in enumerate(groups)]

    def add_to_buffer(self, stored: list[tuple[str, Experience]]) -> None:
        (everything,) = self.ctx.engine.gather_objects(stored)
        for key, experience in everything:
            self.buffer.add(key, experience)
        self.stored += len(stored)

    def metrics(self) -> dict[str, float]:
        engine = self.ctx.engine
        out = {"rollout/eapo_replayed_rows": engine.sum(self.replayed), "rollout/eapo_prompts": len(self.buffer)}
        self.replayed = self.stored = 0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": self.buffer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer.load_state_dict(state["buffer"])


# ------------------------------------------------------------------------------------------------
# FEST: few-shot SFT with a decaying weight

def fest_weight(step: int, coef: float, decay: float) -> float:
    """The SFT weight at optimizer-step ``step`` (1-based): coef · decay^(step − 1)."""
    return coef * decay ** (step - 1)


@dataclass(frozen=True)
class FestParams:
    demonstrations: int = 128
    """Size of the fixed few-shot set (FEST: 128 demonstrations drawn at random from an SFT dataset)."""
    batch_size: int = 16
    """Demonstrations per SFT term (one term per optimizer step)."""
    coef: float = 1.0
    """Weight of the SFT term at the first step (INFERRED)."""
    decay: float = 0.95
    """Per-step factor of the weight: coef · decay^(step − 1) (INFERRED: exponential decay)."""


declare_variant("fest", FestParams)


class Fest(LossHook):
    """FEST (seed #46): ``demonstrations`` examples of the task's training split, drawn once from the run's seed,
    with their reference answers, are a fixed few-shot SFT set. At every optimizer step, ``fest_weight(step)`` ×
    the policy's ``sft_loss`` on ``batch_size`` of them is added to the RL loss: supervised and on-policy
    signal together, the supervised weight decaying so that the many epochs over so few demonstrations do not
    overfit. The draw of a step's demonstrations is seeded by the step, so a resumed run repeats it."""

    def __init__(self, ctx: HookContext):
        self.ctx, self.params = ctx, variant_params(ctx.cfg.algo, "fest")
        rng = np.random.default_rng(derive_seed(ctx.cfg.trainer.seed, 46))
        self.demos = ctx.task.sample_batch("train", self.params.demonstrations, rng)
        self.targets = [ctx.task.reference_output(e) for e in self.demos]
        self.weight = 0.0

    def update_term(self, index: UpdateIndex) -> tuple[Tensor, dict[str, float]] | None:
        p = self.params
        self.weight = fest_weight(index.step, p.coef, p.decay)
        generator = np.random.default_rng(derive_seed(self.ctx.cfg.trainer.seed, index.step, index.epoch,
                                                      index.minibatch, 46))
        pick = generator.choice(len(self.demos), min(p.batch_size, len(self.demos)), replace=False).tolist()
        with self.ctx.engine.autocast():
            loss = self.ctx.policy.sft_loss([self.demos[i] for i in pick], [self.targets[i] for i in pick]).float()
        return self.weight * loss, {"loss/fest_sft": loss.item()}

    def metrics(self) -> dict[str, float]:
        return {"policy/fest_weight": self.weight}


ROLLOUT_HOOKS.register("seele", HookSpec(lambda cfg: cfg.algo.seele, Seele))
ROLLOUT_HOOKS.register("ampo", HookSpec(lambda cfg: cfg.algo.ampo, Ampo))
ROLLOUT_HOOKS.register("eapo", HookSpec(lambda cfg: cfg.algo.eapo, Eapo))
LOSS_HOOKS.register("fest", HookSpec(lambda cfg: cfg.algo.fest, Fest))
