"""Output folders: ``--overwrite`` replaces only folders mmrl marked as its own, and only what mmrl wrote
there; a run folder is locked while a run uses it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mmrl.cli import main
from mmrl.core.run_folder import LOCK_FILE, MARKER

ROOT = Path(__file__).resolve().parent.parent
QUIET = ["log.progress=false", "log.tensorboard=false"]
TINY = ["trainer.steps=1", "eval.num_examples=4", "rollout.prompts_per_step=4", "rollout.group_size=2",
        "trainer.minibatches=1", "warm_start.sft_steps=2"]


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def precious_folder(tmp_path: Path, *names: str) -> Path:
    """A user's folder that happens to hold files with the names mmrl writes, and their own work."""
    folder = tmp_path / "project"
    folder.mkdir()
    for name in names:
        (folder / name).write_text("{}\n")
    (folder / "thesis.txt").write_text("years of work")
    return folder


@pytest.mark.parametrize("argv", [
    ["train", "sanity/tiny_cpu", *QUIET, *TINY],
    ["sft", "sanity/tiny_cpu", *QUIET, "warm_start.sft_steps=2"],
    ["bc", "sanity/tiny_cpu", *QUIET, "warm_start.sft_steps=2"],
    ["pretrain-imagegen", "assets/imagegen/ddim_tiny.json", "--steps", "1", "--no-progress"],
    ["train-world-model", "configs/world_model/reach_tiny.yaml"],
])
def test_overwrite_never_deletes_a_folder_that_merely_looks_like_ours(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.chdir(ROOT)
    folder = precious_folder(tmp_path, "config.yaml", "config.json", "pretrain.json")
    before = files_of(folder)
    assert main([*argv, "--out", str(folder), "--overwrite"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refusing to --overwrite" in err[0] and MARKER in err[0], err
    assert files_of(folder) == before


def test_overwrite_of_our_run_folder_keeps_files_we_did_not_write(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "sanity/tiny_cpu", *QUIET, *TINY, "--out", str(run), "--no-plot"]) == 0
    assert (run / MARKER).is_file()
    (run / "notes.txt").write_text("mine")
    before = files_of(run)
    capsys.readouterr()
    assert main(["train", "sanity/tiny_cpu", *QUIET, *TINY, "--out", str(run), "--overwrite", "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert "did not write (notes.txt)" in err
    assert files_of(run) == before
    (run / "notes.txt").unlink()
    assert main(["train", "sanity/tiny_cpu", *QUIET, *TINY, "trainer.steps=2", "--out", str(run), "--overwrite",
                 "--no-plot"]) == 0
    assert "steps: 2" in (run / "config.yaml").read_text()


def test_sft_overwrite_replaces_its_own_folder(tmp_path, capsys):
    out = tmp_path / "sft"
    args = ["sft", "sanity/tiny_cpu", *QUIET, "warm_start.sft_steps=2", "--out", str(out)]
    assert main(args) == 0 and (out / MARKER).is_file()
    assert main([*args, "warm_start.sft_steps=3", "--overwrite"]) == 0
    assert len(__import__("json").loads((out / "sft_losses.json").read_text())) == 3
    (out / "mine.txt").write_text("mine")
    assert main([*args, "--overwrite"]) == 2
    assert "did not write (mine.txt)" in capsys.readouterr().err and (out / "mine.txt").is_file()


HOLD_LOCK = """
import sys, time
from pathlib import Path
from mmrl.core.run_folder import lock
lock(Path(sys.argv[1]))
print("locked", flush=True)
time.sleep(600)
"""


def test_a_second_run_cannot_use_a_locked_folder(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "sanity/tiny_cpu", *QUIET, *TINY, "checkpoint.every=1", "--out", str(run),
                 "--no-plot"]) == 0
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = files_of(run)
        for flag in ("--resume", "--overwrite"):
            assert main(["train", "sanity/tiny_cpu", *QUIET, *TINY, "--out", str(run), flag, "--no-plot"]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and f"{run} is in use by another mmrl run" in err[0], err
        assert files_of(run) == before
    finally:
        holder.kill()  # a killed run: the operating system drops its lock
        holder.wait()
    assert (run / LOCK_FILE).is_file()
    assert main(["train", "sanity/tiny_cpu", *QUIET, *TINY, "trainer.steps=2", "--out", str(run), "--resume",
                 "--no-plot"]) == 0
