"""``mmrl sample``: deterministic samples of a diffusion pipeline or RL run as a PNG grid, with RL
guidance (RLG, arXiv 2508.21016): v = v_base + w·(v_RL − v_base), each side CFG-combined.

    mmrl sample runs/ddpo --rlg-weight 1.5 --out grid.png            # a run: base = its starting point
    mmrl sample PIPELINE --base BASE_PIPELINE --rlg-weight 0.5 --out grid.png
    mmrl sample runs/ddpo --rlg-weights 0,0.5,1,1.5,2                # reward and distance to the base per w

With ``--rlg-weights`` it prints, per weight, the mean verifiable reward of the samples on the
task's prompts and their mean squared distance (pixels in [0, 1]) to the base model's samples
from the same noise: the trade-off RLG's weight controls.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from mmrl.policies.diffusion import DiffusionConfig, DiffusionPolicy


def load_for_sampling(source: str | Path, base: str | Path | None) -> tuple[DiffusionPolicy, DiffusionPolicy | None,
                                                                           object]:
    """(RL policy, base policy or None, the run's task or None) from a pipeline folder or a run folder.

    A run folder's policy is its latest checkpoint; its base the run's initial policy (built from
    its config, before any update); ``base`` overrides it with a pipeline folder.
    """
    from mmrl.core.checkpoint import latest_checkpoint
    from mmrl.core.config import load_config
    from mmrl.core.registry import make_policy, make_task

    source = Path(source)
    task = None
    if (source / "config.yaml").is_file():
        cfg = load_config(str(source / "config.yaml"))
        if cfg.policy.name != "diffusion":
            raise ValueError(f"{source} is a {cfg.policy.name!r} run, not a diffusion run")
        checkpoint = latest_checkpoint(source)
        if checkpoint is None:
            raise FileNotFoundError(f"{source} has no checkpoint to sample from")
        policy = make_policy("diffusion", cfg.policy.args)
        policy.load_weights(str(checkpoint / "policy"))
        base_policy = make_policy("diffusion", cfg.policy.args) if base is None else None
        task = make_task(cfg.task.name, cfg.task.args)
        args = cfg.policy.args
    elif (source / "model_index.json").is_file():
        args = DiffusionConfig(pretrained=str(source))
        policy, base_policy = DiffusionPolicy.from_config(args), None
    else:
        raise FileNotFoundError(f"{source} is neither an mmrl run folder (config.yaml) nor a diffusers pipeline "
                                f"folder (model_index.json)")
    if base is not None:
        base_args = dataclasses.replace(args, pretrained=str(base), pretrain_config=None, lora_rank=0)
        base_policy = DiffusionPolicy.from_config(base_args)
    policy.eval()
    if base_policy is not None:
        base_policy.eval()
    return policy, base_policy, task


def image_grid(images: Sequence[np.ndarray], columns: int, scale: int = 4) -> Image.Image:
    """Tile uint8 [H, W, 3] images row by row, each upscaled ``scale``× (nearest), 1 px gaps."""
    h, w = images[0].shape[:2]
    rows = (len(images) + columns - 1) // columns
    canvas = np.full((rows * (h * scale + 1) + 1, columns * (w * scale + 1) + 1, 3), 255, dtype=np.uint8)
    for k, img in enumerate(images):
        r, c = divmod(k, columns)
        big = np.asarray(img, dtype=np.uint8).repeat(scale, 0).repeat(scale, 1)
        canvas[1 + r * (h * scale + 1):1 + r * (h * scale + 1) + h * scale,
               1 + c * (w * scale + 1):1 + c * (w * scale + 1) + w * scale] = big
    return Image.fromarray(canvas)


def rlg_sweep(policy: DiffusionPolicy, base: DiffusionPolicy, task: object, prompts: Sequence[object],
              weights: Sequence[float], seed: int, num_steps: int | None = None) -> list[dict[str, float]]:
    """Per RLG weight: the mean task reward of the guided samples and their mean squared distance
    to the base model's samples from the same noise (pixels scaled to [0, 1])."""
    texts = [p.prompt for p in prompts]
    reference = np.stack(base.generate(texts, seed, num_steps)).astype(np.float64) / 255
    rows = []
    for w in weights:
        images = policy.generate(texts, seed, num_steps, base=base, rlg_weight=w)
        rewards = [task.reward(p, img).score for p, img in zip(prompts, images)]
        distance = float(((np.stack(images).astype(np.float64) / 255 - reference) ** 2).mean())
        rows.append({"rlg_weight": float(w), "reward_mean": float(np.mean(rewards)), "distance_to_base": distance})
    return rows


def run_sample(args: argparse.Namespace) -> str:
    """The ``mmrl sample`` verb; bad input (unknown prompt words, no base) is a ConfigError."""
    from mmrl.core.config import ConfigError

    try:
        return _sample(args)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _sample(args: argparse.Namespace) -> str:
    policy, base, task = load_for_sampling(args.source, args.base)
    needs_base = args.rlg_weights is not None or args.rlg_weight != 1.0
    if needs_base and base is None:
        raise ValueError("RL guidance needs a base model: pass --base PIPELINE (or sample a run folder)")
    if args.rlg_weights is not None:
        if task is None:
            raise ValueError("--rlg-weights scores samples with the run's task: give a run folder")
        weights = [float(w) for w in args.rlg_weights.split(",")]
        prompts = task.sample_batch(args.split, args.num_prompts, np.random.default_rng(args.seed))
        rows = rlg_sweep(policy, base, task, prompts, weights, args.seed, args.steps)
        return "\n".join(json.dumps(r) for r in rows)
    if args.prompts:
        texts = list(args.prompts)
    elif task is not None:
        texts = sorted({p.prompt for p in task.sample_batch(args.split, 64, np.random.default_rng(args.seed))})[:8]
    else:
        raise ValueError("give --prompts for a pipeline folder")
    expanded = [t for t in texts for _ in range(args.per_prompt)]
    images = policy.generate(expanded, args.seed, args.steps, base=base if needs_base else None,
                             rlg_weight=args.rlg_weight)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    image_grid(images, args.per_prompt).save(out)
    return f"{len(images)} samples ({len(texts)} prompts × {args.per_prompt}, rlg weight {args.rlg_weight}) -> {out}"
