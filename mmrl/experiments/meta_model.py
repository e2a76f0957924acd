"""A recipe's policy model built on the meta device (shapes, no weights), and the shapes of its update step.

``mmrl plan`` (:mod:`mmrl.experiments.memory_plan`) needs three things from a recipe, none of which needs
the weights: the exact parameter counts of what the trainer trains (per dtype, trainable or frozen: LoRA
adapters counted by building the peft wrapper itself), the architecture numbers its activation and KV-cache
terms read (layers, hidden size, heads, ...), and how long the rows are (prompt tokens, image patches).

Models come from the recipe's own sources: a ``causal_lm`` from its ``model_config`` JSON (with the
character tokenizer's vocabulary) or its ``pretrained`` folder's ``config.json``; a ``vlm`` from its
``model_spec`` (the tiny-VLM spec, processor included) or ``pretrained`` folder's ``config.json``; either
from an explicit transformers ``config.json`` (``--model-config``: a real-size model without its weights,
e.g. ``assets/vlm/qwen2_5_vl_3b_config.json``). ``vla`` and ``candidate_scorer`` policies are built whole
on the meta device (parameters only; their activations are not planned).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmrl.core.config import ConfigError, TrainConfig

META = torch.device("meta")
PLANNED_POLICIES = ("causal_lm", "vlm", "vla", "candidate_scorer")
"""Policies whose parameters ``mmrl plan`` counts (activations: ``causal_lm`` and ``vlm``)."""


@dataclass(frozen=True)
class ParameterCount:
    """Parameters of the trained policy (tied weights once), as the optimizer and the devices see them."""

    total: int
    trainable: int
    total_bytes: int
    """Bytes of all parameters in the dtype they are loaded in (``policy.args.dtype``)."""
    trainable_bytes: int
    by_dtype: dict[str, int]
    """Parameter count per dtype name (``float32``, ``bfloat16``)."""
    largest_layer: int
    """Parameters of the largest decoder / vision block: what FSDP or ZeRO-3 gathers at a time."""


@dataclass(frozen=True)
class VisionArchitecture:
    """The vision tower's numbers (Qwen2-VL / 2.5-VL / 3-VL)."""

    depth: int
    hidden: int
    intermediate: int
    heads: int
    patch_size: int
    patch_inputs: int
    """Values per patch: channels × temporal patch × patch²."""
    merge_size: int
    """Patches merged into one language-model token: merge_size² (spatial_merge_size)."""
    gated_rms: bool
    """Qwen2.5-VL blocks: RMSNorm and a gated (SwiGLU) MLP; else LayerNorm and a plain MLP (Qwen2-VL, Qwen3-VL)."""


@dataclass(frozen=True)
class Architecture:
    """The decoder's numbers (a Qwen2 / Llama style decoder: RMSNorm, rotary attention, SwiGLU MLP)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    qk_norm: bool
    """RMSNorm on queries and keys (Qwen3)."""
    vision: VisionArchitecture | None


@dataclass(frozen=True)
class RowShape:
    """How long one training row is: prompt tokens (text + image placeholders, padded to the longest) and
    image patches fed to the vision tower; ``source`` says where the numbers come from."""

    prompt_tokens: int
    patches: int
    source: str


DECODER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class TrainableParts:
    """Which parts of the model train: a frozen matmul does not keep its input for the backward pass, so
    LoRA (frozen base, adapters on some projections) saves fewer activations than full fine-tuning."""

    linears: tuple[str, ...]
    """Decoder projections (:data:`DECODER_LINEARS`) with trainable parameters, own or adapters."""
    norms: bool
    """The decoder's RMSNorm weights."""
    lm_head: bool
    vision: bool
    """Any vision-tower parameter."""
    adapter_rank: int
    """LoRA rank (0: no adapters)."""


FULL = TrainableParts(DECODER_LINEARS, True, True, True, 0)


def trainable_parts(model: torch.nn.Module, adapter_rank: int) -> TrainableParts:
    """What trains in ``model`` (a transformers model, possibly under peft), read from ``requires_grad``."""
    layer = next(m for m in model.modules() if type(m).__name__.endswith("DecoderLayer"))
    trained = {name.rsplit(".", 1)[-1] for name, m in layer.named_modules() if any(p.requires_grad for p in m.parameters())}
    linears = tuple(name for name in DECODER_LINEARS if name in trained)
    named = list(model.named_parameters())
    trains = lambda *keys: any(p.requires_grad for n, p in named if any(k in n for k in keys))  # noqa: E731
    return TrainableParts(linears, trains("layernorm"), trains("lm_head", "embed_tokens"), trains("visual."),
                          adapter_rank)


@dataclass(frozen=True)
class PlannedModel:
    """What the planner knows about a recipe's policy without its weights."""

    policy: str
    counts: ParameterCount
    architecture: Architecture | None
    """None for policies whose activations are not planned (vla, candidate_scorer)."""
    param_dtype: str
    rows: RowShape | None
    trainable: TrainableParts = FULL


def count_parameters(model: torch.nn.Module) -> ParameterCount:
    """Exact counts of ``model``'s parameters (meta or real): what AdamW and the devices hold."""
    params = list(model.parameters())
    by_dtype: dict[str, int] = {}
    for p in params:
        name = str(p.dtype).removeprefix("torch.")
        by_dtype[name] = by_dtype.get(name, 0) + p.numel()
    trainable = [p for p in params if p.requires_grad]
    blocks = [m for m in model.modules() if type(m).__name__.endswith(("DecoderLayer", "VisionBlock", "Block"))
              and m is not model]
    largest = max((sum(p.numel() for p in b.parameters()) for b in blocks), default=0)
    return ParameterCount(total=sum(p.numel() for p in params), trainable=sum(p.numel() for p in trainable),
                          total_bytes=sum(p.numel() * p.element_size() for p in params),
                          trainable_bytes=sum(p.numel() * p.element_size() for p in trainable),
                          by_dtype=by_dtype, largest_layer=largest)


def architecture_of(config: Any) -> Architecture:
    """The decoder (and vision tower) numbers of a transformers config (text-only or vision-language)."""
    text = config.get_text_config()
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    vision = None
    vision_config = getattr(config, "vision_config", None)
    if vision_config is not None:
        channels = getattr(vision_config, "in_channels", None) or getattr(vision_config, "in_chans", 3)
        vision = VisionArchitecture(
            depth=vision_config.depth, hidden=vision_config.hidden_size,
            intermediate=vision_config.intermediate_size, heads=vision_config.num_heads,
            patch_size=vision_config.patch_size,
            patch_inputs=channels * vision_config.temporal_patch_size * vision_config.patch_size ** 2,
            merge_size=vision_config.spatial_merge_size, gated_rms=config.model_type == "qwen2_5_vl")
    return Architecture(layers=text.num_hidden_layers, hidden=text.hidden_size, intermediate=text.intermediate_size,
                        heads=heads, kv_heads=text.num_key_value_heads, head_dim=head_dim, vocab=text.vocab_size,
                        qk_norm=text.model_type.startswith("qwen3"), vision=vision)


def read_model_config(path: str | Path) -> Any:
    """A transformers config from a ``config.json`` file (or a folder holding one), without weights."""
    from transformers import AutoConfig

    file = Path(path)
    file = file / "config.json" if file.is_dir() else file
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no transformers config.json there")
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{file} is not valid JSON: {err}") from None
    if "model_type" not in data:
        raise ConfigError(f"{file} has no model_type: not a transformers config.json")
    model_type = data.pop("model_type")
    return AutoConfig.for_model(model_type, **{k: v for k, v in data.items() if not k.startswith("_")})


def build_meta_model(cfg: TrainConfig, model_config: str | None = None, seed_examples: int = 64) -> PlannedModel:
    """The recipe's policy on the meta device; ``model_config`` replaces the recipe's model by a config.json."""
    name, args = cfg.policy.name, cfg.policy.args
    if name not in PLANNED_POLICIES:
        raise ConfigError(f"mmrl plan counts the policies {list(PLANNED_POLICIES)}; {name!r} builds its model by "
                          f"loading or pretraining weights, which the planner does not do")
    if name in ("vla", "candidate_scorer"):
        if model_config is not None:
            raise ConfigError(f"--model-config is for causal_lm and vlm policies, not {name}")
        from mmrl.core.registry import make_policy

        with META:  # the policy's own constructor, weights never loaded
            policy = make_policy(name, dataclasses.replace(args, pretrained=None))
        return PlannedModel(name, count_parameters(policy), None, "float32", None)
    if name == "causal_lm":
        return _causal_lm(cfg, model_config, seed_examples)
    return _vlm(cfg, model_config, seed_examples)


def _examples(cfg: TrainConfig, n: int) -> list[Any]:
    from mmrl.core.registry import make_task

    return make_task(cfg.task.name, cfg.task.args).sample_batch("train", n, np.random.default_rng(cfg.trainer.seed))


def _with_lora(model: torch.nn.Module, args: Any) -> torch.nn.Module:
    """The model as the policy trains it: frozen under peft adapters when ``lora_rank > 0``."""
    if args.lora_rank <= 0:
        return model
    from mmrl.policies.lora import add_lora

    with META:
        return add_lora(model, args.lora_rank, args.lora_alpha, args.lora_dropout, args.lora_target_modules,
                        args.init_seed)


def _causal_lm(cfg: TrainConfig, model_config: str | None, seed_examples: int) -> PlannedModel:
    from transformers import AutoModelForCausalLM

    from mmrl.policies.causal_lm import CausalLMPolicy, load_tokenizer, prompt_text, spec_config

    args = cfg.policy.args
    tokenizer = None
    if model_config is not None:
        config = read_model_config(model_config)
    elif args.pretrained is not None:
        config = read_model_config(args.pretrained)
        if (Path(args.pretrained) / "tokenizer_config.json").is_file():
            tokenizer = load_tokenizer(Path(args.pretrained))
    else:
        config, tokenizer = spec_config(args.model_config, args.tokenizer_chars)
    dtype = getattr(torch, args.dtype)
    with META:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        value_head = torch.nn.Linear(config.get_text_config().hidden_size, 1) if args.value_head else None
    model = _with_lora(model, args)
    trained = torch.nn.ModuleList([model] + ([value_head] if value_head is not None else []))
    rows = None
    if tokenizer is not None:
        with META:  # the policy's own prompt encoding, around the meta model
            policy = CausalLMPolicy(model, tokenizer)
        lengths = [len(policy.tokenizer(prompt_text(ex), add_special_tokens=False)["input_ids"])
                   for ex in _examples(cfg, seed_examples)]
        rows = RowShape(max(lengths), 0, f"longest of {seed_examples} training prompts")
    return PlannedModel("causal_lm", count_parameters(trained), architecture_of(config), args.dtype, rows,
                        trainable_parts(model, args.lora_rank))


def _vlm(cfg: TrainConfig, model_config: str | None, seed_examples: int) -> PlannedModel:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    args = cfg.policy.args
    processor = None
    if model_config is not None:
        config = read_model_config(model_config)
    elif args.pretrained is not None:
        config = read_model_config(args.pretrained)
        folder = Path(args.pretrained)
        if any((folder / f).is_file() for f in ("processor_config.json", "preprocessor_config.json")):
            processor = AutoProcessor.from_pretrained(folder)
    else:
        from mmrl.models.tiny_vlm import build_processor, load_spec, model_config as spec_config

        spec = load_spec(args.model_spec)
        processor = build_processor(spec)
        config = spec_config(spec, processor.tokenizer)
    config._attn_implementation = args.attn_implementation
    dtype = getattr(torch, args.dtype)
    with META:
        model = AutoModelForImageTextToText.from_config(config, dtype=dtype)
    architecture = architecture_of(config)
    rows = _vlm_rows(cfg, model, processor, architecture, seed_examples)
    model = _with_lora(model, args)
    return PlannedModel("vlm", count_parameters(model), architecture, args.dtype, rows,
                        trainable_parts(model, args.lora_rank))


def _vlm_rows(cfg: TrainConfig, model: torch.nn.Module, processor: Any, architecture: Architecture,
              seed_examples: int) -> RowShape:
    """Prompt tokens and patches per row: encoded by the policy itself when the processor is known (exact);
    else ``max_prompt_tokens`` (the longest prompt the policy accepts) and the task's images resized under
    the recipe's pixel budget."""
    args = cfg.policy.args
    examples = _examples(cfg, seed_examples)
    if processor is not None:
        from mmrl.policies.vlm import VLMPolicy

        policy = VLMPolicy(model, processor, dataclasses.replace(args, gradient_checkpointing=False))
        prompts = policy.encode(examples)
        patches = 0
        if prompts.image_grid_thw is not None:
            per_image = prompts.image_grid_thw.prod(-1)
            per_row = torch.split(per_image, prompts.images_per_row.tolist())
            patches = int(max(int(p.sum()) for p in per_row))
        return RowShape(prompts.input_ids.shape[1], patches, f"the policy's encoding of {seed_examples} training "
                                                             f"prompts (longest)")
    if args.max_pixels is None:
        raise ConfigError("without the checkpoint's processor the planner needs the recipe's pixel budget: set "
                          "policy.args.max_pixels (or pass --image-patches)")
    from qwen_vl_utils import smart_resize

    vision = architecture.vision
    patches = 0
    for ex in examples:
        row = 0
        for image in ex.images:
            # min_pixels None (the checkpoint's value is unknown without its processor): qwen-vl-utils' default
            # stands in; it only changes images smaller than it
            height, width = smart_resize(image.height, image.width, vision.patch_size * vision.merge_size,
                                         args.min_pixels, args.max_pixels)
            row += (height // vision.patch_size) * (width // vision.patch_size)
        patches = max(patches, row)
    return RowShape(args.max_prompt_tokens, patches,
                    "policy.args.max_prompt_tokens (upper bound, no processor); images of "
                    f"{seed_examples} training examples under the recipe's pixel budget")
