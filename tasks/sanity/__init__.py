"""The core's learning check: a tiny causal LM must reverse a digit string."""

from mmrl.core.registry import register_task
from mmrl.tasks.sanity.reverse import ReverseConfig, ReverseExample, ReverseTask, sequence_reward

register_task("sanity/reverse-v0", ReverseTask, ReverseConfig)

__all__ = ["ReverseConfig", "ReverseExample", "ReverseTask", "sequence_reward"]
