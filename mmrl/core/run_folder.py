"""Run folders: what ``--out`` may hold, and when it may be replaced."""

from __future__ import annotations

import shutil
from pathlib import Path


def prepare_out_dir(out: Path, resume: bool, overwrite: bool) -> None:
    """Refuse to clobber a previous run: ``--resume`` continues it, ``--overwrite`` replaces it."""
    if resume:
        if not (out / "config.yaml").is_file():
            raise FileNotFoundError(f"--resume {out}: no run there (config.yaml missing)")
        return
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out} already holds files; pass --resume to continue that run or "
                                  f"--overwrite to replace it")
        if not (out / "config.yaml").is_file():
            raise FileExistsError(f"refusing to --overwrite {out}: it holds files but is not an mmrl run "
                                  f"folder (no config.yaml)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
