"""DDPO RL step: mmrl's diffusion sampler + loss vs the reference loop, same model, batch and run.

Both sides sample ``--rows`` images (``--prompts`` prompts × group) with ``--steps`` DDIM steps
(η = 1, classifier-free guidance g = 3 inside the policy) and then take one PPO-clip update over
every (image, timestep) decision.

- **reference** (kvablack/ddpo-pytorch ``pipeline_with_logprob`` + ``ddim_step_with_logprob`` +
  ``train.py``): sampling calls ``DDIMScheduler.step`` per timestep and recomputes each step's
  log-prob the reference way (per-step ``alphas_cumprod.gather``, left-broadcasts); training loops
  over ``train.batch_size`` chunks of samples and, inside each, over timesteps: one UNet call +
  backward per (chunk, timestep), gradients accumulated, one optimizer step. The chunk is
  ``--ref-train-batch`` samples, by default the mmrl side's ``--micro-batch``, so both sides
  back-propagate the same rows per chunk (mmrl: all their timesteps at once).
- **mmrl**: ``DiffusionPolicy.rollout`` (log-probs from the step's own mean and σ) and
  ``DiffusionPolicy.forward``, which re-scores all timesteps of the batch in one UNet call, then
  ``ppo_clip`` + ``token-mean`` from ``mmrl.algos``.

Reported: median seconds per RL step (sampling + update) of each side, interleaved, and their
ratio; and the peak memory of the update: bytes autograd saves for backward (CPU), plus
``torch.cuda.max_memory_allocated`` on a GPU. mmrl trades memory for speed here: its re-scoring
graph spans all timesteps of a micro-batch (bounded by ``trainer.micro_batch_size``).

    python bench/bench_diffusion.py [--repeats 5] [--prompts 8] [--group 4] [--steps 10]
    # on a GPU node, a local Stable Diffusion folder (LoRA on both sides, 512 px):
    python bench/bench_diffusion.py --pipeline /models/stable-diffusion-v1-5 --device cuda --steps 50 --lora-rank 4
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import tempfile
import time
from contextlib import contextmanager

import numpy as np
import torch

from mmrl.algos import POLICY_LOSSES, AlgoConfig, aggregate
from mmrl.models.imagegen_pretrain import pretrain
from mmrl.policies.diffusion import DiffusionConfig, DiffusionPolicy
from mmrl.core.registry import make_task
from mmrl.core.rollout import SamplingParams

CLIP = 1e-4  # DDPO clip_range


# -- the reference, as kvablack/ddpo-pytorch writes it ------------------------------------------
def _left_broadcast(t, shape):
    return t.reshape(t.shape + (1,) * (len(shape) - t.ndim)).broadcast_to(shape)


def _get_variance(self, timestep, prev_timestep):
    alpha_prod_t = torch.gather(self.alphas_cumprod, 0, timestep.cpu()).to(timestep.device)
    alpha_prod_t_prev = torch.where(prev_timestep.cpu() >= 0, self.alphas_cumprod.gather(0, prev_timestep.cpu()),
                                    self.final_alpha_cumprod).to(timestep.device)
    beta_prod_t, beta_prod_t_prev = 1 - alpha_prod_t, 1 - alpha_prod_t_prev
    return (beta_prod_t_prev / beta_prod_t) * (1 - alpha_prod_t / alpha_prod_t_prev)


def ddim_step_with_logprob(self, model_output, timestep, sample, eta, prev_sample):
    """ddpo_pytorch/diffusers_patch/ddim_with_logprob.py (epsilon prediction, clip_sample honoured)."""
    prev_timestep = timestep - self.config.num_train_timesteps // self.num_inference_steps
    prev_timestep = torch.clamp(prev_timestep, 0, self.config.num_train_timesteps - 1)
    alpha_prod_t = self.alphas_cumprod.gather(0, timestep.cpu())
    alpha_prod_t_prev = torch.where(prev_timestep.cpu() >= 0, self.alphas_cumprod.gather(0, prev_timestep.cpu()),
                                    self.final_alpha_cumprod)
    alpha_prod_t = _left_broadcast(alpha_prod_t, sample.shape).to(sample.device)
    alpha_prod_t_prev = _left_broadcast(alpha_prod_t_prev, sample.shape).to(sample.device)
    beta_prod_t = 1 - alpha_prod_t
    pred_original_sample = (sample - beta_prod_t ** 0.5 * model_output) / alpha_prod_t ** 0.5
    pred_epsilon = model_output
    if self.config.clip_sample:
        pred_original_sample = pred_original_sample.clamp(-self.config.clip_sample_range, self.config.clip_sample_range)
    variance = _get_variance(self, timestep, prev_timestep)
    std_dev_t = _left_broadcast(eta * variance ** 0.5, sample.shape).to(sample.device)
    pred_sample_direction = (1 - alpha_prod_t_prev - std_dev_t ** 2) ** 0.5 * pred_epsilon
    prev_sample_mean = alpha_prod_t_prev ** 0.5 * pred_original_sample + pred_sample_direction
    log_prob = (-((prev_sample.detach() - prev_sample_mean) ** 2) / (2 * (std_dev_t ** 2)) - torch.log(std_dev_t)
                - torch.log(torch.sqrt(2 * torch.as_tensor(math.pi))))
    return log_prob.mean(dim=tuple(range(1, log_prob.ndim)))


def unet_call(unet: torch.nn.Module, x: torch.Tensor, t: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
    """The UNet as the pipeline calls it: cross-attention on per-token embeddings, or class labels."""
    if embeds.ndim == 3:
        return unet(x, t, encoder_hidden_states=embeds).sample
    return unet(x, t, class_labels=embeds).sample


def reference_step(unet: torch.nn.Module, policy: DiffusionPolicy, prompts: list[str], advantages: torch.Tensor,
                   optimizer, steps: int, seed: int, train_batch: int) -> None:
    sched, g = policy.scheduler, policy.cfg.guidance_scale
    cond, uncond = policy.encode_prompts(prompts), policy.encode_prompts([""])
    n = len(prompts)
    embeds = torch.cat([uncond.expand_as(cond), cond])
    sched.set_timesteps(steps)
    gen = torch.Generator().manual_seed(seed)
    device = policy.device
    x = torch.randn((n, *policy.latent_shape()), generator=gen).to(device)
    latents, logps, timesteps = [x], [], []
    with torch.no_grad():  # pipeline_with_logprob
        for t in sched.timesteps:
            out = unet_call(unet, torch.cat([x, x]), t.to(device), embeds)
            u, c = out.chunk(2)
            eps = u + g * (c - u)
            z = torch.randn(x.shape, generator=gen).to(device)
            x_prev = sched.step(eps, t, x, eta=1.0, variance_noise=z).prev_sample
            logps.append(ddim_step_with_logprob(sched, eps, t.expand(n), x, 1.0, x_prev))
            latents.append(x_prev)
            timesteps.append(t)
            x = x_prev
    old = torch.stack(logps, 1)
    # train.py: batches of train.batch_size samples, one timestep at a time, gradients accumulated
    for rows in torch.arange(n).split(train_batch):
        emb = torch.cat([embeds[:n][rows], embeds[n:][rows]])
        for j, t in enumerate(timesteps):
            x_j = latents[j][rows]
            out = unet_call(unet, torch.cat([x_j, x_j]), t.to(device), emb)
            u, c = out.chunk(2)
            logp = ddim_step_with_logprob(sched, u + g * (c - u), t.expand(len(rows)), x_j, 1.0, latents[j + 1][rows])
            ratio = torch.exp(logp - old[rows, j])
            adv = advantages[rows].to(device)
            loss = torch.mean(torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - CLIP, 1 + CLIP)))
            (loss * len(rows) / n / len(timesteps)).backward()
    torch.nn.utils.clip_grad_norm_([p for p in unet.parameters() if p.requires_grad], 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def mmrl_step(policy: DiffusionPolicy, examples: list, group: int, advantages: torch.Tensor, optimizer,
              seed: int, micro_batch: int) -> None:
    """As the trainer does it: rollout, then re-scoring in micro-batches of rows (gradient
    accumulation with the global token count as the denominator), one optimizer step."""
    rollout = policy.rollout(examples, group, SamplingParams(), seed)
    cfg = AlgoConfig(clip_low=CLIP, clip_high=CLIP)
    num_tokens = float(rollout.mask.sum())
    for idx in torch.arange(rollout.num_rows).split(micro_batch):
        rows = rollout.select(idx)
        out = policy(rows)
        adv = (advantages[idx, None] * rows.mask).to(out.logp.device)
        mask = rows.mask.to(adv.device)
        loss_tok, _ = POLICY_LOSSES.get("ppo_clip")(out.logp, rows.logp.to(adv.device), adv, mask, cfg)
        aggregate(loss_tok, mask, "token-mean", num_tokens=num_tokens).backward()
    torch.nn.utils.clip_grad_norm_([p for p in policy.unet.parameters() if p.requires_grad], 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


@contextmanager
def saved_bytes(record: list):
    """Peak bytes autograd holds for backward during the block (CPU's activation memory)."""
    state = {"now": 0, "peak": 0}

    class Held:  # counted while the graph holds it; released when backward frees the graph
        def __init__(self, t):
            self.t, self.size = t, t.numel() * t.element_size()
            state["now"] += self.size
            state["peak"] = max(state["peak"], state["now"])

        def __del__(self):
            state["now"] -= self.size

    with torch.autograd.graph.saved_tensors_hooks(Held, lambda held: held.t):
        yield
    record.append(state["peak"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--micro-batch", type=int, default=8,
                        help="rows per re-scoring call on the mmrl side (trainer.micro_batch_size)")
    parser.add_argument("--ref-train-batch", type=int, default=None,
                        help="samples per backward chunk on the reference side (ddpo-pytorch's train.batch_size; "
                             "default: the same as --micro-batch, so both sides hold the same rows per chunk)")
    parser.add_argument("--pipeline", default=None,
                        help="a local diffusers pipeline folder (e.g. Stable Diffusion v1.5; DDIM from its config) "
                             "instead of the tiny pretrained pixel UNet")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--lora-rank", type=int, default=0, help="> 0: LoRA adapters on both sides")
    parser.add_argument("--contiguous", action="store_true",
                        help="mmrl side without channels-last (isolates the batched re-scoring's gain)")
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.pipeline or pretrain("assets/imagegen/ddim_tiny.json", f"{tmp}/ddim", progress=False, steps=2)
        policy = DiffusionPolicy.from_config(DiffusionConfig(
            pretrained=str(folder), scheduler="ddim" if args.pipeline else "folder", num_steps=args.steps,
            guidance_scale=3.0, eta=1.0, lora_rank=args.lora_rank, channels_last=not args.contiguous)).to(args.device)
    examples = make_task("imagegen/shapes-v0").sample_batch("train", args.prompts, np.random.default_rng(0))
    prompts = [ex.prompt for ex in examples for _ in range(args.group)]
    advantages = torch.randn(len(prompts), generator=torch.Generator().manual_seed(0)).clamp(-5, 5)
    optimizer = torch.optim.AdamW([p for p in policy.unet.parameters() if p.requires_grad], lr=1e-6)
    # The same weights, in PyTorch's default memory format, as the reference code runs them.
    ref_unet = copy.deepcopy(policy.unet).to(memory_format=torch.contiguous_format)
    ref_optimizer = torch.optim.AdamW([p for p in ref_unet.parameters() if p.requires_grad], lr=1e-6)
    cuda = args.device.startswith("cuda")
    gpu_memory: dict[str, int] = {}
    ref_batch = args.ref_train_batch or args.micro_batch
    sides = {"reference": lambda s: reference_step(ref_unet, policy, prompts, advantages, ref_optimizer, args.steps, s,
                                                   ref_batch),
             "mmrl": lambda s: mmrl_step(policy, examples, args.group, advantages, optimizer, s, args.micro_batch)}
    times: dict[str, list[float]] = {k: [] for k in sides}
    memory: dict[str, list[int]] = {k: [] for k in sides}
    for repeat in range(args.repeats + 1):  # the first round warms up
        for name in (("reference", "mmrl") if repeat % 2 else ("mmrl", "reference")):
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            with saved_bytes(memory[name]):
                sides[name](repeat)
            if cuda:
                torch.cuda.synchronize()
                gpu_memory[name] = max(gpu_memory.get(name, 0), torch.cuda.max_memory_allocated())
            if repeat:
                times[name].append(time.perf_counter() - start)
    ref, ours = statistics.median(times["reference"]), statistics.median(times["mmrl"])
    side = policy.latent_shape()[-1] * (2 ** (len(policy.vae.config.block_out_channels) - 1) if policy.vae else 1)
    print(f"DDPO RL step on {args.device}, {len(prompts)} images x {args.steps} DDIM steps, CFG, {side} px, "
          f"{sum(p.numel() for p in policy.unet.parameters()) / 1e6:.2f} M-param UNet"
          f"{f' (LoRA r{args.lora_rank})' if args.lora_rank else ''}, "
          f"{args.repeats} interleaved repeats")
    print(f"  reference (scheduler.step + per-timestep re-scoring, {ref_batch} rows per call): {ref:.3f} s  "
          f"peak saved for backward {max(memory['reference']) / 2**20:.1f} MiB")
    print(f"  mmrl (batched re-scoring, {args.micro_batch:>3} rows per call):      {ours:.3f} s  "
          f"peak saved for backward {max(memory['mmrl']) / 2**20:.1f} MiB")
    if cuda:
        print(f"  peak GPU memory: reference {gpu_memory['reference'] / 2**30:.2f} GiB, "
              f"mmrl {gpu_memory['mmrl'] / 2**30:.2f} GiB")
    print(f"  speed-up: {ref / ours:.2f}x")


if __name__ == "__main__":
    main()
