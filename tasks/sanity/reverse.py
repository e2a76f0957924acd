"""``sanity/reverse-v0``: given ``"3142>"`` emit ``"2413"`` (the digits reversed) and stop.

Reward (range [0, 1]): the fraction of positions where the output matches the target, over the
longer of the two strings, so both missing and extra characters cost. ``exact`` is 1 only for the
exact string. Train and test strings are disjoint (a hash of the digits picks the split).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mmrl.core.contracts import RewardResult

SPLITS = ("train", "test")


@dataclass(frozen=True)
class ReverseConfig:
    min_len: int = 3
    """Shortest digit string."""
    max_len: int = 4
    """Longest digit string."""
    test_fraction: float = 0.2
    """Share of all digit strings held out for the test split."""


@dataclass(frozen=True)
class ReverseExample:
    digits: str

    @property
    def prompt(self) -> str:
        return f"{self.digits}>"

    @property
    def target(self) -> str:
        return self.digits[::-1]


def sequence_reward(output: str, target: str) -> RewardResult:
    """Position-wise match over the longer string; total for any input.

    >>> sequence_reward("2413", "2413").score
    1.0
    >>> sequence_reward("241", "2413").score
    0.75
    >>> sequence_reward("24135", "2413").score
    0.8
    """
    if not isinstance(output, str) or not output:
        return RewardResult(0.0, {"exact": 0.0, "position_acc": 0.0}, "empty or non-text output")
    matches = sum(a == b for a, b in zip(output, target))
    score = matches / max(len(output), len(target))
    exact = float(output == target)
    info = "" if exact else (f"length {len(output)} != {len(target)}" if len(output) != len(target)
                             else f"{len(target) - matches} wrong positions")
    return RewardResult(score, {"exact": exact, "position_acc": score}, info)


class ReverseTask:
    reward_range = (0.0, 1.0)

    def __init__(self, cfg: ReverseConfig):
        if not 1 <= cfg.min_len <= cfg.max_len:
            raise ValueError(f"need 1 <= min_len <= max_len, got {cfg.min_len}, {cfg.max_len}")
        if not 0 < cfg.test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {cfg.test_fraction}")
        self.cfg = cfg
        self.id = "sanity/reverse-v0"

    def split_of(self, digits: str) -> str:
        bucket = zlib.crc32(digits.encode()) % 1000
        return "test" if bucket < 1000 * self.cfg.test_fraction else "train"

    def sample_batch(self, split: str, n: int, rng: np.random.Generator) -> list[ReverseExample]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; sanity/reverse-v0 has {SPLITS}")
        examples = []
        while len(examples) < n:
            length = int(rng.integers(self.cfg.min_len, self.cfg.max_len + 1))
            digits = "".join(str(d) for d in rng.integers(0, 10, size=length))
            if self.split_of(digits) == split:
                examples.append(ReverseExample(digits))
        return examples

    def reward(self, example: ReverseExample, output: str) -> RewardResult:
        return sequence_reward(output, example.target)

    def reference_output(self, example: ReverseExample) -> str:
        return example.target

    def metrics(self, examples: Sequence[ReverseExample], outputs: Sequence[str],
                results: Sequence[RewardResult]) -> dict[str, float]:
        return {"exact_match": float(np.mean([r.components["exact"] for r in results])),
                "position_acc": float(np.mean([r.components["position_acc"] for r in results]))}
