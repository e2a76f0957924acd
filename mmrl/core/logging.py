"""Run outputs: ``metrics.jsonl`` (one JSON object per step), TensorBoard, a console progress bar.

Metric namespace (defined once; docs/architecture.md lists every key):
``reward/*`` verifiable reward of the rollout batch; ``loss/*`` loss terms; ``policy/*`` policy
statistics (``kl_ref``, ``clip_frac``, ``approx_kl`` = k3 of π_old‖π_θ, ``entropy``, ``grad_norm``);
``rollout/*`` sampling statistics; ``eval/*`` held-out evaluation; ``perf/*`` timings;
``train/*`` bookkeeping (``lr``, skipped updates).

``samples.jsonl``: at each evaluation, the first ``log.num_samples`` held-out outputs of every evaluated
split (step, split, prompt, completion, reward, components, info). Experiment trackers
(:class:`Tracker`, e.g. W&B and Trackio in :mod:`mmrl.core.trackers`) receive the same rows and metrics.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tqdm.auto import tqdm

from mmrl.core.contracts import RewardResult

@dataclass(frozen=True)
class HeldOutSample:
    """One held-out example, the policy's output for it, and the verifier's verdict (``samples.jsonl``)."""

    example: Any
    output: Any
    result: RewardResult


METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
PROMPT_CHARS = 600
"""Prompts longer than this keep their first and last halves of it in ``samples.jsonl``."""
COMPLETION_CHARS = 1500
"""The same for completions."""


class Tracker(Protocol):
    """An experiment tracker fed by :class:`RunLogger` on the main process: the metrics of every
    ``metrics.jsonl`` row (same keys, same step, null values left out) and the ``samples.jsonl`` rows of
    each evaluation."""

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def log_samples(self, rows: list[dict[str, Any]], step: int) -> None: ...

    def close(self) -> None: ...


def _clean(value: Any) -> Any:
    """JSON has no NaN / inf: such metrics are logged as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def shorten(text: str, limit: int) -> str:
    """``text`` if at most ``limit`` characters, else its first and last ``limit / 2`` around a marker
    that counts the characters cut (a prompt's question and a completion's answer are often at the end).

    >>> shorten("0123456789", 4)
    '01 […6 characters…] 89'
    """
    if len(text) <= limit:
        return text
    head = limit // 2
    return f"{text[:head]} […{len(text) - limit} characters…] {text[len(text) - (limit - head):]}"


def as_text(value: Any) -> str:
    """How an example or an output appears in ``samples.jsonl``: a string as it is, an example's
    ``prompt`` (the text tasks' contract), anything else (images, episodes, seeds) by its ``repr``."""
    if isinstance(value, str):
        return value
    prompt = getattr(value, "prompt", None)
    return prompt if isinstance(prompt, str) else repr(value)


def sample_row(step: int, split: str, sample: HeldOutSample) -> dict[str, Any]:
    """One ``samples.jsonl`` row: the output of one held-out example and its verifier's verdict."""
    result = sample.result
    return {"step": step, "split": split, "prompt": shorten(as_text(sample.example), PROMPT_CHARS),
            "completion": shorten(as_text(sample.output), COMPLETION_CHARS), "reward": _clean(float(result.score)),
            "components": {key: _clean(float(value)) for key, value in result.components.items()},
            "info": result.info}


class RunLogger:
    """Writes metrics on the main process only; other processes get a logger that does nothing.
    ``trackers`` receive every row too (the caller opens them on the main process only)."""

    def __init__(self, out: Path, enabled: bool, total_steps: int, start_step: int, tensorboard: bool,
                 progress: bool, trackers: Sequence[Tracker] = ()):
        self.enabled = enabled
        self.path = out / METRICS_FILE
        self.samples_path = out / SAMPLES_FILE
        self.trackers = list(trackers)
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
        metrics = {key: value for key, value in row.items() if key != "step" and value is not None}
        for tracker in self.trackers:
            tracker.log(metrics, row["step"])

    def log_samples(self, step: int, samples: Sequence[tuple[str, HeldOutSample]]) -> None:
        """Append one evaluation's (split, sample) pairs to ``samples.jsonl`` and send them to the trackers
        (before the step's metrics row: trackers need steps in order)."""
        if not self.enabled or not samples:
            return
        rows = [sample_row(step, split, sample) for split, sample in samples]
        with self.samples_path.open("a") as f:
            f.write("".join(json.dumps(row) + "\n" for row in rows))
        for tracker in self.trackers:
            tracker.log_samples(rows, step)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.tb is not None:
            self.tb.close()
        for tracker in self.trackers:
            tracker.close()


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
    """Keep rows with ``step <= last_step`` in ``metrics.jsonl`` and ``samples.jsonl`` (a resumed run
    re-computes the rest); the removed rows are appended to ``metrics.discarded.jsonl`` and
    ``samples.discarded.jsonl``, never thrown away. Returns how many metric rows moved."""
    _truncate_rows(out / SAMPLES_FILE, last_step)
    return _truncate_rows(out / METRICS_FILE, last_step)


def _truncate_rows(path: Path, last_step: int) -> int:
    if not path.is_file():
        return 0
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    keep = [line for line in lines if _step_of(line) <= last_step]  # a torn line has no step: moved
    dropped = [line for line in lines if _step_of(line) > last_step]
    if dropped:
        with path.with_name(f"{path.stem}.discarded.jsonl").open("a") as f:
            f.write("\n".join(dropped) + "\n")
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(line + "\n" for line in keep))
        tmp.replace(path)
    return len(dropped)
