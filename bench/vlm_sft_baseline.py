"""The honest baseline of the VLM sanity run (docs/results.md): continue the recipe's cached SFT
warm start with *supervised* steps at the GRPO learning rate, instead of GRPO, and report greedy
held-out accuracy every 40 steps on the same 200 examples the trainer evaluates.

    OMP_NUM_THREADS=1 python bench/vlm_sft_baseline.py [--steps 320] [--lr 6e-4] [--recipe vlm_sanity/tiny_cpu]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from mmrl.core.config import load_config
from mmrl.core.registry import make_task
from mmrl.core.rollout import SamplingParams
from mmrl.core.warm_start import build_initial_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=320)
    parser.add_argument("--lr", type=float, default=6e-4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1, help="data order of the continued SFT")
    parser.add_argument("--recipe", default="vlm_sanity/tiny_cpu", help="a VLM recipe with a warm start")
    args = parser.parse_args()
    cfg = load_config(args.recipe, ["log.progress=false", "log.tensorboard=false"])
    task = make_task(cfg.task.name, cfg.task.args)
    policy = build_initial_policy(cfg)  # the same warm start GRPO starts from
    held_out = task.sample_batch(cfg.eval.split, cfg.eval.num_examples, np.random.default_rng(cfg.eval.seed))

    def accuracy() -> float:
        with torch.no_grad():
            r = policy.rollout(held_out, 1, SamplingParams(0.0, 1.0, cfg.rollout.max_new_tokens), 0)
        return float(np.mean([task.reward(held_out[i], o).components["accuracy"]
                              for i, o in zip(r.example_index.tolist(), r.outputs)]))

    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=args.lr)
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    print(f"step 0: held-out accuracy {accuracy():.3f}")
    for step in range(1, args.steps + 1):
        examples = task.sample_batch("train", args.batch_size, rng)
        loss = policy.sft_loss(examples, [task.reference_output(e) for e in examples])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 40 == 0:
            print(f"step {step}: held-out accuracy {accuracy():.3f} ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
