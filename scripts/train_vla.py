"""Train a tiny VLA in a MuJoCo table-top env: BC warm start on scripted-expert demos → PPO or GRPO.

    python scripts/train_vla.py --out runs/vla_reach_ppo                                      # reach, PPO
    python scripts/train_vla.py --recipe configs/vla_reach/grpo_tiny_cpu.yaml --out runs/vla_reach_grpo
    python scripts/train_vla.py --recipe configs/vla_push/tiny_cpu.yaml --out runs/vla_push_ppo
    python scripts/train_vla.py --out runs/x trainer.steps=10 policy.args.action_head=gaussian

The recipe's ``warm_start.sft_steps`` of behaviour cloning run first (cached in $MMRL_CACHE, shared by
the PPO and GRPO recipes of a task), then the RL steps through the shared trainer (``mmrl train``);
at the end a few greedy episodes per evaluated split are written to OUT/videos/*.gif.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mmrl.core.checkpoint import latest_checkpoint
from mmrl.cli import USER_ERRORS, add_train_arguments, exit_process, parse_with_overrides, run_train
from mmrl.core.config import load_config
from mmrl.core.registry import make_policy, make_task
from mmrl.tasks.robot.videos import write_rollout_videos


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_train_arguments(parser, default_recipe="configs/vla_reach/tiny_cpu.yaml")
    parser.add_argument("--videos", type=int, default=2, help="greedy episodes per split written as GIFs (0: none)")
    args = parse_with_overrides(parser, argv)
    try:
        out = run_train(args)
    except USER_ERRORS as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    if args.videos:
        cfg = load_config(str(Path(out) / "config.yaml"))
        policy = make_policy(cfg.policy.name, cfg.policy.args)
        policy.load_weights(str(latest_checkpoint(Path(out)) / "policy"))
        paths = write_rollout_videos(out, policy, make_task(cfg.task.name, cfg.task.args),
                                     (cfg.eval.split, *cfg.eval.extra_splits), episodes=args.videos)
        print(f"videos: {len(paths)} GIFs in {Path(out) / 'videos'}")
    return 0


if __name__ == "__main__":
    exit_process(main())
