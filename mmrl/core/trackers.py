"""Experiment trackers beside ``metrics.jsonl``: Weights & Biases (``log.wandb``) and Trackio (``log.trackio``).

Each implements :class:`mmrl.core.logging.Tracker`: it gets every ``metrics.jsonl`` row with the same keys
(``reward/*``, ``loss/*``, ``policy/*``, ``rollout/*``, ``eval/*``, ``perf/*``, ``train/*``) at the same step,
and at each evaluation the ``samples.jsonl`` rows as one table, ``eval/samples`` (one row per sample:
step, split, prompt, completion, reward, info, then one column per reward component). Trackers run on the
main process only. The packages are optional extras (``pip install 'mmrl[track]'``), imported only when
a tracker is on; a missing one fails validation (:func:`mmrl.core.config.validate`) before any work.

Where the data goes without network:
- W&B ``mode: offline`` writes ``OUT/wandb/offline-run-<time>-<id>/`` (``wandb sync`` uploads it later);
- Trackio logs to its local SQLite store, one database per project in ``$TRACKIO_DIR`` (default
  ``~/.cache/huggingface/trackio``; trackio reads the variable once, when it is first imported), so that
  ``trackio show --project mmrl`` compares the project's runs.

Each ``mmrl train`` invocation is one tracker run; a resumed run starts a new one at the checkpoint's step.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from mmrl.core.config import ConfigError, TrackioConfig, TrainConfig, WandbConfig
from mmrl.core.logging import Tracker
from mmrl.core.typed import to_dict

SAMPLES_KEY = "eval/samples"
"""Key of the samples table in the trackers."""
SAMPLE_COLUMNS = ("step", "split", "prompt", "completion", "reward", "info")


def open_trackers(cfg: TrainConfig, out: Path) -> list[Tracker]:
    """The trackers ``cfg.log`` turns on, each started as one run named after ``out`` (unless named) whose
    config is the resolved run config."""
    trackers: list[Tracker] = []
    if cfg.log.wandb_settings is not None:
        trackers.append(WandbTracker(cfg.log.wandb_settings, out, to_dict(cfg)))
    if cfg.log.trackio_settings is not None:
        trackers.append(TrackioTracker(cfg.log.trackio_settings, out, to_dict(cfg)))
    return trackers


def sample_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """``samples.jsonl`` rows as (columns, data): the fixed columns, then each reward component's own
    (sorted; empty where a row's verifier has no such component) so that trackers can sort by them."""
    components = sorted({name for row in rows for name in row["components"]})
    columns = [*SAMPLE_COLUMNS, *components]
    data = [[row[c] for c in SAMPLE_COLUMNS] + [row["components"].get(name) for name in components] for row in rows]
    return columns, data


def _require(package: str) -> ModuleType:
    try:
        return importlib.import_module(package)
    except ImportError as err:
        raise ConfigError(f"log.{package} needs `pip install {package}` (or `pip install 'mmrl[track]'`): {err}") from None


class RunTracker:
    """One run of a tracker package whose API is wandb's: ``run.log(values, step=)`` and ``package.Table``."""

    def __init__(self, package: ModuleType, run: Any):
        self.package, self.run = package, run

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_samples(self, rows: list[dict[str, Any]], step: int) -> None:
        columns, data = sample_table(rows)
        self.run.log({SAMPLES_KEY: self.package.Table(columns=columns, data=data)}, step=step)

    def close(self) -> None:
        self.run.finish()


class WandbTracker(RunTracker):
    """A Weights & Biases run under ``OUT/wandb/`` (offline: nothing leaves the machine)."""

    def __init__(self, settings: WandbConfig, out: Path, config: dict[str, Any]):
        wandb = _require("wandb")
        super().__init__(wandb, wandb.init(project=settings.project, entity=settings.entity,
                                           name=settings.name or out.name, mode=settings.mode, dir=str(out),
                                           config=config))


class TrackioTracker(RunTracker):
    """A Trackio run in trackio's local store (and a Hugging Face Space when ``space_id`` is set)."""

    def __init__(self, settings: TrackioConfig, out: Path, config: dict[str, Any]):
        trackio = _require("trackio")
        super().__init__(trackio, trackio.init(project=settings.project, name=settings.name or out.name,
                                               space_id=settings.space_id, config=config))

    def close(self) -> None:
        self.package.finish()  # finishes the current run (this one) and clears it, so exit does not finish it again
