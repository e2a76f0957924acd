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

from mmrl.algos.real_steps import DEMO_STEPS, REAL_STEPS
from mmrl.core.logging import read_metrics

SPLITS = ("test", "ood_color", "ood_position", "ood_instruction", "ood_distractor")
"""The reach task's evaluated splits: ``eval.split`` and its four ``eval.extra_splits``."""


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
            used += round(row["rollout/trained_rows"] * row["rollout/len_mean"])
        out[int(row["step"])] = used
    return out


def markdown_table(arms: dict[str, list[EvalPoint]], bc_starts: dict[str, EvalPoint] | None = None) -> str:
    """(arm, step, real steps, success) at every evaluation of every arm, as a markdown table; an arm's BC start
    alone (``bc_starts``) first, as step "BC"."""
    header = ("| arm | step | run's real env steps | BC demo steps | total real steps | greedy test success "
              "| 5-split mean |")
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|"]
    bc_starts = bc_starts or {}
    for name, points in arms.items():
        for p in ([bc_starts[name]] if name in bc_starts else []) + points:
            mean = "–" if p.mean_success is None else f"{p.mean_success:.3f}"
            step = "BC" if p is bc_starts.get(name) else str(p.step)
            lines.append(f"| {name} | {step} | {p.real_steps:,} | {p.demo_steps:,} | {p.total_steps:,} "
                         f"| {p.test_success:.3f} | {mean} |")
    return "\n".join(lines) + "\n"


def plot_real_steps(arms: dict[str, list[EvalPoint]], out: str | Path, title: str,
                    bc_starts: dict[str, EvalPoint] | None = None) -> Path:
    """Greedy test success (and the 5-split mean, when every run logged it) against real steps, one curve per
    arm: in the top row against the total real steps behind the policy (BC demonstrations + the run's own; each
    distinct BC demonstration count a dotted vertical line), in the bottom row against the run's own real steps
    only (its learner's cost from its start). Each arm's step-0 evaluation (its start: BC, or BC + offline phase)
    is a large hollow marker; ``bc_starts`` {arm: evaluation of its BC warm start alone} (for arms whose step 0 is
    not BC: an off-policy learner's offline phase comes first) are stars in the arm's colour. Writes a PNG to
    ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bc_starts = bc_starts or {}
    unknown = sorted(set(bc_starts) - set(arms))
    if unknown:
        raise ValueError(f"BC starts of {unknown}: no such arm (arms: {', '.join(arms)})")
    every = [p for points in arms.values() for p in points] + list(bc_starts.values())
    panels = [("greedy test success", lambda p: p.test_success)]
    if all(p.mean_success is not None for p in every):
        panels.append(("greedy success, 5-split mean (test + 4 OOD)", lambda p: p.mean_success))
    axes_x = [("real simulator steps behind the policy (BC demos + the run's own)", lambda p: p.total_steps),
              ("the run's own real simulator steps (from its start)", lambda p: p.real_steps)]
    fig, axes = plt.subplots(len(axes_x), len(panels), figsize=(7.5 * len(panels), 4.4 * len(axes_x)),
                             squeeze=False)
    colours = {name: f"C{i % 10}" for i, name in enumerate(arms)}
    for row, (xlabel, x) in enumerate(axes_x):
        for ax, (label, value) in zip(axes[row], panels):
            if row == 0:
                for demo in sorted({p.demo_steps for p in every}):
                    ax.axvline(demo, color="0.6", linestyle=":", linewidth=1)
            for name, points in arms.items():
                xs, ys = [x(p) for p in points], [value(p) for p in points]
                ax.plot(xs, ys, "o-", color=colours[name], markersize=4, label=name)
                if points[0].step == 0:
                    ax.plot(xs[:1], ys[:1], "o", color=colours[name], markersize=11, markerfacecolor="none",
                            markeredgewidth=1.5)
            for name, point in bc_starts.items():
                ax.plot([x(point)], [value(point)], "*", color=colours[name], markersize=13, markeredgecolor="k",
                        markeredgewidth=0.6, linestyle="none", label=f"{name}: BC alone")
            ax.plot([], [], "o", color="0.3", markersize=11, markerfacecolor="none",
                    label="step 0: the start (BC; off-policy: BC + offline phase)")
            if row == 0:
                ax.plot([], [], ":", color="0.6", label="BC demonstrations' real steps")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(label)
            ax.set_ylim(0, 1.02)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6, ncol=2)
    fig.suptitle(title)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
