"""Robot tasks over the MuJoCo table-top envs (``robot/reach-v0``, ``robot/push-v0``, ``robot/pick_place-v0``)
and over Meta-World (``robot/metaworld-<task>-v0`` for the MT10 and ML10 tasks, ``robot/metaworld-mt10-v0``,
``robot/metaworld-ml10-v0``)."""

from mmrl.core.registry import register_task
from mmrl.envs.metaworld import TASKS as METAWORLD_TASKS
from mmrl.tasks.robot.metaworld import MetaWorldTask, MetaWorldTaskConfig, make_metaworld_task_factory
from mmrl.tasks.robot.tabletop import (Demonstration, EpisodeExample, RobotTask, RobotTaskConfig, episode_reward,
                                       make_task_factory)
from mmrl.tasks.robot.world_model_rft import WorldModelRFTTask, WorldModelTaskConfig, make_wm_task_factory

for _name in ("reach", "push", "pick_place"):
    register_task(f"robot/{_name}-v0", make_task_factory(_name), RobotTaskConfig)
for _name in (*METAWORLD_TASKS, "MT10", "ML10"):
    register_task(f"robot/metaworld-{_name.lower()}-v0", make_metaworld_task_factory(_name), MetaWorldTaskConfig)
register_task("robot/wm_reach-v0", make_wm_task_factory("reach"), WorldModelTaskConfig)  # VLA-RFT (world model)

__all__ = ["Demonstration", "EpisodeExample", "MetaWorldTask", "MetaWorldTaskConfig", "RobotTask", "RobotTaskConfig",
           "WorldModelRFTTask", "WorldModelTaskConfig", "episode_reward"]
