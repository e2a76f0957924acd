"""Gymnasium environments (installed as ``mmrl.envs``), registered as ``mmrl/<Name>-v<k>``.

Importing this package registers every built-in environment with gymnasium.
"""

from mmrl.envs import robot  # noqa: F401  (MuJoCo table-top tasks: mmrl/Reach-v0, mmrl/Push-v0, ...)
