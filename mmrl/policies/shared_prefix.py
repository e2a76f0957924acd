"""Each prompt read once for its whole group, in sampling and in re-scoring (Qwen-VL models).

A GRPO group is G completions of one prompt. Read row by row, the prompt (its text and, through the
vision tower, its images) is computed G times in generation and G times again in every update pass;
with short completions that is most of the work. Here the distinct prompts run once, their
key/value cache is expanded to the group's rows (an index, differentiable: the gradient of every
completion flows back into its prompt's computation, summed over the group), and only completion
tokens run per row. The log-probs equal the row-by-row forward's to float rounding
(``tests/policies/test_shared_prefix.py``).

Positions: Qwen-VL models place text and image tokens with 3-D (mRoPE) positions. They are
computed once per prompt (:func:`prompt_positions`, kept in ``VisionPrompts.position_ids``); a
completion continues as text from one past its prompt's largest position.

Gradient checkpointing: transformers drops the cache in a checkpointed layer's training forward,
unless the layer only reads it (``_can_checkpoint_with_cache``). Sharing under checkpointing is an
option (``policy.args.share_prompts_under_checkpointing``), because it costs memory: the prompt pass
runs without checkpointing (U rows, 1/G of the prompt tokens, but all of each layer's activations) and
writes the cache; the completion pass runs checkpointed over a read-only copy of it
(:class:`ReadOnlyLayer`: each call returns the prompt's states followed by the new ones and stores
nothing, so the backward recompute reads the same), and that group-expanded cache lives until the
backward. By default a checkpointed update scores row by row, as memory is what checkpointing is for.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.modeling_layers import GradientCheckpointingLayer

from mmrl.policies.tokens import positions_from_mask
from mmrl.samplers.tokens import VisionPrompts


def plain_model(model: nn.Module) -> nn.Module:
    """The transformers model under a peft wrapper (or ``model`` itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def cache_keyword(model: nn.Module) -> str:
    """The forward's name for a KV cache: ``cache`` in recent transformers, ``past_key_values`` before."""
    parameters = inspect.signature(plain_model(model).forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def rope_holder(model: nn.Module) -> nn.Module | None:
    """The submodule that keeps Qwen-VL's ``rope_deltas`` between generation steps (None: not a Qwen-VL)."""
    return next((m for m in plain_model(model).modules() if hasattr(m, "rope_deltas") and hasattr(m, "get_rope_index")),
                None)


def prompt_positions(model: nn.Module, prompts: VisionPrompts) -> Tensor:
    """[3, N, P] long: the (m)RoPE positions of the prompt tokens, as the model's own forward places them
    (``get_rope_index`` where a row shows images or videos, else positions that skip the left padding)."""
    holder = rope_holder(model)
    vision = {k: v for k, v in prompts.vision_inputs().items() if k.endswith("grid_thw") or k == "second_per_grid_ts"}
    if holder is None or not vision:
        return positions_from_mask(prompts.attention_mask)[None].expand(3, -1, -1).clone()
    positions, _ = holder.get_rope_index(prompts.input_ids, attention_mask=prompts.attention_mask,
                                         mm_token_type_ids=prompts.mm_token_type_ids, **vision)
    return positions


def next_positions(prompts: VisionPrompts) -> Tensor:
    """[N] long: the position of the first token after each prompt (one past its largest)."""
    return prompts.position_ids.amax(dim=(0, 2)) + 1


def can_share(model: nn.Module, prompts: VisionPrompts, under_checkpointing: bool = False) -> bool:
    """Whether the prompt rows can be run once and their cache expanded: a Qwen-VL model with positions
    computed; with gradient checkpointing on, only when asked (``under_checkpointing``: it trades memory for
    speed) and where transformers lets a checkpointed layer keep a read cache."""
    if prompts.position_ids is None or rope_holder(model) is None:
        return False
    if not checkpointed_layers(model):
        return True
    return under_checkpointing and hasattr(GradientCheckpointingLayer, "_can_checkpoint_with_cache")


def checkpointed_layers(model: nn.Module) -> list[nn.Module]:
    """The layers that recompute their forward in the backward pass (training mode, checkpointing on)."""
    base = plain_model(model)
    return [m for m in base.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing
            and m.training]


@contextlib.contextmanager
def layer_flags(layers: list[nn.Module], **flags: bool) -> Iterator[None]:
    """Set attributes of ``layers`` for the duration (instance attributes, removed or restored after)."""
    saved = [{name: layer.__dict__[name] for name in flags if name in layer.__dict__} for layer in layers]
    for layer in layers:
        for name, value in flags.items():
            setattr(layer, name, value)
    try:
        yield
    finally:
        for layer, before in zip(layers, saved):
            for name in flags:
                if name in before:
                    setattr(layer, name, before[name])
                else:
                    delattr(layer, name)


class ReadOnlyLayer(DynamicLayer):
    """A cache layer of prompt keys and values that a forward reads but never extends: each call returns the
    prompt's states followed by the new ones, so a checkpointed layer's recompute reads what its forward read."""

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)


def read_only(cache: DynamicCache) -> DynamicCache:
    """``cache`` with every layer made a :class:`ReadOnlyLayer` (same tensors)."""
    for i, layer in enumerate(cache.layers):
        frozen = ReadOnlyLayer.__new__(ReadOnlyLayer)
        frozen.__dict__.update(layer.__dict__)
        cache.layers[i] = frozen
    return cache


def score_logits(model: nn.Module, prompts: VisionPrompts, prompt_of_row: Tensor, completion_ids: Tensor,
                 completion_mask: Tensor) -> Tensor:
    """[N, T, V] logits predicting each completion token, with each distinct prompt run once.

    ``prompts`` holds the distinct prompts (U rows, positions computed); row n of the completions
    continues prompt ``prompt_of_row[n]``. The last prompt position predicts completion token 0; the
    completion's own positions 0 … T − 2 predict tokens 1 … T − 1."""
    keyword = cache_keyword(model)
    cache = DynamicCache(config=plain_model(model).config)
    checkpointed = checkpointed_layers(model)
    with layer_flags(checkpointed, gradient_checkpointing=False):  # the prompt pass writes the cache
        out = model(input_ids=prompts.input_ids, attention_mask=prompts.attention_mask,
                    position_ids=prompts.position_ids, mm_token_type_ids=prompts.mm_token_type_ids, use_cache=True,
                    logits_to_keep=1, **{keyword: cache}, **prompts.vision_inputs())
    first = out.logits[:, -1:][prompt_of_row]
    steps = completion_ids.shape[1] - 1
    if steps == 0:
        return first
    cache.batch_select_indices(prompt_of_row)
    if checkpointed:
        cache = read_only(cache)
    start = next_positions(prompts)[prompt_of_row]
    positions = (start[:, None] + torch.arange(steps, device=start.device))[None].expand(3, -1, -1)
    attention = torch.cat([prompts.attention_mask[prompt_of_row], completion_mask[:, :-1]], 1)
    with layer_flags(checkpointed, _can_checkpoint_with_cache=True):
        rest = model(input_ids=completion_ids[:, :-1], attention_mask=attention, position_ids=positions,
                     use_cache=True, **{keyword: cache}).logits
    return torch.cat([first, rest], 1)


@torch.no_grad()
def prefill_for_generation(model: nn.Module, prompts: VisionPrompts, group_size: int) -> dict[str, Any] | None:
    """The keyword arguments that make ``model.generate`` on the group-expanded rows start from one
    prefill per prompt: all prompt tokens but the last run once, the cache is repeated ``group_size``
    times, and the rope offsets are set for the expanded rows (``generate`` then runs the last prompt
    token and samples). None where that does not apply (not a Qwen-VL, or a prompt ending in an
    image token), and the caller generates row by row. Positions are computed here if the prompts lack them."""
    holder = rope_holder(model)
    if holder is None or bool(prompts.mm_token_type_ids[:, -1].any()):
        return None
    if prompts.position_ids is None:
        prompts = replace(prompts, position_ids=prompt_positions(model, prompts))
    keyword = cache_keyword(model)
    cache = DynamicCache(config=plain_model(model).config)
    model(input_ids=prompts.input_ids[:, :-1], attention_mask=prompts.attention_mask[:, :-1],
          position_ids=prompts.position_ids[:, :, :-1], mm_token_type_ids=prompts.mm_token_type_ids[:, :-1],
          use_cache=True, logits_to_keep=1, **{keyword: cache}, **prompts.vision_inputs())
    cache.batch_repeat_interleave(group_size)
    # generate places the new tokens at (real tokens so far) + rope_deltas, as after its own prefill.
    deltas = next_positions(prompts) - prompts.attention_mask.sum(1)
    holder.rope_deltas = deltas.repeat_interleave(group_size)[:, None]
    return {keyword: cache}
