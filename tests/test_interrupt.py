"""SIGTERM / SIGINT stop ``mmrl train`` at the next step boundary with a checkpoint and one line; ``--resume``
then reproduces the uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STEPS = 6
OVERRIDES = [f"trainer.steps={STEPS}", "checkpoint.every=0", "eval.every=2", "eval.num_examples=8",
             "rollout.prompts_per_step=4", "rollout.group_size=2", "trainer.minibatches=1", "warm_start.sft_steps=2",
             "log.progress=false", "log.tensorboard=false"]


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    return {**os.environ, "MMRL_CACHE": str(tmp_path_factory.mktemp("mmrl_cache")), "OMP_NUM_THREADS": "1"}


def command(out: Path, *extra: str) -> list[str]:
    return [str(Path(sys.executable).parent / "mmrl"), "train", "sanity/tiny_cpu", *OVERRIDES, "--out", str(out),
            "--no-plot", *extra]


def rows(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines() if (out / "metrics.jsonl").is_file() else []
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")} for line in lines if line.strip()]


@pytest.fixture(scope="module")
def reference(env, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "reference"
    assert subprocess.run(command(out), env=env, cwd=ROOT, capture_output=True, timeout=300).returncode == 0
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_saves_a_checkpoint_and_resume_reproduces_the_run(env, reference, tmp_path, sig):
    out = tmp_path / "run"
    proc = subprocess.Popen(command(out), env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not any(r["step"] >= 1 for r in rows(out)) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 128 + sig, stderr[-3000:]
    stopped = rows(out)[-1]["step"]
    assert 1 <= stopped < STEPS
    assert f"interrupted at step {stopped}, checkpoint saved; --resume to continue" in stderr.splitlines()
    assert "Traceback" not in stderr, stderr[-3000:]
    assert (out / "checkpoints" / "latest").read_text().strip() == f"step_{stopped}"

    assert subprocess.run(command(out, "--resume"), env=env, cwd=ROOT, capture_output=True,
                          timeout=300).returncode == 0
    assert rows(out) == rows(reference)
