"""Checkpoints and resume, end to end through the ``mmrl train`` command line.

A SIGKILLed run resumed with ``--resume`` must reproduce the uninterrupted run's metrics exactly
(timings aside); ``--resume`` refuses a trajectory-changing config; an existing run folder is
never clobbered without ``--overwrite``; checkpoints are written atomically, pruned to
``keep_last`` and their ``policy/`` folder loads with plain transformers.

Each run is a few seconds on 2 CPU cores (tiny sanity recipe, short overrides).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECIPE = str(ROOT / "configs" / "sanity" / "tiny_cpu.yaml")
STEPS = 12
KEEP_LAST = 3
OVERRIDES = [f"trainer.steps={STEPS}", "checkpoint.every=2", f"checkpoint.keep_last={KEEP_LAST}", "eval.every=4",
             "eval.num_examples=16", "warm_start.sft_steps=20", "log.progress=false", "log.tensorboard=false",
             "rollout.prompts_per_step=8"]
KILL_AT = 4  # SIGKILL as soon as a checkpoint of at least this step exists
TIMEOUT = 300


def _mmrl_command() -> list[str]:
    script = Path(sys.executable).parent / "mmrl"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "mmrl.cli"]


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    # One intra-op thread: these tiny models gain nothing from more, and on a busy 2-core machine
    # two threads per run make each run several times slower. Every run here uses the same setting.
    return {**os.environ, "MMRL_CACHE": str(tmp_path_factory.mktemp("mmrl_cache")), "OMP_NUM_THREADS": "1"}


def train_args(out: Path, *extra: str) -> list[str]:
    overrides = [a for a in extra if not a.startswith("--")]
    flags = [a for a in extra if a.startswith("--")]
    return [*_mmrl_command(), "train", RECIPE, *OVERRIDES, *overrides, "--out", str(out), "--no-plot", *flags]


def mmrl_train(env: dict[str, str], out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(train_args(out, *extra), cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT)


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"exit {proc.returncode}\n--- stderr (tail) ---\n{proc.stderr[-4000:]}"
    return proc


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def latest_step(out: Path) -> int | None:
    try:
        name = (out / "checkpoints" / "latest").read_text().strip()
    except FileNotFoundError:
        return None
    return int(name.split("_")[1]) if name.startswith("step_") else None


def same_value(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return a == b
    return a == b or math.isclose(a, b, rel_tol=1e-6, abs_tol=0.0)


def assert_same_metrics(got: list[dict], want: list[dict], what: str = "resumed run") -> None:
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for g, w in zip(got, want):
        g_keys = {k for k in g if not k.startswith("perf/")}
        w_keys = {k for k in w if not k.startswith("perf/")}
        assert g_keys == w_keys, f"step {w['step']}: keys differ: {sorted(g_keys ^ w_keys)}"
        diff = {k: (g[k], w[k]) for k in sorted(w_keys) if not same_value(g[k], w[k])}
        assert not diff, f"step {w['step']}: {what} != uninterrupted run (got, want): {diff}"


@pytest.fixture(scope="module")
def reference_run(env, tmp_path_factory) -> Path:
    """An uninterrupted run; tests that change a run work on a copy."""
    out = tmp_path_factory.mktemp("runs") / "A"
    ok(mmrl_train(env, out))
    return out


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------------------------------------------
def test_sigkill_and_resume_reproduces_metrics(env, reference_run, tmp_path):
    want = metrics(reference_run)
    assert [r["step"] for r in want] == list(range(STEPS + 1))

    out = tmp_path / "B"
    log = (tmp_path / "B.log").open("w")
    proc = subprocess.Popen(train_args(out), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    killed_at = None
    deadline = time.monotonic() + TIMEOUT
    try:
        while time.monotonic() < deadline:
            step = latest_step(out)
            if step is not None and step >= KILL_AT:
                os.kill(proc.pid, signal.SIGKILL)
                killed_at = step
                break
            if proc.poll() is not None:
                break
            time.sleep(0.005)
    finally:
        if proc.poll() is None and killed_at is None:
            proc.kill()
        proc.wait(timeout=60)
        log.close()
    tail = (tmp_path / "B.log").read_text()[-3000:]
    assert killed_at is not None, f"run ended (exit {proc.returncode}) before a checkpoint >= {KILL_AT}:\n{tail}"
    assert proc.returncode == -signal.SIGKILL, f"exit {proc.returncode}; the run ended before the kill:\n{tail}"
    resume_from = latest_step(out)  # may be past killed_at if a checkpoint landed just before the kill
    assert KILL_AT <= resume_from < STEPS
    before = metrics(out)
    assert len(before) < len(want), "the killed run had already logged every step"
    assert before[-1]["step"] < STEPS
    # Rows logged before the kill come from an uninterrupted process: a difference here is
    # run-to-run nondeterminism (e.g. the first run trains the warm start, the second reads it from
    # the cache), not a resume bug.
    assert_same_metrics(before, want[:len(before)], "killed run before the kill")

    ok(mmrl_train(env, out, "--resume"))
    got = metrics(out)
    assert_same_metrics(got, want)
    assert latest_step(out) == STEPS
    assert not list((out / "checkpoints").glob(".step_*.tmp")), "a temporary checkpoint was left behind"
    # Rows computed after the resumed checkpoint were moved aside, not lost.
    discarded = out / "metrics.discarded.jsonl"
    moved = [r["step"] for r in before if r["step"] > resume_from]
    if moved:
        assert [json.loads(x)["step"] for x in discarded.read_text().splitlines()] == moved
    else:
        assert not discarded.exists()


def test_resume_refuses_changed_config(env, reference_run, tmp_path):
    out = copy_run(reference_run, tmp_path / "C")
    config_before = (out / "config.yaml").read_bytes()
    metrics_before = (out / "metrics.jsonl").read_bytes()

    proc = mmrl_train(env, out, "trainer.lr=1e-4", "--resume")
    assert proc.returncode != 0
    assert "different config" in proc.stderr, proc.stderr[-3000:]
    assert (out / "config.yaml").read_bytes() == config_before
    assert (out / "metrics.jsonl").read_bytes() == metrics_before

    # trainer.steps may change on resume: the run continues to the new step count.
    ok(mmrl_train(env, out, f"trainer.steps={STEPS + 2}", "--resume"))
    rows = metrics(out)
    assert [r["step"] for r in rows] == list(range(STEPS + 3))
    assert rows[:STEPS + 1] == metrics(reference_run)
    assert latest_step(out) == STEPS + 2
    updates = rows[STEPS]["policy/version"] // STEPS  # optimizer steps per training step
    assert rows[STEPS + 2]["policy/version"] == rows[STEPS]["policy/version"] + 2 * updates
    assert f"steps: {STEPS + 2}" in (out / "config.yaml").read_text()


def test_out_dir_is_protected(env, reference_run, tmp_path):
    out = copy_run(reference_run, tmp_path / "D")
    files = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    proc = mmrl_train(env, out)
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    assert "--resume" in proc.stderr and "--overwrite" in proc.stderr, proc.stderr[-3000:]
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == files

    ok(mmrl_train(env, out, "trainer.steps=2", "--overwrite"))
    assert [r["step"] for r in metrics(out)] == [0, 1, 2]
    assert sorted(p.name for p in (out / "checkpoints").glob("step_*")) == ["step_2"]
    assert "steps: 2" in (out / "config.yaml").read_text()


def test_checkpoint_is_atomic_and_loadable(reference_run):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpts = reference_run / "checkpoints"
    steps = sorted(int(p.name.split("_")[1]) for p in ckpts.glob("step_*"))
    assert steps == list(range(STEPS - 2 * (KEEP_LAST - 1), STEPS + 1, 2)), "keep_last not honoured"
    for step in steps:
        path = ckpts / f"step_{step}"
        assert (path / "trainer_state.json").is_file()
        assert (path / "policy" / "config.json").is_file()
        assert json.loads((path / "trainer_state.json").read_text())["step"] == step
    assert not [p.name for p in ckpts.iterdir() if p.name.startswith(".")], "temporary files left behind"
    assert (ckpts / "latest").read_text().strip() == f"step_{max(steps)}"

    policy = ckpts / f"step_{max(steps)}" / "policy"
    model = AutoModelForCausalLM.from_pretrained(policy).eval()
    tokenizer = AutoTokenizer.from_pretrained(policy)
    enc = tokenizer(["123>"], return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=False, max_new_tokens=6)
    new = out[0, enc["input_ids"].shape[1]:]
    assert len(new) > 0
    text = tokenizer.decode(new, skip_special_tokens=True)
    assert isinstance(text, str) and set(text) <= set("0123456789>"), text
