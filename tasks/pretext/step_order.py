"""``pretext/step-order-v0``: MR-RLVR's step-reordering reward over any text task (seed #2).

The second of MR-RLVR's self-supervised, process-level rewards (the first is masked-then-fill,
``pretext/mask-fill-v0``): the steps of a solution are shown shuffled, and the policy restores their order.

**An example** is the base prompt followed by its reference answer (the *transcript*), cut into steps at line
breaks and sentence ends. The steps are shown numbered 1..n in a shuffled order (never the original one), one
per line, and the answer lists the shown numbers in the original order, separated by spaces: for the steps
"Q: Ann has 7 cups and gets 3 more." / "How many cups?" / "A: 10" shown as 1: "A: 10", 2: "Q: Ann ...",
3: "How many cups?", the answer is ``2 3 1``.

**The reward** is the fraction of step pairs the answer puts in their original relative order (1 for the exact
order, 0 for its reverse); an answer that is not a permutation of 1..n scores 0 with a reason. ``exact`` in the
metrics counts exact orders.

INFERRED: the abstract names "step reordering" without its reward. The pairwise fraction (Kendall's τ mapped
to [0, 1]) is our choice: it gives partial credit, which a 0/1 exact-order reward does not, and equals 1 only
for the exact order. Our data have one-line answers, so the steps are the question's sentences and the answer
line. Transcripts with fewer than ``min_steps`` steps, or with a step that repeats (two original orders), are
skipped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmrl.core.contracts import RewardResult, ShowsBase
from mmrl.core.registry import make_task, register_task
from mmrl.core.typed import ConfigError
from mmrl.tasks.pretext.transcripts import derived_batch

TASK_ID = "pretext/step-order-v0"
STEP_END = re.compile(r"\n+|(?<=[.?!])\s+")


@dataclass(frozen=True)
class StepOrderConfig:
    task: str
    """The base task (a registered id whose examples have a text ``prompt``, e.g. ``data/rows-v0``)."""
    args: dict = field(default_factory=dict)
    """The base task's ``task.args``."""
    min_steps: int = 2
    """Transcripts with fewer steps are skipped."""
    max_steps: int = 9
    """At most this many steps are shown (the first ones), so that every label is one digit."""
    template: str = "{steps}\nOrder:"
    """The prompt: ``{steps}`` is the shuffled steps, one ``k: step`` per line."""


@dataclass(frozen=True)
class StepOrderExample(ShowsBase):
    base: Any
    shown: tuple[str, ...]  # the steps in the order shown (label k is shown[k - 1])
    order: tuple[int, ...]  # the labels of the steps in their original order
    template: str = field(repr=False)

    @property
    def prompt(self) -> str:
        return self.template.format(steps="\n".join(f"{k}: {step}" for k, step in enumerate(self.shown, 1)))


def split_steps(text: str) -> list[str]:
    """``text`` cut at line breaks and sentence ends, empty pieces dropped.

    >>> split_steps("Q: Ann has 7 cups. How many?\\nA: 10")
    ['Q: Ann has 7 cups.', 'How many?', 'A: 10']
    """
    return [piece.strip() for piece in STEP_END.split(text) if piece.strip()]


def shuffled(steps: Sequence[str], rng: np.random.Generator) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(the steps in a random order other than the original, the labels 1..n of the original order)."""
    n = len(steps)
    perm = rng.permutation(n)  # shown position i holds original step perm[i]
    while (perm == np.arange(n)).all():
        perm = rng.permutation(n)
    label_of = {int(original): shown + 1 for shown, original in enumerate(perm)}
    return tuple(steps[int(p)] for p in perm), tuple(label_of[i] for i in range(n))


def pairs_in_order(answer: Sequence[int], order: Sequence[int]) -> float:
    """Fraction of the pairs of ``order`` that ``answer`` (a permutation of the same labels) keeps in order.

    >>> pairs_in_order([2, 3, 1], [2, 3, 1]), pairs_in_order([2, 1, 3], [2, 3, 1]), pairs_in_order([1, 3, 2], [2, 3, 1])
    (1.0, 0.6666666666666666, 0.0)
    """
    rank = {label: i for i, label in enumerate(answer)}
    n = len(order)
    kept = sum(rank[order[i]] < rank[order[j]] for i in range(n) for j in range(i + 1, n))
    return kept / (n * (n - 1) / 2)


class StepOrderTask:
    """Step reordering over a base text task (see the module docstring)."""

    reward_range = (0.0, 1.0)

    def __init__(self, cfg: StepOrderConfig):
        if "{steps}" not in cfg.template:
            raise ConfigError("task.args.template must contain {steps}")
        if not 2 <= cfg.min_steps <= cfg.max_steps <= 9:
            raise ConfigError(f"task.args needs 2 <= min_steps <= max_steps <= 9, got {cfg.min_steps}, "
                              f"{cfg.max_steps}")
        self.cfg, self.base, self.id = cfg, make_task(cfg.task, cfg.args), TASK_ID

    def sample_batch(self, split: str, n: int, rng: np.random.Generator) -> list[StepOrderExample]:
        """``n`` base examples of ``split``, each with its steps shuffled (too-short transcripts are skipped)."""
        def derive(base: Any, transcript: str) -> StepOrderExample | None:
            steps = split_steps(transcript)[:self.cfg.max_steps]
            if len(steps) < self.cfg.min_steps or len(set(steps)) < len(steps):  # one original order
                return None
            return StepOrderExample(base, *shuffled(steps, rng), self.cfg.template)

        return derived_batch(self.base, split, n, rng, derive,
                             f"{self.cfg.task}: its transcripts have fewer than {self.cfg.min_steps} steps, or "
                             "repeat one (steps end at line breaks and at '.', '?', '!')")

    def reward(self, example: StepOrderExample, output: Any) -> RewardResult:
        n = len(example.order)
        if not isinstance(output, str) or not output.strip():
            return RewardResult(0.0, {"pairs": 0.0, "exact": 0.0}, "no answer")
        said = output.strip().splitlines()[0].replace(",", " ").split()[:n]
        if sorted(said) != [str(k) for k in range(1, n + 1)]:
            return RewardResult(0.0, {"pairs": 0.0, "exact": 0.0},
                                f"not an order of the labels 1..{n}: {output.strip()[:40]!r}")
        answer = [int(s) for s in said]
        score = pairs_in_order(answer, example.order)
        exact = float(tuple(answer) == example.order)
        return RewardResult(score, {"pairs": score, "exact": exact},
                            "" if exact else f"order {' '.join(said)}, right {self.reference_output(example)}")

    def metrics(self, examples: Sequence[StepOrderExample], outputs: Sequence[Any],
                results: Sequence[RewardResult]) -> dict[str, float]:
        return {"accuracy": float(np.mean([r.components["exact"] for r in results])),
                "pairs_in_order": float(np.mean([r.score for r in results]))}

    def reference_output(self, example: StepOrderExample) -> str:
        return " ".join(str(k) for k in example.order)


register_task(TASK_ID, StepOrderTask, StepOrderConfig)
