"""Experiment trackers and the samples table: a tiny real run logs the same metrics, at the same steps,
to ``metrics.jsonl``, an offline W&B run and Trackio's local store, and the same held-out samples to
``samples.jsonl`` and both trackers' tables; with the trackers off (or their packages missing) neither
package is imported, and turning one on without its package fails before any work."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import struct
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mmrl.cli import main
from mmrl.core.config import ConfigError, TrackioConfig, WandbConfig, load_config
from mmrl.core.logging import read_metrics
from mmrl.core.trainer import train
from mmrl.tasks.sanity import ReverseExample, ReverseTask, ReverseConfig

HAS_TRACKIO = importlib.util.find_spec("trackio") is not None

QUIET = ["log.progress=false", "log.tensorboard=false"]
TINY = ["trainer.steps=2", "eval.every=1", "eval.num_examples=4", "rollout.prompts_per_step=4",
        "rollout.group_size=2", "trainer.minibatches=1", "warm_start.sft_steps=5", "log.num_samples=3"]


def read_samples(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]


def wandb_records(path: Path) -> list[Any]:
    """The protobuf records of a W&B ``.wandb`` transaction log: a 7-byte header (``:W&B``, magic, version),
    then LevelDB-log framing in 32 KiB blocks (7-byte record headers: crc32c, length, type FULL/FIRST/MIDDLE/
    LAST = 1/2/3/4; a block tail shorter than a header is padding)."""
    from wandb.proto import wandb_internal_pb2

    data, block, pos, pending, records = path.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def finished_records(run_dir: Path, timeout: float = 60.0) -> list[Any]:
    """The records of an offline W&B run once its log holds the run's ``exit`` record: wandb's service
    process may still be writing the file when ``run.finish()`` has returned."""
    (log,) = run_dir.glob("run-*.wandb")
    deadline = time.monotonic() + timeout
    while True:
        records = wandb_records(log)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def wandb_history(run_dir: Path) -> dict[int, dict[str, Any]]:
    """Step → logged values of an offline W&B run folder (``OUT/wandb/offline-run-*``)."""
    history: dict[int, dict[str, Any]] = {}
    for record in finished_records(run_dir):
        if record.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history.setdefault(items["_step"], {}).update(items)
    return history


def close(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-6))


def assert_same_metrics(rows: list[dict[str, Any]], logged: dict[int, dict[str, Any]], tracker: str) -> None:
    for row in rows:
        for key, value in row.items():
            if key != "step" and value is not None:
                assert close(logged[row["step"]].get(key), value), (tracker, row["step"], key, value)


def test_wandb_offline_and_trackio_log_the_run_and_its_samples(tmp_path):
    out = tmp_path / "tracked"
    project = f"mmrl-test-{os.getpid()}"
    trackio = [f"log.trackio={{project: {project}}}"] if HAS_TRACKIO else []
    cfg = load_config("sanity/tiny_cpu", [*QUIET, *TINY, "log.wandb={mode: offline, project: mmrl-test}", *trackio])
    assert cfg.log.wandb_settings == WandbConfig(project="mmrl-test")
    assert cfg.log.trackio_settings == (TrackioConfig(project=project) if HAS_TRACKIO else None)
    train(cfg, out)
    rows, samples = read_metrics(out), read_samples(out)
    assert [r["step"] for r in rows] == [0, 1, 2]
    by_step = {step: [s for s in samples if s["step"] == step] for step in (0, 1, 2)}
    assert all(len(shown) == 3 for shown in by_step.values())  # log.num_samples rows at each evaluation

    # W&B: one offline run under OUT/wandb, every metric at its step, one table per evaluation
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    history = wandb_history(run_dir)
    assert_same_metrics(rows, history, "wandb")
    for step, shown in by_step.items():
        table = history[step]
        assert table["eval/samples/_type"] == "table-file" and table["eval/samples/nrows"] == 3
        content = json.loads((run_dir / "files" / table["eval/samples/path"]).read_text())
        assert content["columns"] == ["step", "split", "prompt", "completion", "reward", "info", "exact", "position_acc"]
        assert [r[:6] for r in content["data"]] == [[s[c] for c in content["columns"][:6]] for s in shown]
    run_record = next(r.run for r in finished_records(run_dir) if r.HasField("run"))
    assert run_record.display_name == "tracked" and run_record.project == "mmrl-test"
    config = {u.key: json.loads(u.value_json) for u in run_record.config.update}
    assert config["task"]["name"] == "sanity/reverse-v0" and config["trainer"]["steps"] == 2

    if not HAS_TRACKIO:  # an optional extra (`pip install 'mmrl[track]'`); it pins pillow<13, so not in dev
        return
    # Trackio: the local store (TRACKIO_DIR, a fresh folder in the tests) holds the same
    from trackio.sqlite_storage import SQLiteStorage

    assert SQLiteStorage.get_runs(project) == ["tracked"]
    logged: dict[int, dict[str, Any]] = {}
    for entry in SQLiteStorage.get_logs(project, "tracked"):
        logged.setdefault(entry["step"], {}).update(entry)
    assert_same_metrics(rows, logged, "trackio")
    for step, shown in by_step.items():
        table = logged[step]["eval/samples"]
        assert table["_type"] == "trackio.table"
        assert [{k: r[k] for k in ("prompt", "completion", "reward")} for r in table["_value"]] == \
            [{k: s[k] for k in ("prompt", "completion", "reward")} for s in shown]
    assert SQLiteStorage.get_run_config(project, "tracked")["task"]["name"] == "sanity/reverse-v0"


def test_samples_are_the_verifiers_verdicts_on_the_same_examples(tmp_path):
    out = tmp_path / "run"
    train(load_config("sanity/tiny_cpu", [*QUIET, *TINY, "log.num_samples=8"]), out)
    samples = read_samples(out)
    assert len(samples) == 3 * 4  # 3 evaluations, num_examples (4) < num_samples (8)
    task = ReverseTask(ReverseConfig())
    for s in samples:
        assert set(s) == {"step", "split", "prompt", "completion", "reward", "components", "info"} and s["split"] == "test"
        verdict = task.reward(ReverseExample(s["prompt"].removesuffix(">")), s["completion"])
        assert (s["reward"], s["components"], s["info"]) == (verdict.score, verdict.components, verdict.info)
    prompts = [[s["prompt"] for s in samples if s["step"] == step] for step in (0, 1, 2)]
    assert prompts[0] == prompts[1] == prompts[2]  # the same held-out examples at every evaluation


@pytest.fixture
def without_tracker_packages(monkeypatch):
    """As if wandb and trackio were not installed: importing either raises ImportError."""
    for name in ("wandb", "trackio"):
        monkeypatch.setitem(sys.modules, name, None)


def test_trackers_off_import_nothing_and_a_missing_package_fails_first(tmp_path, capsys, without_tracker_packages):
    out = tmp_path / "plain"
    train(load_config("sanity/tiny_cpu", [*QUIET, *TINY]), out)  # would fail if anything imported them
    assert (out / "samples.jsonl").is_file() and not (out / "wandb").exists()
    for key in ("wandb", "trackio"):
        with pytest.raises(ConfigError, match=rf"log.{key} needs `pip install {key}`"):
            load_config("sanity/tiny_cpu", [f"log.{key}=true"])
        run = tmp_path / f"with_{key}"
        assert main(["train", "sanity/tiny_cpu", f"log.{key}=true", "--out", str(run)]) == 2
        assert f"log.{key} needs `pip install {key}`" in capsys.readouterr().err and not run.exists()


@pytest.mark.parametrize("override, message", [
    ("log.wandb={projct: x}", r"unknown key 'projct' in log.wandb \(did you mean 'project'\?\)"),
    ("log.wandb={mode: cloud}", r"log.wandb.mode must be one of 'offline', 'online', got 'cloud'"),
    ("log.trackio={mode: offline}", r"unknown key 'mode' in log.trackio; valid keys: project, name, space_id"),
    ("log.num_samples=-1", r"log.num_samples must be >= 0, got -1"),
])
def test_tracker_settings_are_typed(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("sanity/tiny_cpu", [override])


def test_true_means_the_documented_defaults(sanity_config):
    cfg = sanity_config("log.wandb=true", "log.trackio=false")
    assert cfg.log.wandb_settings == WandbConfig() and cfg.log.wandb_settings.mode == "offline"
    assert cfg.log.trackio_settings is None
    assert sanity_config().log.wandb_settings is None  # off by default


def test_long_prompts_and_completions_keep_their_start_and_end():
    import doctest

    from mmrl.core import logging as run_logging

    assert doctest.testmod(run_logging).failed == 0
    text = "question: " + "x" * 5000 + " answer: 42"
    short = run_logging.shorten(text, run_logging.COMPLETION_CHARS)
    assert short.startswith("question: ") and short.endswith(" answer: 42")
    assert f"[…{len(text) - run_logging.COMPLETION_CHARS} characters…]" in short
    assert len(short) < run_logging.COMPLETION_CHARS + 40


def test_resume_moves_samples_after_the_checkpoint_aside(tmp_path):
    """A resumed run re-evaluates the steps after its checkpoint: their samples move to
    samples.discarded.jsonl with the metric rows, so samples.jsonl holds each evaluation once."""
    from mmrl.core.logging import truncate_metrics

    for name in ("metrics.jsonl", "samples.jsonl"):
        (tmp_path / name).write_text("".join(json.dumps({"step": step}) + "\n" for step in (0, 2, 4, 4)))
    assert truncate_metrics(tmp_path, 2) == 2
    for name in ("metrics", "samples"):
        assert [json.loads(x)["step"] for x in (tmp_path / f"{name}.jsonl").read_text().splitlines()] == [0, 2]
        assert [json.loads(x)["step"] for x in (tmp_path / f"{name}.discarded.jsonl").read_text().splitlines()] == [4, 4]
