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

Gradient checkpointing drops the cache in training forwards (transformers turns ``use_cache`` off),
so with it the policy scores row by row (:func:`can_share`).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor, nn
from transformers import DynamicCache

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


def can_share(model: nn.Module, prompts: VisionPrompts) -> bool:
    """Whether the prompt rows can be run once and their cache expanded: a Qwen-VL model with positions
    computed, and no gradient checkpointing in a training forward (it turns the cache off)."""
    base = plain_model(model)
    # transformers 5 renamed is_gradient_checkpointing (deprecated) to is_activation_checkpointing.
    flag = "is_activation_checkpointing" if hasattr(type(base), "is_activation_checkpointing") else \
        "is_gradient_checkpointing"
    checkpointing = bool(getattr(base, flag, False)) and base.training
    return prompts.position_ids is not None and rope_holder(model) is not None and not checkpointing


def score_logits(model: nn.Module, prompts: VisionPrompts, prompt_of_row: Tensor, completion_ids: Tensor,
                 completion_mask: Tensor) -> Tensor:
    """[N, T, V] logits predicting each completion token, with each distinct prompt run once.

    ``prompts`` holds the distinct prompts (U rows, positions computed); row n of the completions
    continues prompt ``prompt_of_row[n]``. The last prompt position predicts completion token 0; the
    completion's own positions 0 … T − 2 predict tokens 1 … T − 1."""
    keyword = cache_keyword(model)
    cache = DynamicCache(config=plain_model(model).config)
    out = model(input_ids=prompts.input_ids, attention_mask=prompts.attention_mask, position_ids=prompts.position_ids,
                mm_token_type_ids=prompts.mm_token_type_ids, use_cache=True, logits_to_keep=1,
                **{keyword: cache}, **prompts.vision_inputs())
    first = out.logits[:, -1:][prompt_of_row]
    steps = completion_ids.shape[1] - 1
    if steps == 0:
        return first
    cache.batch_select_indices(prompt_of_row)
    start = next_positions(prompts)[prompt_of_row]
    positions = (start[:, None] + torch.arange(steps, device=start.device))[None].expand(3, -1, -1)
    attention = torch.cat([prompts.attention_mask[prompt_of_row], completion_mask[:, :-1]], 1)
    rest = model(input_ids=completion_ids[:, :-1], attention_mask=attention, position_ids=positions, use_cache=True,
                 **{keyword: cache}).logits
    return torch.cat([first, rest], 1)


@torch.no_grad()
def prefill_for_generation(model: nn.Module, prompts: VisionPrompts, group_size: int) -> dict[str, Any] | None:
    """The keyword arguments that make ``model.generate`` on the group-expanded rows start from one
    prefill per prompt: all prompt tokens but the last run once, the cache is repeated ``group_size``
    times, and the rope offsets are set for the expanded rows (``generate`` then runs the last prompt
    token and samples). None where that does not apply (not a Qwen-VL, or a prompt ending in an
    image token), and the caller generates row by row."""
    holder = rope_holder(model)
    if holder is None or prompts.position_ids is None or bool(prompts.mm_token_type_ids[:, -1].any()):
        return None
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
