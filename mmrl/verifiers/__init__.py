"""Verifiers: the reward functions a recipe names and combines (``task.args.reward``).

``build_reward("math")``, ``build_reward({"math": 0.9, "format": 0.1})`` or
``build_reward("my_rewards.py:score")`` returns a :class:`Reward`, called on a batch as
``reward(prompts, completions, columns) -> RewardBatch``. Importing this package registers the built-in
verifiers: ``math``, ``choice``, ``number``, ``exact``, ``iou``, ``json_f1``, ``format``, ``classifier``,
``judge`` (docs/verifiers.md).
"""

from mmrl.verifiers.base import (VERIFIERS, Reward, RewardBatch, RewardError, RewardSpecError, Verifier,
                                 register_verifier)
from mmrl.verifiers.spec import build_reward
from mmrl.verifiers import answers, fields, grounding, math_equivalence, models  # noqa: F401  (registration)

__all__ = ["VERIFIERS", "Reward", "RewardBatch", "RewardError", "RewardSpecError", "Verifier", "build_reward",
           "register_verifier"]
