"""Train a driving policy: the LaViPlan VLM waypoint planner or the RIFT traffic policy.

    python scripts/train_driving.py --out runs/laviplan                                 # tiny VLM planner, CPU
    python scripts/train_driving.py --recipe configs/laviplan/qwen2_5_vl_3b_gpu.yaml --out runs/laviplan_3b
    python scripts/train_driving.py --recipe configs/rift/tiny_cpu.yaml --out runs/rift  # traffic policy
    python scripts/train_driving.py --out runs/x trainer.steps=10 algo.kl_coef=0.05
    accelerate launch --config_file configs/accelerate/multi_gpu_ddp.yaml scripts/train_driving.py \\
        --recipe configs/laviplan/qwen2_5_vl_3b_gpu.yaml --out runs/laviplan_3b

The same implementation as ``mmrl train``: a recipe, dotted overrides, one trainer loop (the
recipe's SFT / imitation warm start first, cached in $MMRL_CACHE). At the end: OUT/curves.png, and
for the planner (``driving/laviplan-*`` tasks) OUT/plans.gif, a few held-out scenes of the
evaluation split played along the warm start's plan and the trained plan side by side (greedy),
with the expert's waypoints; ``--img-dir docs/img --img-name laviplan`` also copies both there.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

from mmrl.core.checkpoint import latest_checkpoint
from mmrl.cli import USER_ERRORS, add_train_arguments, parse_with_overrides, run_train
from mmrl.core.config import TrainConfig, load_config
from mmrl.core.registry import make_policy, make_task
from mmrl.core.rollout import SamplingParams
from mmrl.core.warm_start import warm_start_path


def greedy_plans(cfg: TrainConfig, task, policy_dir: Path, examples: list) -> list:
    """The parsed greedy plans of the policy saved in ``policy_dir`` for ``examples``."""
    policy = make_policy(cfg.policy.name, cfg.policy.args)
    policy.load_weights(str(policy_dir))
    policy.eval()
    with torch.no_grad():
        rollout = policy.rollout(examples, 1, SamplingParams(0.0, 1.0, cfg.rollout.max_new_tokens), cfg.eval.seed)
    return [task.parse(output) for output in rollout.outputs]  # rows follow the examples (group size 1)


def write_plan_gif(out: Path, num_scenes: int) -> Path | None:
    """OUT/plans.gif for a LaViPlan run: warm start (or the initial policy) vs the last checkpoint."""
    from mmrl.tasks.driving.laviplan import LaviPlanTask
    from mmrl.tasks.driving.laviplan_gif import write_plans_gif

    cfg = load_config(str(out / "config.yaml"))
    task = make_task(cfg.task.name, cfg.task.args)
    if not isinstance(task, LaviPlanTask):
        return None  # the traffic policy writes its own closed-loop GIFs (tasks/driving/rift*)
    examples = task.sample_batch(cfg.eval.split, num_scenes, np.random.default_rng(cfg.eval.seed))
    plans = {}
    start = warm_start_path(cfg)
    if cfg.warm_start.sft_steps and start.is_dir():
        plans["SFT"] = greedy_plans(cfg, task, start, examples)
    plans["GRPO"] = greedy_plans(cfg, task, latest_checkpoint(out) / "policy", examples)
    return write_plans_gif(out / "plans.gif", examples, plans)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_train_arguments(parser, default_recipe="configs/laviplan/tiny_cpu.yaml")
    parser.add_argument("--gif-scenes", type=int, default=4, help="held-out scenes in OUT/plans.gif (0: no GIF)")
    parser.add_argument("--img-dir", help="also copy curves.png and plans.gif here (e.g. docs/img)")
    parser.add_argument("--img-name", default="laviplan", help="file prefix in --img-dir (default laviplan)")
    args = parse_with_overrides(parser, argv)
    try:
        out = run_train(args)
    except USER_ERRORS as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    gif = write_plan_gif(out, args.gif_scenes) if args.gif_scenes else None
    if gif is not None:
        print(f"plans: {gif}")
    if args.img_dir:
        img_dir = Path(args.img_dir)
        img_dir.mkdir(parents=True, exist_ok=True)
        for source, suffix in ((out / "curves.png", "_curves.png"), (gif, "_plans.gif")):
            if source is not None and Path(source).is_file():
                print(f"copied: {shutil.copyfile(source, img_dir / f'{args.img_name}{suffix}')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
