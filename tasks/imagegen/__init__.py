"""Image generation tasks: procedural prompts over coloured shapes, verifiable image rewards."""

from mmrl.core.registry import register_task
from mmrl.tasks.imagegen.shapes import ShapePrompt, all_prompts, prompt_vocabulary, render
from mmrl.tasks.imagegen.task import ShapesConfig, ShapesTask

register_task("imagegen/shapes-v0", ShapesTask, ShapesConfig)

__all__ = ["ShapePrompt", "ShapesConfig", "ShapesTask", "all_prompts", "prompt_vocabulary", "render"]
