"""A policy over any Hugging Face Qwen2-VL / Qwen2.5-VL / Qwen3-VL checkpoint folder.

Examples meet :class:`mmrl.core.contracts.VisualPrompt` (``prompt`` with one ``<image>`` per image,
``images``, ``system``), and :class:`~mmrl.core.contracts.VideoPrompt` when they also show videos
(one ``<video>`` per video: PIL frames, a uint8 ``[T, H, W, 3]`` array or a file path); outputs are
the decoded completion strings. The policy builds the chat messages, resizes images and video frames
with ``qwen_vl_utils.process_vision_info`` under its pixel budgets and tokenises with the
checkpoint's processor. :meth:`VLMPolicy.encode` is the one place that owns vision-token accounting:

- pixel budget: ``min_pixels`` / ``max_pixels`` (the processor's, or the recipe's override, set on
  both the resize and the image processor so they agree);
- video: frames at ``video.fps`` (a file is decoded with PyAV and sampled at that rate), an odd
  count padded with the last frame (qwen-vl-utils), 2 frames per temporal patch; Qwen2.5-VL's
  temporal positions come from ``second_per_grid_ts`` = temporal patch / fps, kept in the payload;
- prompt length: text + image + video tokens are counted before tokenising and checked against
  ``max_prompt_tokens``; the error names both numbers and the knob to turn;
- one padding side: prompts left, completions right;
- vision and other special tokens are never sampled (suppressed in sampling *and* scoring) and a
  completion is cut at any such token an engine returns anyway, so none reaches re-scoring.

Re-scoring passes ``mm_token_type_ids`` (prompt types, zeros over the completion) with
``image_grid_thw`` / ``video_grid_thw``: without them Qwen2.5-VL silently falls back to 1-D positions and the
on-policy ratio is no longer 1 (``tests/policies/test_vlm.py`` shows both).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F
from transformers import AutoModelForImageTextToText, AutoProcessor, GenerationConfig

from mmrl.core.config import ConfigError
from mmrl.core.contracts import (IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER, Policy, PolicyOutput, VideoPrompt,
                                 answer_prefix_of, turns_of)
from mmrl.policies.lora import BASE_FOLDER, add_lora, load_lora_weights
from mmrl.policies.shared_prefix import can_share, prompt_positions, score_logits
from mmrl.policies.tokens import positions_from_mask, tempered_log_softmax, token_logprobs
from mmrl.core.rollout import Rollout, SamplingParams
from mmrl.samplers.tokens import CompletionSampler, Completions, LogitsGuide, TokenRules, VisionPrompts

PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


@dataclass(frozen=True)
class VLLMSettings:
    """The colocated vLLM engine (``sampler: vllm``; GPU nodes with vLLM installed)."""

    gpu_memory_utilization: float = 0.3
    """Share of GPU memory vLLM may take (the trainer shares the device)."""
    max_model_len: int = 4096
    """Longest prompt + completion vLLM plans for."""
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "bfloat16"
    enforce_eager: bool = True
    """No CUDA graphs: weights are replaced after every optimizer step."""
    sleep_between_rollouts: bool = False
    """Free vLLM's KV cache and weights while the trainer updates (``LLM.sleep`` level 1)."""


@dataclass(frozen=True)
class VideoSettings:
    """Videos of :class:`~mmrl.core.contracts.VideoPrompt` examples (``policy.args.video``)."""

    fps: float = 2.0
    """Frames per second of a video given as frames (their timestamps); a video file is sampled at this rate."""
    max_frames: int = 32
    """Most frames sampled from a video file (frames given as a list or array are all used)."""
    min_pixels: int | None = None
    """Override of the video processor's smallest frame area (pixels); null keeps the checkpoint's."""
    max_pixels: int | None = None
    """Override of the video processor's largest frame area (pixels); bounds the tokens of each frame pair."""


@dataclass(frozen=True)
class VLMConfig:
    pretrained: str | None = None
    """A local HF folder (config, weights, processor: tokenizer + image processor + chat template)."""
    model_spec: str | None = None
    """Instead of ``pretrained``: a tiny-VLM spec in assets/ (``vlm/qwen2_5_vl_tiny.json``) built in memory."""
    init_seed: int = 0
    """Seed of a spec-built model's weights (and of LoRA's A matrices)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    """sdpa on CPU; flash_attention_2 where installed (GPU)."""
    min_pixels: int | None = None
    """Override of the processor's smallest image area (pixels); null keeps the checkpoint's."""
    max_pixels: int | None = None
    """Override of the processor's largest image area (pixels); bounds image tokens and memory."""
    video: VideoSettings = field(default_factory=VideoSettings)
    """How videos (``<video>`` in a prompt) become frames; unused by image and text prompts."""
    max_prompt_tokens: int = 1024
    """Text + image + video tokens allowed per prompt; longer prompts fail before any model call."""
    sampler: Literal["hf", "vllm"] = "hf"
    """``hf``: transformers ``generate``; ``vllm``: a colocated vLLM engine (GPU, optional extra)."""
    generation_batch_rows: int = 0
    """HF sampler: rows per ``generate`` call (0: all at once); bounds rollout memory."""
    vllm: VLLMSettings = field(default_factory=VLLMSettings)
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (large models)."""
    share_prompts_under_checkpointing: bool = False
    """With gradient checkpointing, still run each prompt once for its group in the update (faster), at a
    memory cost: the prompt pass is not checkpointed and the group-expanded cache is kept for the recompute
    (``mmrl plan`` shows both). Off: a checkpointed update scores row by row. Without checkpointing prompts
    are always shared."""
    lora_rank: int = 0
    """> 0: train LoRA adapters of this rank (Hu et al. 2021) instead of all weights."""
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    """Language-model attention projections by default (the vision tower's are named qkv / proj)."""


@dataclass(frozen=True)
class VLMPayload:
    """Prompts (with their images) and completions. Satisfies :class:`mmrl.core.rollout.Payload`.

    ``prompts`` holds each distinct prompt once (a group's G rows share one: its images are stored and
    encoded once); row n's completion continues prompt ``prompt_of_row[n]``."""

    prompts: VisionPrompts  # [U] distinct prompt rows
    prompt_of_row: Tensor  # [N] long: the prompt row each completion continues
    completion_ids: Tensor  # [N, T] long, right-padded
    completion_mask: Tensor  # [N, T] long {0,1}
    temperature: Tensor  # [N] float32: each row's sampling temperature (rows at different ones concatenate)

    def row_prompts(self) -> VisionPrompts:
        """The prompts repeated to one per completion row (how a row-by-row forward reads them)."""
        return self.prompts.select(self.prompt_of_row)

    def select(self, index: Tensor) -> VLMPayload:
        index = index.long()
        kept, prompt_of_row = torch.unique(self.prompt_of_row[index], return_inverse=True)
        return VLMPayload(self.prompts.select(kept), prompt_of_row, self.completion_ids[index],
                          self.completion_mask[index], self.temperature[index])

    @classmethod
    def concat(cls, parts: Sequence[VLMPayload]) -> VLMPayload:
        t_max = max(p.completion_ids.shape[1] for p in parts)
        pad = parts[0].prompts.pad_id
        offsets = np.cumsum([0] + [p.prompts.num_rows for p in parts[:-1]])
        return cls(VisionPrompts.concat([p.prompts for p in parts]),
                   torch.cat([p.prompt_of_row + int(offset) for p, offset in zip(parts, offsets)]),
                   torch.cat([F.pad(p.completion_ids, (0, t_max - p.completion_ids.shape[1]), value=pad) for p in parts]),
                   torch.cat([F.pad(p.completion_mask, (0, t_max - p.completion_mask.shape[1])) for p in parts]),
                   torch.cat([p.temperature for p in parts]))


def check_processor_folder(path: Path) -> None:
    if (path / "adapter_config.json").is_file() and not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} holds a LoRA adapter, not a full model: merge it first with "
                                f"`mmrl export {path} --out MERGED` and use MERGED as policy.args.pretrained")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a Hugging Face model folder (no config.json)")
    if not any((path / name).is_file() for name in PROCESSOR_FILES):
        raise FileNotFoundError(
            f"{path} has no processor ({' or '.join(PROCESSOR_FILES)}): save it beside the weights with "
            f"processor.save_pretrained({str(path)!r}) (mmrl init-model and mmrl sft do)")


class VLMPolicy(Policy):
    def __init__(self, model: torch.nn.Module, processor: Any, cfg: VLMConfig, source: Path | None = None):
        super().__init__()
        self.model, self.processor, self.cfg = model, processor, cfg
        self.source = source  # the folder the weights came from (None: built from a spec)
        tokenizer = processor.tokenizer
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the processor's tokenizer needs a pad and an eos token")
        rows = model.get_input_embeddings().num_embeddings
        if len(tokenizer) > rows:
            raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the model embeds only {rows}")
        vocab = tokenizer.get_vocab()
        self.eos_ids = tuple(sorted({tokenizer.eos_token_id} | ({vocab["<|im_end|>"]} if "<|im_end|>" in vocab else set())))
        self.vision_ids = tuple(sorted(vocab[t] for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>",
                                                          "<|vision_end|>", "<|vision_pad|>") if t in vocab))
        # Never sample special tokens other than EOS (a sampled <|image_pad|> breaks re-scoring:
        # "Image features and image tokens do not match"); the same ids leave the scored distribution.
        # Embedding rows past the tokenizer (Qwen pads 151,665 tokens to 151,936 rows) are no tokens.
        suppressed = (set(tokenizer.all_special_ids) | set(self.vision_ids) | set(range(len(tokenizer), rows))) \
            - set(self.eos_ids)
        self.register_buffer("suppressed", torch.tensor(sorted(suppressed), dtype=torch.long), persistent=False)
        self.model.generation_config = GenerationConfig(pad_token_id=tokenizer.pad_token_id,
                                                        eos_token_id=list(self.eos_ids))
        self.set_pixel_budget(cfg.min_pixels, cfg.max_pixels)
        self.set_video_budget(cfg.video.min_pixels, cfg.video.max_pixels)
        if not 0 < cfg.video.fps or cfg.video.max_frames < 2:
            raise ConfigError(f"policy.args.video: need fps > 0 and max_frames >= 2, got {cfg.video.fps}, "
                              f"{cfg.video.max_frames}")
        self.lora = False
        if cfg.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self._sampler: CompletionSampler | None = None
        self.logits_guides: tuple[LogitsGuide, ...] = ()
        """Processors applied to the raw logits of every ``rollout``, in order, before the sampling distribution
        is formed (empty: the model's own logits; the HF sampler only)."""

    # -- construction ----------------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg: VLMConfig) -> VLMPolicy:
        dtype = getattr(torch, cfg.dtype)
        if (cfg.pretrained is None) == (cfg.model_spec is None):
            raise ConfigError("policy.args: give exactly one of pretrained (a HF folder) or model_spec "
                             "(e.g. vlm/qwen2_5_vl_tiny.json)")
        if cfg.pretrained is not None:
            path = Path(cfg.pretrained)
            check_processor_folder(path)
            model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype,
                                                                attn_implementation=cfg.attn_implementation)
            policy = cls(model, AutoProcessor.from_pretrained(path), cfg, source=path)
        else:
            from mmrl.models.tiny_vlm import build_tiny_vlm

            model, processor = build_tiny_vlm(cfg.model_spec, cfg.init_seed, dtype)
            model.config._attn_implementation = cfg.attn_implementation
            policy = cls(model, processor, cfg)
        if cfg.lora_rank > 0:
            policy.model = add_lora(policy.model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout,
                                    cfg.lora_target_modules, cfg.init_seed)
            policy.lora = True
        return policy

    def adapter_disabled(self):
        if not self.lora:
            return super().adapter_disabled()
        return self.model.disable_adapter()

    @property
    def base_model(self) -> torch.nn.Module:
        """The transformers model (under the peft wrapper when training LoRA)."""
        return self.model.get_base_model() if self.lora else self.model

    def save_pretrained(self, path: str) -> None:
        """Full: a plain HF folder (model + processor). LoRA: the peft adapter + processor, and the
        base under ``base/`` when it has no folder of its own (``mmrl export`` merges them)."""
        self.model.save_pretrained(path)
        self.processor.save_pretrained(path)
        if self.lora and self.source is None:  # tiny spec-built bases only
            self.write_plain_folder(Path(path) / BASE_FOLDER, self.plain_state_dict(merged=False))

    def load_weights(self, path: str) -> None:
        if self.lora:
            load_lora_weights(self.model, path)
        else:
            loaded = type(self.model).from_pretrained(path, dtype=next(self.model.parameters()).dtype)
            self.model.load_state_dict(loaded.state_dict())

    # -- image-token accounting ------------------------------------------------------------------
    def set_pixel_budget(self, min_pixels: int | None, max_pixels: int | None) -> None:
        size = self.processor.image_processor.size
        lo = min_pixels if min_pixels is not None else size["shortest_edge"]
        hi = max_pixels if max_pixels is not None else size["longest_edge"]
        if not 0 < lo <= hi:
            raise ValueError(f"need 0 < min_pixels <= max_pixels, got {lo}, {hi}")
        self.processor.image_processor.size = {"shortest_edge": lo, "longest_edge": hi}
        self.min_pixels, self.max_pixels = lo, hi
        self.patch_size = self.processor.image_processor.patch_size
        self.merge_size = self.processor.image_processor.merge_size

    def set_video_budget(self, min_pixels: int | None, max_pixels: int | None) -> None:
        """Frame-area bounds of videos, set on both the qwen-vl-utils resize and the video processor."""
        video_processor = self.processor.video_processor
        size = video_processor.size
        lo = min_pixels if min_pixels is not None else size["shortest_edge"]
        hi = max_pixels if max_pixels is not None else size["longest_edge"]
        if not 0 < lo <= hi:
            raise ValueError(f"need 0 < video.min_pixels <= video.max_pixels, got {lo}, {hi}")
        video_processor.size = {"shortest_edge": lo, "longest_edge": hi}
        self.video_min_pixels, self.video_max_pixels = lo, hi
        self.temporal_patch_size = video_processor.temporal_patch_size

    def video_tokens(self, video: Tensor) -> int:
        """Placeholder tokens of a video ``[T, 3, H, W]`` already resized by qwen-vl-utils."""
        factor = self.patch_size * self.merge_size
        frames, _, height, width = video.shape
        return -(-frames // self.temporal_patch_size) * (height // factor) * (width // factor)

    def image_tokens(self, width: int, height: int) -> int:
        """Placeholder tokens of an image already resized to the budget (multiples of patch·merge)."""
        factor = self.patch_size * self.merge_size
        return (height // factor) * (width // factor)

    def messages(self, example: Any, index: int) -> list[dict]:
        prompt, images, system = example.prompt, tuple(example.images), example.system
        videos = tuple(example.videos) if isinstance(example, VideoPrompt) else ()
        if not isinstance(prompt, str):
            raise TypeError(f"example {index}: prompt must be a str, got {type(prompt).__name__}")
        for placeholder, items, kind in ((IMAGE_PLACEHOLDER, images, "image"), (VIDEO_PLACEHOLDER, videos, "video")):
            if prompt.count(placeholder) != len(items):
                raise ValueError(f"example {index}: the prompt has {prompt.count(placeholder)} {placeholder} "
                                 f"placeholder(s) but {len(items)} {kind}(s) were given; put one {placeholder} per "
                                 f"{kind} in the prompt")
        content: list[dict] = []
        shown = {IMAGE_PLACEHOLDER: iter(enumerate(images)), VIDEO_PLACEHOLDER: iter(enumerate(videos))}
        for piece in re.split(f"({re.escape(IMAGE_PLACEHOLDER)}|{re.escape(VIDEO_PLACEHOLDER)})", prompt):
            if piece == IMAGE_PLACEHOLDER:
                i, image = next(shown[piece])
                content.append({"type": "image", "image": checked_image(image, index, i),
                                "min_pixels": self.min_pixels, "max_pixels": self.max_pixels})
            elif piece == VIDEO_PLACEHOLDER:
                i, video = next(shown[piece])
                content.append(self.video_element(video, index, i))
            elif piece:
                content.append({"type": "text", "text": piece})
        user = {"role": "user", "content": content}
        later = [{"role": role, "content": [{"type": "text", "text": text}]} for role, text in turns_of(example)]
        return ([{"role": "system", "content": system}] if system is not None else []) + [user, *later]

    def video_element(self, video: Any, example: int, position: int) -> dict:
        """The qwen-vl-utils message element of one video: its frames (a file decoded and sampled at
        ``video.fps``), their rate, and the video pixel budget."""
        if isinstance(video, (str, Path)):
            frames, fps = read_video_file(Path(video), self.cfg.video.fps, self.cfg.video.max_frames, example, position)
        else:
            frames, fps = checked_frames(video, example, position), self.cfg.video.fps
        return {"type": "video", "video": frames, "sample_fps": fps,
                "min_pixels": self.video_min_pixels, "max_pixels": self.video_max_pixels}

    def encode(self, examples: Sequence[Any]) -> VisionPrompts:
        """Examples → model inputs (one row each), with the prompt-length check up front."""
        from qwen_vl_utils import process_vision_info

        conversations = [self.messages(ex, i) for i, ex in enumerate(examples)]
        texts = [self.processor.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
                 + answer_prefix_of(ex) for c, ex in zip(conversations, examples)]
        resized: list[tuple[Any, ...]] = []
        clips: list[tuple[tuple[Tensor, dict], ...]] = []  # per row: (frames [T, 3, H, W], metadata) per video
        for i, conversation in enumerate(conversations):
            try:
                images, videos, _ = process_vision_info(conversation, return_video_kwargs=True,
                                                        return_video_metadata=True, image_patch_size=self.patch_size)
            except Exception as err:  # qwen_vl_utils raises bare errors on unreadable/odd images
                raise ValueError(f"example {i}: an image or video could not be prepared "
                                 f"({type(err).__name__}: {err})") from None
            resized.append(tuple(images or ()))
            clips.append(tuple(videos or ()))
        tokenizer = self.processor.tokenizer
        for i, (text, images, videos) in enumerate(zip(texts, resized, clips)):
            self.check_prompt_length(i, text, images, [frames for frames, _ in videos])
        flat = [im for images in resized for im in images]
        flat_videos = [video for videos in clips for video in videos]
        # Video keywords only when a row shows a video: image and text rows are encoded exactly as before.
        video_kwargs = {} if not flat_videos else {
            "videos": [frames for frames, _ in flat_videos], "video_metadata": [meta for _, meta in flat_videos],
            "do_sample_frames": False, "cap_pixels_per_frame": True}  # qwen-vl-utils' per-frame cap, as resized
        enc = self.processor(text=texts, images=flat or None, padding=True, padding_side="left", return_tensors="pt",
                             **video_kwargs)
        images_per_row = torch.tensor([len(images) for images in resized], dtype=torch.long)
        grid = enc["image_grid_thw"] if flat else None
        if grid is not None:  # the processor must have kept the budget's sizes (one accounting)
            counted = sum(self.image_tokens(*im.size) for im in flat)
            placed = int((enc["input_ids"] == self.processor.image_token_id).sum())
            if counted != placed:
                raise RuntimeError(f"image tokens counted {counted} != placed by the processor {placed}")
        dtype = next(self.model.parameters()).dtype
        prompts = VisionPrompts(
            input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
            mm_token_type_ids=enc["mm_token_type_ids"].long(),
            pixel_values=enc["pixel_values"].to(dtype) if flat else None,
            image_grid_thw=grid, images_per_row=images_per_row, pad_id=tokenizer.pad_token_id,
            texts=tuple(texts), images=tuple(resized), **self.video_fields(enc, clips, dtype))
        return prompts

    def check_prompt_length(self, index: int, text: str, images: Sequence[Any], videos: Sequence[Tensor]) -> None:
        """Text + image + video tokens of one templated prompt against ``max_prompt_tokens``, before tokenising."""
        text_tokens = len(self.processor.tokenizer(text, add_special_tokens=False)["input_ids"]) - len(images) - len(videos)
        image_tokens = sum(self.image_tokens(*im.size) for im in images)
        video_tokens = sum(self.video_tokens(frames) for frames in videos)
        if text_tokens + image_tokens + video_tokens <= self.cfg.max_prompt_tokens:
            return
        videos_part = f" + {video_tokens} video tokens" if videos else ""
        video_knob = f", policy.args.video.max_pixels (now {self.video_max_pixels}) or the frame count" if videos else ""
        raise ValueError(
            f"example {index}: the prompt needs {text_tokens} text tokens + {image_tokens} image tokens{videos_part} = "
            f"{text_tokens + image_tokens + video_tokens} > policy.args.max_prompt_tokens = "
            f"{self.cfg.max_prompt_tokens}; lower policy.args.max_pixels (now {self.max_pixels}){video_knob} "
            f"or raise max_prompt_tokens")

    def video_fields(self, enc: Any, clips: Sequence[Sequence[tuple[Tensor, dict]]], dtype: torch.dtype) -> dict:
        """The VisionPrompts video fields of a processor output (none when no row shows a video)."""
        if not any(clips):
            return {}
        counted = sum(self.video_tokens(frames) for videos in clips for frames, _ in videos)
        placed = int((enc["input_ids"] == self.processor.video_token_id).sum())
        if counted != placed:
            raise RuntimeError(f"video tokens counted {counted} != placed by the processor {placed}")
        seconds = enc.get("second_per_grid_ts")  # Qwen2.5-VL only: seconds per temporal patch
        return dict(videos_per_row=torch.tensor([len(videos) for videos in clips], dtype=torch.long),
                    pixel_values_videos=enc["pixel_values_videos"].to(dtype), video_grid_thw=enc["video_grid_thw"],
                    second_per_grid_ts=None if seconds is None else torch.as_tensor(seconds, dtype=torch.float32))

    # -- sampling --------------------------------------------------------------------------------
    @property
    def rules(self) -> TokenRules:
        return TokenRules(self.eos_ids, self.processor.tokenizer.pad_token_id, self.suppressed)

    @property
    def sampler(self) -> CompletionSampler:
        if self._sampler is None:
            if self.cfg.sampler == "hf":
                # Imported here: the sampler module imports this package's token helpers (an import cycle).
                from mmrl.samplers.hf_generate import HFGenerateSampler

                self._sampler = HFGenerateSampler(self.cfg.generation_batch_rows)
            else:
                from mmrl.samplers.vllm import VLLMSampler  # vLLM is imported only here, on demand

                self._sampler = VLLMSampler(self.cfg.vllm, self.engine_folder, self.hf_state_dict)
        return self._sampler

    def hf_state_dict(self) -> dict[str, Tensor]:
        """The current weights under the plain Hugging Face names (LoRA merged in), for an engine
        holding its own copy (vLLM). Full models: views of the live tensors; LoRA: merged copies."""
        return self.plain_state_dict(merged=True)

    def plain_state_dict(self, merged: bool) -> dict[str, Tensor]:
        """Weights under plain HF names: with the LoRA update merged in, or the base's (merged=False)."""
        if not self.lora:
            return {name: tensor.detach() for name, tensor in self.model.state_dict().items()}
        weights = {}
        if merged:
            self.model.merge_adapter()
        try:
            for name, tensor in self.model.get_base_model().state_dict().items():
                if "lora_" not in name:
                    weights[name.replace(".base_layer", "")] = tensor.detach().clone()
        finally:
            if merged:
                self.model.unmerge_adapter()
        return weights

    def write_plain_folder(self, folder: Path, weights: dict[str, Tensor]) -> None:
        """A HF folder (config, safetensors, processor) holding ``weights``."""
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        self.base_model.config.save_pretrained(folder)
        save_file({k: v.contiguous().clone() for k, v in weights.items()}, folder / "model.safetensors",
                  metadata={"format": "pt"})
        self.processor.save_pretrained(folder)

    def engine_folder(self) -> str:
        """A HF folder an engine can start from: the source folder, or (spec-built models) a
        temporary copy of the current weights and processor."""
        if self.source is not None:
            return str(self.source)
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix="mmrl_engine_"))
        self.write_plain_folder(folder, self.hf_state_dict())
        return str(folder)

    def end_at_disallowed(self, completions: Completions) -> Completions:
        """Cut each row at the first suppressed (vision / special) token an engine returned: the
        row then ends before it, so no stray image token reaches re-scoring."""
        bad = torch.isin(completions.ids, self.suppressed.to(completions.ids.device)) & (completions.mask == 1)
        if not bad.any():
            return completions
        keep = completions.mask * (bad.long().cumsum(1) == 0).long()
        return Completions(completions.ids.masked_fill(keep == 0, self.rules.pad_id), keep, completions.logp * keep,
                           completions.policy_version, completions.stats)

    @torch.no_grad()
    def rollout(self, examples: Sequence[Any], group_size: int, sampling: SamplingParams, seed: int) -> Rollout:
        prompts = self.encode(examples)
        # The 3-D positions once per prompt, here: sampling and every update pass of these rows reuse them.
        prompts = replace(prompts, position_ids=prompt_positions(self.model, prompts))
        rows = torch.arange(len(examples)).repeat_interleave(group_size)
        completions = self.sampler.sample(self.model, prompts, sampling, self.rules, seed, self.version,
                                          group_size=group_size, guides=self.logits_guides)
        completions = self.end_at_disallowed(completions)
        ids, mask = completions.ids.cpu(), completions.mask.cpu()
        texts = self.processor.tokenizer.batch_decode(ids.masked_fill(mask == 0, self.rules.pad_id),
                                                      skip_special_tokens=True)
        payload = VLMPayload(prompts, rows.clone(), ids, mask,
                             torch.full((len(rows),), sampling.temperature, dtype=torch.float32))
        return Rollout(logp=(completions.logp.cpu().float() * mask), mask=mask.float(), group_id=rows.clone(),
                       example_index=rows, outputs=texts, payload=payload, policy_version=completions.policy_version,
                       stats=dict(completions.stats))

    # -- scoring ---------------------------------------------------------------------------------
    def score(self, payload: VLMPayload, with_entropy: bool = False, with_token_types: bool = True,
              shared_prefix: bool = True) -> PolicyOutput:
        """Log-probs of the completions under the current weights ([N, T], with gradients).

        Each distinct prompt is run once and its cache shared by its rows (:mod:`mmrl.policies.shared_prefix`);
        ``shared_prefix=False`` runs every row's prompt (the plain forward the tests compare against), as
        does gradient checkpointing unless ``share_prompts_under_checkpointing``. ``with_token_types=False``
        drops ``mm_token_type_ids`` from the plain forward (the bug the tests demonstrate).
        """
        device = self.suppressed.device
        completion_ids, completion_mask = payload.completion_ids.to(device), payload.completion_mask.to(device)
        prompts = payload.prompts.to(device)
        shared = prompts.num_rows < len(payload.prompt_of_row)  # some prompt continues in several rows
        if shared and prompts.position_ids is None:  # payloads built outside rollout (e.g. given outputs)
            prompts = replace(prompts, position_ids=prompt_positions(self.model, prompts))
        if shared and shared_prefix and with_token_types and \
                can_share(self.model, prompts, self.cfg.share_prompts_under_checkpointing):
            logits = score_logits(self.model, prompts, payload.prompt_of_row.to(device), completion_ids,
                                  completion_mask)
        else:
            logits = self.plain_logits(prompts.select(payload.prompt_of_row), completion_ids, completion_mask,
                                       with_token_types)
        mask = completion_mask.float()
        logp, entropy = token_logprobs(logits, completion_ids, payload.temperature, self.suppressed, mask, with_entropy)
        return PolicyOutput(logp=logp * mask, entropy=None if entropy is None else entropy * mask)

    def plain_logits(self, prompts: VisionPrompts, completion_ids: Tensor, completion_mask: Tensor,
                     with_token_types: bool = True) -> Tensor:
        """[N, T, V] logits predicting each completion token from one forward over every row's prompt + completion."""
        out = self.plain_forward(prompts, completion_ids, completion_mask, with_token_types)
        # Position i predicts token i + 1: the last T + 1 positions' first T predict the completion.
        return out.logits[:, :-1]

    def plain_forward(self, prompts: VisionPrompts, completion_ids: Tensor, completion_mask: Tensor,
                      with_token_types: bool = True, hidden_states: bool = False) -> Any:
        """The model's output over every row's prompt + completion, logits kept for the last T + 1 positions."""
        input_ids = torch.cat([prompts.input_ids, completion_ids], 1)
        attention = torch.cat([prompts.attention_mask, completion_mask], 1)
        inputs: dict[str, Any] = prompts.vision_inputs()
        if inputs:
            # 3-D (mRoPE) positions from the token types; the completion is text (type 0).
            if with_token_types:
                inputs["mm_token_type_ids"] = F.pad(prompts.mm_token_type_ids, (0, completion_ids.shape[1]))
        else:  # text only: 1-D positions that skip the left padding, as generate computes them
            inputs["position_ids"] = positions_from_mask(attention)
        t = completion_ids.shape[1]
        return self.model(input_ids=input_ids, attention_mask=attention, use_cache=False, logits_to_keep=t + 1,
                          output_hidden_states=hidden_states, **inputs)

    def forward(self, rollout: Rollout, with_entropy: bool = False) -> PolicyOutput:
        return self.score(rollout.payload, with_entropy)

    def target_payload(self, examples: Sequence[Any], targets: Sequence[str]) -> VLMPayload:
        """Prompts with the given completions (each followed by EOS), as a rollout would hold them."""
        for i, target in enumerate(targets):
            if not isinstance(target, str) or not target:
                raise ValueError(f"SFT target {i} must be a non-empty string, got {target!r}")
        return self.completion_payload(examples, targets, 1.0)

    def completion_payload(self, examples: Sequence[Any], texts: Sequence[str], temperature: float) -> VLMPayload:
        """``texts[i]`` + EOS as the completion of ``examples[i]``'s prompt, at ``temperature``."""
        if len(examples) != len(texts):
            raise ValueError(f"{len(examples)} examples for {len(texts)} outputs")
        tokenizer = self.processor.tokenizer
        eos = tokenizer.convert_ids_to_tokens(self.eos_ids[0])
        enc = tokenizer([t + eos for t in texts], padding=True, padding_side="right", return_tensors="pt",
                        add_special_tokens=False)
        return VLMPayload(self.encode(examples), torch.arange(len(examples)), enc["input_ids"], enc["attention_mask"],
                          torch.full((len(examples),), temperature, dtype=torch.float32))

    @torch.no_grad()
    def rollout_from_outputs(self, examples: Sequence[Any], outputs: Sequence[str],
                             sampling: SamplingParams) -> Rollout:
        """Rows for given outputs (each followed by EOS, as sampled ones end), scored as ``forward`` scores them
        at ``sampling.temperature``: the task's reference answers in a group (ViSurf, CalibRL), or samples
        drawn in another context re-scored in this one (Guide)."""
        payload = self.completion_payload(examples, [str(o) for o in outputs], sampling.temperature)
        was_training = self.model.training
        self.model.eval()
        out = self.score(payload)
        self.model.train(was_training)
        mask = payload.completion_mask.float()
        index = torch.arange(len(examples))
        return Rollout(logp=out.logp.cpu().float() * mask, mask=mask, group_id=index.clone(), example_index=index,
                       outputs=list(outputs), payload=payload, policy_version=self.version)

    def completion_log_distributions(self, examples: Sequence[Any], outputs: Sequence[str],
                                     temperature: float) -> tuple[Tensor, Tensor]:
        payload = self.completion_payload(examples, [str(o) for o in outputs], temperature)
        device = self.suppressed.device
        completion_ids, completion_mask = payload.completion_ids.to(device), payload.completion_mask.to(device)
        logits = self.plain_logits(payload.prompts.to(device).select(payload.prompt_of_row), completion_ids,
                                   completion_mask)
        return tempered_log_softmax(logits, temperature, self.suppressed), completion_mask.float()

    @torch.no_grad()
    def completion_features(self, examples: Sequence[Any], outputs: Sequence[str]) -> Tensor:
        payload = self.completion_payload(examples, [str(o) for o in outputs], 1.0)
        device = self.suppressed.device
        completion_ids, completion_mask = payload.completion_ids.to(device), payload.completion_mask.to(device)
        out = self.plain_forward(payload.prompts.to(device).select(payload.prompt_of_row), completion_ids,
                                 completion_mask, hidden_states=True)
        # The completion is the last T positions (prompts are left-padded, completions right-padded).
        states = out.hidden_states[-1][:, -completion_ids.shape[1]:].float()  # [n, T, D]: after each output token
        mask = completion_mask.float()[..., None]
        return (states * mask).sum(1) / mask.sum(1).clamp(min=1)

    @property
    def vision_encoder(self) -> torch.nn.Module:
        """The vision tower with its patch merger (``model.visual`` in Qwen2-VL / 2.5-VL / 3-VL)."""
        return self.base_model.model.visual

    def pooled_image_features(self, examples: Sequence[Any]) -> Tensor:
        """[N, 2·D]: mean and max over each example's merged vision tokens (the vectors the LM reads),
        for exactly one image per example, or exactly one video and no image; with gradients into the
        vision encoder."""
        prompts = self.encode(examples)
        device = self.suppressed.device
        model = self.base_model.model
        if prompts.pixel_values is not None and bool((prompts.images_per_row == 1).all()) and \
                prompts.videos_per_row is None:
            tokens = model.get_image_features(prompts.pixel_values.to(device),
                                              prompts.image_grid_thw.to(device)).pooler_output
        elif prompts.pixel_values is None and prompts.videos_per_row is not None and \
                bool((prompts.videos_per_row == 1).all()):
            tokens = model.get_video_features(prompts.pixel_values_videos.to(device),
                                              prompts.video_grid_thw.to(device)).pooler_output
        else:
            raise ValueError("pooled_image_features needs exactly one image per example, or exactly one video "
                             "and no image per example")
        return torch.stack([torch.cat([t.mean(0), t.amax(0)]) for t in tokens])

    def sft_loss(self, examples: Sequence[Any], targets: Sequence[str]) -> Tensor:
        payload = self.target_payload(examples, targets)
        out = self.score(payload)
        mask = payload.completion_mask.float().to(out.logp.device)
        return -(out.logp * mask).sum() / mask.sum()


def checked_image(image: Any, example: int, position: int) -> Any:
    """``image`` if it is a readable, non-empty PIL image; else a ValueError saying which one."""
    from PIL import Image

    if not isinstance(image, Image.Image):
        raise TypeError(f"example {example}: image {position} must be a PIL.Image, got {type(image).__name__} "
                        f"(open files with PIL.Image.open and pass the image)")
    return loaded_image(image, f"example {example}: image {position}")


def loaded_image(image: Any, what: str) -> Any:
    """``image`` (a PIL image) decoded, if it is readable and non-empty; else a ValueError naming ``what``."""
    try:
        image.load()
    except Exception as err:  # PIL raises OSError / SyntaxError / ... for truncated or corrupt files
        raise ValueError(f"{what} is corrupt or truncated ({err})") from None
    if image.width < 1 or image.height < 1:
        raise ValueError(f"{what} is empty ({image.width}x{image.height})")
    return image



def checked_frames(video: Any, example: int, position: int) -> list[Any]:
    """A video given as PIL frames or a uint8 array ``[T, H, W, 3]`` → its non-empty list of same-size
    PIL frames; else an error saying which video of which example is wrong."""
    from PIL import Image

    where = f"example {example}: video {position}"
    if isinstance(video, np.ndarray):
        if video.ndim != 4 or video.shape[-1] != 3 or video.dtype != np.uint8:
            raise ValueError(f"{where}: an array video must be uint8 [T, H, W, 3], got {video.dtype} {list(video.shape)}")
        frames = [Image.fromarray(frame) for frame in video]
    elif isinstance(video, (list, tuple)):
        frames = list(video)
    else:
        raise TypeError(f"{where} must be a list of PIL frames, a uint8 array [T, H, W, 3] or a file path, "
                        f"got {type(video).__name__}")
    if not frames:
        raise ValueError(f"{where} has no frames")
    for k, frame in enumerate(frames):
        if not isinstance(frame, Image.Image):
            raise TypeError(f"{where}: frame {k} must be a PIL.Image, got {type(frame).__name__}")
        loaded_image(frame, f"{where}: frame {k}")
        if frame.size != frames[0].size:
            raise ValueError(f"{where}: frame {k} is {frame.size[0]}x{frame.size[1]} but frame 0 is "
                             f"{frames[0].size[0]}x{frames[0].size[1]}; all frames of a video need one size")
    return [frame.convert("RGB") for frame in frames]


def read_video_file(path: Path, fps: float, max_frames: int, example: int, position: int) -> tuple[list[Any], float]:
    """Decode ``path`` with PyAV and keep frames evenly spaced at ``fps`` (at most ``max_frames``, as
    qwen-vl-utils' ``smart_nframes`` counts them); returns the frames and their effective rate.

    qwen-vl-utils' own readers need torchcodec, decord or ``torchvision.io.read_video`` (removed in
    torchvision 0.24); PyAV ships with qwen-vl-utils, and the frames then take its frame-list path."""
    import av
    from qwen_vl_utils.vision_process import smart_nframes

    where = f"example {example}: video {position} ({path})"
    if not path.is_file():
        raise FileNotFoundError(f"{where} is not a file")
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            rate = float(stream.average_rate or stream.guessed_rate or 0)
            frames = [frame.to_image() for frame in container.decode(stream)]
    except Exception as err:  # PyAV raises InvalidDataError / IndexError / ... for corrupt or non-video files
        raise ValueError(f"{where} could not be decoded ({type(err).__name__}: {err})") from None
    if len(frames) < 2 or rate <= 0:
        raise ValueError(f"{where} has {len(frames)} decodable frame(s) at {rate} fps; a video needs >= 2 frames")
    try:
        count = smart_nframes({"fps": fps, "max_frames": max_frames}, total_frames=len(frames), video_fps=rate)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    index = np.linspace(0, len(frames) - 1, count).round().astype(int)
    return [frames[i] for i in index], count / len(frames) * rate
