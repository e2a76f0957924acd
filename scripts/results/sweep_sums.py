"""Per-run totals of logged metrics in an ``mmrl sweep`` folder: for each arm, the mean ± sample std over seeds
of the sum of each metric over the training steps (e.g. Guide's ``rollout/guided_groups``), and the held-out
metric at the first and last evaluation.

    python scripts/results/sweep_sums.py runs/guide3/text_first_digit rollout/guided_groups rollout/guided_solved

One markdown table on stdout; a metric a run never logs counts as 0 (an arm without that option).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from mmrl.core.logging import read_metrics


def mean_std(values: list[float]) -> str:
    """``mean ± std`` (sample std; 0 for one value)."""
    std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return f"{np.mean(values):.3f} ± {std:.3f}"


def run_totals(run: Path, metrics: list[str], held_out: str) -> dict[str, float]:
    """Sums of ``metrics`` over the steps after 0, and ``held_out`` at the first and the last evaluation."""
    rows = read_metrics(run)
    evals = [r[held_out] for r in rows if held_out in r]
    totals = {m: float(sum(r.get(m, 0.0) for r in rows if r["step"] > 0)) for m in metrics}
    return {**totals, "start": evals[0], "end": evals[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", type=Path, help="the sweep's --out folder")
    parser.add_argument("metrics", nargs="+", help="logged metrics to sum over the steps")
    parser.add_argument("--held-out", default="eval/accuracy", help="held-out metric shown at start and end")
    args = parser.parse_args()
    print(f"| arm | seeds | {args.held_out} start | {args.held_out} end | " + " | ".join(args.metrics) + " |")
    print("|---" * (4 + len(args.metrics)) + "|")
    for arm in sorted(p for p in (args.sweep / "runs").iterdir() if p.is_dir()):
        runs = [run_totals(seed, args.metrics, args.held_out) for seed in sorted(arm.glob("seed_*"))]
        cells = [mean_std([r[k] for r in runs]) for k in ("start", "end", *args.metrics)]
        print(f"| {arm.name} | {len(runs)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
