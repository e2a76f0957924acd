"""A policy over a diffusers text-to-image pipeline: each denoising step is a decision.

- DDPO (Black et al. 2023): a DDIM sampler with η > 0 (``DDIMScheduler``), ε-prediction.
- Flow-GRPO (Liu et al. 2025): a flow-matching model (``FlowMatchEulerDiscreteScheduler``)
  sampled with the ODE → SDE step of the same marginals.

The pipeline folder is in diffusers' layout (``model_index.json``, ``unet/``, ``scheduler/``,
``text_encoder/``, ``tokenizer/``, optional ``vae/``) and is loaded unchanged: the tiny pixel-space
models of ``mmrl pretrain-imagegen`` (``UNet2DModel`` conditioned through ``class_labels`` on the
pooled text embedding) and latent Stable Diffusion folders (``UNet2DConditionModel`` with
cross-attention, ``AutoencoderKL``) take the same code path, and so do Stable Diffusion 3 folders
(``transformer/`` = ``SD3Transformer2DModel``, two CLIP and an optional T5 text encoder, a VAE
with a shift factor, ``FlowMatchEulerDiscreteScheduler``): their prompts are encoded by diffusers'
own ``StableDiffusion3Pipeline.encode_prompt`` and the per-token and pooled embeddings travel as
one flat tensor per row (``[L·E + P]``), so rollouts, CFG and re-scoring need no special case. Classifier-free guidance runs inside
the policy, in sampling and in re-scoring (DDPO ``train.cfg=True``). The text encoder is frozen.

Rollouts: T = denoising steps; ``mask`` marks the steps that are trained (a window: Flow-GRPO's
denoising reduction trains a subset), the others are sampled but carry no decision. ``logp`` is
the per-step Gaussian log-prob averaged over dimensions. ``SamplingParams.temperature == 0``
(evaluation) samples deterministically (DDIM η = 0 / the flow ODE) with ``eval_num_steps`` steps
and returns no decisions.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from diffusers import (AutoencoderKL, DDIMScheduler, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel,
                       UNet2DConditionModel, UNet2DModel)
from safetensors.torch import load_file, save_file
from torch import Tensor

from mmrl.core.contracts import Policy, PolicyOutput
from mmrl.core.rollout import Rollout, SamplingParams
from mmrl.models.diffusers_folder import is_sd3_folder, load_pipeline_components, load_sd3_pipeline, save_pipeline
from mmrl.samplers.diffusion import (cfg_combine, ddim_deterministic_step, ddim_step, flow_ode_step, flow_sde_step,
                                     rlg_combine)

log = logging.getLogger(__name__)

LORA_FILE = "unet_lora.safetensors"
LORA_BASE_FILE = "lora_base.json"


@dataclass(frozen=True)
class DiffusionConfig:
    pretrained: str | None = None
    """A diffusers pipeline folder (model_index.json, unet, scheduler, text_encoder, tokenizer[, vae])."""
    pretrain_config: str | None = None
    """Instead of ``pretrained``: an ``assets/imagegen/*.json`` pretraining config; the pipeline is
    built by :mod:`mmrl.models.imagegen_pretrain` once and cached in ``$MMRL_CACHE/imagegen``."""
    scheduler: Literal["folder", "ddim", "flow_match"] = "folder"
    """The folder's own scheduler, or one built from its config: ``ddim`` (DDPO sets
    ``DDIMScheduler.from_config(pipeline.scheduler.config)`` on Stable Diffusion folders, whose
    scheduler is PNDM) or ``flow_match``."""
    num_steps: int = 10
    """Denoising steps of a training rollout (T)."""
    eval_num_steps: int = 20
    """Denoising steps when sampling deterministically (evaluation; Flow-GRPO: more than in training)."""
    train_window: tuple[int, ...] = ()
    """(first, end) step indices that are decisions (trained); empty: every step."""
    guidance_scale: float = 3.0
    """Classifier-free guidance g in sampling and re-scoring (1: no unconditional pass)."""
    eta: float = 1.0
    """DDIM η of training rollouts (DDPO: 1.0); needs a scheduler with set_alpha_to_one=false."""
    noise_level: float = 0.7
    """Flow-GRPO SDE noise level a (s_t = a √(σ/(1−σ)))."""
    lora_rank: int = 0
    """> 0: train LoRA adapters of this rank on the UNet (peft) instead of all its weights."""
    lora_alpha: float = 16.0
    lora_target_modules: tuple[str, ...] = ("to_q", "to_k", "to_v", "to_out.0")
    """UNet module names that get adapters (attention projections; conv1/conv2 for conv-only UNets)."""
    init_seed: int = 0
    """Seed of the LoRA initialisation."""
    max_sequence_length: int = 256
    """SD3 folders: T5 prompt tokens (Flow-GRPO trains SD3.5 with 128)."""
    channels_last: bool = True
    """Run the UNet in channels-last memory format (faster convolutions with oneDNN on CPU and on
    GPU tensor cores; the numbers agree with the default format to float rounding)."""


@dataclass(frozen=True)
class StepSchedule:
    """The denoising schedule of a rollout, shared by all its rows ([S] tensors, S = steps)."""

    kind: Literal["ddim", "flow"]
    timesteps: Tensor  # [S] the model's timestep input at each step
    coef_now: Tensor  # [S] ᾱ_t (ddim) or σ_t (flow)
    coef_next: Tensor  # [S] ᾱ_{t−1} (ddim) or σ_{t+1} (flow)
    sigma_max: float  # flow: σ of the second schedule point (replaces σ = 1 in the SDE std)
    noise: float  # η (ddim) or the SDE noise level (flow)
    guidance_scale: float
    clip_sample: float | None  # ddim: x̂_0 clip range (scheduler's clip_sample), None when off

    def same_as(self, other: StepSchedule) -> bool:
        return (self.kind == other.kind and torch.equal(self.timesteps, other.timesteps)
                and torch.equal(self.coef_now, other.coef_now) and torch.equal(self.coef_next, other.coef_next)
                and (self.sigma_max, self.noise, self.guidance_scale, self.clip_sample)
                == (other.sigma_max, other.noise, other.guidance_scale, other.clip_sample))


@dataclass(frozen=True)
class DiffusionPayload:
    latents: Tensor  # [N, S+1, C, H, W] the trajectory x_0 (noise) … x_S (sample), CPU
    cond: Tensor  # [N, *E] prompt embeddings (pooled [N, E] or per token [N, L, E])
    uncond: Tensor  # [*E] the empty prompt's embedding (classifier-free guidance)
    schedule: StepSchedule

    def select(self, index: Tensor) -> DiffusionPayload:
        return DiffusionPayload(self.latents[index], self.cond[index], self.uncond, self.schedule)

    @classmethod
    def concat(cls, parts: Sequence[DiffusionPayload]) -> DiffusionPayload:
        first = parts[0]
        if not all(p.schedule.same_as(first.schedule) for p in parts):
            raise ValueError("diffusion rollouts with different denoising schedules cannot be concatenated")
        return cls(torch.cat([p.latents for p in parts]), torch.cat([p.cond for p in parts]), first.uncond,
                   first.schedule)


class DiffusionPolicy(Policy):
    def __init__(self, unet: torch.nn.Module, scheduler: Any, text_encoder: torch.nn.Module, tokenizer: Any,
                 vae: AutoencoderKL | None, cfg: DiffusionConfig, source: Path | None = None,
                 sd3_pipeline: Any = None):
        """``unet`` is the denoiser (a UNet, or the SD3 transformer with ``sd3_pipeline`` the
        ``StableDiffusion3Pipeline`` that holds it and encodes the prompts)."""
        super().__init__()
        if isinstance(scheduler, FlowMatchEulerDiscreteScheduler):
            self.kind = "flow"
        elif isinstance(scheduler, DDIMScheduler):
            self.kind = "ddim"
            if scheduler.config.set_alpha_to_one:
                raise ValueError("the DDIM scheduler has set_alpha_to_one=true: its last step has σ = 0 and no "
                                 "log-prob; set \"set_alpha_to_one\": false (and steps_offset 1) in "
                                 "scheduler/scheduler_config.json")
            if scheduler.config.prediction_type != "epsilon":
                raise ValueError(f"DDIM prediction_type {scheduler.config.prediction_type!r}: only epsilon is "
                                 f"supported")
        else:
            raise ValueError(f"scheduler {type(scheduler).__name__} is not supported: use DDIMScheduler (DDPO) or "
                             f"FlowMatchEulerDiscreteScheduler (Flow-GRPO)")
        if not isinstance(unet, (UNet2DModel, UNet2DConditionModel, SD3Transformer2DModel)):
            raise ValueError(f"denoiser {type(unet).__name__}: expected UNet2DModel, UNet2DConditionModel or "
                             f"SD3Transformer2DModel")
        if isinstance(unet, SD3Transformer2DModel) and (sd3_pipeline is None or self.kind != "flow"):
            raise ValueError("an SD3 transformer needs its StableDiffusion3Pipeline (prompt encoders) and a "
                             "FlowMatchEulerDiscreteScheduler")
        if cfg.train_window and (len(cfg.train_window) != 2 or not 0 <= cfg.train_window[0] < cfg.train_window[1]
                                 <= cfg.num_steps):
            raise ValueError(f"policy.args.train_window must be (first, end) with 0 <= first < end <= num_steps "
                             f"({cfg.num_steps}), got {cfg.train_window}")
        if cfg.num_steps < 1 or cfg.eval_num_steps < 1:
            raise ValueError("policy.args.num_steps and eval_num_steps must be >= 1")
        self.unet, self.scheduler, self.text_encoder, self.tokenizer, self.vae = (
            unet, scheduler, text_encoder.requires_grad_(False).eval(), tokenizer, vae)
        if vae is not None:
            vae.requires_grad_(False).eval()
        self.cfg, self.source = cfg, source
        self.sd3 = sd3_pipeline
        if sd3_pipeline is not None:  # registered, so .to(device) moves them; the pipeline shares the objects
            self.text_encoder_2 = sd3_pipeline.text_encoder_2.requires_grad_(False).eval()
            if sd3_pipeline.text_encoder_3 is not None:
                self.text_encoder_3 = sd3_pipeline.text_encoder_3.requires_grad_(False).eval()
        self.cross_attention = isinstance(unet, (UNet2DConditionModel, SD3Transformer2DModel))
        self.memory_format = torch.channels_last if cfg.channels_last else torch.contiguous_format
        self.unet.to(memory_format=self.memory_format)
        self.lora = False
        if cfg.lora_rank > 0:
            self.add_lora()

    # -- construction ----------------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg: DiffusionConfig) -> DiffusionPolicy:
        if (cfg.pretrained is None) == (cfg.pretrain_config is None):
            raise ValueError("policy.args needs exactly one of pretrained (a pipeline folder) or pretrain_config "
                             "(an assets/imagegen/*.json config, built and cached by mmrl pretrain-imagegen)")
        if cfg.pretrained is not None:
            folder = Path(cfg.pretrained)
        else:
            from mmrl.models.imagegen_pretrain import cached_pipeline

            folder = cached_pipeline(cfg.pretrain_config)
        if is_sd3_folder(folder):
            pipe = load_sd3_pipeline(folder)
            return cls(pipe.transformer, pipe.scheduler, pipe.text_encoder, pipe.tokenizer, pipe.vae, cfg=cfg,
                       source=folder, sd3_pipeline=pipe)
        unet, scheduler, text_encoder, tokenizer, vae = load_pipeline_components(folder)
        if cfg.scheduler == "ddim":
            scheduler = DDIMScheduler.from_config(scheduler.config)
        elif cfg.scheduler == "flow_match":
            scheduler = FlowMatchEulerDiscreteScheduler.from_config(scheduler.config)
        return cls(unet, scheduler, text_encoder, tokenizer, vae, cfg=cfg, source=folder)

    def add_lora(self) -> None:
        """Freeze the UNet and add LoRA adapters (peft through diffusers; B = 0: unchanged policy)."""
        from peft import LoraConfig, inject_adapter_in_model

        config = LoraConfig(r=self.cfg.lora_rank, lora_alpha=self.cfg.lora_alpha, init_lora_weights=True,
                            target_modules=list(self.cfg.lora_target_modules))
        self.unet.requires_grad_(False)
        with torch.random.fork_rng():
            torch.manual_seed(self.cfg.init_seed)
            # in place: the UNet keeps its class (and its diffusers config / save format)
            self.unet = inject_adapter_in_model(config, self.unet)
        self.lora = True

    def _set_adapters(self, enabled: bool) -> None:
        from peft.tuners.tuners_utils import BaseTunerLayer

        for module in self.unet.modules():
            if isinstance(module, BaseTunerLayer):
                module.enable_adapters(enabled)

    @contextlib.contextmanager
    def _adapters_off(self) -> Iterator[None]:
        self._set_adapters(False)
        try:
            yield
        finally:
            self._set_adapters(True)

    def adapter_disabled(self):
        if not self.lora:
            return super().adapter_disabled()
        return self._adapters_off()

    def save_pretrained(self, path: str) -> None:
        """A full pipeline folder; with LoRA only the adapter (peft keys) and the base folder's path."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        if self.lora:
            from peft.utils import get_peft_model_state_dict

            save_file(get_peft_model_state_dict(self.unet), out / LORA_FILE)
            (out / LORA_BASE_FILE).write_text(json.dumps({"base_pipeline": str(self.source)}))
            return
        if self.sd3 is not None:
            self.sd3.save_pretrained(out)
            return
        save_pipeline(out, self.unet, self.scheduler, self.text_encoder, self.tokenizer, self.vae)

    def load_weights(self, path: str) -> None:
        folder = Path(path)
        if self.lora:
            from peft.utils import set_peft_model_state_dict

            set_peft_model_state_dict(self.unet, load_file(folder / LORA_FILE))
            return
        loaded = type(self.unet).from_pretrained(folder / ("transformer" if self.sd3 is not None else "unet"))
        self.unet.load_state_dict(loaded.state_dict())

    # -- conditioning ----------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.unet.parameters()).device

    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str]) -> Tensor:
        """Prompt embeddings: the pooled text embedding [B, E] (pixel UNet), per token [B, L, E]
        (cross-attention UNet), or for SD3 the per-token and pooled ones flattened, [B, L·E + P]."""
        if self.sd3 is not None:
            embeds, _, pooled, _ = self.sd3.encode_prompt(list(prompts), list(prompts), list(prompts),
                                                          device=self.device, do_classifier_free_guidance=False,
                                                          max_sequence_length=self.cfg.max_sequence_length)
            return torch.cat([embeds.flatten(1), pooled], 1)
        tok = self.tokenizer
        unk = tok.unk_token_id
        enc = tok(list(prompts), padding="max_length", max_length=tok.model_max_length, truncation=True,
                  return_tensors="pt")
        ids = enc["input_ids"]
        if unk is not None and bool((ids == unk).any()):
            bad = sorted({w for p in prompts for w in p.split() if tok.convert_tokens_to_ids(w) == unk})
            raise ValueError(f"prompt words {bad} are not in the text encoder's vocabulary "
                             f"({len(tok)} tokens, e.g. {sorted(tok.get_vocab())[:12]}...)")
        if ids.shape[1] > tok.model_max_length:
            raise ValueError(f"prompts longer than the tokenizer's {tok.model_max_length} tokens")
        out = self.text_encoder(input_ids=ids.to(self.device), attention_mask=enc["attention_mask"].to(self.device))
        return out.last_hidden_state if self.cross_attention else out.pooler_output

    # -- the model under guidance ------------------------------------------------------------------
    def model_output(self, x: Tensor, t: Tensor, cond: Tensor, uncond: Tensor, scale: float) -> Tensor:
        """ε̂ or v̂ at (x [B,C,H,W], t [B]) for prompts ``cond`` [B,*E], CFG-combined."""
        if scale == 1.0:
            return self._unet(x, t, cond)
        both = self._unet(torch.cat([x, x]), torch.cat([t, t]),
                          torch.cat([uncond.expand_as(cond), cond]))
        out_uncond, out_cond = both.chunk(2)
        return cfg_combine(out_uncond, out_cond, scale)

    def _unet(self, x: Tensor, t: Tensor, cond: Tensor) -> Tensor:
        x = x.contiguous(memory_format=self.memory_format)
        if self.sd3 is not None:
            config = self.unet.config
            tokens, pooled = cond[:, :-config.pooled_projection_dim], cond[:, -config.pooled_projection_dim:]
            return self.unet(hidden_states=x, timestep=t, encoder_hidden_states=tokens.unflatten(
                1, (-1, config.joint_attention_dim)), pooled_projections=pooled).sample
        if self.cross_attention:
            return self.unet(x, t, encoder_hidden_states=cond).sample
        return self.unet(x, t, class_labels=cond).sample

    def schedule(self, num_steps: int, stochastic: bool) -> StepSchedule:
        s = self.scheduler
        s.set_timesteps(num_steps)
        if self.kind == "ddim":
            t = s.timesteps.long()
            prev = t - s.config.num_train_timesteps // s.num_inference_steps
            alphas = s.alphas_cumprod
            a_prev = torch.where(prev >= 0, alphas[prev.clamp(min=0)], s.final_alpha_cumprod)
            clip = s.config.clip_sample_range if s.config.clip_sample else None
            return StepSchedule("ddim", t.float(), alphas[t].float(), a_prev.float(), 0.0,
                                self.cfg.eta if stochastic else 0.0, self.cfg.guidance_scale, clip)
        sigmas = s.sigmas.float()
        return StepSchedule("flow", sigmas[:-1] * s.config.num_train_timesteps, sigmas[:-1], sigmas[1:],
                            float(sigmas[1]), self.cfg.noise_level if stochastic else 0.0,
                            self.cfg.guidance_scale, None)

    def step_mask(self, num_steps: int) -> Tensor:
        """[S] 1 for the decision steps (the training window), 0 for steps sampled but not trained."""
        mask = torch.zeros(num_steps)
        first, end = self.cfg.train_window or (0, num_steps)
        mask[first:end] = 1.0
        return mask

    # -- sampling ----------------------------------------------------------------------------------
    @torch.no_grad()
    def rollout(self, examples: Sequence[Any], group_size: int, sampling: SamplingParams, seed: int) -> Rollout:
        if sampling.temperature not in (0.0, 1.0):
            raise ValueError(f"diffusion policies sample at temperature 1 (SDE / DDIM η > 0) or 0 (deterministic "
                             f"evaluation), got {sampling.temperature}")
        stochastic = sampling.temperature > 0
        steps = self.cfg.num_steps if stochastic else self.cfg.eval_num_steps
        prompts = [ex.prompt for ex in examples for _ in range(group_size)]
        cond = self.encode_prompts(prompts)
        uncond = self.encode_prompts([""])[0]
        schedule = self.schedule(steps, stochastic)
        gen = torch.Generator().manual_seed(seed)
        was_training = self.unet.training
        self.unet.eval()
        latents, logp = self.sample_trajectory(cond, uncond, schedule, gen, stochastic)
        self.unet.train(was_training)
        n = len(prompts)
        mask = self.step_mask(steps).expand(n, steps).clone() if stochastic else torch.zeros(n, steps)
        bad = ~(torch.isfinite(latents.flatten(1)).all(1) & torch.isfinite(logp).all(1))  # [N]
        if bool(bad.any()):
            # Never train on a diverged trajectory: its steps carry no decision, its image scores 0.
            log.warning("%d of %d diffusion rollouts have non-finite latents or log-probs; their steps are "
                        "masked out", int(bad.sum()), n)
            mask[bad] = 0.0
        logp = torch.where(mask > 0, logp, torch.zeros_like(logp))
        example_index = torch.arange(len(examples)).repeat_interleave(group_size)
        payload = DiffusionPayload(latents.cpu(), cond.cpu(), uncond.cpu(), schedule)
        return Rollout(logp=logp.cpu(), mask=mask, group_id=example_index.clone(), example_index=example_index,
                       outputs=self.decode(latents[:, -1]), payload=payload, policy_version=self.version,
                       stats={"rollout/nonfinite_rows": float(bad.sum())})

    def sample_trajectory(self, cond: Tensor, uncond: Tensor, schedule: StepSchedule, gen: torch.Generator,
                          stochastic: bool, base: DiffusionPolicy | None = None,
                          rlg_weight: float = 1.0) -> tuple[Tensor, Tensor]:
        """Latents [N, S+1, *D] and per-step log-probs [N, S] (zeros when deterministic).

        With ``base``, each step uses RL guidance: rlg_combine(base output, own output, w).
        """
        n, device = cond.shape[0], self.device
        shape = self.latent_shape()
        x = torch.randn((n, *shape), generator=gen).to(device)
        xs, logps = [x], []
        for i in range(len(schedule.timesteps)):
            t = schedule.timesteps[i].expand(n).to(device)
            out = self.model_output(x, t, cond, uncond, schedule.guidance_scale)
            if base is not None:
                out = rlg_combine(base.model_output(x, t, cond, uncond, schedule.guidance_scale), out, rlg_weight)
            now, nxt = schedule.coef_now[i].expand(n).to(device), schedule.coef_next[i].expand(n).to(device)
            if stochastic:
                z = torch.randn((n, *shape), generator=gen).to(device)
                step = (ddim_step(out, x, now, nxt, schedule.noise, noise=z, clip_sample=schedule.clip_sample)
                        if schedule.kind == "ddim" else
                        flow_sde_step(out, x, now, nxt, schedule.sigma_max, schedule.noise, noise=z))
                x, lp = step.next_sample, step.logp
            else:
                x = (ddim_deterministic_step(out, x, now, nxt, schedule.clip_sample) if schedule.kind == "ddim"
                     else flow_ode_step(out, x, now, nxt))
                lp = torch.zeros(n, device=device)
            xs.append(x)
            logps.append(lp)
        return torch.stack(xs, 1), torch.stack(logps, 1).float()

    def latent_shape(self) -> tuple[int, int, int]:
        size = self.unet.config.sample_size
        h, w = (size, size) if isinstance(size, int) else tuple(size)
        return (self.unet.config.in_channels, h, w)

    @torch.no_grad()
    def decode(self, x: Tensor) -> list[np.ndarray]:
        """Final latents [N, *D] → uint8 images [H, W, 3]; a non-finite sample stays a float array
        (the task's reward gives it 0 with a reason)."""
        if self.vae is not None:  # SD3's VAE also shifts its latents
            shift = getattr(self.vae.config, "shift_factor", None) or 0.0
            x = self.vae.decode(x / self.vae.config.scaling_factor + shift).sample
        images = ((x.float().clamp(-1, 1) + 1) * 127.5).permute(0, 2, 3, 1).cpu()
        finite = torch.isfinite(x.flatten(1)).all(1).tolist()
        return [img.round().to(torch.uint8).numpy() if ok else x[i].permute(1, 2, 0).float().cpu().numpy()
                for i, (img, ok) in enumerate(zip(images, finite))]

    @torch.no_grad()
    def generate(self, prompts: Sequence[str], seed: int, num_steps: int | None = None,
                 base: DiffusionPolicy | None = None, rlg_weight: float = 1.0) -> list[np.ndarray]:
        """Deterministic samples (DDIM η = 0 / ODE) for ``prompts``, optionally RL-guided against
        ``base`` (``mmrl sample --rlg-weight``)."""
        cond = self.encode_prompts(prompts)
        uncond = self.encode_prompts([""])[0]
        schedule = self.schedule(num_steps or self.cfg.eval_num_steps, stochastic=False)
        was_training = self.unet.training
        self.unet.eval()
        latents, _ = self.sample_trajectory(cond, uncond, schedule, torch.Generator().manual_seed(seed), False,
                                            base=base, rlg_weight=rlg_weight)
        self.unet.train(was_training)
        return self.decode(latents[:, -1])

    # -- re-scoring --------------------------------------------------------------------------------
    def forward(self, rollout: Rollout, with_entropy: bool = False) -> PolicyOutput:
        """Per-step log-probs [N, T] of the recorded trajectory under the current weights, and the
        Gaussian means [N, T, *D] / stds [N, T] (for the KL on the mean). Only the decision steps
        are evaluated, all in one (CFG-doubled) model call."""
        p: DiffusionPayload = rollout.payload
        s, device = p.schedule, self.device
        rows, steps = rollout.mask.nonzero(as_tuple=True)  # [K], [K]
        n, t_max = rollout.mask.shape
        shape = p.latents.shape[2:]
        logp = torch.zeros(n, t_max, device=device)
        mean = torch.zeros(n, t_max, *shape, device=device)
        std = torch.ones(n, t_max, device=device)
        if len(rows):
            x = p.latents[rows, steps].to(device)
            x_next = p.latents[rows, steps + 1].to(device)
            out = self.model_output(x, s.timesteps[steps].to(device), p.cond[rows].to(device), p.uncond.to(device),
                                    s.guidance_scale)
            now, nxt = s.coef_now[steps].to(device), s.coef_next[steps].to(device)
            step = (ddim_step(out, x, now, nxt, s.noise, next_sample=x_next, clip_sample=s.clip_sample)
                    if s.kind == "ddim" else
                    flow_sde_step(out, x, now, nxt, s.sigma_max, s.noise, next_sample=x_next))
            logp = logp.index_put((rows.to(device), steps.to(device)), step.logp.float())
            mean = mean.index_put((rows.to(device), steps.to(device)), step.mean)
            std = std.index_put((rows.to(device), steps.to(device)), step.std.float())
        else:  # no decision in these rows (all masked): zeros that still reach the weights, so the
            # trainer's backward runs and leaves zero gradients
            logp = logp + 0.0 * sum(p.sum() for p in self.unet.parameters() if p.requires_grad).nan_to_num()
        return PolicyOutput(logp=logp, mean=mean, std=std)
