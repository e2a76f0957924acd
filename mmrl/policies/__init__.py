"""Policies: thin adapters over Hugging Face / diffusers models, registered by name."""

from mmrl.policies.causal_lm import CausalLMConfig, CausalLMPolicy
from mmrl.policies.diffusion import DiffusionConfig, DiffusionPolicy
from mmrl.policies.traffic import CandidateScorerConfig, CandidateScorerPolicy
from mmrl.policies.var import VARConfig, VARPolicy
from mmrl.policies.vla import VLAConfig, VLAPolicy
from mmrl.policies.vla_vlm import VLAVLMConfig, VLAVLMPolicy
from mmrl.policies.vlm import VLMConfig, VLMPolicy
from mmrl.core.registry import register_policy

register_policy("causal_lm", CausalLMPolicy.from_config, CausalLMConfig)
register_policy("diffusion", DiffusionPolicy.from_config, DiffusionConfig)
register_policy("vlm", VLMPolicy.from_config, VLMConfig)
register_policy("vla", VLAPolicy.from_config, VLAConfig)
register_policy("vla_vlm", VLAVLMPolicy.from_config, VLAVLMConfig)
register_policy("var", VARPolicy.from_config, VARConfig)
register_policy("candidate_scorer", CandidateScorerPolicy.from_config, CandidateScorerConfig)

__all__ = ["CandidateScorerConfig", "CandidateScorerPolicy", "CausalLMConfig", "CausalLMPolicy", "DiffusionConfig", "DiffusionPolicy", "VARConfig", "VARPolicy",
           "VLAConfig", "VLAPolicy", "VLAVLMConfig", "VLAVLMPolicy", "VLMConfig", "VLMPolicy"]
