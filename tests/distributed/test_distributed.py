"""Multi-process training on CPU (2 processes, gloo) through ``accelerate launch``.

Runs subprocesses; about a minute in all on 2 CPU cores. Note that ``accelerate launch --cpu
--num_processes 2`` silently runs ONE process: these tests use ``ACCELERATE_USE_CPU=true`` with
``--multi_gpu`` (or configs/accelerate/cpu_2proc.yaml) and check the world size the workers saw.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "update_equivalence.py"
ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch"]
LR = 3e-4  # trainer.lr of configs/sanity/tiny_cpu.yaml


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(MMRL_CACHE=str(tmp_path / "cache"), ACCELERATE_USE_CPU="true", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def run(cmd: list[str], env: dict[str, str], timeout: int = 180) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def launch_two(port: int) -> list[str]:
    return [*ACCELERATE, "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
            "--dynamo_backend", "no", "--main_process_port", str(port)]


def assert_same_update_metrics(m1: dict, m2: dict) -> None:
    """The 1-process and 2-process update logged the same metrics (floats to rounding), two optimizer steps
    with a KL term and a gradient."""
    assert m1.keys() == m2.keys()
    for key, value in m1.items():
        if isinstance(value, float):
            assert m2[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
        else:
            assert m2[key] == value, key
    assert m1["policy/version"] == 2 and m1["loss/kl"] > 0 and m1["policy/grad_norm"] > 0


def test_two_process_update_equals_one_process(tmp_path):
    env = env_for(tmp_path)
    # ppo_epochs 2: two optimizer steps (the second off-policy: ratio ≠ 1, KL to the reference ≠ 0);
    # micro-batches 3 and 5 split groups, and 5 < 16 rows per process exercises DDP's no_sync.
    common = ["--ppo-epochs", "2", "algo.kl_coef=0.05", "algo.entropy_coef=0.01", "trainer.ref_model=copy",
              "trainer.warmup_steps=3"]
    run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "one"), "--result", str(tmp_path / "one.pt"),
         "--micro-batch-size", "3", *common], env)
    run([*launch_two(free_port()), str(SCRIPT), "--out", str(tmp_path / "two"), "--result", str(tmp_path / "two.pt"),
         "--micro-batch-size", "5", *common], env)
    one = torch.load(tmp_path / "one.pt", weights_only=False)
    two = torch.load(tmp_path / "two.pt", weights_only=False)

    assert one["world_size"] == 1 and two["world_size"] == 2
    assert two["rows_per_rank"] * 2 == two["global_rows"] == one["rows_per_rank"]
    assert one["outputs"] == two["outputs"]  # the same global batch
    assert two["max_rank_param_diff"] == 0.0  # DDP kept the replicas identical
    assert one["outcome"].std() > 0  # some reward signal, so the update is not zero

    # The gradients each optimizer step applies agree to float rounding.
    assert len(one["grads"]) == len(two["grads"]) == 2
    for step, (g1, g2) in enumerate(zip(one["grads"], two["grads"])):
        assert g1.keys() == g2.keys()
        for name in g1:
            torch.testing.assert_close(g2[name], g1[name], atol=1e-7, rtol=1e-5, msg=lambda m: f"step {step} {name}: {m}")

    # Parameters: Adam's first step lr·g/(|g|+eps) turns rounding noise in gradients of size ~eps
    # (1e-8) into differences up to ~1e-6, so the tolerance is 1% of the learning rate.
    changed = 0.0
    for name, p1 in one["params"].items():
        torch.testing.assert_close(two["params"][name], p1, atol=0.01 * LR, rtol=1e-5, msg=lambda m: f"{name}: {m}")
        changed = max(changed, float((p1 - one["initial"][name]).abs().max()))
        assert torch.equal(one["initial"][name], two["initial"][name])
    assert changed > 0.5 * LR, f"the update barely moved the parameters ({changed})"
    flat = lambda r: torch.cat([v.flatten() for v in r["params"].values()])  # noqa: E731
    assert float((flat(one) - flat(two)).abs().mean()) < 1e-8

    assert_same_update_metrics(one["metrics"], two["metrics"])


def test_two_process_training_runs(tmp_path):
    env = env_for(tmp_path)
    out = tmp_path / "run"
    # The config-file route; it needs ACCELERATE_USE_CPU=true (set in env) to really start 2 workers.
    cmd = [*ACCELERATE, "--config_file", str(ROOT / "configs/accelerate/cpu_2proc.yaml"),
           "--main_process_port", str(free_port()), "-m", "mmrl.cli", "train", "configs/sanity/tiny_cpu.yaml",
           "trainer.steps=3", "rollout.prompts_per_step=8", "rollout.group_size=4", "warm_start.sft_steps=5",
           "eval.num_examples=8", "checkpoint.every=2", "log.progress=false", "log.tensorboard=false",
           "log.num_samples=2", "log.wandb=true", "--out", str(out), "--no-plot"]
    has_trackio = importlib.util.find_spec("trackio") is not None  # optional: `pip install 'mmrl[track]'`
    cmd += [f"log.trackio={{project: two-proc-{os.getpid()}}}"] if has_trackio else []
    run(cmd, env)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]  # one row per step: only the main process logs
    samples = [json.loads(line)["step"] for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples == [0, 0, 3, 3]  # log.num_samples per evaluation, from the main process only
    assert len(list((out / "wandb").glob("offline-run-*"))) == 1  # one tracker run: the main process's
    if has_trackio:
        from trackio.sqlite_storage import SQLiteStorage  # the store of $TRACKIO_DIR, as the workers had it

        assert SQLiteStorage.get_runs(f"two-proc-{os.getpid()}") == ["run"]
    for row in rows[1:]:
        assert 0.0 <= row["reward/mean"] <= 1.0
        assert row["policy/version"] == 4 * row["step"]  # ppo_epochs 2 × minibatches 2 per step
    assert "eval/reward_mean" in rows[0] and "eval/reward_mean" in rows[-1]
    for step in (2, 3):
        ckpt = out / "checkpoints" / f"step_{step}"
        assert (ckpt / "trainer_state.json").is_file() and (ckpt / "policy" / "config.json").is_file()
        # accelerate saves one RNG state per process: proof that two processes ran.
        assert sorted(p.name for p in ckpt.glob("random_states_*.pkl")) == ["random_states_0.pkl",
                                                                           "random_states_1.pkl"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU machine runs 2 processes without ACCELERATE_USE_CPU")
def test_two_processes_without_accelerate_use_cpu_is_one_line_from_rank_0(tmp_path):
    env = env_for(tmp_path)
    env.pop("ACCELERATE_USE_CPU")
    proc = subprocess.run([*launch_two(free_port()), "-m", "mmrl.cli", "train", "sanity/tiny_cpu", "--out",
                           str(tmp_path / "run"), "log.progress=false"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode != 0
    ours = [line for line in proc.stderr.splitlines() if line.startswith(("mmrl train", "[rank"))]
    assert ours == ["mmrl train: error: launched with WORLD_SIZE=2 but accelerate sees one process; on CPU set "
                    "ACCELERATE_USE_CPU=true (see configs/accelerate/cpu_2proc.yaml)"], proc.stderr[-4000:]
    assert not (tmp_path / "run").exists()


def processes_naming(text: str) -> list[int]:
    """PIDs of the live processes whose command line contains ``text``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (entry / "stat").read_text().split(")")[-1].split()[0]
            except OSError:
                continue
            if text in cmdline and state != "Z":
                pids.append(int(entry.name))
    return pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_killing_the_launcher_stops_its_workers(tmp_path):
    """SIGKILL to `accelerate launch` alone (as when a job's shell dies): its two workers get SIGTERM from
    the kernel and stop at once, instead of training on unowned for ~45 s until a collective times out.
    They save a checkpoint at that step boundary when they can still agree on it (4 runs in 5 here; the
    rendezvous store died with the launcher), so the check on the checkpoint is only that any is sane."""
    import signal
    import time

    out = tmp_path / "orphans"
    cmd = [*launch_two(free_port()), "-m", "mmrl.cli", "train", "configs/sanity/tiny_cpu.yaml", "trainer.steps=500",
           "rollout.prompts_per_step=8", "rollout.group_size=4", "warm_start.sft_steps=5", "eval.every=0",
           "eval.num_examples=8", "checkpoint.every=0", "log.progress=false", "log.tensorboard=false",
           "--out", str(out), "--no-plot"]
    log = open(tmp_path / "launch.log", "w")  # noqa: SIM115
    launcher = subprocess.Popen(cmd, cwd=ROOT, env=env_for(tmp_path), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while not ((out / "metrics.jsonl").is_file() and len((out / "metrics.jsonl").read_text().splitlines()) >= 3):
            assert launcher.poll() is None and time.monotonic() < deadline, "training did not start"
            time.sleep(0.5)
        assert len(processes_naming(str(out))) >= 3  # the launcher and its two workers
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        killed = time.monotonic()
        while processes_naming(str(out)) and time.monotonic() < killed + 15:
            time.sleep(0.2)
        # Without the death signal they trained on unowned for ~45 s, until a collective timed out.
        assert not processes_naming(str(out)), "the workers outlived their launcher by 15 s"
    finally:
        for pid in processes_naming(str(out)):
            os.kill(pid, signal.SIGKILL)
    log.close()
    steps = sorted(int(p.name.split("_")[1]) for p in (out / "checkpoints").glob("step_*"))
    assert all(1 <= step < 500 for step in steps), steps  # a step boundary, not the end of the run


def test_seed_per_example_makes_two_processes_draw_the_one_process_rollouts(tmp_path):
    """rollout.seed_per_example: every example's group is sampled with a seed from its global position, so
    `accelerate launch` with 2 processes trains on the rollouts of the 1-process run (the step-1 rewards are
    equal: same weights, same samples) and the runs agree up to float reduction order afterwards."""
    env = env_for(tmp_path)
    args = ["configs/sanity/tiny_cpu.yaml", "trainer.steps=3", "rollout.prompts_per_step=8", "rollout.group_size=4",
            "warm_start.sft_steps=5", "eval.num_examples=16", "eval.every=0", "checkpoint.every=0",
            "log.progress=false", "log.tensorboard=false", "rollout.seed_per_example=true", "--no-plot"]
    run([sys.executable, "-m", "mmrl.cli", "train", *args, "--out", str(tmp_path / "one")], env)
    run([*launch_two(free_port()), "-m", "mmrl.cli", "train", *args, "--out", str(tmp_path / "two")], env)
    one, two = ([json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
                for name in ("one", "two"))
    assert [r["step"] for r in one] == [r["step"] for r in two] == [0, 1, 2, 3]
    assert one[1]["reward/mean"] == pytest.approx(two[1]["reward/mean"], abs=1e-6)
    assert one[1]["rollout/len_mean"] == pytest.approx(two[1]["rollout/len_mean"], abs=1e-6)
    for a, b in zip(one[2:], two[2:]):
        assert a["reward/mean"] == pytest.approx(b["reward/mean"], abs=1e-4), (a, b)
    assert one[-1]["eval/reward_mean"] == pytest.approx(two[-1]["eval/reward_mean"], abs=1e-4)


def test_a_multi_stage_program_runs_on_two_processes(tmp_path):
    """RL that keeps its successes (both processes' rows) → RFT on the main process → RL from its result."""
    import yaml

    data = yaml.safe_load((ROOT / "configs/rloop/tiny_cpu.yaml").read_text())
    data["trainer"] |= {"steps": 2, "minibatches": 1, "ppo_epochs": 1}
    data["rollout"] |= {"prompts_per_step": 8, "group_size": 4}
    data |= {"eval": {"every": 2, "num_examples": 16}, "log": {"progress": False, "tensorboard": False}}
    data["stages"] = [{"name": "rl1"}, {"name": "rft1", "kind": "rft", "init": "rl1@start", "data": ["rl1"],
                                        "overrides": {"warm_start.sft_steps": 3, "warm_start.batch_size": 8}},
                      {"name": "rl2"}]
    recipe = tmp_path / "program.yaml"
    recipe.write_text(yaml.safe_dump(data))
    out = tmp_path / "run"
    run([*launch_two(free_port()), "-m", "mmrl.cli", "train", str(recipe), "--out", str(out), "--no-plot"],
        env_for(tmp_path), timeout=300)
    state = json.loads((out / "program.json").read_text())
    assert [d["name"] for d in state["done"]] == ["rl1", "rft1", "rl2"]
    kept = sorted(p.name for p in (out / "stages/01_rl1/kept").iterdir())
    assert kept == ["step_1.rank0.pkl", "step_1.rank1.pkl", "step_2.rank0.pkl", "step_2.rank1.pkl"]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in rows if "eval/reward_mean" in r] == ["rl1", "rl1", "rft1", "rl2", "rl2"]
