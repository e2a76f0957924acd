"""A RIFT-family recipe over several training seeds, each from an empty warm-start cache: open-loop
(the trainer's held-out evaluation) and closed-loop (``mmrl.tasks.driving.rift_eval``) numbers,
step 0 and last, in one table.

    python scripts/results/rift_seeds.py --out runs/rift_seeds --seeds 0 1 2 --threads 1   # from the repo root
    python scripts/results/rift_seeds.py --recipe configs/rift/highway_tiny_cpu.yaml --splits test,ood \
        --out runs/rift_highway_seeds --seeds 0 1

``--recipe`` (default ``configs/rift/tiny_cpu.yaml``) may be any recipe of ``driving/rift-v0`` or
``driving/rift-highway-v0``, with either reward; ``--splits`` are the closed-loop splits (the table shows the
first; ``summary.json`` has them all, and the open-loop numbers of the trainer's extra splits).

For each seed ``s`` it runs, one process at a time, with ``OMP_NUM_THREADS=<threads>`` and
``MMRL_CACHE=<out>/cache_s<s>`` (deleted first, so the imitation warm start is trained afresh):

    mmrl train <recipe> --out <out>/s<s> trainer.seed=<s> [overrides]
    python -m mmrl.tasks.driving.rift_eval --run <out>/s<s> --episodes <episodes> --splits <splits> \\
        --json <out>/s<s>/closed_loop.json

then writes ``<out>/summary.json`` and prints a markdown table. A seed whose run folder already
holds ``closed_loop.json`` is not run again (``--rerun`` forces it), so the table can be rebuilt.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from mmrl.core.logging import read_metrics

RECIPE = "configs/rift/tiny_cpu.yaml"
OPEN_LOOP = ("reward_mean", "collision_rate", "progress_mean")
CLOSED_LOOP = ("collision_rate", "progress_mean", "goal_rate", "w1_speed")


def run_seed(recipe: str, out: Path, seed: int, threads: int, episodes: int, splits: str,
             overrides: list[str]) -> Path:
    """Train and evaluate one seed from an empty cache; returns the run folder."""
    run, cache = out / f"s{seed}", out / f"cache_s{seed}"
    shutil.rmtree(cache, ignore_errors=True)
    env = os.environ | {"OMP_NUM_THREADS": str(threads), "MMRL_CACHE": str(cache)}
    subprocess.run([sys.executable, "-m", "mmrl.cli", "train", recipe, "--out", str(run), "--overwrite",
                    f"trainer.seed={seed}", *overrides], env=env, check=True)
    subprocess.run([sys.executable, "-m", "mmrl.tasks.driving.rift_eval", "--run", str(run), "--episodes",
                    str(episodes), "--splits", splits, "--json", str(run / "closed_loop.json")], env=env, check=True)
    return run


def seed_summary(run: Path) -> dict:
    """Open-loop eval at the first and last evaluation (every split the trainer evaluated), closed-loop
    imitation start vs fine-tuned (named after the run's reward) for every split evaluated; ``closed_loop`` is
    the first split's."""
    evals = [row for row in read_metrics(run) if "eval/reward_mean" in row]
    closed = json.loads((run / "closed_loop.json").read_text())
    per_split = {split: {k: [m["imitation"][k], next(v for name, v in m.items() if name != "imitation")[k]]
                         for k in CLOSED_LOOP} for split, m in closed.items()}
    return {"open_loop": {"steps": [evals[0]["step"], evals[-1]["step"]],
                          **{k: [evals[0][f"eval/{k}"], evals[-1][f"eval/{k}"]] for k in OPEN_LOOP}},
            "open_loop_all": {k: [evals[0][k], evals[-1][k]] for k in evals[-1] if k.startswith("eval/")},
            "closed_loop": next(iter(per_split.values())), "closed_loop_splits": per_split}


def table(summaries: dict[int, dict]) -> str:
    head = ("| seed | open-loop return | open-loop collision | open-loop progress (m) | closed-loop collision "
            "| closed-loop progress (m) | goal | W1 speed |")
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for seed, s in summaries.items():
        o, c = s["open_loop"], s["closed_loop"]
        cells = [f"{o[k][0]:.2f} → {o[k][1]:.2f}" if k != "collision_rate" else f"{o[k][0]:.3f} → {o[k][1]:.3f}"
                 for k in OPEN_LOOP]
        cells += [f"{c[k][0]:.2f} → {c[k][1]:.2f}" for k in CLOSED_LOOP]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default=RECIPE, help="a recipe of driving/rift-v0 or driving/rift-highway-v0")
    parser.add_argument("--splits", default="test", help="closed-loop splits, comma-separated (the table shows the first)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every process")
    parser.add_argument("--episodes", type=int, default=100, help="closed-loop test episodes")
    parser.add_argument("--rerun", action="store_true", help="train again even where results exist")
    parser.add_argument("overrides", nargs="*", help="recipe overrides for every seed, e.g. trainer.lr=3e-4")
    args = parser.parse_args()
    summaries = {}
    for seed in args.seeds:
        run = args.out / f"s{seed}"
        if args.rerun or not (run / "closed_loop.json").is_file():
            run_seed(args.recipe, args.out, seed, args.threads, args.episodes, args.splits, args.overrides)
        summaries[seed] = seed_summary(run)
    (args.out / "summary.json").write_text(json.dumps(summaries, indent=2))
    print(table(summaries))


if __name__ == "__main__":
    main()
