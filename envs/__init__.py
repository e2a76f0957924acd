"""Gymnasium environments (installed as ``mmrl.envs``), registered as ``mmrl/<Name>-v<k>``.

Importing this package registers every built-in environment with gymnasium.
"""

from mmrl.envs import robot  # noqa: F401  (MuJoCo table-top tasks: mmrl/Reach-v0, mmrl/Push-v0, ...)
from mmrl.envs import driving  # noqa: F401  (2-D multi-agent driving world: mmrl/Driving-v0, ...)
from mmrl.envs import world_model  # noqa: F401  (learned world-model simulators: mmrl/WM-<Task>-v0)
from mmrl.envs import metaworld  # noqa: F401  (Meta-World tasks: mmrl/MetaWorld-Reach-v0, ...; metaworld is imported on first make)
