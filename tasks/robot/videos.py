"""Rollout videos of a trained VLA: a few greedy episodes per split written as GIFs (Pillow)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from mmrl.core.rollout import SamplingParams


def write_gif(frames: list[np.ndarray], path: Path, scale: int = 3, fps: int = 10) -> Path:
    """Frames [H, W, 3] uint8 → an animated GIF, each frame upscaled ``scale`` times (nearest)."""
    images = [Image.fromarray(f).resize((f.shape[1] * scale, f.shape[0] * scale), Image.NEAREST) for f in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    return path


def write_rollout_videos(run_dir: str | Path, policy, task, splits: tuple[str, ...] = ("test",),
                         episodes: int = 2, seed: int = 0) -> list[Path]:
    """Greedy episodes of ``policy`` on each split, saved as ``run_dir/videos/<split>_<i>_<success|fail>.gif``."""
    out = Path(run_dir) / "videos"
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for split in splits:
        examples = task.sample_batch(split, episodes, np.random.default_rng(seed))
        rollout = policy.rollout(examples, 1, SamplingParams(temperature=0.0), seed=seed, record_frames=True)
        for i, (frames, summary) in enumerate(zip(policy.last_frames, rollout.outputs)):
            tag = "success" if summary.success else "fail"
            paths.append(write_gif(frames, out / f"{split}_{i}_{tag}.gif"))
    return paths
