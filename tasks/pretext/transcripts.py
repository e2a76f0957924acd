"""What the MR-RLVR pretexts (``pretext/mask-fill-v0``, ``pretext/step-order-v0``) share: drawing pretext examples
from a base task's transcripts (a base prompt followed by its reference answer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from mmrl.core.typed import ConfigError


def derived_batch(base_task: Any, split: str, n: int, rng: np.random.Generator,
                  derive: Callable[[Any, str], Any | None], none_left: str) -> list[Any]:
    """``n`` pretext examples, each ``derive(base, transcript)`` of a base example of ``split`` (its prompt and
    reference answer); base examples it returns None for are skipped. A ``ConfigError`` saying ``none_left`` when
    100 draws do not fill the batch."""
    examples: list[Any] = []
    for _ in range(100):
        for base in base_task.sample_batch(split, n - len(examples), rng):
            example = derive(base, f"{base.prompt} {base_task.reference_output(base)}")
            if example is not None:
                examples.append(example)
        if len(examples) == n:
            return examples
    raise ConfigError(none_left)
