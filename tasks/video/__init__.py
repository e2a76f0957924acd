"""Procedural video tasks for the VLM path (issue 25): questions that need more than one frame."""

from mmrl.core.registry import register_task
from mmrl.tasks.video.motion import MotionConfig, MotionExample, MotionTask

register_task("video/motion-v0", MotionTask, MotionConfig)

__all__ = ["MotionConfig", "MotionExample", "MotionTask"]
