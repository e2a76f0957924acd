"""Atomic checkpoints and exact resume.

``OUT/checkpoints/step_<k>/`` holds accelerate's state (model, optimizer, scheduler, RNG; sharded
correctly under FSDP/DeepSpeed), ``policy/`` in the ecosystem's format (loads without mmrl), and
``trainer_state.json`` (step, data-iterator RNG state, counters, config fingerprint). A checkpoint
is written to a temporary folder and renamed into place, so a killed run never leaves a partial
one; ``OUT/checkpoints/latest`` names the newest.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from mmrl.core.config import ConfigError, TrainConfig, dump_config, to_dict
from mmrl.core.logging import truncate_metrics

STATE_FILE = "trainer_state.json"

# Fields that may change between a run and its resumption without changing the trajectory.
# (trainer.steps too, but only under a constant learning rate: a decaying schedule spans the run.)
RESUMABLE_CHANGES = {("eval", "every"), ("checkpoint", "every"), ("checkpoint", "keep_last"),
                     ("log", "tensorboard"), ("log", "progress"), ("log", "num_samples"), ("log", "wandb"),
                     ("log", "trackio")}


def resumable_changes(cfg: TrainConfig) -> set[tuple[str, str]]:
    if cfg.trainer.lr_schedule == "constant":
        return RESUMABLE_CHANGES | {("trainer", "steps")}
    return RESUMABLE_CHANGES


def config_fingerprint(cfg: TrainConfig) -> str:
    data = to_dict(cfg)
    for section, key in resumable_changes(cfg):
        data[section].pop(key, None)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def checkpoint_dir(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"step_{step}"


def latest_checkpoint(out: Path) -> Path | None:
    pointer = out / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = out / "checkpoints" / pointer.read_text().strip()
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"{pointer} names {path.name}, which is missing or incomplete")
    return path


def read_state(path: Path) -> dict[str, Any]:
    return json.loads((path / STATE_FILE).read_text())


def finalize(tmp: Path, final: Path, state: dict[str, Any], keep_last: int) -> None:
    """Main process: write the state file, move ``tmp`` into place, update ``latest``, prune."""
    (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
    if final.exists():  # a checkpoint of the same step from a run that was resumed before it
        shutil.rmtree(final)
    os.replace(tmp, final)
    write_text_atomic(final.parent / "latest", final.name)
    if keep_last > 0:
        steps = sorted(int(p.name.split("_")[1]) for p in final.parent.glob("step_*") if p.is_dir())
        for old in steps[:-keep_last]:
            shutil.rmtree(final.parent / f"step_{old}", ignore_errors=True)


def save(engine: Any, policy: Any, out: Path, step: int, state: dict[str, Any], keep_last: int) -> None:
    """Write ``checkpoints/step_<step>``: accelerate's state (model, optimizer, scheduler, every process's RNG
    states), the policy in its ecosystem's format (``policy/``) and ``state``; atomically, all processes."""
    final = checkpoint_dir(out, step)
    tmp = final.with_name(f".{final.name}.tmp")
    if engine.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
    engine.wait()
    engine.accelerator.save_state(str(tmp))
    engine.wait()  # every process has written its RNG state into tmp before it is renamed
    if engine.is_main:
        policy.save_pretrained(str(tmp / "policy"))
        finalize(tmp, final, state, keep_last)
    engine.wait()


def load(engine: Any, out: Path, cfg: TrainConfig) -> dict[str, Any]:
    """Restore the latest checkpoint of run ``out`` into the engine's objects; returns its state. The config
    may differ from the checkpoint's only in :data:`RESUMABLE` fields."""
    path = latest_checkpoint(out)
    if path is None:
        raise FileNotFoundError(f"--resume {out}: no checkpoint in {out / 'checkpoints'}")
    state = read_state(path)
    if state["config_fingerprint"] != config_fingerprint(cfg):
        raise ConfigError(f"{path} was written with a different config (only "
                          f"{sorted('.'.join(k) for k in resumable_changes(cfg))} may change on resume); "
                          f"compare with {out / 'config.yaml'}")
    engine.accelerator.load_state(str(path))
    if engine.is_main:
        truncate_metrics(out, state["step"])
        dump_config(cfg, out / "config.yaml")
    return state
