"""The contract between token-emitting (vision-)language policies and their samplers.

A policy encodes its prompts once into :class:`VisionPrompts` (the model's own inputs, left-padded,
image placeholders expanded) and asks a :class:`CompletionSampler` (``hf_generate`` or ``vllm``)
for :class:`Completions`: token ids, the behaviour log-probs of the tempered distribution with the
policy's :class:`TokenRules` applied, and the mask. The sampler knows nothing about tasks or
policies; the policy re-scores the same rows with gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from mmrl.core.rollout import SamplingParams


@dataclass(frozen=True)
class VisionPrompts:
    """N prompt rows as the model reads them. Images of row r are ``images_per_row[r]`` consecutive
    entries of ``image_grid_thw``, whose patches are consecutive rows of ``pixel_values``.

    ``texts`` / ``images`` are the chat-templated strings (one ``<|image_pad|>`` per image, not
    expanded) and the resized images: what an engine that tokenises itself (vLLM) consumes.
    """

    input_ids: Tensor  # [N, P] long, left-padded, one <|image_pad|> per image token
    attention_mask: Tensor  # [N, P] long {0,1}
    mm_token_type_ids: Tensor  # [N, P] long: 0 text, 1 image, 2 video (Qwen-VL 3-D positions need it)
    pixel_values: Tensor | None  # [patches, D] float, all images of all rows in row order
    image_grid_thw: Tensor | None  # [num_images, 3] long (t, h, w) in patches
    images_per_row: Tensor  # [N] long
    pad_id: int
    texts: tuple[str, ...] = ()
    images: tuple[tuple[Any, ...], ...] = ()  # PIL images per row (after the pixel-budget resize)

    @property
    def num_rows(self) -> int:
        return self.input_ids.shape[0]

    def _patch_rows(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        """Indices of the images ([k] long) and of the pixel rows ([m] long) of ``rows``."""
        first_image = torch.cumsum(self.images_per_row, 0) - self.images_per_row  # [N]
        images = [torch.arange(int(first_image[r]), int(first_image[r] + self.images_per_row[r])) for r in rows.tolist()]
        image_index = torch.cat(images) if images else torch.zeros(0, dtype=torch.long)
        if self.image_grid_thw is None:
            return image_index, torch.zeros(0, dtype=torch.long)
        patches = self.image_grid_thw.prod(-1)  # [num_images]
        first_patch = torch.cumsum(patches, 0) - patches
        pixel_rows = [torch.arange(int(first_patch[i]), int(first_patch[i] + patches[i])) for i in image_index.tolist()]
        return image_index, (torch.cat(pixel_rows) if pixel_rows else torch.zeros(0, dtype=torch.long))

    def select(self, index: Tensor) -> VisionPrompts:
        index = index.long().cpu()
        image_index, pixel_rows = self._patch_rows(index)
        has_images = image_index.numel() > 0
        return VisionPrompts(
            input_ids=self.input_ids[index], attention_mask=self.attention_mask[index],
            mm_token_type_ids=self.mm_token_type_ids[index],
            pixel_values=self.pixel_values[pixel_rows.to(self.pixel_values.device)] if has_images else None,
            image_grid_thw=self.image_grid_thw[image_index] if has_images else None,
            images_per_row=self.images_per_row[index], pad_id=self.pad_id,
            texts=tuple(self.texts[i] for i in index.tolist()) if self.texts else (),
            images=tuple(self.images[i] for i in index.tolist()) if self.images else ())

    @classmethod
    def concat(cls, parts: Sequence[VisionPrompts]) -> VisionPrompts:
        """Stack rows, left-padding every part to the longest prompt."""
        p_max = max(p.input_ids.shape[1] for p in parts)
        pad = parts[0].pad_id

        def left(x: Tensor, value: int) -> Tensor:
            return F.pad(x, (p_max - x.shape[1], 0), value=value)

        with_images = [p for p in parts if p.image_grid_thw is not None]
        return cls(
            input_ids=torch.cat([left(p.input_ids, pad) for p in parts]),
            attention_mask=torch.cat([left(p.attention_mask, 0) for p in parts]),
            mm_token_type_ids=torch.cat([left(p.mm_token_type_ids, 0) for p in parts]),
            pixel_values=torch.cat([p.pixel_values for p in with_images]) if with_images else None,
            image_grid_thw=torch.cat([p.image_grid_thw for p in with_images]) if with_images else None,
            images_per_row=torch.cat([p.images_per_row for p in parts]), pad_id=pad,
            texts=tuple(t for p in parts for t in p.texts) if all(p.texts for p in parts) else (),
            images=tuple(i for p in parts for i in p.images) if all(p.images for p in parts) else ())

    def to(self, device: torch.device | str) -> VisionPrompts:
        def move(x: Tensor | None) -> Tensor | None:
            return None if x is None else x.to(device)

        return VisionPrompts(self.input_ids.to(device), self.attention_mask.to(device),
                             self.mm_token_type_ids.to(device), move(self.pixel_values), move(self.image_grid_thw),
                             self.images_per_row, self.pad_id, self.texts, self.images)


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
               seed: int, policy_version: int) -> Completions:
        """``policy_version`` is the version of ``model``'s weights; an engine holding its own copy
        of the weights (vLLM) syncs them first when its copy is older."""
