"""The policy-gradient core: pure tensor functions behind registries, one axis each.

- ``ADVANTAGE_ESTIMATORS``: grpo, rloo, reinforce_pp, gae, returns (+ the variants of ``docs/algorithms.md``)
- ``POLICY_LOSSES``: ppo_clip, gspo, gspo_token, reinforce, none (+ the variants of ``docs/algorithms.md``)
- ``AGGREGATIONS``: token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm
- ``KL_ESTIMATORS``: k1, k2, k3, low_var_kl (+ GAUSSIAN_KL_ESTIMATORS: gaussian_mean, Flow-GRPO)
- ``SHAPING_HOOKS``: adv_clip (+ the variants of ``docs/algorithms.md``)
"""

from mmrl.algos.advantages import ADVANTAGE_ESTIMATORS, AdvantageInputs, discounted_returns
from mmrl.algos.aggregation import AGGREGATIONS, aggregate
from mmrl.algos.config import AlgoConfig
from mmrl.algos.losses import POLICY_LOSSES, bounded_log_ratio, clipped_surrogate, truncated_is_weights
from mmrl.algos.masked import count_nonfinite, group_is_constant, group_mean_std, masked_mean, masked_whiten
from mmrl.algos.regularizers import (KL_ESTIMATORS, drift_gate, entropy_from_logits, explained_variance, kl_penalty,
                                     value_loss)
from mmrl.algos.sampling import groups_with_signal, overlong_penalty
from mmrl.algos.shaping import SHAPING_HOOKS, ShapingContext
from mmrl.algos import variants  # noqa: E402,F401  (registers the paper variants on the axes above)
from mmrl.algos import offpolicy  # noqa: E402,F401  (registers the off-policy learners' loss hook)
from mmrl.algos import real_steps  # noqa: E402,F401  (last: the innermost rollout hook, counts real env steps)
from mmrl.algos.flow_grpo import GAUSSIAN_KL_ESTIMATORS  # noqa: E402  (grpo_global_std, gaussian_mean KL)

__all__ = [
    "ADVANTAGE_ESTIMATORS", "AGGREGATIONS", "GAUSSIAN_KL_ESTIMATORS", "KL_ESTIMATORS", "POLICY_LOSSES",
    "SHAPING_HOOKS",
    "AdvantageInputs", "AlgoConfig", "ShapingContext", "aggregate", "bounded_log_ratio", "clipped_surrogate",
    "count_nonfinite", "discounted_returns", "entropy_from_logits", "explained_variance", "group_is_constant",
    "group_mean_std",
    "groups_with_signal", "kl_penalty", "masked_mean", "masked_whiten", "overlong_penalty",
    "truncated_is_weights", "value_loss",
]
