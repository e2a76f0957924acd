"""Driving tasks (issue 8): the LaViPlan VLM waypoint planner on the :mod:`mmrl.envs.driving` world.

``driving/laviplan-highway-v0``: the same planner on highway-env scenes (``laviplan_highway.py``; the
highway-env package is the optional ``highway`` extra, imported when the task is made).
``driving/rift-v0``: RIFT's group-relative fine-tuning of a candidate-scoring traffic policy (``rift.py``).
"""

from mmrl.core.registry import register_task
from mmrl.tasks.driving.laviplan import LaviPlanConfig, LaviPlanTask, PlanExample
from mmrl.tasks.driving.laviplan_highway import HighwayPlanExample, LaviPlanHighwayConfig, LaviPlanHighwayTask
from mmrl.tasks.driving.rift import RiftConfig, RiftExample, RiftTask

register_task("driving/laviplan-v0", LaviPlanTask, LaviPlanConfig)
register_task("driving/laviplan-highway-v0", LaviPlanHighwayTask, LaviPlanHighwayConfig)
register_task("driving/rift-v0", RiftTask, RiftConfig)

__all__ = ["HighwayPlanExample", "LaviPlanConfig", "LaviPlanHighwayConfig", "LaviPlanHighwayTask", "LaviPlanTask",
           "PlanExample", "RiftConfig", "RiftExample", "RiftTask"]
