"""Greedy success per evaluation split against the RL step, one panel per Meta-World run (step 0 is the
BC warm start); writes docs/img/metaworld_curves.png.

    python scripts/results/plot_metaworld_curves.py \\
        runs/mw22s/ppo_door-open:"door-open, PPO" runs/mw22s/grpo_window-open:"window-open, GRPO"

A run is ``FOLDER`` or ``FOLDER:LABEL`` (the label defaults to the folder's name). The in-run evaluations
are ``eval.num_examples`` episodes each (32 in the tiny recipes): a point moves by ±0.09 from one draw to the
next, which is why docs/metaworld.md quotes paired evaluations on 128–256 layouts for the gains.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from mmrl.core.logging import read_metrics  # noqa: E402

SPLITS = {"eval/success_rate": "test (held-out layouts)",
          "eval/ood_instruction/success_rate": "ood_instruction (unseen paraphrases)",
          "eval/ood_task/success_rate": "ood_task (held-out tasks)",
          "eval/val/success_rate": "val (picks checkpoints/best)"}


COLORS = dict(zip(SPLITS, ("C0", "C1", "C2", "C3")))


def parse_run(spec: str) -> tuple[Path, str]:
    folder, _, label = spec.partition(":")
    path = Path(folder)
    if not (path / "metrics.jsonl").is_file():
        raise SystemExit(f"{folder}: no metrics.jsonl (not a run folder)")
    return path, label or path.name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="FOLDER or FOLDER:LABEL")
    parser.add_argument("--out", default="docs/img/metaworld_curves.png")
    parser.add_argument("--columns", type=int, default=3)
    args = parser.parse_args()
    runs = [parse_run(spec) for spec in args.runs]
    cols = min(args.columns, len(runs))
    rows = math.ceil(len(runs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, (path, label) in zip(axes.flat, runs):
        evals = [row for row in read_metrics(path) if "eval/success_rate" in row]
        for key, name in SPLITS.items():
            points = [(row["step"], row[key]) for row in evals if key in row]
            if points:
                ax.plot(*zip(*points), "o-", label=name, color=COLORS[key])
        best = path / "checkpoints" / "best" / "best.json"
        if best.is_file():  # the checkpoint a run hands over (checkpoint.best_metric)
            record = json.loads(best.read_text())
            ax.axvline(record["step"], color="0.4", ls=":", lw=1.2, label="checkpoints/best")
        ax.set_title(label, fontsize=10)
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel("RL step (0 = BC warm start)")
        ax.set_ylabel("greedy success")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(runs):]:
        ax.axis("off")
    entries = {}  # every line kind any panel drew, once (the first panel may lack some)
    for ax in axes.flat:
        for handle, name in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(name, handle)
    axes.flat[0].legend(entries.values(), entries.keys(), fontsize=7, loc="lower right")
    fig.tight_layout()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
