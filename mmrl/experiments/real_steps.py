"""Success against real simulator steps (issue 27: the x-axis that matters for robots), from runs' metrics files.

A run of a simulator task logs at every evaluation ``eval/real_env_steps`` (every real step the run took: its
training episodes, the demonstrations it ran beyond its warm start's, a world model's own data) and
``eval/demo_env_steps`` (its warm start's demonstrations) (:mod:`mmrl.algos.real_steps`). A policy's cost in
real steps is their sum: :attr:`EvalPoint.total_steps`. Greedy success is ``eval/success_rate`` on the test
split and ``eval/<split>/success_rate`` on the OOD splits; the 5-split mean when all five were evaluated.

Used by ``scripts/results/plot_real_steps.py`` (any runs, one figure and a table) and
``scripts/results/plot_wm_results.py`` (the VLA-RFT comparison, also for runs logged before the counts existed:
:func:`rollout_steps_by_step`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mmrl.core.logging import read_metrics

SPLITS = ("test", "ood_color", "ood_position", "ood_instruction", "ood_distractor")
"""The reach task's evaluated splits: ``eval.split`` and its four ``eval.extra_splits``."""
REAL_STEPS = "eval/real_env_steps"
DEMO_STEPS = "eval/demo_env_steps"


def success(row: dict, split: str) -> float:
    """Greedy success of one split at an evaluation row."""
    return row["eval/success_rate"] if split == "test" else row[f"eval/{split}/success_rate"]


def mean_success(row: dict) -> float | None:
    """Greedy success averaged over the five :data:`SPLITS` (5 × eval.num_examples episodes); None when the
    evaluation did not cover all five."""
    if any(("eval/success_rate" if s == "test" else f"eval/{s}/success_rate") not in row for s in SPLITS):
        return None
    return float(np.mean([success(row, s) for s in SPLITS]))


@dataclass(frozen=True)
class EvalPoint:
    """One evaluation of a run and the real simulator steps behind the policy it evaluated."""

    step: int
    real_steps: int
    """The run's own real steps so far (``eval/real_env_steps``)."""
    demo_steps: int
    """Its warm start's demonstrations (``eval/demo_env_steps``)."""
    row: dict

    @property
    def total_steps(self) -> int:
        return self.real_steps + self.demo_steps

    @property
    def test_success(self) -> float:
        return success(self.row, "test")

    @property
    def mean_success(self) -> float | None:
        return mean_success(self.row)


def eval_points(run: str | Path) -> list[EvalPoint]:
    """The evaluations of a run folder (its ``metrics.jsonl``), in step order. A run without the real-step
    counts (an older run, or one of a task that is not a simulator) is a :class:`ValueError` naming it."""
    points = []
    for row in read_metrics(Path(run)):
        if "eval/success_rate" not in row:
            continue
        if row.get(REAL_STEPS) is None or row.get(DEMO_STEPS) is None:
            raise ValueError(f"{Path(run) / 'metrics.jsonl'}: the evaluation of step {row['step']} has no "
                             f"{REAL_STEPS} / {DEMO_STEPS} (a run of a simulator task, trained since the counts "
                             f"were logged, has both)")
        points.append(EvalPoint(int(row["step"]), int(row[REAL_STEPS]), int(row[DEMO_STEPS]), row))
    if not points:
        raise ValueError(f"{Path(run) / 'metrics.jsonl'}: no evaluation (no eval/success_rate) in it")
    return points


def rollout_steps_by_step(rows: Sequence[dict]) -> dict[int, int]:
    """For runs logged before ``eval/real_env_steps``: the cumulative env steps of the training rollouts at each
    step, as ``Σ rollout/trained_rows × rollout/len_mean`` (exact for a policy whose decision is one env step and
    a run that trains every row it draws; it misses demonstrations the run ran itself)."""
    used, out = 0, {}
    for row in rows:
        if "rollout/len_mean" in row and row["step"] > 0:
            used += int(round(row["rollout/trained_rows"] * row["rollout/len_mean"]))
        out[int(row["step"])] = used
    return out


def markdown_table(arms: dict[str, list[EvalPoint]]) -> str:
    """(arm, step, real steps, success) at every evaluation of every arm, as a markdown table."""
    lines = ["| arm | step | run's real env steps | BC demo steps | total real steps | greedy test success "
             "| 5-split mean |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, points in arms.items():
        for p in points:
            mean = "–" if p.mean_success is None else f"{p.mean_success:.3f}"
            lines.append(f"| {name} | {p.step} | {p.real_steps:,} | {p.demo_steps:,} | {p.total_steps:,} "
                         f"| {p.test_success:.3f} | {mean} |")
    return "\n".join(lines) + "\n"


def plot_real_steps(arms: dict[str, list[EvalPoint]], out: str | Path, title: str) -> Path:
    """Greedy test success (and the 5-split mean, when every run logged it) against the total real steps, one
    curve per arm; each arm's step-0 evaluation (its start: BC, or BC + offline phase) a large hollow marker and
    each distinct BC demonstration count a dotted vertical line. Writes a PNG to ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with_mean = all(p.mean_success is not None for points in arms.values() for p in points)
    panels = [("greedy test success (64 held-out real episodes)", lambda p: p.test_success)]
    if with_mean:
        panels.append(("greedy success, 5-split mean (test + 4 OOD)", lambda p: p.mean_success))
    fig, axes = plt.subplots(1, len(panels), figsize=(7.5 * len(panels), 4.6), squeeze=False)
    for ax, (label, value) in zip(axes[0], panels):
        for demo in sorted({p.demo_steps for points in arms.values() for p in points}):
            ax.axvline(demo, color="0.6", linestyle=":", linewidth=1)
        for i, (name, points) in enumerate(arms.items()):
            colour = f"C{i % 10}"
            xs, ys = [p.total_steps for p in points], [value(p) for p in points]
            ax.plot(xs, ys, "o-", color=colour, markersize=4, label=name)
            if points[0].step == 0:
                ax.plot(xs[:1], ys[:1], "o", color=colour, markersize=11, markerfacecolor="none", markeredgewidth=1.5)
        ax.plot([], [], "o", color="0.3", markersize=11, markerfacecolor="none",
                label="step 0: the start (BC; off-policy: BC + offline phase)")
        ax.plot([], [], ":", color="0.6", label="BC demonstrations' real steps")
        ax.set_xlabel("real simulator steps behind the policy (BC demos + the run's own)")
        ax.set_ylabel(label)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
