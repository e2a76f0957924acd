"""Train and test the world model: ``mmrl train-world-model <recipe> --out DIR``.

A recipe (``configs/world_model/*.yaml``) has three sections: ``model``
(:class:`~mmrl.envs.world_model.model.WorldModelConfig`), ``data`` (:class:`DataConfig`: real-sim
episodes to collect) and ``train`` (:class:`OptimConfig`).

Loss (multi-step open-loop prediction, as the environment uses the model): from the encoded
real first frame, the latent is rolled out under the episode's actions for all T steps;
``frames_per_sequence`` random time steps are decoded and compared with the real frames by a
foreground-weighted squared or absolute error (``train.pixel_loss``; pixels that differ from the
per-pixel median background count ``1 + foreground_weight``: the arm and the object cover a few
pixels of a 64 px table; ``train.foreground`` can add the first frame's arm), plus the proprio
head's squared error at every step.

Accuracy (``accuracy.json``): per-horizon MAE and SSIM of the open-loop prediction against the real
simulator on held-out episodes (seeds never used for training), next to the "copy the first
frame" baseline, and ``side_by_side.gif`` / ``side_by_side.png`` (real | world model | |error|).

Output folder: the model (see :mod:`mmrl.envs.world_model.model`), ``reference_pool.npz``,
``accuracy.json``, ``train_log.json`` (losses, real-sim steps, wall time) and ``recipe.yaml``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import yaml

from mmrl.envs.world_model.data import (DEMONSTRATION, Trajectories, behaviour_schedule, collect, concatenate,
                                        warm_start_demonstrations, warm_start_seeds)
from mmrl.envs.world_model.metrics import mae, ssim
from mmrl.envs.world_model.model import CONFIG_FILE, POOL_FILE, LatentWorldModel, WorldModelConfig
from mmrl.core.run_folder import mark_written, prepare_atomic_out

HORIZONS = (1, 5, 10, 20, 30)


@dataclass(frozen=True)
class DataConfig:
    demonstrations: bool = False
    """Train on the BC warm start's own demonstration episodes (VLA-RFT: the world model learns from
    the policy's SFT data, so RFT itself adds no real-simulator step): the ``demo_*`` fields must
    equal the RFT recipe's ``warm_start`` (sft_steps, batch_size, seed) and ``task.args.demo_noise``.
    Their steps are logged as ``demonstration_env_steps`` (shared with BC, not counted again); the
    ``episodes`` collected below come on top (0 for none) and are the world model's own real steps.
    The reference pool is then the successful demonstrations (first frame + executed actions)."""
    demo_batches: int = 120
    """The warm start's ``sft_steps`` (one batch of demonstrations per step)."""
    demo_batch_size: int = 16
    """The warm start's ``batch_size``."""
    demo_seed: int = 0
    """The warm start's ``seed`` (its example generator)."""
    demo_noise: float = 0.3
    """The task's ``demo_noise`` (DART noise of the executed action)."""
    episodes: int = 400
    """Training episodes collected in the real simulator (each ``model.max_steps`` steps)."""
    expert_fraction: float = 0.25
    """Share of clean scripted-expert episodes (also the env's reference pool)."""
    random_fraction: float = 0.15
    """Share of correlated-random-action episodes; the rest are expert + noise."""
    noise_levels: tuple[float, ...] = (0.2, 0.5, 1.0)
    """Std of the Gaussian noise of ``noisy`` episodes (one level drawn per episode)."""
    seed_base: int = 500_000
    """Training episodes use reset seeds seed_base, seed_base + 1, … (robot tasks' train range)."""
    eval_episodes: int = 32
    """Held-out episodes for the accuracy table (half expert + noise 0.5, half random)."""
    eval_seed_base: int = 900_000
    """Held-out reset seeds start here (disjoint from the training seeds)."""
    seed: int = 0
    """Seed of the behaviour noise."""


@dataclass(frozen=True)
class OptimConfig:
    steps: int = 1200
    batch_size: int = 16
    lr: float = 1.0e-3
    frames_per_sequence: int = 5
    """Time steps decoded per sequence per step (the latent rollout always covers all T)."""
    foreground_weight: float = 10.0
    foreground: Literal["target", "target_and_first"] = "target"
    """Pixels weighted ``1 + foreground_weight``: where the target frame differs from the background
    (``target``), or also where the episode's first frame does (``target_and_first``: the arm's
    starting place, which the compositing decoder must learn to erase instead of copying a ghost)."""
    pixel_loss: Literal["mse", "l1"] = "mse"
    """``mse`` or ``l1`` per pixel. The accuracy table's MAE is dominated by the static table (> 99 % of
    the pixels): squared errors leave a faint haze there (a 0.02 error costs 0.0004), an L1 loss
    drives the compositing mask to copy it exactly."""
    proprio_weight: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class WorldModelRecipe:
    model: WorldModelConfig = field(default_factory=WorldModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: OptimConfig = field(default_factory=OptimConfig)


def load_recipe(path: str | Path) -> tuple[WorldModelRecipe, dict]:
    """The typed recipe and its raw mapping (the cache key); unknown keys raise ConfigError."""
    from mmrl.core.config import build
    from mmrl.core.paths import recipes_dir

    file = Path(path)
    inside = file.relative_to("configs") if file.parts[:1] == ("configs",) else file
    if not file.is_file() and (recipes_dir() / inside).is_file():
        file = recipes_dir() / inside
    if not file.is_file():
        raise FileNotFoundError(f"world-model recipe {path} not found (looked here and in {recipes_dir()})")
    raw = yaml.safe_load(file.read_text()) or {}
    recipe = build(WorldModelRecipe, raw, "world_model")
    recipe.model.validate()
    return recipe, raw


def collect_dataset(recipe: WorldModelRecipe) -> tuple[Trajectories, Trajectories]:
    """Training (the warm start's demonstrations and / or new episodes) and held-out trajectories."""
    m, d = recipe.model, recipe.data
    fractions = {"expert": d.expert_fraction, "random": d.random_fraction}
    parts = []
    if d.demonstrations:
        seeds = warm_start_seeds(m.task, m.image_size, d.demo_noise, d.demo_batches, d.demo_batch_size, d.demo_seed)
        parts.append(warm_start_demonstrations(m.task, m.image_size, d.demo_noise, seeds, m.max_steps))
    if d.episodes:
        parts.append(collect(m.task, m.image_size, d.seed_base + np.arange(d.episodes),
                             behaviour_schedule(d.episodes, fractions), m.max_steps, d.noise_levels, d.seed))
    if not parts:
        raise ValueError("world-model recipe has no training data: set data.demonstrations: true or data.episodes > 0")
    train = parts[0] if len(parts) == 1 else concatenate(parts)
    half = d.eval_episodes // 2
    held_out = collect(m.task, m.image_size, d.eval_seed_base + np.arange(d.eval_episodes),
                       ["noisy"] * half + ["random"] * (d.eval_episodes - half), m.max_steps, (0.5,), d.seed + 1)
    return train, held_out


def background(images: np.ndarray) -> torch.Tensor:
    """Per-pixel median frame [3, H, W] in [0, 1] of up to 512 frames (the empty table)."""
    flat = images.reshape(-1, *images.shape[-3:])
    pick = np.random.default_rng(0).choice(len(flat), size=min(512, len(flat)), replace=False)
    return torch.from_numpy(np.median(flat[pick], axis=0)).permute(2, 0, 1).float() / 255.0


def prediction_loss(model: LatentWorldModel, batch: Trajectories, bg: torch.Tensor, cfg: OptimConfig,
                    gen: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
    """Foreground-weighted frame error (MSE or L1) at sampled horizons + proprio MSE at all of them."""
    images = torch.from_numpy(batch.images)
    latents = model.rollout_latents(images[:, 0], torch.from_numpy(batch.actions))  # [B, T+1, latent]
    b, t1 = latents.shape[:2]
    k = min(cfg.frames_per_sequence, t1)
    # k distinct real frames per episode (0..length; repeated when an episode has fewer): the padding
    # after an episode's end is never a target
    steps = torch.stack([torch.randperm(int(n) + 1, generator=gen)[torch.arange(k) % (int(n) + 1)]
                         for n in batch.lengths])  # [B, k]
    valid = (torch.arange(t1)[None] <= torch.from_numpy(batch.lengths)[:, None]).float()  # [B, T+1]
    rows = torch.arange(b)[:, None].expand(-1, k)
    predicted = model.decode(latents[rows, steps].flatten(0, 1), images[:, 0].repeat_interleave(k, 0))
    target = images[rows, steps].flatten(0, 1).permute(0, 3, 1, 2).float() / 255.0
    moved = (target - bg).abs().sum(1, keepdim=True) > 0.1
    if cfg.foreground == "target_and_first":
        first = images[:, 0].repeat_interleave(k, 0).permute(0, 3, 1, 2).float() / 255.0
        moved |= (first - bg).abs().sum(1, keepdim=True) > 0.1
    foreground = moved.float()
    error = predicted - target
    per_pixel = error.abs() if cfg.pixel_loss == "l1" else error ** 2
    frame_loss = ((1 + cfg.foreground_weight * foreground) * per_pixel).mean()
    proprio_error = ((model.proprio(latents) - torch.from_numpy(batch.proprio)) ** 2).mean(-1)  # [B, T+1]
    proprio_loss = (proprio_error * valid).sum() / valid.sum()
    loss = frame_loss + cfg.proprio_weight * proprio_loss
    return loss, {"frame": frame_loss.item(), "proprio": proprio_loss.item()}


def fit(model: LatentWorldModel, data: Trajectories, cfg: OptimConfig, log_every: int = 100) -> list[dict]:
    """``cfg.steps`` AdamW steps (cosine learning rate) on random episode batches."""
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    bg = background(data.images)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 0.5 * (1 + np.cos(np.pi * i / cfg.steps)))
    history, start = [], time.perf_counter()
    model.train()
    for step in range(1, cfg.steps + 1):
        batch = data.select(rng.choice(len(data.seeds), size=min(cfg.batch_size, len(data.seeds)), replace=False))
        loss, parts = prediction_loss(model, batch, bg, cfg, gen)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % log_every == 0 or step == cfg.steps:
            history.append({"step": step, "loss": loss.item(), **parts, "wall_s": time.perf_counter() - start})
            print(f"world model step {step}/{cfg.steps}: loss {loss.item():.5f} (frame {parts['frame']:.5f}, "
                  f"proprio {parts['proprio']:.5f})", flush=True)
    return history


@torch.no_grad()
def predict_frames(model: LatentWorldModel, first_frames: np.ndarray, actions: np.ndarray) -> torch.Tensor:
    """Open-loop predicted frames [B, T+1, 3, H, W] in [0, 1] (index 0: the reconstruction)."""
    model.eval()
    first = torch.from_numpy(first_frames)
    latents = model.rollout_latents(first, torch.from_numpy(actions))
    frames = model.decode(latents.flatten(0, 1), first.repeat_interleave(latents.shape[1], 0))
    return frames.view(*latents.shape[:2], 3, *first_frames.shape[1:3])


@torch.no_grad()
def accuracy(model: LatentWorldModel, held_out: Trajectories, horizons: tuple[int, ...] = HORIZONS) -> dict:
    """Per-horizon MAE / SSIM of the world model and of copying the first frame, per behaviour."""
    predicted = predict_frames(model, held_out.images[:, 0], held_out.actions)
    real = torch.from_numpy(held_out.images).permute(0, 1, 4, 2, 3).float() / 255.0
    result = {}
    for behaviour in sorted(set(held_out.behaviours)) + ["all"]:
        rows = [i for i, b in enumerate(held_out.behaviours) if behaviour in (b, "all")]
        table = {}
        for h in (h for h in horizons if h < real.shape[1]):
            p, r, first = predicted[rows, h], real[rows, h], real[rows, 0]
            table[str(h)] = {"mae": mae(p, r).mean().item(), "ssim": ssim(p, r).mean().item(),
                             "copy_first_mae": mae(first, r).mean().item(), "copy_first_ssim": ssim(first, r).mean().item()}
        result[behaviour] = table
    return result


def side_by_side(model: LatentWorldModel, held_out: Trajectories, out: Path, episodes: int = 3) -> list[Path]:
    """``side_by_side.gif`` (real | world model | 3·|error|, one row per episode) and a PNG strip."""
    from PIL import Image

    from mmrl.tasks.robot.videos import write_gif

    index = np.linspace(0, len(held_out.seeds) - 1, episodes).round().astype(int)
    predicted = LatentWorldModel.to_uint8(predict_frames(model, held_out.images[index, 0], held_out.actions[index])
                                          .flatten(0, 1)).view(len(index), -1, *held_out.images.shape[2:]).numpy()
    real = held_out.images[index]
    error = np.clip(3 * np.abs(real.astype(np.int16) - predicted.astype(np.int16)), 0, 255).astype(np.uint8)
    rows = np.concatenate([real, predicted, error], axis=3)  # [E, T+1, H, 3W, 3]
    frames = [np.concatenate(list(rows[:, t]), axis=0) for t in range(rows.shape[1])]
    gif = write_gif(frames, out / "side_by_side.gif", scale=2, fps=8)
    strip_steps = [t for t in (0, 5, 10, 20, 30) if t < rows.shape[1]]
    strip = np.concatenate([np.concatenate([real[0, t], predicted[0, t]], axis=0) for t in strip_steps], axis=1)
    png = out / "side_by_side.png"
    Image.fromarray(strip).resize((strip.shape[1] * 2, strip.shape[0] * 2), Image.NEAREST).save(png)
    return [gif, png]


def reference_pool(data: Trajectories) -> dict[str, np.ndarray]:
    """The env's reset states: real first frames, proprio, instructions and expert actions: the clean
    scripted-expert episodes, or, when the data holds the warm start's demonstrations, the successful
    ones with their executed actions (VLA-RFT's reference is the dataset trajectory's ground-truth
    actions; 0 = stay after the episode ended)."""
    source = DEMONSTRATION if DEMONSTRATION in data.behaviours else "expert"
    rows = [i for i, b in enumerate(data.behaviours) if b == source and (source == "expert" or data.success[i])]
    if not rows:
        raise ValueError("the world-model recipe has no expert episodes (data.expert_fraction is 0) and no successful "
                         "demonstrations: the environment needs them as its reference pool")
    return {"first_frames": data.images[rows, 0], "first_proprio": data.proprio[rows, 0],
            "expert_actions": data.actions[rows], "instructions": np.asarray([data.instructions[i] for i in rows]),
            "seeds": data.seeds[rows], "expert_success": data.success[rows]}


def train_world_model(recipe_path: str | Path, out: str | Path, overwrite: bool = False) -> Path:
    """Collect data, fit, measure and save a world model to ``out`` (atomically)."""
    recipe, raw = load_recipe(recipe_path)
    out = Path(out)
    prepare_atomic_out(out, overwrite, "mmrl train-world-model")
    start, cpu_start = time.perf_counter(), time.process_time()
    train, held_out = collect_dataset(recipe)
    collect_s = time.perf_counter() - start
    with torch.random.fork_rng():
        torch.manual_seed(recipe.train.seed)
        model = LatentWorldModel(recipe.model)
    history = fit(model, train, recipe.train)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save(tmp)
    np.savez_compressed(tmp / POOL_FILE, **reference_pool(train))
    (tmp / "accuracy.json").write_text(json.dumps(accuracy(model, held_out), indent=1))
    side_by_side(model, held_out, tmp)
    demo_steps = int(train.lengths[[b == DEMONSTRATION for b in train.behaviours]].sum())
    log = {"real_env_steps": train.real_steps, "demonstration_env_steps": demo_steps,
           "held_out_real_env_steps": held_out.real_steps,
           "collect_wall_s": collect_s, "wall_s": time.perf_counter() - start,
           "cpu_s": time.process_time() - cpu_start, "parameters": sum(p.numel() for p in model.parameters()),
           "expert_success_rate": float(train.success[[b in ("expert", DEMONSTRATION) for b in train.behaviours]].mean()),
           "history": history}
    (tmp / "train_log.json").write_text(json.dumps(log, indent=1))
    (tmp / "recipe.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    mark_written(tmp, "train-world-model")
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, out)
    return out


def cached_world_model(recipe_path: str | Path) -> Path:
    """The world model of a recipe, trained once and cached in ``$MMRL_CACHE/world_model/<task>-<hash>``."""
    from mmrl.core.paths import cache_root

    recipe, raw = load_recipe(recipe_path)
    key = hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_root() / "world_model" / f"{recipe.model.task}-{key}"
    if not (path / CONFIG_FILE).is_file():
        train_world_model(recipe_path, path, overwrite=True)
    return path


def resolve_world_model(spec: str) -> Path:
    """A world-model folder from ``spec``: a folder holding config.json, or a recipe (trained and cached)."""
    folder = Path(spec)
    if folder.is_dir():
        if not (folder / CONFIG_FILE).is_file():
            raise FileNotFoundError(f"world model {spec}: {folder} has no {CONFIG_FILE}; point at a folder written "
                                    f"by `mmrl train-world-model` or at a recipe under configs/world_model/")
        return folder
    if spec.endswith((".yaml", ".yml")):
        return cached_world_model(spec)
    raise FileNotFoundError(f"world model {spec!r} is neither a world-model folder nor a .yaml recipe")


def run_train_world_model(args) -> str:
    out = train_world_model(args.recipe, args.out, overwrite=args.overwrite)
    acc = json.loads((out / "accuracy.json").read_text())["all"]
    log = json.loads((out / "train_log.json").read_text())
    table = ", ".join(f"h{h}: MAE {v['mae']:.4f} SSIM {v['ssim']:.3f}" for h, v in acc.items())
    return (f"world model saved to {out} ({log['real_env_steps']} real-sim steps of data, {log['wall_s']:.0f} s); "
            f"held-out open-loop accuracy {table}")
