"""Driving tasks (issue 8): the LaViPlan VLM waypoint planner on the :mod:`mmrl.envs.driving` world.

``driving/rift-v0``: RIFT's group-relative fine-tuning of a candidate-scoring traffic policy (``rift.py``).
"""

from mmrl.core.registry import register_task
from mmrl.tasks.driving.laviplan import LaviPlanConfig, LaviPlanTask, PlanExample
from mmrl.tasks.driving.rift import RiftConfig, RiftExample, RiftTask

register_task("driving/laviplan-v0", LaviPlanTask, LaviPlanConfig)
register_task("driving/rift-v0", RiftTask, RiftConfig)

__all__ = ["LaviPlanConfig", "LaviPlanTask", "PlanExample", "RiftConfig", "RiftExample", "RiftTask"]
