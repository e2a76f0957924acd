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
with the expert's waypoints (``mmrl plans-gif OUT`` writes it for any planner run); ``--img-dir docs/img
--img-name laviplan`` also copies both there.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from mmrl.cli import USER_ERRORS, add_train_arguments, exit_process, parse_with_overrides, run_train


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
    if args.gif_scenes:
        from mmrl.tasks.driving.laviplan_gif import write_run_plans_gif

        gif = write_run_plans_gif(out, args.gif_scenes)
    else:
        gif = None
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
    exit_process(main())
