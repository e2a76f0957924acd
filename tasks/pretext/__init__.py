"""``pretext/mask-fill-v0``: MR-RLVR's masked-then-fill reward over any text task (seed #2).

MR-RLVR trains in two stages. First it trains on self-supervised, process-level rewards built from
solution text, "masked-then-fill" and "step reordering". Then it runs outcome RLVR. This task is the
masked-then-fill stage for any registered task whose examples have a text ``prompt`` and whose reference
output is text, the *base*.

**An example** is the base prompt followed by its reference answer, with one number masked by
``mask_token``. The number is drawn from ``rng`` among every number in that text. The policy answers with
the missing number.

**The reward** is 1 when the answer's first token is the masked number, else 0. A malformed answer scores
0 with a reason.

INFERRED: the abstract masks steps of multi-step solutions. Our data have one-line answers, so the
transcript is the question and its answer, and the masked span is one number. Step reordering is
``pretext/step-order-v0`` (``step_order.py``). The recipe is ``configs/mr_rlvr/text_tiny_cpu.yaml`` (pretext stage, then outcome RLVR).
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

TASK_ID = "pretext/mask-fill-v0"
NUMBER = re.compile(r"\d+")


@dataclass(frozen=True)
class MaskFillConfig:
    task: str
    """The base task (a registered id whose examples have a text ``prompt``, e.g. ``data/rows-v0``)."""
    args: dict = field(default_factory=dict)
    """The base task's ``task.args``."""
    mask_token: str = "_"
    """What replaces the masked number (it must be in the policy's vocabulary)."""
    template: str = "{text}\nMissing:"
    """The prompt: ``{text}`` is the base prompt and its reference answer, one number masked."""


@dataclass(frozen=True)
class MaskFillExample(ShowsBase):
    base: Any
    text: str  # the masked transcript
    missing: str  # the masked number
    template: str = field(repr=False)

    @property
    def prompt(self) -> str:
        return self.template.format(text=self.text)


def mask_one_number(text: str, rng: np.random.Generator, mask_token: str) -> tuple[str, str] | None:
    """(``text`` with one of its numbers, drawn by ``rng``, replaced by ``mask_token``; that number), or None
    when the text holds no number.

    >>> mask_one_number("7 plus 3 is 10", np.random.default_rng(0), "_")
    ('7 plus 3 is _', '10')
    """
    spans = [m.span() for m in NUMBER.finditer(text)]
    if not spans:
        return None
    start, end = spans[int(rng.integers(len(spans)))]
    return text[:start] + mask_token + text[end:], text[start:end]


class MaskFillTask:
    """Masked-then-fill over a base text task (see the module docstring)."""

    reward_range = (0.0, 1.0)

    def __init__(self, cfg: MaskFillConfig):
        if "{text}" not in cfg.template:
            raise ConfigError("task.args.template must contain {text}")
        if not cfg.mask_token or NUMBER.search(cfg.mask_token):
            raise ConfigError(f"task.args.mask_token must be non-empty and hold no digit, got {cfg.mask_token!r}")
        self.cfg, self.base, self.id = cfg, make_task(cfg.task, cfg.args), TASK_ID

    def sample_batch(self, split: str, n: int, rng: np.random.Generator) -> list[MaskFillExample]:
        """``n`` base examples of ``split`` with a number masked (examples without one are skipped)."""
        def derive(base: Any, transcript: str) -> MaskFillExample | None:
            masked = mask_one_number(transcript, rng, self.cfg.mask_token)
            return None if masked is None else MaskFillExample(base, masked[0], masked[1], self.cfg.template)

        return derived_batch(self.base, split, n, rng, derive, f"{self.cfg.task}: its prompts and answers hold "
                                                                 "no numbers to mask")

    def reward(self, example: MaskFillExample, output: Any) -> RewardResult:
        if not isinstance(output, str) or not output.strip():
            return RewardResult(0.0, {"filled": 0.0}, "no answer")
        said = output.strip().split()[0].strip(".,:;!?")
        right = float(said == example.missing)
        return RewardResult(right, {"filled": right}, "" if right else f"filled {said!r}, missing {example.missing!r}")

    def metrics(self, examples: Sequence[MaskFillExample], outputs: Sequence[Any],
                results: Sequence[RewardResult]) -> dict[str, float]:
        return {"accuracy": float(np.mean([r.score for r in results]))}

    def reference_output(self, example: MaskFillExample) -> str:
        return example.missing


register_task(TASK_ID, MaskFillTask, MaskFillConfig)

from mmrl.tasks.pretext import step_order  # noqa: E402,F401  (registers pretext/step-order-v0)
