"""A damaged checkpoint file is found by its manifest: ``--resume`` falls back to the newest intact
checkpoint (one warning naming the file) and reproduces the uninterrupted run; with none intact it is
one clear error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mmrl.core.checkpoint import MANIFEST_FILE
from mmrl.cli import main
from mmrl.core.logging import read_metrics

QUIET = ["log.progress=false", "log.tensorboard=false"]
RUN = ["trainer.steps=4", "checkpoint.every=2", "checkpoint.keep_last=0", "eval.every=2", "eval.num_examples=4",
       "rollout.prompts_per_step=4", "rollout.group_size=2", "trainer.minibatches=1", "warm_start.sft_steps=2"]


def train(out: Path, *flags: str) -> int:
    return main(["train", "sanity/tiny_cpu", *QUIET, *RUN, "--out", str(out), "--no-plot", *flags])


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "ref"
    assert train(out) == 0
    return out


def without_timings(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


def test_every_file_is_in_the_manifest(reference_run):
    folder = reference_run / "checkpoints" / "step_4"
    files = json.loads((folder / MANIFEST_FILE).read_text())["files"]
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {MANIFEST_FILE}
    assert set(files) == on_disk
    assert {"model.safetensors", "optimizer.bin", "custom_checkpoint_0.pkl", "random_states_0.pkl",
            "trainer_state.json", "policy/model.safetensors"} <= on_disk


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.bin", "custom_checkpoint_0.pkl",
                                  "trainer_state.json", "policy/model.safetensors"])
def test_resume_skips_a_truncated_file(reference_run, tmp_path, capsys, name):
    out = tmp_path / "run"
    shutil.copytree(reference_run, out)
    bad = out / "checkpoints" / "step_4" / name
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    capsys.readouterr()
    assert train(out, "--resume") == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1, warnings
    assert f"step_4: {name} is " in warnings[0] and warnings[0].endswith("; using step_2"), warnings
    assert without_timings(read_metrics(out)) == without_timings(read_metrics(reference_run))


def test_no_intact_checkpoint_is_one_clear_error(reference_run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(reference_run, out)
    for step in (2, 4):
        (out / "checkpoints" / f"step_{step}" / "optimizer.bin").write_bytes(b"")
    capsys.readouterr()
    assert train(out, "--resume") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no intact checkpoint" in err[0] and "optimizer.bin is 0 bytes" in err[0], err


def test_a_checkpoint_without_manifest_is_accepted_with_a_warning(reference_run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(reference_run, out)
    for step in (2, 4):
        (out / "checkpoints" / f"step_{step}" / MANIFEST_FILE).unlink()
    capsys.readouterr()
    assert train(out, "trainer.steps=5", "--resume") == 0
    err = capsys.readouterr().err
    assert err.count(f"no {MANIFEST_FILE}") == 1, err
    assert [r["step"] for r in read_metrics(out)] == [0, 1, 2, 3, 4, 5]


# sh -c FILL_DISK sh MOUNT_POINT RUN_FOLDER COMMAND...: the command's exit code; its checkpoints folder on stdout
FILL_DISK = """
set -e
mount -t tmpfs -o size=700k tmpfs "$1"
out="$2"
shift 2
set +e
"$@"
code=$?
ls -A "$out/checkpoints"
exit $code
"""


def test_a_full_disk_is_one_line_and_leaves_no_partial_checkpoint(tmp_path):
    """The run folder on a 700 kB filesystem (a mount namespace of its own): the first checkpoint does
    not fit; torch says ``unexpected pos``, mmrl says the disk is full."""
    import os
    import subprocess
    import sys

    small = tmp_path / "small"
    small.mkdir()
    probe = subprocess.run(["unshare", "-m", "sh", "-c", FILL_DISK, "sh", str(small), str(small), "mkdir",
                            str(small / "checkpoints")], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {probe.stderr.decode().strip()}")
    mmrl = Path(sys.executable).parent / "mmrl"
    out = small / "run"
    proc = subprocess.run(["unshare", "-m", "sh", "-c", FILL_DISK, "sh", str(small), str(out), str(mmrl), "train",
                           "sanity/tiny_cpu", *QUIET, *RUN, "trainer.steps=1", "--out", str(out), "--no-plot"],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        f"mmrl train: error: no space left on the disk of {out} (the partial checkpoint was removed); free some "
        f"space, then continue the run with --resume"], proc.stderr[-3000:]
    assert proc.stdout.split() == [], f"left in checkpoints/: {proc.stdout}"
