"""Output folders that mmrl writes: recognised by a marker, replaced only file by file, locked while in use.

Every folder that a command writes (``mmrl train``'s run folder, ``mmrl sft``'s policy folder, a world
model, an image-generation pipeline, ...) holds a marker file, ``.mmrl-run``, written when the folder is
created. ``--overwrite`` replaces only a marked folder, and within it only the entries mmrl writes there:
a folder that holds anything else is refused, never emptied. (A file named ``config.yaml`` is not proof
of a run folder: any project may have one.)

A run folder is also locked while a run uses it (an advisory ``flock`` on ``.mmrl-run.lock``), so that a
second ``mmrl train --out`` on the same folder, with or without ``--resume`` / ``--overwrite``, fails at
once instead of interleaving checkpoints. The operating system drops the lock when the process ends,
also when it crashes or is killed.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import IO

MARKER = ".mmrl-run"
LOCK_FILE = ".mmrl-run.lock"

# What ``mmrl train`` (and the per-domain scripts) write at the top of a run folder.
TRAIN_ENTRIES = ("config.yaml", "metrics.jsonl", "metrics.discarded.jsonl", "samples.jsonl", "samples.discarded.jsonl",
                 "checkpoints", "tb", "wandb", "curves.png", "plans.gif",  # plans.gif: scripts/train_driving.py
                 "kept",  # rollout.keep_successes
                 "hook_state",  # rollout hooks whose checkpointed state holds examples (mmrl/algos/variants/replay.py)
                 "stages", "program.json")  # multi-stage recipes (mmrl.core.program)


class FolderInUseError(RuntimeError):
    """Another process holds the folder's lock."""


# Locks this process holds, by resolved folder. Re-entry from the same process (a second Trainer on the
# folder after the first ended) replaces the handle; another process is refused.
_HELD: dict[Path, IO] = {}


def is_marked(folder: Path) -> bool:
    return (folder / MARKER).is_file()


def marked_entries(folder: Path) -> set[str]:
    """The top-level entries mmrl wrote in ``folder`` (from its marker), marker and lock included."""
    data = json.loads((folder / MARKER).read_text())
    return {*data["entries"], MARKER, LOCK_FILE}


def write_marker(folder: Path, kind: str, entries: Iterable[str]) -> None:
    """Mark ``folder`` as written by ``mmrl <kind>``, holding (at most) ``entries`` at its top level."""
    (folder / MARKER).write_text(json.dumps({"kind": kind, "entries": sorted(set(entries))}) + "\n")


def mark_written(folder: Path, kind: str) -> None:
    """Mark a folder that was written in one go (e.g. into a temporary folder then renamed): its
    entries now are all that mmrl wrote."""
    write_marker(folder, kind, [p.name for p in folder.iterdir()])


def unknown_entries(folder: Path) -> list[str]:
    """Entries of ``folder`` that mmrl did not write; every entry when the folder is not marked."""
    known = marked_entries(folder) if is_marked(folder) else set()
    tmp_names = {f".{name}.tmp" for name in known}  # left by an interrupted atomic write
    return sorted(p.name for p in folder.iterdir() if p.name not in known | tmp_names)


def clear_for_overwrite(folder: Path, what: str) -> None:
    """Remove what mmrl wrote in ``folder`` (``--overwrite``), refusing a folder that is not ours or
    holds other files. The folder itself, its marker and its lock file stay."""
    if not is_marked(folder):
        raise FileExistsError(f"refusing to --overwrite {folder}: it holds files but is not a folder written "
                              f"by {what} (no {MARKER} marker); choose another --out or empty it yourself")
    unknown = unknown_entries(folder)
    if unknown:
        shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise FileExistsError(f"refusing to --overwrite {folder}: it holds files {what} did not write ({shown}); "
                              f"move them away or choose another --out")
    for entry in folder.iterdir():
        if entry.name in (MARKER, LOCK_FILE):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def prepare_out_dir(out: Path, resume: bool, overwrite: bool) -> None:
    """Refuse to clobber a previous run: ``--resume`` continues it, ``--overwrite`` replaces it. Locks
    the folder for the life of this process (or until :func:`release_lock`)."""
    if resume:
        if not (out / "config.yaml").is_file():
            raise FileNotFoundError(f"--resume {out}: no run there (config.yaml missing)")
        lock(out)
        return
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out} already holds files; pass --resume to continue that run or "
                                  f"--overwrite to replace it")
        if not is_marked(out):
            raise FileExistsError(f"refusing to --overwrite {out}: it holds files but is not an mmrl run "
                                  f"folder (no {MARKER} marker); choose another --out or empty it yourself")
        lock(out)  # before removing anything: a run still writing there keeps its files
        clear_for_overwrite(out, "mmrl train")
    else:
        out.mkdir(parents=True, exist_ok=True)
        lock(out)
    write_marker(out, "train", TRAIN_ENTRIES)


def prepare_atomic_out(out: Path, overwrite: bool, what: str) -> None:
    """For a folder written in one go (into ``.<name>.tmp``, then renamed): refuse an existing folder
    without ``overwrite``; with it, remove only what ``what`` wrote there (the folder stays, empty, and
    the rename replaces it)."""
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out} already holds files; pass --overwrite to replace it")
        clear_for_overwrite(out, what)
        for name in (MARKER, LOCK_FILE):
            (out / name).unlink(missing_ok=True)


def lock(out: Path) -> None:
    """Take the folder's advisory lock, or fail naming the folder."""
    key = out.resolve()
    held = _HELD.pop(key, None)
    if held is not None:
        held.close()
    handle = open(out / LOCK_FILE, "a+")  # noqa: SIM115 (held for the run's life)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise FolderInUseError(f"{out} is in use by another mmrl run (it holds the lock {out / LOCK_FILE}); "
                               f"wait for that run to end or choose another --out") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    _HELD[key] = handle


def release_lock(out: Path) -> None:
    """Drop this process's lock on ``out`` (no-op when it holds none)."""
    held = _HELD.pop(out.resolve(), None)
    if held is not None:
        held.close()


def remove_if_unused(out: Path) -> None:
    """Remove a run folder that holds nothing but its marker and lock (a run that failed before
    writing anything); any other folder is left as it is."""
    if not out.is_dir() or {p.name for p in out.iterdir()} - {MARKER, LOCK_FILE}:
        return
    release_lock(out)
    for name in (MARKER, LOCK_FILE):
        (out / name).unlink(missing_ok=True)
    out.rmdir()
