"""Driving tasks (issue 8): the LaViPlan VLM waypoint planner on the :mod:`mmrl.envs.driving` world.

``driving/laviplan-highway-v0``: the same planner on highway-env scenes (``laviplan_highway.py``; the
highway-env package is the optional ``highway`` extra, imported when the task is made).
``driving/rift-v0``: RIFT's group-relative fine-tuning of a candidate-scoring traffic policy (``rift.py``);
``driving/rift-highway-v0``: the same on highway-env traffic (``rift_highway.py``, the ``highway`` extra).
"""

from mmrl.core.registry import register_task
from mmrl.tasks.driving.laviplan import LaviPlanConfig, LaviPlanTask, PlanExample
from mmrl.tasks.driving.laviplan_highway import HighwayPlanExample, LaviPlanHighwayConfig, LaviPlanHighwayTask
from mmrl.tasks.driving.rift import RiftConfig, RiftExample, RiftTask
from mmrl.tasks.driving.rift_highway import HighwayRiftExample, RiftHighwayConfig, RiftHighwayTask

register_task("driving/laviplan-v0", LaviPlanTask, LaviPlanConfig)
register_task("driving/laviplan-highway-v0", LaviPlanHighwayTask, LaviPlanHighwayConfig)
register_task("driving/rift-v0", RiftTask, RiftConfig)
register_task("driving/rift-highway-v0", RiftHighwayTask, RiftHighwayConfig)

__all__ = ["HighwayPlanExample", "HighwayRiftExample", "RiftHighwayConfig", "RiftHighwayTask", "LaviPlanConfig", "LaviPlanHighwayConfig", "LaviPlanHighwayTask", "LaviPlanTask",
           "PlanExample", "RiftConfig", "RiftExample", "RiftTask"]
