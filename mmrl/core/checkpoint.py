"""Atomic checkpoints and exact resume.

``OUT/checkpoints/step_<k>/`` holds accelerate's state (model, optimizer, scheduler, RNG; sharded
correctly under FSDP/DeepSpeed), ``policy/`` in the ecosystem's format (loads without mmrl), and
``trainer_state.json`` (step, data-iterator RNG state, counters, config fingerprint). A checkpoint
is written to a temporary folder and renamed into place, so a killed run never leaves a partial
one; ``OUT/checkpoints/latest`` names the newest. ``OUT/checkpoints/best/`` (``checkpoint.best_metric``) holds
the policy that scored best on an evaluation metric, with the run's config and ``best.json``.

Each checkpoint also holds ``manifest.json``: the size and SHA-256 of every other file in it, written
last, before the rename. The checkpoint to resume from (:func:`latest_checkpoint`) is the newest one
whose files match their manifest, so a file damaged later (a full disk, a copy cut short, bit rot) costs
the steps since the previous checkpoint, with a warning naming the file, instead of a crash deep in
``torch.load``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from mmrl.core.config import ConfigError, TrainConfig, dump_config, to_dict
from mmrl.core.logging import truncate_metrics

STATE_FILE = "trainer_state.json"
MANIFEST_FILE = "manifest.json"


class DamagedCheckpointError(FileNotFoundError):
    """No checkpoint of a run has all its files intact."""


class DiskFullError(OSError):
    """The disk of a run folder filled up while the run wrote to it."""


def disk_full_error(err: BaseException, out: Path) -> DiskFullError | None:
    """``err`` as a :class:`DiskFullError` when it comes from a full disk under ``out`` (None otherwise);
    the partial checkpoint being written is removed. torch's writer reports a full disk as
    ``RuntimeError: ... unexpected pos N vs M`` with no errno: then the free space decides."""
    chain, seen = [], err
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    full = any(isinstance(e, OSError) and e.errno == errno.ENOSPC or "No space left" in str(e) for e in chain)
    if not full and isinstance(err, RuntimeError):
        try:
            full = shutil.disk_usage(out).free < 1 << 20
        except OSError:
            return None
    if not full:
        return None
    for partial in (out / "checkpoints").glob(".step_*.tmp"):
        shutil.rmtree(partial, ignore_errors=True)
    return DiskFullError(errno.ENOSPC, f"no space left on the disk of {out} (the partial checkpoint was removed); "
                                       f"free some space, then continue the run with --resume")

# Fields that may change between a run and its resumption without changing the trajectory.
# (trainer.steps too, but only under a constant learning rate: a decaying schedule spans the run.)
RESUMABLE_CHANGES = {("eval", "every"), ("checkpoint", "every"), ("checkpoint", "keep_last"),
                     ("checkpoint", "best_metric"), ("checkpoint", "best_mode"),
                     ("log", "tensorboard"), ("log", "progress"), ("log", "num_samples"), ("log", "wandb"),
                     ("log", "trackio"), ("log", "expected"), ("trainer", "max_skipped_frac")}


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
    """The newest checkpoint of the run in ``out`` whose files match its manifest (None: no checkpoint).
    A damaged newer one is skipped with a one-line warning naming the bad file; when every checkpoint
    is damaged, :class:`DamagedCheckpointError` lists them."""
    root = out / "checkpoints"
    steps = sorted((int(p.name.split("_")[1]) for p in root.glob("step_*")
                    if p.is_dir() and p.name.split("_")[1].isdigit()), reverse=True)
    damaged = []
    for step in steps:
        path = root / f"step_{step}"
        problem = checkpoint_problem(path)
        if problem is None:
            for bad in damaged:
                warn(f"checkpoint {bad}; using {path.name}")
            return path
        damaged.append(f"{path}: {problem}")
    if damaged:
        raise DamagedCheckpointError(f"no intact checkpoint in {root}: " + "; ".join(damaged))
    return None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def checkpoint_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).as_posix() != MANIFEST_FILE)


def write_manifest(folder: Path) -> None:
    """``manifest.json``: size and SHA-256 of every file of the checkpoint (``policy/`` and the RNG
    states of every process included)."""
    files = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": file_sha256(p)}
             for p in checkpoint_files(folder)}
    (folder / MANIFEST_FILE).write_text(json.dumps({"files": files}, indent=1))


_UNVERIFIED_WARNED: set[Path] = set()


def checkpoint_problem(folder: Path) -> str | None:
    """What is wrong with the checkpoint in ``folder`` (its first damaged file), or None when every file
    matches the manifest. A checkpoint written before manifests existed is accepted when its state file
    reads (with a warning, once per run folder)."""
    manifest = folder / MANIFEST_FILE
    if not manifest.is_file():
        try:
            json.loads((folder / STATE_FILE).read_text())
        except (OSError, ValueError) as err:
            return f"{STATE_FILE} does not read ({type(err).__name__}: {err})"
        if folder.parent not in _UNVERIFIED_WARNED:
            _UNVERIFIED_WARNED.add(folder.parent)
            warn(f"{folder} has no {MANIFEST_FILE} (written by an older mmrl): its files are not verified")
        return None
    try:
        files = json.loads(manifest.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"{MANIFEST_FILE} does not read ({type(err).__name__})"
    for name, want in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != want["size"]:
            return f"{name} is {size} bytes, the manifest says {want['size']} (truncated or overwritten)"
        if file_sha256(path) != want["sha256"]:
            return f"{name} does not match its SHA-256 in the manifest (corrupted)"
    return None


def warn(message: str) -> None:
    print(f"mmrl: warning: {message}", file=sys.stderr, flush=True)


def read_state(path: Path) -> dict[str, Any]:
    return json.loads((path / STATE_FILE).read_text())


def finalize(tmp: Path, final: Path, state: dict[str, Any], keep_last: int) -> None:
    """Main process: write the state file and the manifest, move ``tmp`` into place, update ``latest``, prune."""
    (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
    write_manifest(tmp)
    if final.exists():  # a checkpoint of the same step from a run that was resumed before it
        shutil.rmtree(final)
    os.replace(tmp, final)
    write_text_atomic(final.parent / "latest", final.name)
    if keep_last > 0:
        steps = sorted(int(p.name.split("_")[1]) for p in final.parent.glob("step_*") if p.is_dir())
        for old in steps[:-keep_last]:
            shutil.rmtree(final.parent / f"step_{old}", ignore_errors=True)


@contextlib.contextmanager
def whole_weights_on_main(engine: Any, policy: torch.nn.Module) -> Iterator[None]:
    """On the main process, ``policy``'s sharded (FSDP2 DTensor) parameters are replaced by whole CPU
    tensors for the duration, so that its own ``save_pretrained`` (whose ``state_dict`` FSDP would
    otherwise hand shards) writes whole weights. All processes enter: the weights are gathered with
    torch's distributed-checkpoint API. Without sharding it does nothing."""
    if not engine.sharded:
        yield
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.tensor import DTensor

    whole = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    swapped = []
    if engine.is_main:
        # One whole tensor per parameter, set wherever that parameter is registered: tied weights
        # (embeddings = LM head) stay tied, which save_pretrained relies on.
        replacement = {id(param): torch.nn.Parameter(whole[name], requires_grad=param.requires_grad)
                       for name, param in policy.named_parameters() if isinstance(param, DTensor)}
        for module in policy.modules():
            for attr, param in list(module._parameters.items()):
                if param is not None and id(param) in replacement:
                    module._parameters[attr] = replacement[id(param)]
                    swapped.append((module, attr, param))
    try:
        yield
    finally:
        for owner, attr, param in swapped:
            owner._parameters[attr] = param


def save(engine: Any, policy: Any, out: Path, step: int, state: dict[str, Any], keep_last: int) -> None:
    """Write ``checkpoints/step_<step>``: accelerate's state (model, optimizer, scheduler, every process's RNG
    states; sharded under FSDP), the policy in its ecosystem's format (``policy/``, whole weights) and
    ``state``; atomically, all processes."""
    final = checkpoint_dir(out, step)
    tmp = final.with_name(f".{final.name}.tmp")
    if engine.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
    engine.wait()
    engine.accelerator.save_state(str(tmp))
    engine.wait()  # every process has written its RNG state into tmp before it is renamed
    with whole_weights_on_main(engine, policy):
        if engine.is_main:
            policy.save_pretrained(str(tmp / "policy"))
    if engine.is_main:
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


PROGRAM_FILE = "program.json"  # a multi-stage run's progress (mmrl.core.program)


def final_policy(run: Path) -> Path | None:
    """The result policy of a completed multi-stage run (None when ``run`` is not one, or not finished)."""
    path = Path(run) / PROGRAM_FILE
    if not path.is_file():
        return None
    final = json.loads(path.read_text()).get("final_policy")
    return None if final is None else Path(run) / final


BEST_DIR = "best"
BEST_FILE = "best.json"


def is_better(value: float, best: float | None, mode: str) -> bool:
    """Whether ``value`` beats ``best`` (None: nothing yet) under ``mode`` (``max`` | ``min``); a tie does not."""
    if best is None:
        return True
    return value > best if mode == "max" else value < best


def save_best(engine: Any, policy: Any, out: Path, cfg: TrainConfig, record: dict[str, Any]) -> None:
    """Write the policy to ``OUT/checkpoints/best/`` (its ecosystem's format, the run's ``config.yaml`` and
    ``record`` as ``best.json``), replacing the previous best atomically; all processes."""
    final = out / "checkpoints" / BEST_DIR
    tmp = final.with_name(f".{BEST_DIR}.tmp")
    if engine.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
    with whole_weights_on_main(engine, policy):
        if engine.is_main:
            policy.save_pretrained(str(tmp))
    if engine.is_main:
        dump_config(cfg, tmp / "config.yaml")
        (tmp / BEST_FILE).write_text(json.dumps(record, indent=1))
        old = final.with_name(f".{BEST_DIR}.old")
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    engine.wait()


def drop_best_after(out: Path, step: int) -> None:
    """On resume from ``step``: remove a best policy written at a later step (the steps about to be replayed
    write it again if it is still the best)."""
    folder = out / "checkpoints" / BEST_DIR
    try:
        saved = json.loads((folder / BEST_FILE).read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    if saved > step:
        shutil.rmtree(folder, ignore_errors=True)
