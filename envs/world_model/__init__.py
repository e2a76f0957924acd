"""Learned world-model simulators for VLA fine-tuning (VLA-RFT, Li et al. 2025): ``mmrl.envs.world_model``.

- :mod:`.model`: the action-conditioned latent-dynamics frame predictor and its saved format;
- :mod:`.data`: real MuJoCo trajectories (expert, noisy expert, random) to train it on;
- :mod:`.training`: ``mmrl train-world-model <recipe>``, accuracy against the real simulator, cache;
- :mod:`.env`: ``mmrl/WM-Reach-v0``, a gymnasium env (and batched vector env) stepping the model,
  with VLA-RFT's trajectory-level reward −(MAE + 1 − SSIM) against the expert's imagined rollout.

``gymnasium.make("mmrl/WM-Reach-v0", world_model=<folder or recipe>)``; without ``world_model``
the default recipe ``configs/world_model/reach_tiny.yaml`` is trained on first use and cached in
``$MMRL_CACHE/world_model/``.
"""

from __future__ import annotations

import gymnasium

from mmrl.envs.world_model.env import WorldModelEnv, WorldModelVectorEnv

WM_TASKS = {"reach": "Reach"}


def wm_env_id(task: str) -> str:
    return f"mmrl/WM-{WM_TASKS[task]}-v0"


WM_ENV_IDS: list[str] = []
for _task in WM_TASKS:
    _id = wm_env_id(_task)
    if _id not in gymnasium.registry:
        gymnasium.register(id=_id, entry_point=WorldModelEnv, vector_entry_point=WorldModelVectorEnv,
                           kwargs={"task": _task})
    WM_ENV_IDS.append(_id)

__all__ = ["WM_ENV_IDS", "WM_TASKS", "WorldModelEnv", "WorldModelVectorEnv", "wm_env_id"]
