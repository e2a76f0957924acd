"""2-D multi-agent driving world (shapely geometry, kinematic bicycle, IDM + pure-pursuit traffic).

Modules: ``geometry`` (polylines, oriented boxes, frames), ``maps`` (procedural road layouts),
``world`` (seeded scenarios with OOD splits, traffic simulation, ``check_trajectory``,
``expert_trajectory``), ``render`` (ego-centred BEV raster), ``env`` (the gymnasium env).

Registered: ``mmrl/Driving-v0`` (:class:`~mmrl.envs.driving.env.DrivingEnv`; the scenario split —
``train``, ``test``, ``ood_layout``, ``ood_obstacles``, ``ood_dense``, ``ood_weather`` — is the make
kwarg ``split`` or the reset option ``{"split": ...}``; ``action_mode`` ``continuous`` or ``candidates``).
"""

import gymnasium

from mmrl.envs.driving.env import DrivingEnv

if "mmrl/Driving-v0" not in gymnasium.registry:
    gymnasium.register(id="mmrl/Driving-v0", entry_point=DrivingEnv, kwargs={"split": "train"})

__all__ = ["DrivingEnv"]
