"""Before / after PNG grids of a VAR GRPO run (``mmrl train var/tiny_cpu --out RUN``): for prompts of each
split, the pretrained model's samples (left block) next to the final checkpoint's (right block), same
seeds; prints each block's mean verifiable reward.

    python scripts/sample_var.py runs/var/tiny --splits test ood --per-prompt 4 --out docs/img/var_grpo
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

from mmrl.checkpoint import latest_checkpoint
from mmrl.config import load_config
from mmrl.registry import load_builtins, make_policy, make_task


def tile(images: list[np.ndarray], rows: int, scale: int, gap: int = 1) -> np.ndarray:
    """Images [H, W, 3] in a rows × (len/rows) grid, each upscaled ``scale``× (nearest), white gaps."""
    cols = len(images) // rows
    h, w = images[0].shape[0] * scale, images[0].shape[1] * scale
    grid = np.full((rows * (h + gap) - gap, cols * (w + gap) - gap, 3), 255, np.uint8)
    for i, img in enumerate(images):
        r, c = divmod(i, cols)
        grid[r * (h + gap):r * (h + gap) + h, c * (w + gap):c * (w + gap) + w] = img.repeat(scale, 0).repeat(scale, 1)
    return grid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run")
    parser.add_argument("--splits", nargs="+", default=["test", "ood"])
    parser.add_argument("--num-prompts", type=int, default=6)
    parser.add_argument("--per-prompt", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="var_grid", help="prefix: writes <out>_<split>.png")
    args = parser.parse_args()
    load_builtins()
    run = Path(args.run)
    cfg = load_config(str(run / "config.yaml"))
    checkpoint = latest_checkpoint(run)
    if checkpoint is None:
        raise FileNotFoundError(f"{run} has no checkpoint")
    before = make_policy(cfg.policy.name, cfg.policy.args)
    after = make_policy(cfg.policy.name, cfg.policy.args)
    after.load_weights(str(checkpoint / "policy"))
    task = make_task(cfg.task.name, cfg.task.args)
    for split in args.splits:
        prompts = task.prompts[split][:args.num_prompts]
        texts = [p.prompt for p in prompts for _ in range(args.per_prompt)]
        rows = []
        for policy, name in ((before, "before"), (after, f"after ({checkpoint.name})")):
            images = policy.generate(texts, seed=args.seed, temperature=args.temperature)
            score = np.mean([task.reward(p, img).score for p, img in
                             zip([p for p in prompts for _ in range(args.per_prompt)], images)])
            print(f"{split:5} {name:22} reward {score:.3f}  ({len(images)} images)")
            rows.append(tile(images, len(prompts), 3))
        spacer = np.full((rows[0].shape[0], 8, 3), 255, np.uint8)
        out = Path(f"{args.out}_{split}.png")
        out.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.concatenate([rows[0], spacer, rows[1]], 1)).save(out, optimize=True)
        print(f"  grid: {out}  (rows: {', '.join(p.prompt for p in prompts)})")


if __name__ == "__main__":
    main()
