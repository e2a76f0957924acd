"""mmrl: reinforcement fine-tuning with verifiable rewards for multimodal and embodied models.

One policy-gradient core (:mod:`mmrl.algos`, :mod:`mmrl.core.trainer`) drives task adapters
(:mod:`mmrl.tasks`) and environments (:mod:`mmrl.envs`) through small contracts
(:mod:`mmrl.core.contracts`, :mod:`mmrl.core.rollout`).
"""

__version__ = "0.1.0"
