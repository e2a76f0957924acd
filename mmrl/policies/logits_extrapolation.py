"""Logits extrapolation (seed #10, "Linear evolution" of RLVR): sample from z_base + α·(z_RL − z_base).

The paper observes that the log-probabilities of an RLVR run move near-linearly in the step, and samples from
logits extrapolated along the direction RL moved them, beyond the step range where training stays stable.
Here both models read the same tokens: at every decoding step the RL policy's raw logits z_RL and the base
model's z_base for the same prefix are combined,

    z = z_base + α·(z_RL − z_base)          α = 0: the base, α = 1: the RL model, α > 1: extrapolation

before temperature, suppressed ids and top-p (the policy's own sampling pipeline), so the recorded behaviour
log-probs are those of the combined distribution. ``mmrl eval ... --extrapolate-logits ALPHA --base BASE``
evaluates a model this way, for ``causal_lm`` and ``vlm`` policies (the HF sampler).

The base runs as a :data:`~mmrl.samplers.tokens.LogitsGuide` of one ``generate`` call: its first call reads the
distinct prompts (a VLM's with their images or videos, token types and the base's own 3-D mRoPE positions) into
its own key/value cache, repeated to the group; each later call feeds it the token sampled last at the next
position (a Qwen-VL's text continues one past its prompt's largest position, as ``generate`` places it with
``rope_deltas``). Positions are always given explicitly, so the base model's own ``rope_deltas`` state is never
read or written.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from transformers import LogitsProcessor

from mmrl.core.contracts import Policy
from mmrl.policies.causal_lm import CausalLMPolicy
from mmrl.policies.shared_prefix import cache_keyword, prompt_positions, rope_holder
from mmrl.policies.vlm import VLMPolicy
from mmrl.samplers.tokens import VisionPrompts


def extrapolated_logits(base: Tensor, rl: Tensor, alpha: float) -> Tensor:
    """z_base + α·(z_RL − z_base) ([..., V] each, float32). ``torch.lerp`` evaluates it so that α = 0 returns the
    base's logits and α = 1 the RL model's exactly (no rounding from adding and subtracting the difference)."""
    return torch.lerp(base.float(), rl.float(), alpha)


class LogitsExtrapolation(LogitsProcessor):
    """One ``generate`` call's processor: replaces the RL model's raw logits by :func:`extrapolated_logits` with
    the base model's logits for the same prefix.

    ``prompts`` are the call's distinct (left-padded) prompts; the call samples ``group_size`` rows of each,
    prompt-major. The first call runs the base on them once and repeats its cache to the rows; each later call
    feeds it the token sampled last, with its cache (the attention mask grows by one, as ``generate`` grows the
    RL model's, and each row's position by one)."""

    def __init__(self, base: torch.nn.Module, alpha: float, prompts: VisionPrompts, group_size: int):
        self.base, self.alpha, self.prompts, self.group_size = base, alpha, prompts, group_size
        self.mrope = rope_holder(base) is not None  # a Qwen-VL: 3-D positions [3, N, L]; else [N, L]
        self.keyword = cache_keyword(base)  # ``cache`` in recent transformers, ``past_key_values`` before
        self.cache: Any = None
        self.attention = prompts.attention_mask.repeat_interleave(group_size, 0)  # [N, P + steps so far]
        self.next_position: Tensor | None = None  # [N] long: where each row's next token sits

    @torch.no_grad()
    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        base_logits = self.read_prompts(input_ids) if self.cache is None else self.step(input_ids[:, -1:])
        return extrapolated_logits(base_logits, scores, self.alpha)

    def read_prompts(self, input_ids: Tensor) -> Tensor:
        """[N, V] the base's logits after each row's prompt; fills the cache (each prompt run once)."""
        prompts = self.prompts
        if not torch.equal(input_ids, prompts.input_ids.repeat_interleave(self.group_size, 0)):
            raise RuntimeError("logits extrapolation: generate's prompt rows are not the guide's prompts "
                               f"({prompts.num_rows} prompts × group {self.group_size}, {input_ids.shape[0]} rows)")
        positions = prompt_positions(self.base, prompts)  # [3, U, P]: the base's own (m)RoPE positions
        # Qwen-VL reads the images (or videos) and their token types; a text model only ids and 1-D positions.
        vision = {"mm_token_type_ids": prompts.mm_token_type_ids, **prompts.vision_inputs()} if self.mrope else {}
        out = self.base(input_ids=prompts.input_ids, attention_mask=prompts.attention_mask,
                        position_ids=positions if self.mrope else positions[0], use_cache=True, logits_to_keep=1,
                        **vision)
        self.cache = out[self.keyword]
        self.cache.batch_repeat_interleave(self.group_size)
        self.next_position = (positions.amax(dim=(0, 2)) + 1).repeat_interleave(self.group_size)
        return out.logits[:, -1].repeat_interleave(self.group_size, 0)

    def step(self, new_ids: Tensor) -> Tensor:
        """[N, V] the base's logits after the token each row sampled last (``new_ids`` [N, 1])."""
        self.attention = torch.cat([self.attention, torch.ones_like(self.attention[:, :1])], 1)
        positions = self.next_position[:, None]  # [N, 1]: text continues one past the last position
        out = self.base(input_ids=new_ids, attention_mask=self.attention,
                        position_ids=positions[None].expand(3, -1, -1) if self.mrope else positions, use_cache=True,
                        **{self.keyword: self.cache})
        self.cache = out[self.keyword]
        self.next_position = self.next_position + 1
        return out.logits[:, -1]


def vocabulary(policy: CausalLMPolicy | VLMPolicy) -> dict[str, int]:
    """The token → id map the policy samples from."""
    tokenizer = policy.tokenizer if isinstance(policy, CausalLMPolicy) else policy.processor.tokenizer
    return tokenizer.get_vocab()


def check_pair(policy: Policy, base: Policy) -> None:
    """A TypeError / ValueError saying why ``base`` cannot guide ``policy``'s sampling: both must be the same kind
    of token policy (``causal_lm`` or ``vlm``) over one tokenizer; VLMs must also see images alike (the base reads
    the prompts the RL model's processor encoded) and sample with the HF sampler."""
    for name, p in (("the model", policy), ("--base", base)):
        if not isinstance(p, (CausalLMPolicy, VLMPolicy)):
            raise TypeError(f"logits extrapolation needs causal_lm or vlm policies; {name} is a {type(p).__name__}")
    if type(policy) is not type(base):
        raise TypeError(f"logits extrapolation needs the model and --base to be one kind of policy; they are a "
                        f"{type(policy).__name__} and a {type(base).__name__}")
    if vocabulary(policy) != vocabulary(base):
        raise ValueError("logits extrapolation needs the base and the RL model to share one tokenizer; they differ")
    if isinstance(policy, VLMPolicy):
        if policy.cfg.sampler != "hf":
            raise ValueError(f"logits extrapolation runs the base beside transformers' generate: set "
                             f"policy.args.sampler: hf (now {policy.cfg.sampler!r})")
        vision = ("patch_size", "merge_size", "min_pixels", "max_pixels", "temporal_patch_size",
                  "video_min_pixels", "video_max_pixels")
        differ = [name for name in vision if getattr(policy, name) != getattr(base, name)]
        if differ:
            raise ValueError(f"logits extrapolation needs the base VLM to read images as the RL model does; "
                             f"their {', '.join(differ)} differ")


@contextmanager
def logits_extrapolation(policy: Policy, base: Policy, alpha: float) -> Iterator[Policy]:
    """``policy`` sampling from the extrapolated logits of itself and ``base`` inside the block (both
    ``causal_lm`` or both ``vlm`` over the same vocabulary; :func:`check_pair` says which is not)."""
    check_pair(policy, base)
    base.eval()
    model = base.model
    before = policy.logits_guides
    policy.logits_guides = (*before, lambda prompts, group_size: LogitsExtrapolation(model, alpha, prompts,
                                                                                     group_size))
    try:
        yield policy
    finally:
        policy.logits_guides = before
