"""The built-in hooks (``mmrl.algos.hooks``), in the order they apply.

Rollout hooks — ``draw`` wrappers nest first-outermost, ``refine`` runs in this order:

- ``answer_prefix`` (TFPI): samples drawn with the answer's first text already written (``algo.answer_prefix``);
- ``param_noise`` (PSN-RLVR): rollouts from perturbed weights (``rollout.param_noise_std`` > 0);
- ``tool_turns`` (tool calls, issue 25): each row continued as an episode whose tool calls the task answers, every
  turn a row carrying the episode's score (``algo.tool_turns``); before the hooks that read outcomes;
- ``reference_rows`` (ViSurf): the task's reference output joins each group (``rollout.reference_rows`` > 0);
- ``prompt_temperature`` (ERPO): each prompt sampled at its own temperature (``algo.temperature_schedule``),
  its table updated from the round's rows, reference rows included;
- ``guide`` (Guide): groups that all failed are drawn again with a hint, trained without it (``algo.guide``);
- ``feedback_turns`` (multi-turn feedback): failed rows answered again after the task's feedback
  (``algo.feedback_turns``);
- ``rollout_strategy`` (AERO): more samples for some prompts, then a row selection (``algo.rollout_strategy``);
- ``dynamic_sampling`` (DAPO): rounds of new prompts until enough groups carry signal (``algo.dynamic_sampling``);
- ``keep_successes`` (RLoop): the step's rows that succeeded, kept on disk for a later ``rft`` stage
  (``rollout.keep_successes``);
- ``prompt_history`` (MSSR / AERO's Beta posterior): per-prompt outcome counts for the estimator;
- ``output_classes`` (Polychromic PPO): which rows of a group decoded to the same output;
- then ``polychromic_vine`` (Polychromic PPO's vine sampling, ``mmrl/algos/variants/vine.py``): groups of
  continuations from a state inside a sampled answer (``algo.extra.polychromic.vine_states``);
- then those of ``mmrl/algos/variants/guidance.py``: ``seele`` (hinted rounds), ``ampo`` (teacher rows),
  ``eapo`` (replayed successes); then those of ``mmrl/algos/variants/programs.py``: ``npo`` (a later
  checkpoint's rows), ``scope_rl`` (prefix credit / process shape).

Loss hooks, in the order their terms are added:

- ``loss_terms`` (CalibRL, PACS, FRPO): registered per-token / per-sequence terms (``algo.loss_terms``), with expert rows when needed;
- ``behaviour_cloning`` (VLA-RFT): drift-gated BC on the warm start's examples (``algo.bc_coef`` > 0);
- ``dyme`` (DyME): SFT on the reference for groups whose rollouts all failed (``algo.dyme``);
- ``rehearsal`` (DPH-RL): an f-divergence to π_0 on its own always-solved samples (``algo.rehearsal_divergence``);
- then ``fest`` (FEST, ``mmrl/algos/variants/guidance.py``): decaying SFT on a fixed few-shot set (``algo.fest``).
- then ``recap`` (RECAP, ``mmrl/algos/variants/programs.py``): replay of the warm start's data, reweighted each step
  (``algo.recap``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
import itertools
import os
import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mmrl.algos.aggregation import aggregate
from mmrl.algos.hooks import (LOSS_HOOKS, ROLLOUT_HOOKS, Draw, HookContext, HookSpec, LossHook, MicroBatch, Round,
                              RolloutHook, UpdateIndex)
from mmrl.algos.regularizers import drift_gate
from mmrl.algos.sampling import groups_with_signal
from mmrl.algos.variants.adaptive_sampling import ROLLOUT_STRATEGIES
from mmrl.algos.variants.divergences import REHEARSAL_DIVERGENCES
from mmrl.algos.variants.history import PromptHistory, prompt_key
from mmrl.algos.variants.loss_terms import LOSS_TERMS, LossTermInputs, LossTermRows, group_counts
from mmrl.algos.variants.param_noise import perturbed_parameters
from mmrl.algos.variants.params import algo_needs, declare_variant, variant_params
from mmrl.algos.variants.prompt_temperature import TEMPERATURE_SCHEDULES, PromptTemperatures
from mmrl.core.contracts import FeedbackTask, FollowUp, HintedTask, Prefixed, ToolTask, turns_of
from mmrl.core.episodes import episode_results, run_tool_episodes, tool_metrics
from mmrl.core.rollout import Rollout, SamplingParams, derive_seed
from mmrl.core.scored import Scored


def training_sampling(cfg: Any) -> SamplingParams:
    return SamplingParams(cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_new_tokens)


# ------------------------------------------------------------------------------------------------
# Rollout hooks

class ParamNoise(RolloutHook):
    """PSN-RLVR (arXiv 2602.02555): each draw from θ + N(0, σ²) noise, one noise draw per call."""

    def __init__(self, ctx: HookContext):
        self.policy, self.std = ctx.policy, ctx.cfg.rollout.param_noise_std

    def draw(self, examples, group_size, sampling, seed, inner: Draw) -> Rollout:
        with perturbed_parameters(self.policy, self.std, derive_seed(seed, 13)):
            return inner(examples, group_size, sampling, seed)


class PromptTemperature(RolloutHook):
    """Per-prompt sampling temperatures (``algo.temperature_schedule``; ERPO). A round's groups are drawn at
    the temperatures its prompts had when it began, one sampling call per distinct temperature; the table is
    updated from each round's outcomes and checkpointed."""

    def __init__(self, ctx: HookContext):
        self.cfg, self.engine = ctx.cfg, ctx.engine
        self.schedule = TEMPERATURE_SCHEDULES.get(ctx.cfg.algo.temperature_schedule)
        self.table = PromptTemperatures()
        self.current: dict[str, float] = {}  # this round's prompts → their temperature
        self.temperature_sum, self.rounds = 0.0, 0

    def begin_round(self, examples: Sequence[Any]) -> None:
        keys = [prompt_key(e) for e in examples]
        temperatures = self.table.lookup(keys, self.cfg.rollout.temperature)
        self.current = dict(zip(keys, temperatures.tolist()))
        self.temperature_sum += float(temperatures.mean())
        self.rounds += 1

    def draw(self, examples, group_size, sampling, seed, inner: Draw) -> Rollout:
        temperatures = torch.tensor([self.current[prompt_key(e)] for e in examples], dtype=torch.float64)
        if bool((temperatures == sampling.temperature).all()):
            return inner(examples, group_size, sampling, seed)
        parts = []
        for value in sorted(set(temperatures.tolist())):
            chosen = (temperatures == value).nonzero().squeeze(1)
            part = inner([examples[i] for i in chosen.tolist()], group_size,
                         dataclasses.replace(sampling, temperature=value), derive_seed(seed, round(value * 1e6), 23))
            index = chosen[part.example_index]  # back to indices into ``examples``
            parts.append(part.replace(example_index=index, group_id=index.clone()))
        rollout = Rollout.concat(parts)
        return rollout.select(torch.argsort(rollout.example_index, stable=True))

    def refine(self, part: Scored, round_: Round) -> Scored:
        keys = [prompt_key(e) for e in part.examples]
        temperatures = torch.tensor([self.current[k] for k in keys], dtype=torch.float64)
        following = self.schedule(temperatures, part.outcome, part.rollout.example_index, self.cfg.rollout.temperature,
                                  self.cfg.algo)
        self.table.update(*self.engine.gather_objects(keys, following.tolist()), self.cfg.rollout.temperature)
        return part

    def metrics(self) -> dict[str, float]:
        out = {"rollout/temperature_mean": self.engine.mean(self.temperature_sum / self.rounds),
               "rollout/hot_prompts": len(self.table)}
        self.temperature_sum, self.rounds = 0.0, 0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"prompt_temperatures": self.table.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.table.load_state_dict(state["prompt_temperatures"])


class ReferenceRows(RolloutHook):
    """ViSurf (arXiv 2510.10606): ``rollout.reference_rows`` rows per group hold the task's reference output,
    scored by the current policy (π_old is the policy's own probability of the reference). The trainer draws
    ``group_size − reference_rows`` samples per prompt when this hook is on."""

    def __init__(self, ctx: HookContext):
        self.ctx, self.copies = ctx, ctx.cfg.rollout.reference_rows

    def refine(self, part: Scored, round_: Round) -> Scored:
        examples, task = part.examples, self.ctx.task
        index = torch.arange(len(examples)).repeat_interleave(self.copies)
        references = self.ctx.policy.rollout_from_outputs([examples[i] for i in index.tolist()],
                                                          [task.reference_output(examples[i]) for i in index.tolist()],
                                                          round_.sampling)
        return part.extend(self.ctx.score(references.replace(example_index=index, group_id=index.clone()), examples))


@dataclass(frozen=True)
class GuideParams:
    fail_threshold: float = 0.0
    """A group is guided when no sample scores above this (Guide: "all rollouts initially incorrect")."""


declare_variant("guide", GuideParams)


class Guide(RolloutHook):
    """Guide (seed #63, Guide-GRPO): every group of the round whose samples all fail (score ≤
    ``fail_threshold``) is drawn again from the prompt with a hint (``task.hinted(example)``), and those rows
    replace the group. They are trained as answers to the hint-free prompt x: each row's π_old is the
    behaviour policy's, π_old(y | x, hint), so PPO's ratio is π_θ(y | x) / π_old(y | x, hint), the paper's
    correction that optimises the policy for contexts without the hint. Both sides are re-scored with
    ``rollout_from_outputs`` so that they share one tokenisation. The reward is the hint-free example's.

    INFERRED (the abstract does not say): the hinted rows replace the failed group (rather than joining it),
    with the group's own size, and the hint comes from the task (``task.hinted``)."""

    def __init__(self, ctx: HookContext):
        if not isinstance(ctx.task, HintedTask):
            raise ValueError(f"algo.guide needs a task that can give hints (a hinted(example) method); "
                             f"{ctx.cfg.task.name} has none (data/rows-v0 does: task.args.hint_template)")
        ctx.task.hinted(ctx.task.sample_batch("train", 1, np.random.default_rng(0))[0])  # no hints: fail now
        self.ctx, self.params = ctx, variant_params(ctx.cfg.algo, "guide")
        self.guided = self.solved = 0

    def refine(self, part: Scored, round_: Round) -> Scored:
        rollout = part.rollout
        best = torch.full((len(part.examples),), -torch.inf).scatter_reduce(
            0, rollout.example_index, part.outcome.float(), reduce="amax")
        failed = [g for g in range(len(part.examples)) if best[g] <= self.params.fail_threshold]
        if not failed:
            return part
        task, policy, size = self.ctx.task, self.ctx.policy, self.ctx.cfg.rollout.samples_per_group
        hinted = [task.hinted(part.examples[g]) for g in failed]
        drawn = round_.draw(hinted, size, round_.sampling, derive_seed(round_.seed, 63))
        which = drawn.example_index.tolist()
        plain = policy.rollout_from_outputs([part.examples[failed[i]] for i in which], drawn.outputs, round_.sampling)
        behaviour = policy.rollout_from_outputs([hinted[i] for i in which], drawn.outputs, round_.sampling)
        index = torch.tensor([failed[i] for i in which], dtype=torch.long)
        rows = plain.replace(logp=behaviour.logp, example_index=index, group_id=index.clone())
        guided = self.ctx.score(rows, part.examples)
        keep = (~torch.isin(rollout.example_index, torch.tensor(failed))).nonzero().squeeze(1)
        kept = Scored(rollout.select(keep), part.examples, [part.results[i] for i in keep.tolist()],
                      part.outcome[keep], part.rewards[keep])
        self.guided += len(failed)
        self.solved += int(torch.unique(index[guided.outcome > self.params.fail_threshold]).numel())
        return kept.extend(guided)

    def metrics(self) -> dict[str, float]:
        engine = self.ctx.engine
        metrics = {"rollout/guided_groups": engine.sum(self.guided), "rollout/guided_solved": engine.sum(self.solved)}
        self.guided = self.solved = 0
        return metrics


@dataclass(frozen=True)
class FeedbackParams:
    fail_below: float = 1.0
    """A row scoring below this is answered again with the task's feedback."""


declare_variant("feedback_turns", FeedbackParams)


class FeedbackTurns(RolloutHook):
    """Multi-turn feedback-guided RL (seed #28): every row of the round that scores below ``fail_below`` gets
    the task's feedback on its answer (``task.feedback(example, output, result)``) as a user turn after it, and
    the policy answers once more in that context (a :class:`~mmrl.core.contracts.FollowUp`), up to
    ``algo.feedback_turns`` times. Each new answer is a row of its prompt's group, scored against the prompt's
    own reference: its context holds the earlier turns, its decisions are only the new answer's tokens, and
    the group's baseline spans every turn, so an answer that the feedback corrected is credited against the
    first attempts (the paper's cross-turn signal) and the answers of one turn against each other (within-turn).

    INFERRED (the abstract names the mechanisms, not their form): one new answer per failed row, new answers
    joining the prompt's group, feedback as a plain user turn."""

    def __init__(self, ctx: HookContext):
        if not isinstance(ctx.task, FeedbackTask):
            raise ValueError(f"algo.feedback_turns needs a task that can say why an answer is wrong (a "
                             f"feedback(example, output, result) method); {ctx.cfg.task.name} has none")
        self.ctx, self.turns = ctx, ctx.cfg.algo.feedback_turns
        self.params = variant_params(ctx.cfg.algo, "feedback_turns")
        self.asked = self.fixed = 0

    def refine(self, part: Scored, round_: Round) -> Scored:
        context: dict[int, Any] = {}  # row → the example it answered, when that was a later turn
        latest = list(range(part.rollout.num_rows))
        for turn in range(1, self.turns + 1):
            asks = []  # (group, follow-up)
            for i in latest:
                if float(part.outcome[i]) >= self.params.fail_below:
                    continue
                group = int(part.rollout.example_index[i])
                base, output = part.examples[group], part.rollout.outputs[i]
                said = self.ctx.task.feedback(base, output, part.results[i])
                if said is not None:
                    earlier = turns_of(context.get(i, base))
                    asks.append((group, FollowUp(base, (*earlier, ("assistant", str(output)), ("user", said)))))
            if not asks:
                break
            drawn = round_.draw([f for _, f in asks], 1, round_.sampling, derive_seed(round_.seed, 28, turn))
            which = drawn.example_index.tolist()
            index = torch.tensor([asks[j][0] for j in which], dtype=torch.long)
            start = part.rollout.num_rows
            part = part.extend(self.ctx.score(drawn.replace(example_index=index, group_id=index.clone()),
                                              part.examples))
            latest = list(range(start, part.rollout.num_rows))
            context |= {row: asks[j][1] for row, j in zip(latest, which)}
            self.asked += len(latest)
            self.fixed += int((part.outcome[start:] >= self.params.fail_below).sum())
        return part

    def metrics(self) -> dict[str, float]:
        engine = self.ctx.engine
        metrics = {"rollout/feedback_rows": engine.sum(self.asked), "rollout/feedback_fixed": engine.sum(self.fixed)}
        self.asked = self.fixed = 0
        return metrics


class ToolTurns(RolloutHook):
    """Tool calls through the multi-turn contract (issue 25): every row of the round is the first turn of an
    episode (:func:`mmrl.core.episodes.run_tool_episodes`): while its output holds a call, the task's tool answers
    it as the next turn (a :class:`~mmrl.core.contracts.FollowUp`) and the policy continues, up to
    ``algo.tool_turns`` calls; one more ends the episode at the floor of the task's reward range. Only the final
    answer is verified; every turn of the episode is a row of its prompt's group carrying the episode's score
    (its own reward shaping, e.g. the overlong penalty, kept), whose decisions are only that turn's tokens.

    INFERRED (the issue asks only for "the same contract usable for tool calls"): each turn a row of the prompt's
    group, so GRPO's group mean and std run over turns, an episode of k turns weighing k in them, and the
    token-mean loss weighs each turn's tokens alike; tool results as plain user turns."""

    def __init__(self, ctx: HookContext):
        if not isinstance(ctx.task, ToolTask) or not ctx.task.tool_names:
            raise ValueError(f"algo.tool_turns needs a task whose answers may call tools (call(example, output) and "
                             f"reference_turns(example) methods, tools configured, e.g. data/rows-v0's "
                             f"task.args.tools); {ctx.cfg.task.name} has none")
        self.ctx, self.max_calls = ctx, ctx.cfg.algo.tool_turns
        self.floor = float(ctx.task.reward_range[0])
        self.counts: dict[str, float] = {}

    def refine(self, part: Scored, round_: Round) -> Scored:
        episodes = run_tool_episodes(part.rollout, part.examples, self.ctx.task, round_.draw, round_.sampling,
                                     round_.seed, self.max_calls)
        first = part.rollout.num_rows
        if episodes.rollout.num_rows > first:
            later = episodes.rollout.select(torch.arange(first, episodes.rollout.num_rows))
            part = part.extend(self.ctx.score(later, part.examples))
        verdicts = episode_results(episodes, [part.results[i] for i in episodes.final.tolist()], self.floor)
        outcome = torch.tensor([v.score for v in verdicts], dtype=part.outcome.dtype)[episodes.episode]  # [N]
        shaping = part.rewards - part.outcome  # each row's own shaping terms
        metrics = tool_metrics(episodes)
        for key, value in metrics.items():
            self.counts[key] = self.counts.get(key, 0.0) + value * episodes.num_episodes
        self.counts["episodes"] = self.counts.get("episodes", 0.0) + episodes.num_episodes
        return Scored(part.rollout, part.examples, [verdicts[e] for e in episodes.episode.tolist()], outcome,
                      outcome + shaping)

    def metrics(self) -> dict[str, float]:
        engine, counts = self.ctx.engine, self.counts
        total = max(engine.sum(counts.pop("episodes", 0.0)), 1.0)
        self.counts = {}
        return {f"rollout/{key}": engine.sum(value) / total for key, value in sorted(counts.items())}


class AnswerPrefix(RolloutHook):
    """TFPI (seed #86): training samples are drawn with ``algo.answer_prefix`` already written at the start of
    the answer (TFPI's ThinkFree operation appends ``</think>``, discarding the thinking): the prefix is
    context in the row's payload, not decisions, and the task scores prefix + continuation. Evaluation is
    unchanged (the trainer's held-out draws go through no hook), so a ThinkFree stage is measured in the
    ordinary mode, as the paper measures it. INFERRED: the prefix for our ``<think>…</think><answer>…``
    tasks is an empty think block."""

    def __init__(self, ctx: HookContext):
        self.prefix = ctx.cfg.algo.answer_prefix

    def draw(self, examples, group_size, sampling, seed, inner: Draw) -> Rollout:
        rollout = inner([Prefixed(e, self.prefix) for e in examples], group_size, sampling, seed)
        return rollout.replace(outputs=[self.prefix + str(o) for o in rollout.outputs])


class RolloutStrategy(RolloutHook):
    """``algo.rollout_strategy`` (mmrl/algos/variants/adaptive_sampling.py; AERO): draw the extra samples the
    strategy asks for, per example, until it asks for none; then keep the rows it selects."""

    def __init__(self, ctx: HookContext):
        self.ctx, self.strategy = ctx, ROLLOUT_STRATEGIES.get(ctx.cfg.algo.rollout_strategy)

    def refine(self, part: Scored, round_: Round) -> Scored:
        a, examples = self.ctx.cfg.algo, part.examples
        for extra_round in itertools.count(1):  # the strategy bounds the rounds (AERO: its per-prompt budget)
            more = self.strategy.more(part.outcome, part.rollout.example_index, len(examples), a)  # [E]
            if not torch.any(more > 0):
                break
            for count in sorted(set(more[more > 0].tolist())):  # one sampling call per requested count
                asked = (more == count).nonzero().squeeze(1)
                rollout = round_.draw([examples[i] for i in asked.tolist()], count, round_.sampling,
                                      derive_seed(round_.seed, extra_round, count, 11))
                index = asked[rollout.example_index]  # back to indices into ``examples``
                part = part.extend(self.ctx.score(rollout.replace(example_index=index, group_id=index.clone()),
                                                  examples))
        generator = torch.Generator().manual_seed(derive_seed(round_.seed, 12))
        keep = self.strategy.keep(part.outcome, part.rollout.example_index, a, generator)
        return part if bool(keep.all()) else part.select(keep)


class DynamicSampling(RolloutHook):
    """DAPO dynamic sampling: rounds of new prompts until every process holds its share of groups whose
    verifiable outcome varies (at most ``algo.max_gen_rounds``); short batches are filled with flat groups.
    All processes run the same number of rounds."""

    drives_rounds = True

    def __init__(self, ctx: HookContext):
        self.cfg, self.engine = ctx.cfg, ctx.engine
        self.last: dict[str, float] = {}

    def rounds(self, one_round: Callable[[int], Scored]) -> Scored:
        eng, per_rank = self.engine, self.cfg.rollout.prompts_per_step // self.engine.world_size
        kept, dropped, n_dropped = [], [], 0
        for index in range(self.cfg.algo.max_gen_rounds):
            part = one_round(index)
            signal = groups_with_signal(part.outcome, part.rollout.group_id)
            kept.append(part.select(signal))
            dropped.append(part.select(~signal))
            n_dropped += int((~signal).sum()) // self.cfg.rollout.group_size
            if not eng.any(sum(len(b.examples) for b in kept) < per_rank):
                break
        self.last = {"rollout/gen_rounds": index + 1, "rollout/dropped_groups": eng.sum(n_dropped)}
        return Scored.merge(kept + dropped, per_rank)

    def metrics(self) -> dict[str, float]:
        return self.last


class PromptHistoryHook(RolloutHook):
    """Per-prompt success / failure pseudo-counts from earlier steps, for estimators that declare the
    ``prompt_history`` need (``AdvantageInputs.prompt_successes`` / ``prompt_failures``); this step's outcomes
    are added after the lookup, on every process, unless a reward is not finite (the step is skipped)."""

    def __init__(self, ctx: HookContext):
        self.engine, self.history = ctx.engine, PromptHistory()

    def finish(self, batch: Scored) -> Scored:
        keys = [prompt_key(batch.examples[i]) for i in batch.rollout.example_index.tolist()]
        successes, failures = self.history.lookup(keys)
        all_keys, outcomes = self.engine.gather_objects(keys, batch.outcome.tolist())
        if np.isfinite(outcomes).all():
            self.history.update(all_keys, outcomes)
        return dataclasses.replace(batch, row_inputs={**batch.row_inputs, "prompt_successes": successes,
                                                      "prompt_failures": failures})

    def state_dict(self) -> dict[str, Any]:
        return {"prompt_history": self.history.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history.load_state_dict(state["prompt_history"])


def output_key(output: Any) -> str:
    """What makes two outputs "the same" for set diversity: the text itself, else its ``repr``."""
    return output if isinstance(output, str) else repr(output)


class OutputClasses(RolloutHook):
    """For estimators that declare the ``output_classes`` need (Polychromic PPO's set diversity): each row's
    class of equal decoded outputs (``AdvantageInputs.output_class``, [N] long; equal ids = equal outputs)."""

    def __init__(self, ctx: HookContext):
        pass

    def finish(self, batch: Scored) -> Scored:
        ids: dict[str, int] = {}
        classes = [ids.setdefault(output_key(o), len(ids)) for o in batch.rollout.outputs]
        return dataclasses.replace(batch, row_inputs={**batch.row_inputs,
                                                      "output_class": torch.tensor(classes, dtype=torch.long)})


class KeepSuccesses(RolloutHook):
    """RLoop (seed paper #58): the successful trajectories RL explores, kept as an expert set.

    Every step's rows whose verifiable score is at least ``rollout.keep_successes`` are pickled, with their
    examples, to ``<run>/kept/step_<n>.rank<r>.pkl``. A resumed run writes the steps after its checkpoint
    again, identically, so the files stay those of one uninterrupted run. :func:`read_kept` reads them back."""

    def __init__(self, ctx: HookContext):
        if ctx.out is None:
            raise ValueError("rollout.keep_successes needs a run folder to keep its rows in")
        self.folder, self.threshold, self.engine = ctx.out / KEPT_DIR, ctx.cfg.rollout.keep_successes, ctx.engine
        self.step, self.kept = 0, 0

    def finish(self, batch: Scored) -> Scored:
        self.step += 1
        rows = (batch.outcome >= self.threshold).nonzero().squeeze(1).tolist()
        index = batch.rollout.example_index.tolist()
        pairs = [(batch.examples[index[i]], batch.rollout.outputs[i]) for i in rows]
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"step_{self.step}.rank{self.engine.rank}.pkl"
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as f:
            pickle.dump(pairs, f)
        os.replace(tmp, path)
        self.kept = len(pairs)
        return batch

    def metrics(self) -> dict[str, float]:
        return {"rollout/kept_rows": self.engine.sum(self.kept)}

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = state["step"]


KEPT_DIR = "kept"


def read_kept(run: Path, last_step: int) -> list[tuple[Any, Any]]:
    """The (example, output) pairs a run kept (``rollout.keep_successes``) in steps 1..``last_step``, in
    step then process order."""
    files = sorted((run / KEPT_DIR).glob("step_*.rank*.pkl"),
                   key=lambda p: tuple(int(x) for x in p.name[5:-4].split(".rank")))
    pairs = []
    for path in files:
        if int(path.name[5:].split(".")[0]) <= last_step:
            with open(path, "rb") as f:
                pairs += pickle.load(f)
    return pairs


ROLLOUT_HOOKS.register("answer_prefix", HookSpec(lambda cfg: cfg.algo.answer_prefix is not None, AnswerPrefix))
ROLLOUT_HOOKS.register("param_noise", HookSpec(lambda cfg: cfg.rollout.param_noise_std > 0, ParamNoise))
ROLLOUT_HOOKS.register("tool_turns", HookSpec(lambda cfg: cfg.algo.tool_turns > 0, ToolTurns))
ROLLOUT_HOOKS.register("reference_rows", HookSpec(lambda cfg: cfg.rollout.reference_rows > 0, ReferenceRows))
ROLLOUT_HOOKS.register("prompt_temperature", HookSpec(lambda cfg: cfg.algo.temperature_schedule != "fixed",
                                                      PromptTemperature))
ROLLOUT_HOOKS.register("guide", HookSpec(lambda cfg: cfg.algo.guide, Guide))
ROLLOUT_HOOKS.register("feedback_turns", HookSpec(lambda cfg: cfg.algo.feedback_turns > 0, FeedbackTurns))
ROLLOUT_HOOKS.register("rollout_strategy", HookSpec(lambda cfg: cfg.algo.rollout_strategy != "plain",
                                                    RolloutStrategy))
ROLLOUT_HOOKS.register("dynamic_sampling", HookSpec(lambda cfg: cfg.algo.dynamic_sampling, DynamicSampling))
ROLLOUT_HOOKS.register("keep_successes", HookSpec(lambda cfg: cfg.rollout.keep_successes is not None,
                                                   KeepSuccesses))
ROLLOUT_HOOKS.register("prompt_history", HookSpec(lambda cfg: "prompt_history" in algo_needs(cfg.algo),
                                                  PromptHistoryHook))
ROLLOUT_HOOKS.register("output_classes", HookSpec(lambda cfg: "output_classes" in algo_needs(cfg.algo), OutputClasses))


# ------------------------------------------------------------------------------------------------
# Loss hooks

class LossTerms(LossHook):
    """``algo.loss_terms``: registered per-token terms (mmrl/algos/variants/loss_terms.py), aggregated like the
    policy loss. With the ``expert_rows`` need (CalibRL), π_old's log-probs of the task's reference output
    for each row's prompt are scored by the current policy before the update."""

    def __init__(self, ctx: HookContext):
        self.ctx, self.rows = ctx, None
        self.with_expert = "expert_rows" in algo_needs(ctx.cfg.algo)

    def prepare(self, batch: Scored) -> None:
        group_id = batch.rollout.group_id
        groups = (group_id, group_counts(group_id))
        if not self.with_expert:
            self.rows = LossTermRows(batch.outcome, None, None, *groups)
            return
        references = [self.ctx.task.reference_output(e) for e in batch.examples]
        expert = self.ctx.policy.rollout_from_outputs(batch.examples, references, training_sampling(self.ctx.cfg))
        index = batch.rollout.example_index
        self.rows = LossTermRows(batch.outcome, expert.logp[index], expert.mask[index], *groups)

    def micro_term(self, micro: MicroBatch) -> tuple[Tensor | None, dict[str, float]]:
        a, total, metrics = self.ctx.cfg.algo, None, {}
        inputs = LossTermInputs(micro.logp, micro.logp_old, micro.advantages, micro.mask, self.rows.select(micro.rows))
        for name in a.loss_terms:
            loss, term_metrics = LOSS_TERMS.get(name)(inputs, a)
            if loss.dim() == 1:  # per-sequence: a mean over the global minibatch's sequences
                value = loss.sum() / micro.denominators["num_seqs"]
            else:
                value = aggregate(loss, micro.mask, a.loss_agg, **micro.denominators)
            total = value if total is None else total + value
            metrics |= {f"loss/{name}": value.item(), **{k: float(v) for k, v in term_metrics.items()}}
        return total, metrics


class BehaviourCloning(LossHook):
    """VLA-RFT's drift-gated BC regulariser: ``bc_coef`` · clamp(KL_ref / ``bc_kl_threshold``, 0, 1) · the
    policy's ``sft_loss`` on ``bc_batch_size`` of the warm start's own examples and reference outputs, weighted
    so that a minibatch adds it once. Needs a reference model (the gate) and a warm start (the data)."""

    def __init__(self, ctx: HookContext):
        self.ctx = ctx
        self.pool = ctx.warm_start_examples()

    def micro_term(self, micro: MicroBatch) -> tuple[Tensor | None, dict[str, float]]:
        a = self.ctx.cfg.algo
        if micro.kl_ref is None:
            return None, {}
        gate = drift_gate(micro.kl_ref, a.bc_kl_threshold)
        if gate <= 0:
            return None, {"policy/bc_gate": gate}
        loss = self.bc_loss(micro.index)
        term = a.bc_coef * gate * loss * (len(micro.rows) / micro.denominators["num_seqs"])
        return term, {"policy/bc_gate": gate, "loss/bc": loss.item()}

    def bc_loss(self, index: UpdateIndex) -> Tensor:
        """The supervised loss on a draw seeded by the step and the policy version (the same after ``--resume``)."""
        policy, task = self.ctx.policy, self.ctx.task
        rng = np.random.default_rng(derive_seed(self.ctx.cfg.trainer.seed, index.step, policy.version, 23))
        examples = [self.pool[i] for i in rng.choice(len(self.pool), self.ctx.cfg.algo.bc_batch_size)]
        with self.ctx.engine.autocast():
            return policy.sft_loss(examples, [task.reference_output(e) for e in examples]).float()


@dataclass(frozen=True)
class DymeParams:
    coef: float = 1.0
    """Weight of the memorisation (SFT) term."""
    fail_threshold: float = 0.0
    """A group switches to memorisation when none of its samples scores above this."""


declare_variant("dyme", DymeParams)


class Dyme(LossHook):
    """DyME (seed #33): at each step, every group whose rollouts all failed (advantage collapse: GRPO gives it
    no signal) is switched from exploration to memorisation, an SFT term on the task's reference output for
    its prompt; the other groups are trained by RL as usual. The term is added once per step, at its first
    optimizer step (one memorisation update per step, as RL's groups get theirs).

    INFERRED: the abstract's "dynamically selects between Memorization (via SFT) and Exploration (via RLVR) at
    each optimization step", decided per group by the verifier as the checker; the paper's visual checker and
    refiner (image-grounded guidance) are not built."""

    def __init__(self, ctx: HookContext):
        self.ctx, self.params = ctx, variant_params(ctx.cfg.algo, "dyme")
        self.examples: list[Any] = []
        self.groups = 0

    def prepare(self, batch: Scored) -> None:
        rollout = batch.rollout
        best = torch.full((len(batch.examples),), -torch.inf).scatter_reduce(
            0, rollout.example_index, batch.outcome.float(), reduce="amax")
        self.examples = [batch.examples[g] for g in range(len(batch.examples)) if best[g] <= self.params.fail_threshold]
        self.groups = len(batch.examples)

    def update_term(self, index: UpdateIndex) -> tuple[Tensor, dict[str, float]] | None:
        if not self.examples or index.epoch or index.minibatch:
            return None
        task = self.ctx.task
        with self.ctx.engine.autocast():
            loss = self.ctx.policy.sft_loss(self.examples, [task.reference_output(e) for e in self.examples]).float()
        return self.params.coef * loss, {"loss/dyme_sft": loss.item()}

    def metrics(self) -> dict[str, float]:
        engine = self.ctx.engine
        return {"rollout/dyme_memorised_frac": engine.sum(len(self.examples)) / max(engine.sum(self.groups), 1.0)}


class Rehearsal(LossHook):
    """DPH-RL (arXiv 2509.07430): ``coef`` × the token-mean of ``algo.rehearsal_divergence`` between π_θ and
    π_0 on ``rows_per_update`` rows of the rehearsal set, once per optimizer step. The set — π_0's samples of
    the training prompts it always solves, with π_0's log-probs — is built from the initial weights when the
    hook is made (before a checkpoint is loaded on ``--resume``), from seeds of the config, so it is the same
    every time and need not be stored."""

    def __init__(self, ctx: HookContext):
        self.ctx, cfg = ctx, ctx.cfg
        self.params = variant_params(cfg.algo, "dph_rl")
        examples = ctx.task.sample_batch("train", self.params.rehearsal_prompts,
                                         np.random.default_rng(derive_seed(cfg.trainer.seed, 17)))
        rollout = ctx.policy.rollout(examples, self.params.samples_per_prompt, training_sampling(cfg),
                                     derive_seed(cfg.trainer.seed, 18))
        success = torch.tensor([r.score >= self.params.success_threshold for r in ctx.score(rollout, examples).results])
        failures = torch.zeros(len(examples)).index_add_(0, rollout.example_index, (~success).float())
        always_solved = (failures == 0)[rollout.example_index]
        self.rows = rollout.select(always_solved.nonzero().squeeze(1))

    def update_term(self, index: UpdateIndex) -> tuple[Tensor, dict[str, float]] | None:
        if not self.rows.num_rows:
            return None
        seed = derive_seed(self.ctx.cfg.trainer.seed, index.step, index.epoch, index.minibatch, 19)
        pick = torch.randperm(self.rows.num_rows, generator=torch.Generator().manual_seed(seed))
        rows = self.rows.select(pick[:self.params.rows_per_update])
        device = self.ctx.engine.device
        mask = rows.mask.to(device)
        with self.ctx.engine.autocast():
            logp = self.ctx.model(rows).logp.float()
        divergence = REHEARSAL_DIVERGENCES.get(self.ctx.cfg.algo.rehearsal_divergence)
        value = aggregate(divergence(logp, rows.logp.to(device), self.params) * mask, mask, "token-mean")
        return value * self.params.coef, {"loss/rehearsal": value.item()}

    def metrics(self) -> dict[str, float]:
        return {"rollout/rehearsal_rows": self.rows.num_rows}


LOSS_HOOKS.register("loss_terms", HookSpec(lambda cfg: bool(cfg.algo.loss_terms), LossTerms))
LOSS_HOOKS.register("behaviour_cloning", HookSpec(lambda cfg: cfg.algo.bc_coef > 0, BehaviourCloning))
LOSS_HOOKS.register("dyme", HookSpec(lambda cfg: cfg.algo.dyme, Dyme))
LOSS_HOOKS.register("rehearsal", HookSpec(lambda cfg: cfg.algo.rehearsal_divergence is not None, Rehearsal))
