"""Spatial-SSRL (arXiv 2510.27606): five self-supervised spatial pretext tasks — shuffled patch
reordering, flipped patch recognition, cropped patch inpainting, regional depth ordering, relative 3D
position — from a procedural RGB-D renderer or a folder of RGB / RGB-D images, and their mixture."""

from functools import partial

from mmrl.core.registry import register_task
from mmrl.tasks.spatial_ssrl.pretext import PRETEXTS, Puzzle, Unsuitable
from mmrl.tasks.spatial_ssrl.reward import boxed_contents, normalise_answer, ssrl_reward
from mmrl.tasks.spatial_ssrl.task import SpatialSSRLConfig, SpatialSSRLTask, SSRLExample

for _pretext in PRETEXTS:
    register_task(f"spatial_ssrl/{_pretext}-v0", partial(SpatialSSRLTask, pretexts=(_pretext,)), SpatialSSRLConfig)
register_task("spatial_ssrl/mixture-v0", partial(SpatialSSRLTask, pretexts=PRETEXTS), SpatialSSRLConfig)

__all__ = ["PRETEXTS", "Puzzle", "SSRLExample", "SpatialSSRLConfig", "SpatialSSRLTask", "Unsuitable",
           "boxed_contents", "normalise_answer", "ssrl_reward"]
