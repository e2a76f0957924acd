"""Before / after evaluation and PNG grids of a VAR GRPO run (``mmrl train var/tiny_cpu --out RUN``).

1. **Fixed-noise evaluation** (``--eval-per-prompt N``): every prompt of each split, N samples each at
   ``--temperature`` (the policy's own sampler), from the pretrained model and from the final
   checkpoint with the SAME seed, so both see the same sampling noise. Prints, per split, the mean
   prompt correctness (mean of the colour / count / shape / position checks) and the strict
   all-checks ``correct`` rate, each ± its standard error over images, and the paired difference
   after − before ± its s.e. (per image: same prompt, same noise).
2. **Grids**: for the first ``--num-prompts`` prompts of each split, ``--per-prompt`` samples (one row
   per prompt): the pretrained model's block on the left, the checkpoint's on the right, same seeds.

    python scripts/sample_var.py runs/var/tiny --splits test ood --eval-per-prompt 64 --out docs/img/var_grpo
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from mmrl.core.checkpoint import latest_checkpoint
from mmrl.core.config import load_config
from mmrl.core.registry import load_plugins, make_policy, make_task


def tile(images: list[np.ndarray], rows: int, scale: int, gap: int = 1) -> np.ndarray:
    """Images [H, W, 3] in a rows × (len/rows) grid, each upscaled ``scale``× (nearest), white gaps."""
    cols = len(images) // rows
    h, w = images[0].shape[0] * scale, images[0].shape[1] * scale
    grid = np.full((rows * (h + gap) - gap, cols * (w + gap) - gap, 3), 255, np.uint8)
    for i, img in enumerate(images):
        r, c = divmod(i, cols)
        grid[r * (h + gap):r * (h + gap) + h, c * (w + gap):c * (w + gap) + w] = img.repeat(scale, 0).repeat(scale, 1)
    return grid


KEYS = ("correctness", "correct", "colour", "count", "shape", "position")


def score_images(policy, task, prompts: Sequence, per_prompt: int, seed: int, temperature: float,
                 chunk: int = 256) -> dict[str, np.ndarray]:
    """Per-image reward components (:data:`KEYS`: correctness, the strict ``correct`` and each check)
    [len(prompts) · per_prompt] of ``per_prompt`` samples of each prompt. Chunk i is sampled with seed
    ``seed + i``: two policies given the same arguments draw the same noise."""
    examples = [p for p in prompts for _ in range(per_prompt)]
    scores: dict[str, list[float]] = {k: [] for k in KEYS}
    for i in range(0, len(examples), chunk):
        part = examples[i:i + chunk]
        images = policy.generate([p.prompt for p in part], seed=seed + i // chunk, temperature=temperature)
        for p, img in zip(part, images):
            components = task.reward(p, img).components
            for k in KEYS:
                scores[k].append(components[k])
    return {k: np.array(v) for k, v in scores.items()}


def mean_se(x: np.ndarray) -> tuple[float, float]:
    return float(x.mean()), float(x.std(ddof=1) / np.sqrt(len(x)))


def compare(before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> dict[str, list[float]]:
    """{metric: [before, s.e., after, s.e., after − before, paired s.e.]}."""
    out = {}
    for k in before:
        out[k] = [*mean_se(before[k]), *mean_se(after[k]), *mean_se(after[k] - before[k])]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run")
    parser.add_argument("--splits", nargs="+", default=["test", "ood"])
    parser.add_argument("--num-prompts", type=int, default=6, help="grid rows per split")
    parser.add_argument("--per-prompt", type=int, default=4, help="grid samples per prompt")
    parser.add_argument("--eval-per-prompt", type=int, default=0,
                        help="> 0: fixed-noise evaluation with this many samples of every prompt of each split")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="", help="grid prefix: writes <out>_<split>.png (empty: no grids)")
    parser.add_argument("--json", help="write the evaluation to this JSON file")
    args = parser.parse_args()
    load_plugins()
    run = Path(args.run)
    cfg = load_config(str(run / "config.yaml"))
    checkpoint = latest_checkpoint(run)
    if checkpoint is None:
        raise FileNotFoundError(f"{run} has no checkpoint")
    before = make_policy(cfg.policy.name, cfg.policy.args)
    after = make_policy(cfg.policy.name, cfg.policy.args)
    after.load_weights(str(checkpoint / "policy"))
    task = make_task(cfg.task.name, cfg.task.args)
    report = {"run": str(run), "checkpoint": checkpoint.name, "temperature": args.temperature, "seed": args.seed,
              "eval_per_prompt": args.eval_per_prompt, "splits": {}}
    for split in args.splits:
        prompts = task.prompts[split]
        if args.eval_per_prompt:
            scores = [score_images(p, task, prompts, args.eval_per_prompt, args.seed + 1000, args.temperature)
                      for p in (before, after)]
            result = compare(*scores)
            report["splits"][split] = {"num_prompts": len(prompts), **result}
            for k, (b, bse, a, ase, d, dse) in result.items():
                print(f"{split:5} {k:12} before {b:.3f} ± {bse:.3f}  after ({checkpoint.name}) {a:.3f} ± {ase:.3f}  "
                      f"diff {d:+.3f} ± {dse:.3f}  ({len(prompts)} prompts × {args.eval_per_prompt})")
        if not args.out:
            continue
        grid_prompts = prompts[:args.num_prompts]
        rows = []
        for policy in (before, after):
            images = policy.generate([p.prompt for p in grid_prompts for _ in range(args.per_prompt)], seed=args.seed,
                                     temperature=args.temperature)
            rows.append(tile(images, len(grid_prompts), 3))
        spacer = np.full((rows[0].shape[0], 8, 3), 255, np.uint8)
        out = Path(f"{args.out}_{split}.png")
        out.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.concatenate([rows[0], spacer, rows[1]], 1)).save(out, optimize=True)
        print(f"  grid: {out}  (left: pretrained, right: {checkpoint.name}; rows: "
              f"{', '.join(p.prompt for p in grid_prompts)})")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
