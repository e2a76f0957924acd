"""The seed papers' GRPO variants, registered on the core's axes (docs/algorithms.md, "Paper variants").

Importing this package registers them: estimators ``psr``, ``nsr``, ``w_reinforce``,
``noisy_backward``, ``noisy_forward``, ``beta_posterior``, ``polychromic``, ``weighted_grpo``, ``direct_opd``; the policy
loss ``rw_sft``; shaping hooks ``f_grpo``, ``ace``,
``rl_zvp``, ``divergence_weighted``, ``entropy_bonus``; rollout strategies ``plain``, ``aero``
(``ROLLOUT_STRATEGIES``); DPH-RL rehearsal divergences ``forward_kl``, ``js``, ``alpha``
(``REHEARSAL_DIVERGENCES``); extra loss terms ``calibrl``, ``pacs``, ``frpo`` (``LOSS_TERMS``); temperature schedules
``fixed``, ``erpo`` (``TEMPERATURE_SCHEDULES``); rollout hooks ``teacher_shift`` (Direct-OPD),
``polychromic_vine`` (Polychromic PPO's vine sampling), ``cipo``, ``ebft``,
``rorecomp``, ``rollout_bandit``, ``npo``, ``scope_rl``
and the loss hooks ``ssb``, ``recap`` (``mmrl.algos.hooks``). Hyper-parameters: ``algo.extra.<name>`` (typed
dataclasses in each module); trainer needs: :func:`~mmrl.algos.variants.params.algo_needs`.
"""

from mmrl.algos.variants import group_estimators, hooks, objectives, outcome, selection, shaping  # noqa: F401  (registration)
from mmrl.algos.variants import vine, corrections, distillation, feature_matching, guidance, programs  # noqa: F401  (registration: after hooks, so their hooks come last)
from mmrl.algos.variants import rollout_selection  # noqa: F401  (registration: last, so it sees every other hook's rows)
from mmrl.algos.variants.adaptive_sampling import ROLLOUT_STRATEGIES, RolloutStrategy
from mmrl.algos.variants.divergences import REHEARSAL_DIVERGENCES
from mmrl.algos.variants.history import PromptHistory, prompt_key
from mmrl.algos.variants.loss_terms import LOSS_TERMS, LossTermInputs, LossTermRows
from mmrl.algos.variants.param_noise import perturbed_parameters
from mmrl.algos.variants.prompt_temperature import TEMPERATURE_SCHEDULES, PromptTemperatures
from mmrl.algos.variants.selection import PROMPT_SELECTORS
from mmrl.algos.variants.params import VARIANTS, algo_needs, validate_extra, variant_params

__all__ = ["LOSS_TERMS", "PROMPT_SELECTORS", "REHEARSAL_DIVERGENCES", "ROLLOUT_STRATEGIES", "TEMPERATURE_SCHEDULES", "VARIANTS",
           "LossTermInputs", "LossTermRows", "PromptHistory", "PromptTemperatures", "RolloutStrategy", "algo_needs",
           "perturbed_parameters", "prompt_key", "validate_extra", "variant_params"]
