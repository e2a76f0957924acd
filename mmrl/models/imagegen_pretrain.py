"""``mmrl pretrain-imagegen``: train the tiny text-to-image models RL starts from, on the procedural
shapes of ``imagegen/shapes-v0``, and save them as diffusers pipeline folders.

A config (``assets/imagegen/ddim_tiny.json`` / ``flow_tiny.json``) names the kind (``ddim``:
ε-prediction with ``DDIMScheduler``; ``flow``: rectified-flow velocity with
``FlowMatchEulerDiscreteScheduler``), the ``UNet2DModel`` and ``CLIPTextModel`` sizes and the
training budget. The UNet is conditioned through ``class_labels`` on the pooled text embedding
(``class_embed_type="identity"``), so prompts compose from words. Prompts are dropped with
probability ``cond_dropout`` so classifier-free guidance has an unconditional model.

Pipelines built from a config are cached in ``$MMRL_CACHE/imagegen/<hash of the config>/``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from diffusers import DDIMScheduler, FlowMatchEulerDiscreteScheduler, UNet2DModel
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from tqdm.auto import tqdm
from transformers import CLIPTextConfig, CLIPTextModel, PreTrainedTokenizerFast

from mmrl.core.config import build
from mmrl.core.paths import resolve_asset
from mmrl.models.diffusers_folder import save_pipeline
from mmrl.core.run_folder import mark_written, prepare_atomic_out
from mmrl.tasks.imagegen.shapes import all_prompts, prompt_vocabulary, render

PAD, EOS, UNK = "[PAD]", "[EOS]", "[UNK]"
MAX_PROMPT_TOKENS = 8


@dataclass(frozen=True)
class PretrainSchedule:
    steps: int = 1500
    """AdamW steps (denoising loss on fresh procedural images every step)."""
    batch_size: int = 64
    lr: float = 1e-3
    warmup_steps: int = 50
    """Linear warm-up, then cosine decay to 0."""
    seed: int = 0
    """Seeds initialisation, data and noise."""
    cond_dropout: float = 0.1
    """Probability of training on the empty prompt (classifier-free guidance, Ho & Salimans 2022)."""


@dataclass(frozen=True)
class PretrainConfig:
    kind: Literal["ddim", "flow"]
    """ddim: ε-prediction + DDIMScheduler (DDPO); flow: velocity v = ε − x_0 +
    FlowMatchEulerDiscreteScheduler (Flow-GRPO)."""
    image_size: int = 16
    unet: dict = field(default_factory=dict)
    """UNet2DModel arguments (block_out_channels, layers_per_block, block types, norm_num_groups)."""
    text_encoder: dict = field(default_factory=dict)
    """CLIPTextConfig arguments; hidden_size is the UNet's time-embedding width (4 × first channels)."""
    scheduler: dict = field(default_factory=dict)
    """DDIMScheduler / FlowMatchEulerDiscreteScheduler arguments."""
    train: PretrainSchedule = field(default_factory=PretrainSchedule)


def load_pretrain_config(path: str | Path) -> tuple[PretrainConfig, dict]:
    file = resolve_asset(str(path))
    data = json.loads(file.read_text())
    return build(PretrainConfig, data, str(file)), data


def word_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    """Whitespace word-level tokenizer: ``[PAD]`` 0, ``[EOS]`` 1 (appended), ``[UNK]`` 2, then words."""
    vocab = {PAD: 0, EOS: 1, UNK: 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK,
                                   model_max_length=MAX_PROMPT_TOKENS, padding_side="right")


def build_models(cfg: PretrainConfig) -> tuple[UNet2DModel, Any, CLIPTextModel, PreTrainedTokenizerFast]:
    """Fresh components from a config (seeded by ``cfg.train.seed``)."""
    unet_args = {"sample_size": cfg.image_size, "in_channels": 3, "out_channels": 3,
                 "class_embed_type": "identity", **cfg.unet}
    time_dim = 4 * unet_args.get("block_out_channels", (64,))[0]
    if cfg.text_encoder.get("hidden_size", time_dim) != time_dim:
        raise ValueError(f"text_encoder.hidden_size must equal the UNet's time-embedding width {time_dim}")
    tokenizer = word_tokenizer(prompt_vocabulary())
    text_config = CLIPTextConfig(vocab_size=len(tokenizer), hidden_size=time_dim,
                                 max_position_embeddings=MAX_PROMPT_TOKENS, pad_token_id=0, eos_token_id=1,
                                 bos_token_id=1, **{k: v for k, v in cfg.text_encoder.items() if k != "hidden_size"})
    if cfg.kind == "ddim":
        scheduler = DDIMScheduler(set_alpha_to_one=False, steps_offset=1, **cfg.scheduler)
    else:
        scheduler = FlowMatchEulerDiscreteScheduler(**cfg.scheduler)
    with torch.random.fork_rng():
        torch.manual_seed(cfg.train.seed)
        unet, text_encoder = UNet2DModel(**unet_args), CLIPTextModel(text_config)
    return unet, scheduler, text_encoder, tokenizer


def encode(text_encoder: CLIPTextModel, tokenizer: PreTrainedTokenizerFast, prompts: list[str]) -> torch.Tensor:
    enc = tokenizer(prompts, padding="max_length", max_length=MAX_PROMPT_TOKENS, return_tensors="pt")
    return text_encoder(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).pooler_output


def denoising_loss(cfg: PretrainConfig, unet: UNet2DModel, scheduler: Any, x0: torch.Tensor, cond: torch.Tensor,
                   gen: torch.Generator) -> torch.Tensor:
    """ddim: ‖ε̂(x_t, t) − ε‖² (Ho et al. 2020); flow: ‖v̂(x_σ, σ) − (ε − x_0)‖² with x_σ = (1−σ)x_0 + σε
    (Lipman et al. 2023; SD3's convention, timestep = 1000 σ)."""
    n = x0.shape[0]
    noise = torch.randn(x0.shape, generator=gen)
    if cfg.kind == "ddim":
        t = torch.randint(0, scheduler.config.num_train_timesteps, (n,), generator=gen)
        x_t = scheduler.add_noise(x0, noise, t)
        return torch.nn.functional.mse_loss(unet(x_t, t, class_labels=cond).sample, noise)
    sigma = torch.rand(n, generator=gen)
    x_t = (1 - sigma)[:, None, None, None] * x0 + sigma[:, None, None, None] * noise
    pred = unet(x_t, sigma * scheduler.config.num_train_timesteps, class_labels=cond).sample
    return torch.nn.functional.mse_loss(pred, noise - x0)


def pretrain(config: str | Path, out: str | Path, progress: bool = True, overwrite: bool = False,
             steps: int | None = None) -> Path:
    """Train the models of ``config`` and save the pipeline to ``out`` (with ``pretrain.json``)."""
    cfg, raw = load_pretrain_config(config)
    if steps is not None:
        cfg = PretrainConfig(cfg.kind, cfg.image_size, cfg.unet, cfg.text_encoder, cfg.scheduler,
                             PretrainSchedule(**{**cfg.train.__dict__, "steps": steps}))
    out = Path(out)
    prepare_atomic_out(out, overwrite, "mmrl pretrain-imagegen")
    unet, scheduler, text_encoder, tokenizer = build_models(cfg)
    t = cfg.train
    params = list(unet.parameters()) + list(text_encoder.parameters())
    optimizer = torch.optim.AdamW(params, lr=t.lr)
    def lr_at(i: int) -> float:  # linear warm-up, cosine decay
        return min(1.0, (i + 1) / max(t.warmup_steps, 1)) * 0.5 * (1 + math.cos(math.pi * i / t.steps))

    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    rng, gen = np.random.default_rng(t.seed), torch.Generator().manual_seed(t.seed)
    prompts = all_prompts()
    losses = []
    bar = tqdm(range(t.steps), desc=f"pretrain {cfg.kind}", disable=not progress, dynamic_ncols=True)
    unet.train()
    text_encoder.train()
    for _ in bar:
        batch = [prompts[i] for i in rng.integers(0, len(prompts), size=t.batch_size)]
        images = np.stack([render(p, cfg.image_size, rng) for p in batch])
        x0 = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1
        texts = ["" if rng.random() < t.cond_dropout else p.prompt for p in batch]
        loss = denoising_loss(cfg, unet, scheduler, x0, encode(text_encoder, tokenizer, texts), gen)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        sched.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.4f}", refresh=False)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_pipeline(tmp, unet.eval(), scheduler, text_encoder.eval(), tokenizer, None)
    (tmp / "pretrain.json").write_text(json.dumps({"config": raw, "steps": t.steps, "losses": losses}))
    mark_written(tmp, "pretrain-imagegen")
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, out)
    return out


def cached_pipeline(config: str | Path, progress: bool = True) -> Path:
    """The pipeline of ``config``, pretrained once and cached (key: the config's content)."""
    from mmrl.core.paths import cache_root

    _, raw = load_pretrain_config(config)
    key = hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_root() / "imagegen" / f"{raw['kind']}-{key}"
    if not (path / "model_index.json").is_file():
        shutil.rmtree(path, ignore_errors=True)
        pretrain(config, path, progress=progress)
    return path


def run_pretrain(args) -> str:
    if json.loads(resolve_asset(str(args.config)).read_text()).get("kind") == "var":  # next-scale VAR model
        from mmrl.models.var_pretrain import run_pretrain_var

        return run_pretrain_var(args)
    out = pretrain(args.config, args.out, progress=not args.no_progress, overwrite=args.overwrite, steps=args.steps)
    losses = json.loads((out / "pretrain.json").read_text())["losses"]
    tail = losses[-min(50, len(losses)):]
    return f"pipeline saved to {out} ({len(losses)} steps, final loss {np.mean(tail):.4f})"
