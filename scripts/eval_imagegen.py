"""Held-out evaluation of a diffusion RL run against its starting point, same prompts and noise.

    python scripts/eval_imagegen.py runs/ddpo --step 20 --num 256 --grid docs/img/ddpo_before_after.png

For both samplers — the stochastic one RL trained (SDE / DDIM η = 1, ``num_steps``) and the
deterministic one (ODE / DDIM η = 0, ``eval_num_steps``) — prints the mean verifiable reward of
the start and of the checkpoint, with its standard error. ``--grid`` writes 8 prompts × 4 samples,
start (top half) and RL (bottom half), from the same noise with the deterministic sampler.
"""

from __future__ import annotations

import argparse

import numpy as np

from mmrl.experiments.imagegen_sample import image_grid, load_for_sampling
from mmrl.core.rollout import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="a diffusion run folder")
    parser.add_argument("--step", type=int, help="checkpoint step (default: the latest)")
    parser.add_argument("--num", type=int, default=256, help="held-out prompts (test split, with repeats)")
    parser.add_argument("--seed", type=int, default=123)
    parser.add_argument("--grid", help="PNG of start vs RL samples")
    args = parser.parse_args()
    policy, base, task = load_for_sampling(args.run, None)
    if args.step is not None:
        policy.load_weights(f"{args.run}/checkpoints/step_{args.step}/policy")
    examples = task.sample_batch("test", args.num, np.random.default_rng(args.seed))
    for name, temperature in (("stochastic (training sampler)", 1.0), ("deterministic (ODE / DDIM eta=0)", 0.0)):
        line = []
        for label, model in (("start", base), ("RL", policy)):
            scores = []
            for k in range(0, args.num, 64):
                batch = examples[k:k + 64]
                rollout = model.rollout(batch, 1, SamplingParams(temperature=temperature), seed=args.seed + k)
                scores += [task.reward(e, o).score for e, o in zip(batch, rollout.outputs)]
            line.append(f"{label} {np.mean(scores):.3f} ± {np.std(scores) / np.sqrt(len(scores)):.3f}")
        print(f"{name}: " + ", ".join(line), flush=True)
    if args.grid:
        prompts = sorted({e.prompt for e in examples})[:8]
        texts = [p for p in prompts for _ in range(4)]
        images = base.generate(texts, args.seed) + policy.generate(texts, args.seed)
        image_grid(images, 16, scale=3).save(args.grid)
        print(f"grid ({', '.join(prompts)}) -> {args.grid}")


if __name__ == "__main__":
    main()
