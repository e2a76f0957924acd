"""Distillation variants: a teacher's signal on the policy's own samples (docs/algorithms.md, "Paper variants").

- ``direct_opd`` (advantage estimator + the ``teacher_shift`` rollout hook): Direct On-Policy Distillation
  (seed #116): a post-RL teacher and its own pre-RL reference give, on every token the student sampled, the
  implicit reward β·(log π_teacher − log π_teacher_base); the student follows it on its own states.
- ``ssb`` (loss hook, ``algo.ssb``): Semantic Soft Bootstrapping (seed #73, arXiv 2512.05105; code
  purbeshmitra/semantic-soft-bootstrapping ``ssb_train.py``): the model, shown a correct and a wrong answer
  of its own, writes a new answer; a verified one is distilled from that hinted context into the bare prompt
  by matching whole next-token distributions, KL(teacher ‖ student) at temperature T, × T².
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mmrl.algos.advantages import ADVANTAGE_ESTIMATORS, AdvantageInputs, grpo_advantage
from mmrl.algos.config import AlgoConfig
from mmrl.algos.hooks import (LOSS_HOOKS, ROLLOUT_HOOKS, HookContext, HookSpec, LossHook, RolloutHook,
                              UpdateIndex)
from mmrl.algos.variants.params import algo_needs, declare_variant, variant_params
from mmrl.core.contracts import FollowUp, Policy
from mmrl.core.rescoring import forward_no_grad
from mmrl.core.rollout import SamplingParams, derive_seed
from mmrl.core.scored import Scored
from mmrl.core.typed import ConfigError

# -- loading a frozen checkpoint --------------------------------------------------------------------------


def policy_folder(path: str, what: str) -> Path:
    """``path`` when it is a Hugging Face model folder (it holds ``config.json``); else a FileNotFoundError naming
    ``what`` (a run's policy is ``RUN/checkpoints/step_N/policy``)."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{what}: {path} is not a model folder (no config.json); give a saved policy, e.g. "
                                f"RUN/checkpoints/step_N/policy (export LoRA runs first: mmrl export)")
    return folder


def frozen_policy(cfg: Any, path: str, device: Any, what: str) -> Policy:
    """The run's policy class built from the checkpoint at ``path`` (``pretrained``, the run's dtype), frozen."""
    from mmrl.core.registry import make_policy

    args = {"pretrained": str(policy_folder(path, what))}
    if "dtype" in {f.name for f in dataclasses.fields(cfg.policy.args)}:  # the run's precision, where it has one
        args["dtype"] = cfg.policy.args.dtype
    return make_policy(cfg.policy.name, args).to(device).eval().requires_grad_(False)


def frozen_copy(policy: Policy) -> Policy:
    """A frozen copy of ``policy`` as it is now (hooks are built before a checkpoint is loaded: the initial policy)."""
    return copy.deepcopy(policy).eval().requires_grad_(False)


def check_same_tokens(student: Policy, other: Policy, example: Any, output: Any, what: str) -> None:
    """``other`` must tokenise outputs as ``student`` does (its log-probs are read on the student's tokens): the
    same token mask for one reference answer, else a ConfigError naming ``what``."""
    sampling = SamplingParams(1.0, 1.0, 1)
    mine = student.rollout_from_outputs([example], [output], sampling).mask
    theirs = other.rollout_from_outputs([example], [output], sampling).mask
    if mine.shape != theirs.shape or not torch.equal(mine, theirs):
        raise ConfigError(f"{what} tokenises text differently from the policy ({int(theirs.sum())} vs "
                         f"{int(mine.sum())} tokens for one reference answer): it must share the policy's tokenizer")


def encodable(policy: Policy, example: Any, output: Any, what: str) -> None:
    """``example`` (a context a hook writes) must be one the policy can encode: else a ConfigError naming ``what``
    (e.g. a text with characters outside a character-level vocabulary), before any training."""
    try:
        policy.rollout_from_outputs([example], [output], SamplingParams(1.0, 1.0, 1))
    except Exception as err:  # the tokenizer's own error type varies; name the setting that caused it
        raise ConfigError(f"{what}: the policy cannot encode the text it writes ({' '.join(str(err).split())}); "
                         f"use characters of the policy's vocabulary") from err


# -- Direct-OPD -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DirectOpdParams:
    teacher: str | None = None
    """The post-RL teacher: a model folder (e.g. ``RUN/checkpoints/step_N/policy``), built as the run's policy
    class; it must share the student's tokenizer. Required."""
    teacher_base: str | None = None
    """The teacher's own pre-RL reference (a model folder). None: the student's initial policy (the right pair when
    the teacher was trained by RL from the same starting point, e.g. a smaller run of the same model)."""
    beta: float = 1.0
    """β of the implicit reward β·(log π_teacher − log π_teacher_base)(y_t) (INFERRED: the abstract gives no
    scale; 1 transfers the shift as it is)."""
    kl_coef: float = 1.0
    """λ of the per-token KL to the student's reference in the reward, −λ·(log π_old − log π_ref)(y_t): the
    KL-regularised optimum is then π_ref·(π_teacher/π_teacher_base)^(β/λ), the student's start moved by the
    teacher's shift; without it the policy collapses onto the tokens the shift favours most (INFERRED; with
    π_ref = π_teacher_base and β = λ = 1 this is on-policy distillation from the teacher). > 0 needs a
    reference model (``trainer.ref_model``)."""
    outcome_coef: float = 0.0
    """Weight of GRPO's verifier advantage added to every token (0: the abstract's "without running
    sparse-reward RL on the target model")."""


declare_variant("direct_opd", DirectOpdParams,
                needs=lambda p: ("teacher_shift", "ref_logp") if p.kl_coef else ("teacher_shift",))


def direct_opd_advantages(implicit_rewards: Tensor, kl: Tensor, outcome_advantages: Tensor, mask: Tensor,
                          params: DirectOpdParams) -> Tensor:
    """A_{i,t} = β·r_{i,t} − λ·kl_{i,t} + c·A^{GRPO}_{i,t} on valid tokens ([N, T] each → [N, T]), r the teacher
    pair's log-ratio and kl = log π_old − log π_ref on the token: each token's own reward, undiscounted and
    without a baseline (the per-token advantage of on-policy distillation; INFERRED)."""
    return (params.beta * implicit_rewards - params.kl_coef * kl + params.outcome_coef * outcome_advantages) * mask


@ADVANTAGE_ESTIMATORS.register("direct_opd")
def direct_opd_advantage(inp: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, None]:
    """Direct-OPD (seed #116): :func:`direct_opd_advantages` with r = ``inp.implicit_rewards`` (the teacher
    pair's log-ratio, from the ``teacher_shift`` rollout hook)."""
    p = variant_params(cfg, "direct_opd")
    if inp.implicit_rewards is None:
        raise ValueError("direct_opd needs the teacher's per-token log-ratio (AdvantageInputs.implicit_rewards, "
                         "from the teacher_shift rollout hook)")
    if p.kl_coef and inp.kl is None:
        raise ValueError("direct_opd with kl_coef > 0 needs the KL to a reference model (trainer.ref_model: copy)")
    outcome = grpo_advantage(inp, cfg)[0] if p.outcome_coef else torch.zeros_like(inp.mask)
    kl = inp.kl.to(inp.mask) if p.kl_coef else torch.zeros_like(inp.mask)
    return direct_opd_advantages(inp.implicit_rewards.to(inp.mask), kl, outcome, inp.mask, p), None


class TeacherShift(RolloutHook):
    """For estimators that declare the ``teacher_shift`` need: each row's per-token log-ratio of the post-RL
    teacher to its pre-RL reference on the student's own tokens, ``AdvantageInputs.implicit_rewards`` [N, T],
    at the rows' sampling temperature (both teachers frozen, scored in micro-batches without gradients)."""

    def __init__(self, ctx: HookContext):
        p = variant_params(ctx.cfg.algo, "direct_opd")
        if p.teacher is None:
            raise ConfigError("advantage direct_opd needs algo.extra.direct_opd.teacher: the post-RL teacher's model "
                             "folder (e.g. RUN/checkpoints/step_N/policy)")
        self.ctx, device = ctx, ctx.engine.device
        self.teacher = frozen_policy(ctx.cfg, p.teacher, device, "algo.extra.direct_opd.teacher")
        self.base = (frozen_copy(ctx.policy) if p.teacher_base is None else
                     frozen_policy(ctx.cfg, p.teacher_base, device, "algo.extra.direct_opd.teacher_base"))
        probe = ctx.task.sample_batch("train", 1, np.random.default_rng(0))[0]
        reference = ctx.task.reference_output(probe)
        check_same_tokens(ctx.policy, self.teacher, probe, reference, "algo.extra.direct_opd.teacher")
        check_same_tokens(ctx.policy, self.base, probe, reference, "algo.extra.direct_opd.teacher_base")
        self.shift_sum, self.tokens = 0.0, 0.0

    def finish(self, batch: Scored) -> Scored:
        rollout, t, autocast = batch.rollout, self.ctx.cfg.trainer, self.ctx.engine.autocast
        shift = (forward_no_grad(self.teacher, rollout, t.micro_batch_size, autocast)
                 - forward_no_grad(self.base, rollout, t.micro_batch_size, autocast)) * rollout.mask
        self.shift_sum, self.tokens = float(shift.sum()), float(rollout.mask.sum())
        return dataclasses.replace(batch, row_inputs={**batch.row_inputs, "implicit_rewards": shift})

    def metrics(self) -> dict[str, float]:
        engine = self.ctx.engine
        # the teacher pair's mean log-ratio on the student's tokens: > 0 where the student already takes the
        # actions RL made the teacher more likely to take
        return {"rollout/teacher_shift_mean": engine.sum(self.shift_sum) / max(engine.sum(self.tokens), 1.0)}


# -- SSB --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SsbParams:
    coef: float = 1.0
    """Weight of the distillation loss (SSB code: λ_KD = 1, λ_CE = 0)."""
    temperature: float = 2.0
    """T of both distributions; the loss is KL × T² (SSB code: TEMP = 2.0)."""
    success_threshold: float = 1.0
    """A sample is correct when its verifier score is ≥ this (the paper: the boxed answer equals the label)."""
    hint_template: str = ("\nHere is a correct answer:\n{correct}\nHere is a wrong answer:\n{incorrect}\n"
                          "Write a careful answer that avoids the mistake.\n")
    """The user turn after the prompt that shows both answers ({correct}, {incorrect}); its text must be in the
    policy's vocabulary (INFERRED wording; the paper's prompt was not readable)."""
    teacher: str = "initial"
    """initial: a frozen copy of the initial policy writes and scores the hinted answers (the paper's base-model
    teacher, its student a LoRA on top) | current: the policy itself, without gradients (online bootstrapping)."""
    max_examples: int = 16
    """Hinted answers drawn per step and process (at most one per group)."""


declare_variant("ssb", SsbParams)


def distribution_distillation(teacher_logp: Tensor, student_logp: Tensor, mask: Tensor, temperature: float) -> Tensor:
    """T² · mean over the mask's tokens of KL(p_teacher ‖ p_student) = Σ_v p_t (log p_t − log p_s) ([n, T, V]
    log-distributions at temperature T, mask [n, T] → scalar; SSB ``kd_loss_fn``). Ids the teacher gives no
    mass (suppressed ids) add nothing."""
    p = teacher_logp.exp()
    diff = torch.where(p > 0, teacher_logp - student_logp, torch.zeros_like(student_logp))
    kl = (p * diff).sum(-1)  # [n, T]
    return temperature ** 2 * (kl * mask).sum() / mask.sum().clamp(min=1)


def hint_pairs(batch: Scored, threshold: float) -> list[tuple[int, Any, Any]]:
    """(group, a correct output, the most common wrong output) for every group of ``batch`` with both (the
    first correct row; ties between wrong outputs go to the first drawn)."""
    pairs = []
    index, outcome = batch.rollout.example_index.tolist(), batch.outcome.tolist()
    for g in range(len(batch.examples)):
        rows = [i for i, e in enumerate(index) if e == g]
        correct = [batch.rollout.outputs[i] for i in rows if outcome[i] >= threshold]
        wrong = Counter(str(batch.rollout.outputs[i]) for i in rows if outcome[i] < threshold)
        if correct and wrong:
            pairs.append((g, correct[0], wrong.most_common(1)[0][0]))
    return pairs


class Ssb(LossHook):
    """SSB (seed #73): every step, up to ``max_examples`` groups with a correct and a wrong answer become hinted
    prompts (the prompt, then ``hint_template`` with both answers as a user turn); the teacher writes one answer
    to each, and the ones the verifier accepts are distilled into the bare prompt: ``coef`` ×
    :func:`distribution_distillation` of the teacher's distributions in the hinted context and the policy's in
    the bare one, on the answer's tokens. Added once per step, at its first optimizer step (as DyME's SFT).

    INFERRED: online (each step's groups) rather than the paper's offline set built once, and added to the RL
    objective (the paper trains by distillation alone; a large ``coef`` weights it over the RL term); the hint
    wording."""

    def __init__(self, ctx: HookContext):
        self.ctx, self.params = ctx, variant_params(ctx.cfg.algo, "ssb")
        if self.params.teacher not in ("initial", "current"):
            raise ConfigError(f"algo.extra.ssb.teacher must be initial or current, got {self.params.teacher!r}")
        if "{correct}" not in self.params.hint_template or "{incorrect}" not in self.params.hint_template:
            raise ConfigError("algo.extra.ssb.hint_template must contain {correct} and {incorrect}")
        self.teacher = frozen_copy(ctx.policy) if self.params.teacher == "initial" else ctx.policy
        probe = ctx.task.sample_batch("train", 1, np.random.default_rng(0))[0]
        answer = ctx.task.reference_output(probe)
        encodable(ctx.policy, FollowUp(probe, (("user", self.params.hint_template.format(correct=answer,
                                                                                          incorrect=answer)),)),
                  answer, "algo.extra.ssb.hint_template")
        self.bases: list[Any] = []
        self.hinted: list[Any] = []
        self.answers: list[Any] = []
        self.candidates = 0

    def prepare(self, batch: Scored) -> None:
        p, cfg = self.params, self.ctx.cfg
        pairs = hint_pairs(batch, p.success_threshold)[:p.max_examples]
        self.candidates, self.bases, self.hinted, self.answers = len(pairs), [], [], []
        if not pairs:
            return
        bases = [batch.examples[g] for g, _, _ in pairs]
        hinted = [FollowUp(base, (("user", p.hint_template.format(correct=c, incorrect=w)),))
                  for base, (_, c, w) in zip(bases, pairs)]
        sampling = SamplingParams(cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_new_tokens)
        seed = derive_seed(cfg.trainer.seed, self.ctx.policy.version, self.ctx.engine.rank, 73)
        drawn = self.teacher.rollout(hinted, 1, sampling, seed)
        scored = self.ctx.score(drawn, bases)  # the reward of the bare example
        for row, e in enumerate(drawn.example_index.tolist()):
            if float(scored.outcome[row]) >= p.success_threshold:
                self.bases.append(bases[e])
                self.hinted.append(hinted[e])
                self.answers.append(drawn.outputs[row])

    def update_term(self, index: UpdateIndex) -> tuple[Tensor, dict[str, float]] | None:
        if not self.answers or index.epoch or index.minibatch:
            return None
        t = self.params.temperature
        with self.ctx.engine.autocast():
            with torch.no_grad():
                teacher_logp, _ = self.teacher.completion_log_distributions(self.hinted, self.answers, t)
            student_logp, mask = self.ctx.policy.completion_log_distributions(self.bases, self.answers, t)
            loss = distribution_distillation(teacher_logp.float(), student_logp.float(), mask, t)
        return self.params.coef * loss, {"loss/ssb_kd": loss.item()}

    def metrics(self) -> dict[str, float]:
        engine = self.ctx.engine
        return {"rollout/ssb_hinted": engine.sum(self.candidates), "rollout/ssb_distilled": engine.sum(len(self.answers))}


ROLLOUT_HOOKS.register("teacher_shift", HookSpec(lambda cfg: "teacher_shift" in algo_needs(cfg.algo), TeacherShift))
LOSS_HOOKS.register("ssb", HookSpec(lambda cfg: cfg.algo.ssb, Ssb))
