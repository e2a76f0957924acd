"""The contract between token-emitting (vision-)language policies and their samplers.

A policy encodes its prompts once into :class:`VisionPrompts` (the model's own inputs, left-padded,
image placeholders expanded) and asks a :class:`CompletionSampler` (``hf_generate`` or ``vllm``)
for :class:`Completions`: token ids, the behaviour log-probs of the tempered distribution with the
policy's :class:`TokenRules` applied, and the mask. The sampler knows nothing about tasks or
policies; the policy re-scores the same rows with gradients. A :data:`LogitsGuide` (logits extrapolation)
changes the raw logits of one sampling call before the sampling distribution is formed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from transformers import LogitsProcessor

from mmrl.core.rollout import SamplingParams


def _items_of_rows(rows: Tensor, per_row: Tensor, grid_thw: Tensor | None) -> tuple[Tensor, Tensor]:
    """Indices of the visual items (images or videos, [k] long) of ``rows`` and of their patch rows
    ([m] long): row r owns ``per_row[r]`` consecutive items, item i ``grid_thw[i].prod()`` consecutive patches."""
    first_item = torch.cumsum(per_row, 0) - per_row  # [N]
    items = [torch.arange(int(first_item[r]), int(first_item[r] + per_row[r])) for r in rows.tolist()]
    item_index = torch.cat(items) if items else torch.zeros(0, dtype=torch.long)
    if grid_thw is None:
        return item_index, torch.zeros(0, dtype=torch.long)
    patches = grid_thw.prod(-1)  # [num_items]
    first_patch = torch.cumsum(patches, 0) - patches
    patch_rows = [torch.arange(int(first_patch[i]), int(first_patch[i] + patches[i])) for i in item_index.tolist()]
    return item_index, (torch.cat(patch_rows) if patch_rows else torch.zeros(0, dtype=torch.long))


@dataclass(frozen=True)
class VisionPrompts:
    """N prompt rows as the model reads them. Images of row r are ``images_per_row[r]`` consecutive
    entries of ``image_grid_thw``, whose patches are consecutive rows of ``pixel_values``; videos
    likewise (``videos_per_row``, ``video_grid_thw``, ``pixel_values_videos``), each with its
    ``second_per_grid_ts`` (seconds between temporal patches: Qwen2.5-VL's temporal positions).

    ``texts`` / ``images`` are the chat-templated strings (one ``<|image_pad|>`` per image, not
    expanded) and the resized images: what an engine that tokenises itself (vLLM) consumes.
    """

    input_ids: Tensor  # [N, P] long, left-padded, one <|image_pad|> / <|video_pad|> per vision token
    attention_mask: Tensor  # [N, P] long {0,1}
    mm_token_type_ids: Tensor  # [N, P] long: 0 text, 1 image, 2 video (Qwen-VL 3-D positions need it)
    pixel_values: Tensor | None  # [patches, D] float, all images of all rows in row order
    image_grid_thw: Tensor | None  # [num_images, 3] long (t, h, w) in patches
    images_per_row: Tensor  # [N] long
    pad_id: int
    texts: tuple[str, ...] = ()
    images: tuple[tuple[Any, ...], ...] = ()  # PIL images per row (after the pixel-budget resize)
    videos_per_row: Tensor | None = None  # [N] long; None when no row has a video
    pixel_values_videos: Tensor | None = None  # [video patches, D] float, all videos of all rows in row order
    video_grid_thw: Tensor | None = None  # [num_videos, 3] long (t, h, w) in patches
    second_per_grid_ts: Tensor | None = None  # [num_videos] float; None where the processor gives none (Qwen2-VL, Qwen3-VL)
    position_ids: Tensor | None = None  # [3, N, P] long: the prompt tokens' (m)RoPE positions, computed once per prompt

    @classmethod
    def text_only(cls, input_ids: Tensor, attention_mask: Tensor, pad_id: int) -> VisionPrompts:
        """Left-padded text prompts ([N, P] each) as a text-only causal LM reads them (no images, no videos)."""
        rows = input_ids.shape[0]
        return cls(input_ids=input_ids, attention_mask=attention_mask, mm_token_type_ids=torch.zeros_like(input_ids),
                   pixel_values=None, image_grid_thw=None,
                   images_per_row=torch.zeros(rows, dtype=torch.long, device=input_ids.device), pad_id=pad_id)

    @property
    def num_rows(self) -> int:
        return self.input_ids.shape[0]

    def select(self, index: Tensor) -> VisionPrompts:
        index = index.long().cpu()
        image_index, pixel_rows = _items_of_rows(index, self.images_per_row, self.image_grid_thw)
        has_images = image_index.numel() > 0
        videos: dict[str, Any] = {}
        if self.videos_per_row is not None:
            video_index, video_rows = _items_of_rows(index, self.videos_per_row, self.video_grid_thw)
            has_videos = video_index.numel() > 0
            videos = dict(
                videos_per_row=self.videos_per_row[index],
                pixel_values_videos=self.pixel_values_videos[video_rows.to(self.pixel_values_videos.device)]
                if has_videos else None,
                video_grid_thw=self.video_grid_thw[video_index] if has_videos else None,
                second_per_grid_ts=self.second_per_grid_ts[video_index]
                if has_videos and self.second_per_grid_ts is not None else None)
        return VisionPrompts(
            input_ids=self.input_ids[index], attention_mask=self.attention_mask[index],
            mm_token_type_ids=self.mm_token_type_ids[index],
            pixel_values=self.pixel_values[pixel_rows.to(self.pixel_values.device)] if has_images else None,
            image_grid_thw=self.image_grid_thw[image_index] if has_images else None,
            images_per_row=self.images_per_row[index], pad_id=self.pad_id,
            texts=tuple(self.texts[i] for i in index.tolist()) if self.texts else (),
            images=tuple(self.images[i] for i in index.tolist()) if self.images else (),
            position_ids=None if self.position_ids is None else self.position_ids[:, index.to(self.position_ids.device)],
            **videos)

    @classmethod
    def concat(cls, parts: Sequence[VisionPrompts]) -> VisionPrompts:
        """Stack rows, left-padding every part to the longest prompt."""
        p_max = max(p.input_ids.shape[1] for p in parts)
        pad = parts[0].pad_id

        def left(x: Tensor, value: int) -> Tensor:
            return F.pad(x, (p_max - x.shape[-1], 0), value=value)

        with_images = [p for p in parts if p.image_grid_thw is not None]
        return cls(
            input_ids=torch.cat([left(p.input_ids, pad) for p in parts]),
            attention_mask=torch.cat([left(p.attention_mask, 0) for p in parts]),
            mm_token_type_ids=torch.cat([left(p.mm_token_type_ids, 0) for p in parts]),
            pixel_values=torch.cat([p.pixel_values for p in with_images]) if with_images else None,
            image_grid_thw=torch.cat([p.image_grid_thw for p in with_images]) if with_images else None,
            images_per_row=torch.cat([p.images_per_row for p in parts]), pad_id=pad,
            texts=tuple(t for p in parts for t in p.texts) if all(p.texts for p in parts) else (),
            images=tuple(i for p in parts for i in p.images) if all(p.images for p in parts) else (),
            position_ids=torch.cat([left(p.position_ids, 0) for p in parts], 1)
            if all(p.position_ids is not None for p in parts) else None,
            **concat_videos(parts))

    def to(self, device: torch.device | str) -> VisionPrompts:
        def move(x: Tensor | None) -> Tensor | None:
            return None if x is None else x.to(device)

        return replace(self, input_ids=self.input_ids.to(device), attention_mask=self.attention_mask.to(device),
                       mm_token_type_ids=self.mm_token_type_ids.to(device), pixel_values=move(self.pixel_values),
                       image_grid_thw=move(self.image_grid_thw), pixel_values_videos=move(self.pixel_values_videos),
                       video_grid_thw=move(self.video_grid_thw), second_per_grid_ts=move(self.second_per_grid_ts),
                       position_ids=move(self.position_ids))

    def vision_inputs(self) -> dict[str, Tensor]:
        """The model's keyword inputs for the images and videos these rows hold (none for text-only rows)."""
        inputs: dict[str, Tensor] = {}
        if self.image_grid_thw is not None:
            inputs |= {"pixel_values": self.pixel_values, "image_grid_thw": self.image_grid_thw}
        if self.video_grid_thw is not None:
            inputs |= {"pixel_values_videos": self.pixel_values_videos, "video_grid_thw": self.video_grid_thw}
            if self.second_per_grid_ts is not None:
                inputs["second_per_grid_ts"] = self.second_per_grid_ts
        return inputs


def concat_videos(parts: Sequence[VisionPrompts]) -> dict[str, Any]:
    """The video fields of ``parts`` stacked in row order (empty when no part holds a video row)."""
    if all(p.videos_per_row is None for p in parts):
        return {}
    with_videos = [p for p in parts if p.video_grid_thw is not None]
    timed = [p.second_per_grid_ts for p in with_videos if p.second_per_grid_ts is not None]
    if timed and len(timed) != len(with_videos):
        raise ValueError("cannot concatenate prompts with and without second_per_grid_ts (two processor kinds)")
    return dict(
        videos_per_row=torch.cat([p.videos_per_row if p.videos_per_row is not None
                                  else torch.zeros(p.num_rows, dtype=torch.long) for p in parts]),
        pixel_values_videos=torch.cat([p.pixel_values_videos for p in with_videos]) if with_videos else None,
        video_grid_thw=torch.cat([p.video_grid_thw for p in with_videos]) if with_videos else None,
        second_per_grid_ts=torch.cat(timed) if timed else None)


LogitsGuide = Callable[[VisionPrompts, int], LogitsProcessor]
"""``(prompts, group_size) -> LogitsProcessor`` for one ``generate`` call over the ``prompts.num_rows · group_size``
rows it samples (prompt-major, as :class:`CompletionSampler` orders them): the processor sees every step's raw
logits [rows, V] and returns the logits the sampling distribution is formed from (temperature, suppressed ids,
top-p come after). Logits extrapolation (:mod:`mmrl.policies.logits_extrapolation`) is one."""


@dataclass(frozen=True)
class TokenRules:
    """What every sampler and the re-scoring forward must agree on."""

    eos_ids: tuple[int, ...]  # a row ends after the first of these (included in the completion)
    pad_id: int  # fills completions after their end
    suppressed: Tensor  # [S] long: ids never sampled and removed from the scored distribution


@dataclass(frozen=True)
class Completions:
    ids: Tensor  # [N, T] long, ``pad_id`` after the end of each row
    mask: Tensor  # [N, T] long {0,1}: tokens up to and including the first EOS
    logp: Tensor  # [N, T] float32 behaviour log-probs (0 where mask is 0)
    policy_version: int  # optimizer steps of the weights that sampled them
    stats: dict[str, float] = field(default_factory=dict)  # e.g. perf/weight_sync_s


class CompletionSampler(Protocol):
    """Draws completions for prompt rows; all randomness from ``seed``."""

    def sample(self, model: nn.Module, prompts: VisionPrompts, sampling: SamplingParams, rules: TokenRules,
               seed: int, policy_version: int, group_size: int = 1,
               guides: Sequence[LogitsGuide] = ()) -> Completions:
        """``group_size`` completions per prompt row, prompt-major (rows ``r·G … r·G + G − 1`` continue prompt
        ``r``), so a sampler can read each prompt once. ``policy_version`` is the version of ``model``'s
        weights; an engine holding its own copy of the weights (vLLM) syncs them first when its copy is older.
        ``guides`` change the raw logits, in order, before sampling; a sampler that cannot run them refuses."""
