"""Driving tasks (issue 8): the LaViPlan VLM waypoint planner on the :mod:`mmrl.envs.driving` world.

The RIFT closed-loop traffic policy is not built yet.
"""

from mmrl.registry import register_task
from mmrl.tasks.driving.laviplan import LaviPlanConfig, LaviPlanTask, PlanExample

register_task("driving/laviplan-v0", LaviPlanTask, LaviPlanConfig)

__all__ = ["LaviPlanConfig", "LaviPlanTask", "PlanExample"]
