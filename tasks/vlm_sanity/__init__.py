"""Tiny VQA sanity task for the VLM path (issue 3): colour / count of procedurally drawn shapes."""

from mmrl.core.registry import register_task
from mmrl.tasks.vlm_sanity.shapes import (ShapeColorConfig, ShapeColorTask, ShapeExample, answer_reward,
                                          extract_answer)

register_task("vlm_sanity/shape_color-v0", ShapeColorTask, ShapeColorConfig)

__all__ = ["ShapeColorConfig", "ShapeColorTask", "ShapeExample", "answer_reward", "extract_answer"]
