"""Bar chart of greedy success per evaluation split for VLA runs (BC = step 0 of the first run), and
held-out success curves; writes docs/img/vla_<name>.png.

    python scripts/results/plot_vla_results.py --name reach --runs runs/vla_reach_ppo runs/vla_reach_grpo
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from mmrl.core.logging import read_metrics  # noqa: E402


def split_keys(row: dict) -> list[tuple[str, str]]:
    keys = [("test", "eval/success_rate")]
    keys += [(k.split("/")[1], k) for k in row if k.startswith("eval/") and k.endswith("/success_rate")
             and k.count("/") == 2]
    return keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True)
    parser.add_argument("--runs", nargs="+", required=True, help="run folders; labels are the folder names")
    parser.add_argument("--out", default="docs/img")
    args = parser.parse_args()
    evals = {Path(r).name: [row for row in read_metrics(Path(r)) if "eval/success_rate" in row]
             for r in args.runs}
    first = next(iter(evals.values()))
    keys = split_keys(first[0])
    bars = {"BC (warm start)": [first[0][k] for _, k in keys]}
    bars |= {name: [rows[-1][k] for _, k in keys] for name, rows in evals.items()}
    fig, (ax, curves) = plt.subplots(1, 2, figsize=(11, 3.6))
    width = 0.8 / len(bars)
    for i, (label, values) in enumerate(bars.items()):
        ax.bar(np.arange(len(keys)) + i * width, values, width, label=label)
    ax.set_xticks(np.arange(len(keys)) + 0.4 - width / 2, [s for s, _ in keys], rotation=20)
    ax.set_ylabel("greedy success rate")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    for name, rows in evals.items():
        curves.plot([r["step"] for r in rows], [r["eval/success_rate"] for r in rows], "o-", label=f"{name} test")
        curves.plot([r["step"] for r in rows], [np.mean([r[k] for s, k in keys if s != "test"]) for r in rows],
                    "s--", label=f"{name} OOD mean")
    curves.set_xlabel("RL step")
    curves.set_ylabel("greedy success rate")
    curves.grid(alpha=0.3)
    curves.legend(fontsize=8)
    fig.suptitle(f"{args.name}: BC warm start vs PPO vs GRPO (64 held-out episodes per split)")
    fig.tight_layout()
    out = Path(args.out) / f"vla_{args.name}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    print(out)


if __name__ == "__main__":
    main()
