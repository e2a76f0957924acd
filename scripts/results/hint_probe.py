"""Can a recipe's warm start use the task's hints? Success rates of its initial policy with and without them.

    OMP_NUM_THREADS=1 python scripts/results/hint_probe.py configs/data/guide_tiny_cpu.yaml
    OMP_NUM_THREADS=1 python scripts/results/hint_probe.py configs/data/guide_tiny_cpu.yaml warm_start.hint_fraction=0

The policy is the one RL would start from (``build_initial_policy``: the recipe's warm start, from the cache when
it is there). For ``--prompts`` training prompts (drawn with ``--seed``) it samples ``rollout.group_size`` answers
at ``rollout.temperature``, once from the plain prompt and once from ``task.hinted(example)``, and prints one JSON
line: the success rates (score above ``algo.extra.guide.fail_threshold``, Guide's test), the share of all-failed
groups (those Guide redraws) and the share of those with a success once hinted (what ``rollout/guided_solved``
counts), and the share of hinted groups whose samples all succeed (a group with no spread gives GRPO no signal).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np
import torch

from mmrl.algos.variants.params import variant_params
from mmrl.core.config import load_config
from mmrl.core.evaluate import verify
from mmrl.core.registry import make_task
from mmrl.core.rollout import SamplingParams
from mmrl.core.warm_start import build_initial_policy


@torch.no_grad()
def group_successes(policy: Any, task: Any, task_id: str, examples: list[Any], group_size: int,
                    sampling: SamplingParams, seed: int, threshold: float) -> torch.Tensor:
    """[prompts, group_size] bool: which sampled answers score above ``threshold``."""
    rollout = policy.rollout(examples, group_size, sampling, seed)
    scores = torch.tensor([r.score for r in verify(task, task_id, rollout, examples)])
    success = torch.zeros(len(examples), group_size, dtype=torch.bool)
    seen = [0] * len(examples)
    for row, example in enumerate(rollout.example_index.tolist()):
        success[example, seen[example]] = bool(scores[row] > threshold)
        seen[example] += 1
    return success


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*", help="recipe overrides (a.b=c)")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cfg = load_config(args.recipe, ["log.progress=false", *args.overrides])
    task = make_task(cfg.task.name, cfg.task.args)
    policy = build_initial_policy(cfg)
    policy.eval()
    threshold = variant_params(cfg.algo, "guide").fail_threshold
    examples = task.sample_batch("train", args.prompts, np.random.default_rng(args.seed))
    sampling = SamplingParams(cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_new_tokens)
    size = cfg.rollout.group_size
    plain = group_successes(policy, task, cfg.task.name, examples, size, sampling, args.seed, threshold)
    hinted = group_successes(policy, task, cfg.task.name, [task.hinted(e) for e in examples], size, sampling,
                             args.seed, threshold)
    failed = ~plain.any(1)  # [prompts]: the groups Guide redraws
    print(json.dumps({
        "recipe": args.recipe, "overrides": args.overrides, "prompts": args.prompts, "group_size": size,
        "success_plain": round(float(plain.float().mean()), 4),
        "success_hinted": round(float(hinted.float().mean()), 4),
        "all_failed_groups": round(float(failed.float().mean()), 4),
        "all_failed_solved_with_hint": round(float(hinted[failed].any(1).float().mean()), 4) if failed.any() else None,
        "hinted_groups_all_solved": round(float(hinted.all(1).float().mean()), 4),
    }))


if __name__ == "__main__":
    main()
