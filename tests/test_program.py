"""Multi-stage recipes (``stages:``, mmrl.core.program): validation before any work, one run folder with
one metrics file, RLoop's keep → RFT → re-initialise chain, evaluation of the result, and exact resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from mmrl.algos.variants.hooks import read_kept
from mmrl.core.config import ConfigError, load_config
from mmrl.core.program import plan

ROOT = Path(__file__).resolve().parent.parent
SMALL = {"trainer": {"steps": 4, "minibatches": 1, "ppo_epochs": 1}, "checkpoint": {"every": 2},
         "eval": {"every": 2, "num_examples": 16}, "rollout": {"prompts_per_step": 8, "group_size": 4},
         "warm_start": {"sft_steps": 60}, "log": {"progress": False, "tensorboard": False}}
RFT = {"warm_start.sft_steps": 5, "warm_start.batch_size": 8, "warm_start.lr": 1.0e-3}


def recipe(tmp_path: Path, stages: list[dict], **sections) -> Path:
    """The RLoop recipe, shortened, with ``stages``."""
    data = yaml.safe_load((ROOT / "configs/rloop/tiny_cpu.yaml").read_text())
    for name, values in {**SMALL, **sections}.items():
        data[name] = {**data.get(name, {}), **values}
    data["stages"] = stages
    path = tmp_path / "program.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


RLOOP = [{"name": "rl1", "kind": "train"},
         {"name": "rft1", "kind": "rft", "init": "rl1@start", "data": ["rl1"], "overrides": RFT},
         {"name": "rl2", "kind": "train"},
         {"name": "check", "kind": "eval"}]


@pytest.mark.parametrize("stages, message", [
    ([{"name": "a"}, {"name": "a"}], "the name is used twice"),
    ([{"name": "a b"}], "a name is letters"),
    ([{"name": "a", "init": "b"}], "init must be"),
    ([{"name": "a"}, {"name": "b", "init": "a@end"}], "init must be"),
    ([{"name": "a", "kind": "rft"}], "needs data"),
    ([{"name": "a", "kind": "sft"}, {"name": "b", "kind": "rft", "data": ["a"]}], "not an earlier train stage"),
    ([{"name": "a", "data": ["a"]}], "data is for rft stages"),
    ([{"name": "a", "kind": "tune"}], "stages"),
])
def test_malformed_programs_are_refused_before_any_work(tmp_path, stages, message):
    with pytest.raises(ConfigError, match=message):
        load_config(str(recipe(tmp_path, stages)))


def test_a_stage_override_typo_names_the_stage(tmp_path):
    cfg = load_config(str(recipe(tmp_path, [{"name": "rl1", "overrides": {"trainer.stepz": 3}}])))
    with pytest.raises(ConfigError, match="stage 'rl1'.*stepz"):
        plan(cfg)


def test_rft_needs_rows_kept_by_its_data_stage(tmp_path):
    path = recipe(tmp_path, [{"name": "rl1", "overrides": {"rollout.keep_successes": None}},
                             {"name": "rft1", "kind": "rft", "data": ["rl1"], "overrides": RFT}])
    with pytest.raises(ConfigError, match="set rollout.keep_successes in 'rl1'"):
        plan(load_config(str(path)))


def test_init_from_excludes_a_warm_start(sanity_config):
    with pytest.raises(ConfigError, match="warm_start.init_from"):
        sanity_config("warm_start.init_from=/somewhere")


def mmrl(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "mmrl"), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=env)


def metric_rows(out: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def rloop_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("program")
    out = folder / "run"
    done = mmrl("train", str(recipe(folder, RLOOP)), "--out", str(out), "--no-plot")
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_stages_run_in_order_in_one_folder_with_one_metrics_file(rloop_run):
    state = json.loads((rloop_run / "program.json").read_text())
    assert [d["name"] for d in state["done"]] == ["rl1", "rft1", "rl2", "check"]
    rows = metric_rows(rloop_run)
    assert [r["stage"] for r in rows][0] == "rl1" and rows[-1]["stage"] == "check"
    steps = [r["step"] for r in rows]
    assert steps == sorted(steps) and steps[-1] == 8  # RL steps over the program: 4 + 4
    assert [r["stage_step"] for r in rows if r["stage"] == "rl2"] == [0, 1, 2, 3, 4]
    assert all("eval/reward_mean" in r for r in rows if r["stage"] in ("rft1", "check"))


def test_rloop_chain_rft_refines_the_rl_start_on_its_successes(rloop_run):
    state = {d["name"]: d for d in json.loads((rloop_run / "program.json").read_text())["done"]}
    # RFT starts where rl1 started (RLoop re-initialises), not from rl1's result; rl2 starts from RFT's result
    assert state["rft1"]["start"] == state["rl1"]["start"] == "stages/01_rl1.start"
    assert state["rl2"]["start"] == state["rft1"]["result"]
    kept = read_kept(rloop_run / "stages" / "01_rl1", 4)
    rows = metric_rows(rloop_run)
    assert len(kept) == sum(r["rollout/kept_rows"] for r in rows if r["stage"] == "rl1" and "rollout/kept_rows" in r)
    assert next(r for r in rows if r["stage"] == "rft1")["rft/rows"] == len(kept) > 0
    assert all(output == example.target for example, output in kept)  # score 1 = an exact reversal

    def weights(relative: str) -> dict:
        from safetensors.torch import load_file
        return load_file(str(rloop_run / relative / "model.safetensors"))

    start, result = weights(state["rft1"]["start"]), weights(state["rft1"]["result"])
    assert any(not torch.equal(start[k], result[k]) for k in start)
    # the eval stage evaluates rl2's result: the same numbers as rl2's last evaluation
    last_rl2 = [r for r in rows if r["stage"] == "rl2"][-1]
    check = rows[-1]
    assert check["eval/reward_mean"] == pytest.approx(last_rl2["eval/reward_mean"])


def test_mmrl_eval_of_a_program_run_uses_its_last_result(rloop_run, tmp_path):
    """The run folder evaluates as its last stage's policy: the numbers the program logged for it."""
    out = tmp_path / "eval.json"
    done = mmrl("eval", "sanity/reverse-v0", "--model", str(rloop_run), "--num-examples", "16", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    (metrics,) = json.loads(out.read_text())["metrics"].values()
    assert metrics["reward_mean"] == pytest.approx(metric_rows(rloop_run)[-1]["eval/reward_mean"])


def test_a_program_killed_inside_a_stage_resumes_exactly(rloop_run, tmp_path):
    path = recipe(tmp_path, RLOOP)
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([str(Path(sys.executable).parent / "mmrl"), "train", str(path), "--out", str(out),
                             "--no-plot"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rl2 = out / "stages" / "03_rl2" / "metrics.jsonl"
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline and not (
            rl2.is_file() and any(json.loads(line)["step"] >= 1 for line in rl2.read_text().splitlines())):
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert [d["name"] for d in json.loads((out / "program.json").read_text())["done"]] == ["rl1", "rft1"]
    done = mmrl("train", str(path), "--out", str(out), "--no-plot", "--resume", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert metric_rows(out) == metric_rows(rloop_run)
