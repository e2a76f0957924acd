"""Reward curves as PNG from a run's ``metrics.jsonl``."""

from __future__ import annotations

from pathlib import Path

from mmrl.core.logging import read_metrics

PANELS = (("reward/mean", "eval/reward_mean"), ("loss/policy",), ("policy/kl_ref", "policy/entropy"),
          ("policy/clip_frac",))


def plot_run(out: str | Path, path: str | Path | None = None) -> Path:
    """Write ``OUT/curves.png``: train and held-out reward, policy loss, KL / entropy, clip fraction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    rows = read_metrics(out)
    panels = [keys for keys in PANELS if any(r.get(k) is not None for r in rows for k in keys)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, keys in zip(axes[0], panels):
        for key in keys:
            points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if points:
                steps, values = zip(*points)
                style = "o-" if key.startswith("eval/") else "-"
                ax.plot(steps, values, style, label=key, markersize=4)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(out.name)
    fig.tight_layout()
    path = Path(path) if path else out / "curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
