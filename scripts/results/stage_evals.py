"""Held-out metrics of runs at their start, at the end of each stage (multi-stage runs) and at the end, as a
Markdown table; the mean over the runs in the last row.

    python scripts/results/stage_evals.py runs/rloop_s0 runs/rloop_s1 runs/rloop_s2 --metric eval/exact_match
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from mmrl.core.logging import read_metrics


def stage_points(run: Path, metric: str) -> list[tuple[str, int, float]]:
    """(label, step, value): the first evaluation, then the last one of each stage (of the run, for one stage)."""
    evals = [r for r in read_metrics(run) if r.get(metric) is not None]
    points = [("start", evals[0]["step"], evals[0][metric])]
    for i, row in enumerate(evals):
        if i + 1 == len(evals) or evals[i + 1].get("stage") != row.get("stage"):
            points.append((row.get("stage") or "end", row["step"], row[metric]))
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--metric", default="eval/reward_mean")
    args = parser.parse_args()
    table = {run: stage_points(run, args.metric) for run in args.runs}
    labels = [f"{label} (step {step})" for label, step, _ in next(iter(table.values()))]
    print(f"| run | {' | '.join(labels)} |\n|---|{'---|' * len(labels)}")
    for run, points in table.items():
        print(f"| {run} | {' | '.join(f'{value:.3f}' for _, _, value in points)} |")
    if len(table) > 1 and len({len(p) for p in table.values()}) == 1:
        values = np.array([[v for _, _, v in points] for points in table.values()])
        print(f"| mean ± sd | {' | '.join(f'{m:.3f} ± {s:.3f}' for m, s in zip(values.mean(0), values.std(0, ddof=1)))} |")


if __name__ == "__main__":
    main()
