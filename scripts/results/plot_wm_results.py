"""The VLA-RFT claim as a plot: greedy success in the REAL MuJoCo simulator vs real-simulator steps
consumed, for the BC warm start, RL in MuJoCo and RFT inside the learned world model; writes
docs/img/wm_rft_real_steps.png and prints the table behind it.

    python scripts/results/plot_wm_results.py --bc-steps 13275 --world-model runs/wm/reach_demos \\
        --mujoco runs/world_model/mujoco_grpo_seed0 --rft runs/world_model/rft_seed0 \\
        runs/world_model/rft_cov_seed0:runs/wm/reach_demos_cov

An ``--rft`` entry ``RUN:WORLD_MODEL`` names the world model that run used (default ``--world-model``).
Success is greedy, in the real simulator; the curves show the mean over the five splits (test and
the four OOD variants, 5 × 64 episodes), the bars each split at the last eval.

Real-simulator steps counted per arm (evaluation episodes are not counted for any arm):

- BC: the warm start's demonstration steps (``--bc-steps``; every arm starts from this policy);
- RL in MuJoCo: BC + every rollout step of RL so far (from each training row's episode count and
  mean length, ``rollout/trained_rows`` × ``rollout/len_mean``, summed up to the eval's step);
- RFT in the world model: BC + the world model's own training data (``real_env_steps`` of its
  ``train_log.json`` minus the BC demonstrations it reused, ``demonstration_env_steps``), constant
  during RFT: no rollout touches MuJoCo.

Runs that log ``eval/real_env_steps`` (all runs since it exists) plot for any set of learners, without these
constants, with ``scripts/results/plot_real_steps.py``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from mmrl.core.logging import read_metrics  # noqa: E402
from mmrl.experiments.real_steps import SPLITS, mean_success, rollout_steps_by_step, success  # noqa: E402
from mmrl.tasks.robot.world_model_rft import world_model_own_steps  # noqa: E402


def mujoco_points(run: Path, bc_steps: int) -> list[tuple[int, int, dict]]:
    """(RL step, real steps, eval row) of an RL-in-MuJoCo run: BC + the rollouts' steps so far (derived from the
    rollout rows, so runs logged before ``eval/real_env_steps`` plot too)."""
    rows = read_metrics(run)
    used = rollout_steps_by_step(rows)
    return [(row["step"], bc_steps + used[row["step"]], row) for row in rows if "eval/success_rate" in row]


def rft_points(run: Path, bc_steps: int, world_model_steps: int) -> list[tuple[int, int, dict]]:
    return [(row["step"], bc_steps + world_model_steps, row) for row in read_metrics(run) if "eval/success_rate" in row]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bc-steps", type=int, required=True, help="real steps of the warm start's demonstrations")
    parser.add_argument("--world-model", required=True, help="world-model folder (its train_log.json)")
    parser.add_argument("--mujoco", nargs="*", default=[], help="RL-in-MuJoCo run folders")
    parser.add_argument("--rft", nargs="+", required=True, help="RFT-in-world-model run folders")
    parser.add_argument("--out", default="docs/img/wm_rft_real_steps.png")
    args = parser.parse_args()
    arms = {f"RL in MuJoCo ({Path(r).name})": mujoco_points(Path(r), args.bc_steps) for r in args.mujoco}
    for entry in args.rft:
        run, _, world_model = entry.partition(":")
        log = json.loads((Path(world_model or args.world_model) / "train_log.json").read_text())
        arms[f"RFT in WM ({Path(run).name})"] = rft_points(Path(run), args.bc_steps, world_model_own_steps(log))
    bc = next(iter(arms.values()))[0][2]

    print("| arm | RL step | real-sim steps | " + " | ".join(SPLITS) + " | 5-split mean |")
    print("|---|---|---|" + "---|" * (len(SPLITS) + 1))
    print(f"| BC warm start | 0 | {args.bc_steps:,} | " + " | ".join(f"{success(bc, s):.3f}" for s in SPLITS)
          + f" | {mean_success(bc):.3f} |")
    for name, points in arms.items():
        for step, real, row in points[1:]:
            print(f"| {name} | {step} | {real:,} | " + " | ".join(f"{success(row, s):.3f}" for s in SPLITS)
                  + f" | {mean_success(row):.3f} |")

    fig, (ax, steps, bars) = plt.subplots(1, 3, figsize=(16, 4.2))
    ax.plot([args.bc_steps], [mean_success(bc)], "k*", markersize=12, label="BC warm start")
    for i, (name, points) in enumerate(arms.items()):
        xs = [p[1] for p in points]
        ys = [mean_success(p[2]) for p in points]
        if name.startswith("RFT"):  # every RFT step costs no real step: its evals stack at one x
            line, = ax.plot(xs, ys, "s:", alpha=0.5)
            ax.plot(xs[-1:], ys[-1:], "s", color=line.get_color(), markersize=9, label=f"{name}, last eval")
        else:
            ax.plot(xs, ys, "o-", label=name)
        steps.plot([p[0] for p in points], ys, "s--" if name.startswith("RFT") else "o-", label=name)
    ax.set_xlabel("real MuJoCo steps consumed (BC demos + WM's own data or RL rollouts)")
    ax.set_ylabel("greedy success, real sim (5-split mean)")
    ax.set_ylim(0, 0.6)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    steps.set_xlabel("RL step (GRPO update)")
    steps.set_ylabel("greedy success, real sim (5-split mean)")
    steps.set_ylim(0, 0.6)
    steps.grid(alpha=0.3)
    steps.legend(fontsize=6)
    labels = {"BC warm start": bc} | {name: points[-1][2] for name, points in arms.items()}
    width = 0.8 / len(labels)
    for i, (label, row) in enumerate(labels.items()):
        bars.bar(np.arange(len(SPLITS)) + i * width, [success(row, s) for s in SPLITS], width, label=label,
                 color="0.25" if i == 0 else f"C{(i - 1) % 10}")  # the arms keep their curve colours
    bars.set_xticks(np.arange(len(SPLITS)) + 0.4 - width / 2, SPLITS, rotation=20)
    bars.set_ylabel("greedy success, real sim")
    bars.set_ylim(0, 0.6)
    bars.grid(alpha=0.3, axis="y")
    bars.legend(fontsize=6)
    fig.suptitle("reach: BC vs RL in MuJoCo vs RFT in the learned world model (64 held-out real episodes per split)")
    fig.tight_layout()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    print(out)


if __name__ == "__main__":
    main()
