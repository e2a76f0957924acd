"""The imagegen task: prompts from :mod:`shapes`, a weighted sum of the rewards of :mod:`rewards`.

Reward names usable in ``reward_weights`` (score = Σ w_k · r_k, Flow-GRPO's multi-reward):

- ``correctness``: mean of the colour / count / shape / position checks, in [0, 1];
- ``correct``: 1 when all four checks pass (GenEval's strict rule), else 0;
- ``jpeg_compressibility``: −JPEG size in kB (DDPO); ``jpeg_incompressibility``: +size in kB;
- ``brightness``: mean pixel value / 255, in [0, 1] (a pixel-statistics target, the CPU analogue
  of Flow-GRPO's dense rewards; a quick learning signal for tests, not prompt-aware).

``RewardResult.components`` always carries every check, ``correctness``, ``correct`` and
``jpeg_kb``, whatever the weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from mmrl.core.contracts import RewardResult
from mmrl.tasks.imagegen.rewards import CHECKS, as_image, correctness, jpeg_size_kb, prompt_checks
from mmrl.tasks.imagegen.shapes import ShapePrompt, all_prompts, is_ood, render, split_of

SPLITS = ("train", "test", "ood")
REWARDS = ("correctness", "correct", "jpeg_compressibility", "jpeg_incompressibility", "brightness")
BOUNDED = {"correctness": (0.0, 1.0), "correct": (0.0, 1.0), "brightness": (0.0, 1.0)}


@dataclass(frozen=True)
class ShapesConfig:
    size: int = 16
    """Image side in pixels (the policy must generate this size)."""
    test_fraction: float = 0.25
    """Share of the 64 prompts held out as the test split (by a hash of the prompt text)."""
    reward_weights: dict = field(default_factory=lambda: {"correctness": 1.0})
    """Reward name → weight (names: correctness, correct, jpeg_compressibility, jpeg_incompressibility,
    brightness)."""
    exclude_ood: bool = False
    """Drop the ``ood`` split's prompts (``shapes.OOD_COMBINATIONS``, colour × shape pairs held out of
    VAR pretraining) from train and test; the ``ood`` split always holds them."""


class ShapesTask:
    def __init__(self, cfg: ShapesConfig):
        unknown = sorted(set(cfg.reward_weights) - set(REWARDS))
        if unknown or not cfg.reward_weights:
            raise ValueError(f"task.args.reward_weights: unknown or no rewards {unknown}; choose from {REWARDS}")
        if not 0 < cfg.test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {cfg.test_fraction}")
        if cfg.size < 8:
            raise ValueError(f"size must be >= 8 pixels, got {cfg.size}")
        self.cfg = cfg
        self.id = "imagegen/shapes-v0"
        self.prompts = {split: [p for p in all_prompts() if split_of(p, cfg.test_fraction) == split
                                and not (cfg.exclude_ood and is_ood(p))] for split in ("train", "test")}
        self.prompts["ood"] = [p for p in all_prompts() if is_ood(p)]
        for split, prompts in self.prompts.items():
            if not prompts:
                raise ValueError(f"test_fraction {cfg.test_fraction} leaves the {split} split empty")
        low = high = 0.0
        for name, w in cfg.reward_weights.items():
            lo, hi = BOUNDED.get(name, (-math.inf, math.inf))
            low, high = low + min(w * lo, w * hi), high + max(w * lo, w * hi)
        self.reward_range = (low, high)

    def sample_batch(self, split: str, n: int, rng: np.random.Generator) -> list[ShapePrompt]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; imagegen/shapes-v0 has {SPLITS}")
        prompts = self.prompts[split]
        return [prompts[i] for i in rng.integers(0, len(prompts), size=n)]

    def reward(self, example: ShapePrompt, output: object) -> RewardResult:
        image, reason = as_image(output)
        if image is None:
            return RewardResult(0.0, dict.fromkeys(("object", *CHECKS, "correctness", "correct", "jpeg_kb",
                                                    "brightness"), 0.0),
                                reason)
        checks, info = prompt_checks(image, example)
        values = {"correctness": correctness(checks), "correct": float(all(checks[c] for c in CHECKS)),
                  "jpeg_kb": jpeg_size_kb(image), "brightness": float(image.mean()) / 255.0}
        values["jpeg_compressibility"], values["jpeg_incompressibility"] = -values["jpeg_kb"], values["jpeg_kb"]
        score = sum(w * values[name] for name, w in self.cfg.reward_weights.items())
        components = {**checks, **{k: values[k] for k in ("correctness", "correct", "jpeg_kb", "brightness")}}
        return RewardResult(float(score), components, info)

    def reference_output(self, example: ShapePrompt) -> np.ndarray:
        """A correct image, drawn with a seed derived from the prompt (deterministic)."""
        seed = int.from_bytes(example.prompt.encode()[:8].ljust(8, b"\0"), "little")
        return render(example, self.cfg.size, np.random.default_rng(seed))

    def metrics(self, examples: Sequence[ShapePrompt], outputs: Sequence[object],
                results: Sequence[RewardResult]) -> dict[str, float]:
        keys = ("object", *CHECKS, "correct", "jpeg_kb", "brightness")
        return {(k if k in ("correct", "jpeg_kb", "brightness") else f"{k}_acc"):
                float(np.mean([r.components.get(k, 0.0) for r in results])) for k in keys}
