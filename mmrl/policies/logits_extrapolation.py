"""Logits extrapolation (seed #10, "Linear evolution" of RLVR): sample from z_base + α·(z_RL − z_base).

The paper observes that the log-probabilities of an RLVR run move near-linearly in the step, and samples from
logits extrapolated along the direction RL moved them, beyond the step range where training stays stable.
Here both models read the same tokens: at every decoding step the RL policy's raw logits z_RL and the base
model's z_base for the same prefix are combined,

    z = z_base + α·(z_RL − z_base)          α = 0: the base, α = 1: the RL model, α > 1: extrapolation

before temperature, suppressed ids and top-p (the policy's own sampling pipeline), so the recorded behaviour
log-probs are those of the combined distribution. The base keeps its own key/value cache across the steps of
one ``generate`` call. ``mmrl eval ... --extrapolate-logits ALPHA --base BASE`` evaluates a model this way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor
from transformers import LogitsProcessor

from mmrl.core.contracts import Policy
from mmrl.policies.causal_lm import CausalLMPolicy
from mmrl.policies.shared_prefix import cache_keyword
from mmrl.policies.tokens import positions_from_mask


def extrapolated_logits(base: Tensor, rl: Tensor, alpha: float) -> Tensor:
    """z_base + α·(z_RL − z_base) ([..., V] each, float32)."""
    base = base.float()
    return base + alpha * (rl.float() - base)


class LogitsExtrapolation(LogitsProcessor):
    """One ``generate`` call's processor: replaces the RL model's raw logits by :func:`extrapolated_logits` with
    the base model's logits for the same prefix. The first call runs the base on the (left-padded) prompts;
    each later call feeds it the token sampled last, with its cache (the attention mask grows by one, as
    ``generate`` grows the RL model's)."""

    def __init__(self, base: torch.nn.Module, alpha: float, prompt_mask: Tensor):
        self.base, self.alpha = base, alpha
        self.attention = prompt_mask
        self.cache = None
        self.keyword = cache_keyword(base)  # ``cache`` in recent transformers, ``past_key_values`` before

    @torch.no_grad()
    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        if self.cache is None:
            new_ids = input_ids
        else:
            new_ids = input_ids[:, -1:]
            self.attention = torch.cat([self.attention, torch.ones_like(self.attention[:, :1])], 1)
        positions = positions_from_mask(self.attention)[:, -new_ids.shape[1]:]
        out = self.base(input_ids=new_ids, attention_mask=self.attention, position_ids=positions, use_cache=True,
                        **{self.keyword: self.cache})
        self.cache = out[self.keyword]
        return extrapolated_logits(out.logits[:, -1], scores, self.alpha)


@contextmanager
def logits_extrapolation(policy: Policy, base: Policy, alpha: float) -> Iterator[Policy]:
    """``policy`` sampling from the extrapolated logits of itself and ``base`` inside the block (both causal LMs
    over the same vocabulary; a TypeError / ValueError says which is not)."""
    for name, p in (("the model", policy), ("--base", base)):
        if not isinstance(p, CausalLMPolicy):
            raise TypeError(f"logits extrapolation needs causal_lm policies; {name} is a {type(p).__name__}")
    if policy.tokenizer.get_vocab() != base.tokenizer.get_vocab():
        raise ValueError("logits extrapolation needs the base and the RL model to share one tokenizer; they differ")
    base.eval()
    before = policy.logits_guides
    policy.logits_guides = (*before, lambda prompt_ids, prompt_mask: LogitsExtrapolation(base.model, alpha,
                                                                                         prompt_mask))
    try:
        yield policy
    finally:
        policy.logits_guides = before
