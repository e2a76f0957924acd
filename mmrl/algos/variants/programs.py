"""Seed papers of issue 25 that change the training signal over a run: RECAP, NPO / AutoNPO and SCOPE-RL.

Each is a registered hook (``mmrl.algos.hooks``), turned on by its ``algo.<name>`` flag, with typed
hyper-parameters in ``algo.extra.<name>``; the rules they rest on are the pure functions below, which the tests
check against golden numbers (docs/programs.md, "RECAP, NPO / AutoNPO, SCOPE-RL").

- ``recap`` (RECAP, seed #49), a loss hook: replay of the warm start's data (the earlier objective) beside the
  RL objective, the replay term's weight set each step from both objectives' short-horizon convergence and
  instability (``objective_weights``); the loss histories are checkpointed.
- ``npo`` (NPO / AutoNPO, seed #87), a rollout hook: rows drawn by a *later* checkpoint of the same training run
  (a finished earlier stage of the program, or any run folder) replace some rows of each group, trained with
  the guide's log-probabilities as π_old, so PPO's ratio π_θ / π_guide is the importance correction. NPO
  intervenes in a fixed window of steps with a fixed checkpoint; AutoNPO intervenes when the training reward
  plateaus and chooses the checkpoint with the largest learning signal S = Q / V (``signal_score``).
- ``scope_rl`` (SCOPE-RL, seed #70), a rollout hook: until a prompt is first solved, its rows also earn the
  prefix-decomposed reward of the reference's sub-answers (``prefix_credit``); once solved, its correct rows
  are shaped by process quality (``process_shape``). Which prompts are solved is checkpointed.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mmrl.algos.hooks import LOSS_HOOKS, ROLLOUT_HOOKS, HookContext, HookSpec, LossHook, Round, RolloutHook, \
    UpdateIndex
from mmrl.algos.variants.guidance import replace_rows
from mmrl.algos.variants.history import prompt_key
from mmrl.algos.variants.params import declare_variant, variant_params
from mmrl.core.rollout import SamplingParams, derive_seed
from mmrl.core.scored import Scored
from mmrl.core.typed import ConfigError


# ------------------------------------------------------------------------------------------------
# RECAP: replay with dynamic objective reweighting

def objective_weights(histories: Sequence[Sequence[float]], window: int, temperature: float,
                      eps: float = 1e-3) -> Tensor:
    """RECAP's weights of K objectives ([K], summing to K) from each one's loss history (oldest first).

    For objective k, with ``recent`` the mean of its last ``window`` losses and ``first`` its first loss:
    remaining_k = (recent + ε) / (first + ε), how much of its loss is left (a converged, saturated objective
    is near 0, one that has not moved near 1); instability_k = std / (|mean| + ε) over the same window, the
    coefficient of variation (volatile objectives are large). Score s_k = remaining_k + instability_k, and
    w = K · softmax(s / temperature): focus moves away from saturated objectives toward underperforming or
    volatile ones. An objective with fewer than two losses scores 1 (no evidence yet).

    INFERRED (the abstract names the signals, not their form): both signals' definitions, their sum, the
    softmax and the loss proxies they are computed on.

    >>> [round(w, 4) for w in objective_weights([[1.0, 1.0, 1.0], [1.0, 0.1, 0.1]], 2, 1.0).tolist()]
    [1.4215, 0.5785]
    """
    scores = []
    for losses in histories:
        if len(losses) < 2:
            scores.append(1.0)
            continue
        recent = torch.tensor(losses[-window:], dtype=torch.float64)
        mean = float(recent.mean())
        remaining = (mean + eps) / (losses[0] + eps)
        instability = float(recent.std(unbiased=False)) / (abs(mean) + eps)
        scores.append(remaining + instability)
    return len(scores) * torch.softmax(torch.tensor(scores, dtype=torch.float64) / temperature, 0)


@dataclass(frozen=True)
class RecapParams:
    replay_batch: int = 16
    """Earlier examples (the warm start's data, with their reference outputs) in each replay term."""
    coef: float = 1.0
    """Base weight of the replay objective; its weight at a step is coef · w_replay / w_task."""
    window: int = 8
    """Short horizon: the last this many steps' losses give each objective's signals."""
    temperature: float = 0.5
    """Softmax temperature of the reweighting (smaller: sharper shifts; INFERRED)."""


declare_variant("recap", RecapParams)


class Recap(LossHook):
    """RECAP (seed #49): replay of earlier data with dynamic objective reweighting. Two objectives share each
    update: the in-task RL objective, whose loss proxy is the step's failure rate 1 − mean verifiable score,
    and replay of the warm start's examples (the data the policy knew before RL), an SFT term whose loss is its
    negative log-likelihood. Before each step's update, :func:`objective_weights` turns both loss histories into
    weights (w_task, w_replay), and the replay term, added once per optimizer step, is weighted
    ``coef`` · w_replay / w_task: the RL loss keeps weight 1, so the ratio carries the reweighting (Adam's
    steps do not depend on the loss's overall scale). The draw of a step's replay examples is seeded by the step.

    INFERRED: which objectives (the paper replays heterogeneous general-capability data beside several in-task
    rewards; here: the task's own warm-start data) and the signals' forms (``objective_weights``)."""

    def __init__(self, ctx: HookContext):
        self.ctx, self.params = ctx, variant_params(ctx.cfg.algo, "recap")
        if self.params.replay_batch <= 0 or self.params.window <= 0 or self.params.temperature <= 0:
            raise ConfigError("algo.extra.recap: replay_batch, window and temperature must be positive")
        self.pool = ctx.warm_start_examples()
        if not self.pool:
            raise ConfigError("algo.recap replays the warm start's examples: set warm_start.sft_steps > 0")
        self.task_losses: list[float] = []  # one per step: 1 − mean verifiable score
        self.replay_losses: list[float] = []  # one per step: mean replay NLL of its optimizer steps
        self.step_replay: list[float] = []
        self.replay_weight = self.params.coef

    def prepare(self, batch: Scored) -> None:
        if self.step_replay:
            self.replay_losses.append(sum(self.step_replay) / len(self.step_replay))
            self.step_replay = []
        self.task_losses.append(1.0 - self.ctx.engine.mean(batch.outcome.float().mean()))
        w = objective_weights([self.task_losses, self.replay_losses], self.params.window, self.params.temperature)
        self.replay_weight = self.params.coef * float(w[1] / w[0])

    def update_term(self, index: UpdateIndex) -> tuple[Tensor, dict[str, float]] | None:
        policy, task = self.ctx.policy, self.ctx.task
        generator = torch.Generator().manual_seed(derive_seed(self.ctx.cfg.trainer.seed, index.step, index.epoch,
                                                              index.minibatch, 49))
        pick = torch.randint(len(self.pool), (self.params.replay_batch,), generator=generator).tolist()
        examples = [self.pool[i] for i in pick]
        with self.ctx.engine.autocast():
            loss = policy.sft_loss(examples, [task.reference_output(e) for e in examples]).float()
        self.step_replay.append(loss.item())
        return self.replay_weight * loss, {"loss/recap_replay": loss.item()}

    def metrics(self) -> dict[str, float]:
        return {"policy/recap_replay_weight": self.replay_weight}

    def state_dict(self) -> dict[str, Any]:
        return {"task_losses": self.task_losses, "replay_losses": self.replay_losses, "step_replay": self.step_replay}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.task_losses, self.replay_losses = list(state["task_losses"]), list(state["replay_losses"])
        self.step_replay = list(state["step_replay"])


# ------------------------------------------------------------------------------------------------
# NPO / AutoNPO: a later checkpoint's trajectories, importance-corrected

def signal_score(quality: Tensor, guide_logp: Tensor, policy_logp: Tensor, mask: Tensor, eps: float) -> float:
    """NPO's effective learning signal S = Q / V of one guide checkpoint on some rows ([N, T] log-probs, mask).

    Q = mean verifiable score of the guide's rows (quality: how much there is to learn); V = ε + the mean over
    rows of the token-mean squared log-ratio (log π_guide − log π_θ)², the second moment of the log importance
    weight (variance cost: how far off-policy the rows are for the current policy). INFERRED: the abstract
    defines S = Q/V, not the estimators of Q and V.

    >>> signal_score(torch.tensor([1.0, 0.0]), torch.tensor([[0.0, 0.0], [-1.0, 0.0]]),
    ...              torch.tensor([[-1.0, 0.0], [-1.0, 0.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]]), 0.5)
    0.6666666666666666
    """
    tokens = mask.sum(1).clamp(min=1)
    per_row = (((guide_logp - policy_logp) ** 2) * mask).sum(1) / tokens
    return float(quality.float().mean()) / (eps + float(per_row.mean()))


def plateaued(rewards: Sequence[float], window: int, tolerance: float) -> bool:
    """AutoNPO's plateau trigger: the mean training reward of the last ``window`` steps exceeds that of the
    ``window`` steps before by at most ``tolerance`` (INFERRED form of "online training signals")."""
    if len(rewards) < 2 * window:
        return False
    recent = sum(rewards[-window:]) / window
    before = sum(rewards[-2 * window:-window]) / window
    return recent - before <= tolerance


@dataclass(frozen=True)
class NpoParams:
    guide_run: str = ""
    """The run whose later checkpoints guide this one: the name of an earlier train stage of the same program
    (its ``checkpoints/step_*/policy``), or a run folder. Set ``checkpoint.keep_last: 0`` there to keep all."""
    rows: int = 2
    """Rows of each group drawn by the guide (replacing as many of the group's own samples)."""
    auto: bool = False
    """AutoNPO: intervene on a reward plateau (and in the first ``bootstrap_steps``), choosing the guide
    checkpoint with the largest S = Q / V on the round's prompts. False: NPO with the fixed ``guide_step``."""
    guide_step: int = 0
    """NPO: the guide checkpoint's step (0: the guide run's latest checkpoint)."""
    start_step: int = 1
    """NPO: first step of this run with guidance."""
    end_step: int = 0
    """NPO: last step with guidance (0: to the end). E.g. 1..10 early bootstrapping, or a late window."""
    bootstrap_steps: int = 5
    """AutoNPO: steps 1..this always intervene (early-stage bootstrapping)."""
    plateau_window: int = 5
    """AutoNPO: the trigger compares the mean reward of the last this many steps with the ones before."""
    plateau_tolerance: float = 0.02
    """AutoNPO: a gain of at most this much over the window counts as a plateau."""
    variance_eps: float = 0.1
    """ε of V in S = Q / (ε + V) (keeps a near-identical guide from dividing by 0; INFERRED)."""


declare_variant("npo", NpoParams)


def guide_checkpoints(run: Path) -> dict[int, Path]:
    """A run folder's checkpoint policies by step (``checkpoints/step_<n>/policy``)."""
    found = {}
    for folder in (run / "checkpoints").glob("step_*"):
        if (folder / "policy").is_dir() and folder.name[5:].isdigit():
            found[int(folder.name[5:])] = folder / "policy"
    return dict(sorted(found.items()))


def resolve_guide_run(name: str, out: Path | None) -> Path:
    """``algo.extra.npo.guide_run`` as a folder: an earlier stage of this program (``stages/NN_<name>``, a
    sibling of this stage's folder) or a run folder."""
    if out is not None and out.parent.name == "stages":
        siblings = [p for p in out.parent.glob(f"[0-9][0-9]_{name}") if p.is_dir()]
        if siblings:
            return siblings[0]
    if name and Path(name).is_dir():
        return Path(name)
    raise ConfigError(f"algo.extra.npo.guide_run: {name!r} is neither a completed earlier stage of this program "
                      f"nor a run folder")


class Npo(RolloutHook):
    """NPO / AutoNPO (seed #87): learning from the policy's own near-future self. A later checkpoint of the same
    training run (the guide) is stronger than the current policy and closer to it than any external teacher.
    When the hook intervenes, the guide answers each prompt ``rows`` times; those rows replace as many of the
    group's own samples, are scored by the same verifier, and are trained with π_old = π_guide (both sides
    re-scored with ``rollout_from_outputs``, one tokenisation), so the clipped ratio π_θ / π_guide corrects the
    off-policy rows and the group baseline spans both sources (mixed-policy GRPO).

    NPO intervenes in steps ``start_step``..``end_step`` with checkpoint ``guide_step``. AutoNPO intervenes in
    the first ``bootstrap_steps`` and whenever the training reward plateaus (:func:`plateaued`); it then draws
    from every checkpoint of the guide run and keeps the one with the largest S = Q / V (:func:`signal_score`),
    provided its rows score better than the policy's own (otherwise there is nothing to learn and it stays
    on-policy). The reward history is checkpointed.

    INFERRED: replacement of ``rows`` samples per group (the abstract mixes trajectories without saying how
    many), the trigger's form and the estimators of Q and V. The program runs the guide's stage first (a scout
    run from the same start) and this stage from that stage's start, so every guide checkpoint is a near
    future of this run's policy."""

    def __init__(self, ctx: HookContext):
        self.ctx, self.params = ctx, variant_params(ctx.cfg.algo, "npo")
        p = self.params
        if p.rows <= 0 or p.rows > ctx.cfg.rollout.samples_per_group:
            raise ConfigError(f"algo.extra.npo.rows must be in 1..rollout.group_size "
                              f"({ctx.cfg.rollout.samples_per_group}), got {p.rows}")
        run = resolve_guide_run(p.guide_run, ctx.out)
        checkpoints = guide_checkpoints(run)
        if not checkpoints:
            raise ConfigError(f"algo.extra.npo.guide_run: {run} holds no checkpoints/step_*/policy")
        if not p.auto:
            step = p.guide_step or max(checkpoints)
            if step not in checkpoints:
                raise ConfigError(f"algo.extra.npo.guide_step: {run} has no checkpoint of step {step} "
                                  f"(it has {sorted(checkpoints)})")
            checkpoints = {step: checkpoints[step]}
        self.guides = {step: self.load_guide(path) for step, path in checkpoints.items()}
        self.rewards: list[float] = []  # per step, the mean verifiable score of the policy's own rows
        self.step = 0
        self.chosen = self.guide_rows = 0
        self.signal = 0.0

    def load_guide(self, folder: Path) -> Any:
        guide = copy.deepcopy(self.ctx.policy)
        guide.load_weights(str(folder))
        return guide.eval().requires_grad_(False)

    def intervenes(self) -> bool:
        """Whether this step draws guide rows (the step's own reward is not known yet: history up to the last)."""
        p = self.params
        if p.auto:
            return self.step <= p.bootstrap_steps or plateaued(self.rewards, p.plateau_window, p.plateau_tolerance)
        return self.step >= p.start_step and (p.end_step == 0 or self.step <= p.end_step)

    def refine(self, part: Scored, round_: Round) -> Scored:
        if round_.index == 0:
            self.step += 1
        own = self.ctx.engine.mean(part.outcome.float().mean())
        if round_.index == 0:
            self.rewards.append(own)
        self.chosen, self.signal = 0, 0.0
        if not self.intervenes():
            return part
        sampling = round_.sampling
        best: tuple[float, int, Scored] | None = None
        for step, guide in self.guides.items():
            rows = self.guide_rows_for(guide, part.examples, sampling, derive_seed(round_.seed, 87, step))
            quality = self.ctx.engine.mean(rows.outcome.float().mean())
            policy_logp = self.ctx.policy.rollout_from_outputs(
                [part.examples[g] for g in rows.rollout.example_index.tolist()], rows.rollout.outputs, sampling).logp
            score = signal_score(rows.outcome, rows.rollout.logp, policy_logp, rows.rollout.mask,
                                 self.params.variance_eps)
            score = self.ctx.engine.mean(score)
            if self.params.auto and quality <= own:
                continue
            if best is None or score > best[0]:
                best = (score, step, rows)
        if best is None:
            return part
        self.signal, self.chosen, rows = best
        self.guide_rows = rows.rollout.num_rows
        return replace_rows(part, rows, {g: self.params.rows for g in range(len(part.examples))})

    def guide_rows_for(self, guide: Any, examples: list[Any], sampling: SamplingParams, seed: int) -> Scored:
        """``rows`` answers of ``guide`` per example, as rows of the policy with π_old = π_guide, scored."""
        drawn = guide.rollout(examples, self.params.rows, sampling, seed)
        which = drawn.example_index.tolist()
        given = [examples[g] for g in which]
        rows = self.ctx.policy.rollout_from_outputs(given, drawn.outputs, sampling)
        behaviour = guide.rollout_from_outputs(given, drawn.outputs, sampling)
        index = drawn.example_index.clone()
        return self.ctx.score(rows.replace(logp=behaviour.logp, example_index=index, group_id=index.clone()),
                              examples)

    def metrics(self) -> dict[str, float]:
        return {"rollout/npo_guide_step": self.chosen, "rollout/npo_signal": self.signal,
                "rollout/npo_guide_rows": self.ctx.engine.sum(self.guide_rows if self.chosen else 0)}

    def state_dict(self) -> dict[str, Any]:
        return {"rewards": self.rewards, "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rewards, self.step = list(state["rewards"]), int(state["step"])


# ------------------------------------------------------------------------------------------------
# SCOPE-RL: prefix-decomposed rewards before success, correctness-gated process shape after

def answer_steps(reference: str) -> list[str]:
    """A reference answer's chain of sub-answers: its non-empty lines, or for a one-line answer its characters
    (a number's leading digits first; INFERRED stand-in for the paper's sub-question chain).

    >>> answer_steps("x = 3\\ny = 5\\n"), answer_steps("17")
    (['x = 3', 'y = 5'], ['1', '7'])
    """
    lines = [line.strip() for line in reference.strip().splitlines() if line.strip()]
    return lines if len(lines) > 1 else list(reference.strip())


def prefix_credit(output: str, reference: str) -> float:
    """The fraction of the reference's sub-answers (:func:`answer_steps`) the output reproduces, in order, from
    the first: the prefix-decomposed verifiable reward (each prefix of the chain checked against the reference).

    >>> prefix_credit("15", "17"), prefix_credit("17", "17"), prefix_credit("7", "17")
    (0.5, 1.0, 0.0)
    """
    want, got = answer_steps(reference), answer_steps(output)
    matched = 0
    for a, b in zip(want, got):
        if a != b:
            break
        matched += 1
    return matched / len(want) if want else 0.0


def process_shape(output: str, reference: str) -> float:
    """Process quality of a correct answer in [0, 1]: useful-step density, the reference's sub-answer count
    over the output's (1 for an answer as short as the reference, less for redundant steps).

    >>> process_shape("17", "17"), process_shape("17 17", "17")
    (1.0, 0.4)
    """
    useful, written = len(answer_steps(reference)), len(answer_steps(output))
    return min(1.0, useful / written) if written else 0.0


def scope_reward(outcome: float, credit: float, shape: float, solved_before: bool, success: float,
                 credit_coef: float, shape_coef: float) -> float:
    """SCOPE-RL's reward of one row. Before its prompt is first solved (Adaptive Scaffolded RL): the outcome,
    and for a failed row ``credit_coef`` · its prefix credit. After (Quality-Aware Process RL): a correct row's
    outcome scaled by 1 − ``shape_coef`` · (1 − shape), the process reward gated by correctness; a wrong row
    keeps its outcome.

    >>> scope_reward(0.0, 0.5, 1.0, False, 1.0, 0.5, 0.2), scope_reward(1.0, 1.0, 0.4, True, 1.0, 0.5, 0.5)
    (0.25, 0.7)
    """
    if not solved_before:
        return outcome if outcome >= success else outcome + credit_coef * credit
    return outcome * (1.0 - shape_coef * (1.0 - shape)) if outcome >= success else outcome


@dataclass(frozen=True)
class ScopeRlParams:
    credit_coef: float = 0.5
    """Weight of the prefix credit of a failed row before its prompt is solved (below a success's 1)."""
    shape_coef: float = 0.2
    """Largest share of a correct row's reward that process shape can take away after the prompt is solved."""
    success_threshold: float = 1.0
    """A row at least this good is a success; its prompt counts as solved from the next round on."""


declare_variant("scope_rl", ScopeRlParams)


class ScopeRl(RolloutHook):
    """SCOPE-RL (seed #70): the sparse verifiable outcome densified, with the GRPO update unchanged. Per prompt,
    two stages: until the policy first solves it, a failed row earns ``credit_coef`` × the fraction of the
    reference's chain of sub-answers it gets right from the first (:func:`prefix_credit`: progress before
    success); from then on, a correct row's reward is scaled by its process quality (:func:`process_shape`), so
    that among correct rows the concise ones are preferred. Which prompts are solved is gathered over processes
    and checkpointed. The verifiable outcome is logged unchanged (``reward/mean``); the shaped reward feeds the
    advantages.

    INFERRED / not built: the paper's answer-hidden sub-question chains are written per problem and shown as
    scaffolds in the prompt; here the chain is the reference's own lines (or a number's digits) and is used only
    to verify prefixes, nothing is added to the prompt. The process-shape reward is one signal (useful-step
    density); the paper's Step-Quality Evaluation Protocol is not built."""

    def __init__(self, ctx: HookContext):
        self.ctx, self.params = ctx, variant_params(ctx.cfg.algo, "scope_rl")
        probe = ctx.task.sample_batch("train", 1, np.random.default_rng(0))[0]
        if not isinstance(ctx.task.reference_output(probe), str):
            raise ConfigError(f"algo.scope_rl checks prefixes of text reference answers; {ctx.cfg.task.name}'s "
                              f"reference_output is not text")
        self.solved: set[str] = set()
        self.scaffolded = self.shaped = 0

    def refine(self, part: Scored, round_: Round) -> Scored:
        p, task = self.params, self.ctx.task
        keys = [prompt_key(e) for e in part.examples]
        references = [task.reference_output(e) for e in part.examples]
        rewards = part.rewards.clone()
        for i, group in enumerate(part.rollout.example_index.tolist()):
            output, reference = part.rollout.outputs[i], references[group]
            output = output if isinstance(output, str) else ""  # a non-text output earns no credit
            outcome, solved = float(part.outcome[i]), keys[group] in self.solved
            shaped = scope_reward(outcome, prefix_credit(output, reference), process_shape(output, reference),
                                  solved, p.success_threshold, p.credit_coef, p.shape_coef)
            rewards[i] = rewards[i] - outcome + shaped  # keeps any other shaping (overlong penalty)
            self.scaffolded += int(not solved)
            self.shaped += int(solved and outcome >= p.success_threshold)
        wins = {keys[g] for g in part.rollout.example_index[part.outcome >= p.success_threshold].tolist()}
        (everything,) = self.ctx.engine.gather_objects(sorted(wins))
        self.solved |= set(everything)
        return replace(part, rewards=rewards)

    def metrics(self) -> dict[str, float]:
        engine = self.ctx.engine
        out = {"rollout/scope_scaffolded_rows": engine.sum(self.scaffolded),
               "rollout/scope_shaped_rows": engine.sum(self.shaped), "rollout/scope_solved_prompts": len(self.solved)}
        self.scaffolded = self.shaped = 0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"solved": sorted(self.solved)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.solved = set(state["solved"])


ROLLOUT_HOOKS.register("npo", HookSpec(lambda cfg: cfg.algo.npo, Npo))
ROLLOUT_HOOKS.register("scope_rl", HookSpec(lambda cfg: cfg.algo.scope_rl, ScopeRl))
LOSS_HOOKS.register("recap", HookSpec(lambda cfg: cfg.algo.recap, Recap))
