"""Run outputs: ``metrics.jsonl`` (one JSON object per step), TensorBoard, a console progress bar.

Metric namespace (defined once; docs/architecture.md lists every key):
``reward/*`` verifiable reward of the rollout batch; ``loss/*`` loss terms; ``policy/*`` policy
statistics (``kl_ref``, ``clip_frac``, ``approx_kl`` = k3 of π_old‖π_θ, ``entropy``, ``grad_norm``);
``rollout/*`` sampling statistics; ``eval/*`` held-out evaluation; ``perf/*`` timings;
``train/*`` bookkeeping (``lr``, skipped updates).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

METRICS_FILE = "metrics.jsonl"


def _clean(value: Any) -> Any:
    """JSON has no NaN / inf: such metrics are logged as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunLogger:
    """Writes metrics on the main process only; other processes get a logger that does nothing."""

    def __init__(self, out: Path, enabled: bool, total_steps: int, start_step: int, tensorboard: bool,
                 progress: bool):
        self.enabled = enabled
        self.path = out / METRICS_FILE
        self.tb = None
        self.bar = None
        self.postfix: dict[str, str] = {}
        if not enabled:
            return
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional: log to jsonl only
                SummaryWriter = None
            if SummaryWriter is not None:
                self.tb = SummaryWriter(str(out / "tb"), purge_step=start_step or None)
        if progress:
            self.bar = tqdm(total=total_steps, initial=start_step, desc="train", dynamic_ncols=True)

    def log(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        row = {k: _clean(v) for k, v in row.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self.tb is not None:
            for key, value in row.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.tb.add_scalar(key, value, row["step"])
        if self.bar is not None:
            for key, label in (("reward/mean", "reward"), ("eval/reward_mean", "eval")):
                if row.get(key) is not None:
                    self.postfix[label] = f"{row[key]:.3f}"
            self.bar.set_postfix(self.postfix, refresh=False)
            if row["step"] > self.bar.n:
                self.bar.update(row["step"] - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.tb is not None:
            self.tb.close()


def read_metrics(out: Path) -> list[dict[str, Any]]:
    path = out / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is {out} a run folder?")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _step_of(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return float("inf")


def truncate_metrics(out: Path, last_step: int) -> int:
    """Keep rows with ``step <= last_step`` (a resumed run re-computes the rest); the removed rows
    are appended to ``metrics.discarded.jsonl``, never thrown away. Returns how many moved."""
    path = out / METRICS_FILE
    if not path.is_file():
        return 0
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    keep = [line for line in lines if _step_of(line) <= last_step]  # a torn line has no step: moved
    dropped = [line for line in lines if _step_of(line) > last_step]
    if dropped:
        with (out / "metrics.discarded.jsonl").open("a") as f:
            f.write("\n".join(dropped) + "\n")
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(line + "\n" for line in keep))
        tmp.replace(path)
    return len(dropped)
