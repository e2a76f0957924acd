"""``judge/verdict-v0``: learn to judge a task's answers before learning to give them (JudgeRLVR, seed #56).

JudgeRLVR trains in two stages: the policy first learns to judge solution responses with verifiable
answers, then it is fine-tuned by ordinary generation RLVR, starting from the judge. This task is the
first stage for any registered task, the *base*.

**An example** is a base example with a proposed answer. The prompt is ``template``, filled with the base
prompt and the proposal; images stay the base example's. The proposal is either:
- the base task's reference output for this example, with probability ``correct_fraction``; or
- the reference output of another example of the same split (a plausible answer to a different question).

**The verdict** is the base task's own reward: ``yes`` when the proposal scores at least ``threshold``,
else ``no``. A mismatched answer that happens to be right is labelled ``yes``. The reward is 1 when the
answer's first word is the verdict, else 0.

INFERRED: the abstract does not say where the judged solutions come from; here they are references and
mismatched references, not the policy's own samples.

The recipe is ``configs/judgerlvr/text_tiny_cpu.yaml`` (a multi-stage program: judge, then generate).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmrl.core.contracts import RewardResult, ShowsBase
from mmrl.core.registry import make_task, register_task
from mmrl.core.typed import ConfigError

TASK_ID = "judge/verdict-v0"
VERDICTS = ("yes", "no")


@dataclass(frozen=True)
class JudgeConfig:
    task: str
    """The base task whose answers are judged (a registered id, e.g. ``data/rows-v0``)."""
    args: dict = field(default_factory=dict)
    """The base task's ``task.args``."""
    correct_fraction: float = 0.5
    """Share of proposals that are the example's own reference answer."""
    threshold: float = 1.0
    """A proposal is correct (verdict ``yes``) when the base reward gives it at least this."""
    template: str = "{prompt} {proposal}\nCorrect? yes or no:"
    """The judge's prompt: ``{prompt}`` (the base prompt) and ``{proposal}``."""


@dataclass(frozen=True)
class JudgeExample(ShowsBase):
    """A base example, a proposed answer and the verdict the base reward gives it."""

    base: Any
    proposal: str
    verdict: str
    template: str = field(repr=False)

    @property
    def prompt(self) -> str:
        return self.template.format(prompt=self.base.prompt, proposal=self.proposal)


def verdict_of(output: Any) -> str | None:
    """``yes`` / ``no`` when the output's first word is one of them (case and punctuation ignored), else None."""
    if not isinstance(output, str):
        return None
    words = output.strip().lower().split()
    first = words[0].strip(".,:;!?\"'") if words else ""
    return first if first in VERDICTS else None


class JudgeTask:
    """The judging stage of JudgeRLVR over a base task (see the module docstring)."""

    reward_range = (0.0, 1.0)

    def __init__(self, cfg: JudgeConfig):
        if not 0.0 <= cfg.correct_fraction <= 1.0:
            raise ConfigError(f"task.args.correct_fraction must be in [0, 1], got {cfg.correct_fraction}")
        if "{prompt}" not in cfg.template or "{proposal}" not in cfg.template:
            raise ConfigError("task.args.template must contain {prompt} and {proposal}")
        self.cfg, self.base = cfg, make_task(cfg.task, cfg.args)
        self.id = TASK_ID

    def sample_batch(self, split: str, n: int, rng: np.random.Generator) -> list[JudgeExample]:
        """``n`` base examples of ``split``, each with its own reference or another example's (seeded by ``rng``)."""
        bases = self.base.sample_batch(split, n, rng)
        others = self.base.sample_batch(split, n, rng)
        own = rng.random(n) < self.cfg.correct_fraction
        examples = []
        for base, other, keep in zip(bases, others, own):
            proposal = str(self.base.reference_output(base if keep else other))
            score = self.base.reward(base, proposal).score
            examples.append(JudgeExample(base, proposal, "yes" if score >= self.cfg.threshold else "no",
                                         self.cfg.template))
        return examples

    def reward(self, example: JudgeExample, output: Any) -> RewardResult:
        said = verdict_of(output)
        if said is None:
            return RewardResult(0.0, {"verdict": 0.0}, "no yes/no verdict")
        right = float(said == example.verdict)
        return RewardResult(right, {"verdict": right}, "" if right else f"said {said}, the verdict is {example.verdict}")

    def metrics(self, examples: Sequence[JudgeExample], outputs: Sequence[Any],
                results: Sequence[RewardResult]) -> dict[str, float]:
        """``accuracy`` and the accuracy on correct (``yes``) and wrong (``no``) proposals."""
        right = np.array([r.score for r in results])
        yes = np.array([e.verdict == "yes" for e in examples])
        metrics = {"accuracy": float(right.mean())}
        for name, rows in (("accuracy_yes", yes), ("accuracy_no", ~yes)):
            metrics[name] = float(right[rows].mean()) if rows.any() else float("nan")
        return metrics

    def reference_output(self, example: JudgeExample) -> str:
        return example.verdict


register_task(TASK_ID, JudgeTask, JudgeConfig)
