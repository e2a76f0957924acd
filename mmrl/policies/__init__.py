"""Policies: thin adapters over Hugging Face / diffusers models, registered by name."""

from mmrl.policies.causal_lm import CausalLMConfig, CausalLMPolicy
from mmrl.registry import register_policy

register_policy("causal_lm", CausalLMPolicy.from_config, CausalLMConfig)

__all__ = ["CausalLMConfig", "CausalLMPolicy"]
