"""bench/gpu_check.sh, the one prepared GPU run: valid bash, every script and test it calls exists, its GPU
pieces' time limits fit in 10 minutes, and (slow) its reduced CPU form runs end to end into one JSON."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
PIECES = ["vlm_3b_hf", "vllm_test", "vlm_3b_vllm", "sd3_flow_grpo", "fsdp_1gpu"]


def branch(mode: str) -> list[str]:
    """The ``run_piece`` / ``skip_piece`` lines of the script's GPU or CPU branch (continuations joined)."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    gpu, cpu = text.split("if [[ $MODE == gpu ]]; then", 1)[1].split("\nelse\n", 1)
    body = gpu if mode == "gpu" else cpu.split("\nfi\n", 1)[0]
    return [line.strip() for line in body.splitlines() if line.strip().startswith(("run_piece", "skip_piece"))]


def test_the_script_is_valid_bash_naming_existing_files_within_ten_minutes():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    assert os.access(SCRIPT, os.X_OK)
    for mode in ("gpu", "cpu"):
        lines = branch(mode)
        assert [line.split()[1] for line in lines] == PIECES, mode
        for path in re.findall(r"\b((?:bench|tests)/[\w/]+\.py)\b", " ".join(lines)):
            assert (ROOT / path).is_file(), f"{mode}: {path} does not exist"
    limits = [int(line.split()[2]) for line in branch("gpu")]
    assert sum(limits) <= 570, limits  # 10 minutes with 30 s to spare for starting and merging


@pytest.mark.slow
def test_the_reduced_cpu_form_runs_every_piece_into_one_json(tmp_path):
    """About 80 s on 2 CPU cores (the FSDP piece launches 2 × 2 processes)."""
    env = {**os.environ, "PYTHON": sys.executable, "MMRL_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([str(SCRIPT), "--cpu", str(tmp_path / "out")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["mode"] == "cpu" and list(results["pieces"]) == PIECES
    status = {name: piece["status"] for name, piece in results["pieces"].items()}
    vllm_installed = subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True).returncode == 0
    assert status == {"vlm_3b_hf": "ok", "vllm_test": "ok" if vllm_installed else "skipped", "vlm_3b_vllm": "skipped",
                      "sd3_flow_grpo": "ok", "fsdp_1gpu": "ok"}, status
    pieces = results["pieces"]
    assert pieces["vlm_3b_hf"]["result"]["rollout_tokens_per_s"] > 0
    assert pieces["sd3_flow_grpo"]["result"]["skipped_updates"] == 0
    assert pieces["fsdp_1gpu"]["result"]["resume_metrics_equal"] and pieces["fsdp_1gpu"]["result"]["resume_policy_bytes_equal"]
