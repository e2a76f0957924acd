"""Greedy success against real simulator steps, one curve per run, and the table behind it (issue 27: the
x-axis that matters for robots).

    python scripts/results/plot_real_steps.py --runs PPO=runs/realsteps/ppo GRPO=runs/realsteps/grpo \\
        WSRL=runs/realsteps/wsrl --bc-starts WSRL=runs/realsteps/wsrl_bc_only \
        --out docs/img/reach_real_steps.png --table runs/realsteps/table.md

x = the real steps behind each evaluated policy: its warm start's demonstrations (``eval/demo_env_steps``)
plus every real step the run took itself (``eval/real_env_steps``: training episodes, extra demonstrations
such as an off-policy learner's offline data, a world model's own data; evaluation episodes are never
counted); a second row of panels puts each run's own real steps alone on x. y = greedy test success, and the
5-split mean (test + 4 OOD) when every run evaluated all five. ``--bc-starts ARM=DIR``: DIR's step-0 evaluation is
ARM's BC warm start alone (for a learner whose step 0 comes after an offline phase: the same recipe with that
phase off), drawn as a star. The table lists (arm, step, real steps, success) at each evaluation; it is printed,
and written to ``--table`` when given.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mmrl.experiments.real_steps import EvalPoint, eval_points, markdown_table, plot_real_steps


def parse_runs(entries: list[str]) -> dict[str, Path]:
    """``NAME=DIR`` entries → {name: run folder}; a malformed entry, a repeated name or a missing folder is a
    :class:`ValueError` naming it."""
    runs: dict[str, Path] = {}
    for entry in entries:
        name, sep, folder = entry.partition("=")
        if not sep or not name or not folder:
            raise ValueError(f"--runs {entry!r}: expected NAME=DIR")
        if name in runs:
            raise ValueError(f"--runs: the name {name!r} is given twice")
        if not (Path(folder) / "metrics.jsonl").is_file():
            raise ValueError(f"--runs {entry!r}: {folder} has no metrics.jsonl")
        runs[name] = Path(folder)
    return runs


def start_point(folder: Path) -> EvalPoint:
    """The step-0 evaluation of a run (a :class:`ValueError` naming it when it has none)."""
    point = eval_points(folder)[0]
    if point.step != 0:
        raise ValueError(f"--bc-starts: {folder} has no step-0 evaluation")
    return point


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", required=True, metavar="NAME=DIR", help="run folders, one curve each")
    parser.add_argument("--bc-starts", nargs="*", default=[], metavar="ARM=DIR",
                        help="runs whose step-0 evaluation is ARM's BC warm start alone")
    parser.add_argument("--out", required=True, help="the figure (PNG)")
    parser.add_argument("--table", help="also write the markdown table here")
    parser.add_argument("--title", default="reach: greedy success vs real simulator steps")
    args = parser.parse_args(argv)
    try:
        arms = {name: eval_points(folder) for name, folder in parse_runs(args.runs).items()}
        bc_starts = {name: start_point(folder) for name, folder in parse_runs(args.bc_starts).items()}
        unknown = sorted(set(bc_starts) - set(arms))
        if unknown:
            raise ValueError(f"--bc-starts {', '.join(unknown)}: not an arm of --runs ({', '.join(arms)})")
    except ValueError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    table = markdown_table(arms, bc_starts)
    print(table, end="")
    if args.table:
        Path(args.table).parent.mkdir(parents=True, exist_ok=True)
        Path(args.table).write_text(table)
    print(plot_real_steps(arms, args.out, args.title, bc_starts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
