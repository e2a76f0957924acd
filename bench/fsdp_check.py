"""An FSDP2 training run through ``accelerate launch``, and its resume from a checkpoint (bench/gpu_check.sh).

Trains the tiny text recipe (configs/sanity/tiny_cpu.yaml) for 3 steps with checkpoints at steps 2 and 3
(sampling under ``Engine.full_parameters``, sharded update, checkpoint with the whole-weight ``policy/``
folder); then a copy of the run without its step-3 checkpoint is resumed. Reported: the run's last metrics,
the seconds of both runs, the checkpoint's files, and whether the resumed step 3 equals the uninterrupted one
(metrics apart from timings, and the bytes of the exported policy weights).

    python bench/fsdp_check.py --json OUT.json                 # one GPU: configs/accelerate/fsdp.yaml
    python bench/fsdp_check.py --cpu --json OUT.json           # 2 CPU processes: fsdp_cpu_2proc.yaml
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ["configs/sanity/tiny_cpu.yaml", "trainer.steps=3", "rollout.prompts_per_step=8", "rollout.group_size=4",
         "warm_start.sft_steps=5", "eval.num_examples=8", "eval.every=2", "checkpoint.every=2",
         "log.progress=false", "log.tensorboard=false", "--no-plot"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(config: Path, processes: int, out: Path, env: dict[str, str], *extra: str) -> float:
    """``accelerate launch`` of ``mmrl train`` (the tiny text recipe) into ``out``; returns its seconds."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), "--num_processes",
           str(processes), "--main_process_port", str(free_port()), "--fsdp_transformer_layer_cls_to_wrap",
           "Qwen2DecoderLayer", "-m", "mmrl.cli", "train", *TRAIN, "--out", str(out), *extra]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}")
    return time.perf_counter() - start


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def untimed(row: dict) -> dict:
    return {key: value for key, value in row.items() if not key.startswith("perf/")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="2 CPU processes (gloo) instead of one GPU")
    parser.add_argument("--config", type=Path, help="another accelerate FSDP config file (default: see above)")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    args = parser.parse_args()
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    if args.cpu:
        config, processes = ROOT / "configs/accelerate/fsdp_cpu_2proc.yaml", 2
        env |= {"ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
        env.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("fsdp_check.py needs a CUDA device (use --cpu for the 2-process CPU form)")
        config, processes = ROOT / "configs/accelerate/fsdp.yaml", 1
    config = (args.config or config).resolve()

    with tempfile.TemporaryDirectory(prefix="mmrl_fsdp_") as tmp:
        whole, resumed = Path(tmp) / "whole", Path(tmp) / "resumed"
        env["MMRL_CACHE"] = str(Path(tmp) / "cache")
        train_s = launch(config, processes, whole, env)
        shutil.copytree(whole, resumed)
        shutil.rmtree(resumed / "checkpoints" / "step_3")
        (resumed / "checkpoints" / "latest").write_text("step_2")
        resume_s = launch(config, processes, resumed, env, "--resume")
        last, again = rows(whole)[-1], rows(resumed)[-1]
        step3 = whole / "checkpoints" / "step_3"
        exported = sorted(p.name for p in (step3 / "policy").glob("*.safetensors"))
        same_policy = all((step3 / "policy" / name).read_bytes()
                          == (resumed / "checkpoints" / "step_3" / "policy" / name).read_bytes() for name in exported)
        result = {"config": str(config), "processes": processes, "steps": [r["step"] for r in rows(whole)],
                  "train_s": train_s, "resume_s": resume_s, "last_metrics": untimed(last),
                  "checkpoint_files": sorted(str(p.relative_to(step3)) for p in step3.rglob("*") if p.is_file()),
                  "resume_metrics_equal": untimed(last) == untimed(again), "resume_policy_bytes_equal": same_policy}
    print(json.dumps(result, indent=1))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    if not (result["resume_metrics_equal"] and result["resume_policy_bytes_equal"]):
        raise SystemExit("the resumed run differs from the uninterrupted one")


if __name__ == "__main__":
    main()
