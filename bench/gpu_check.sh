#!/usr/bin/env bash
# The GPU checks of the scale paths in one run (under 10 minutes on one H100), written to one JSON file.
#
#   bench/gpu_check.sh [OUT_DIR]          # on a GPU machine (OUT_DIR defaults to runs/gpu_check)
#   bench/gpu_check.sh --cpu [OUT_DIR]    # every piece in its reduced CPU form: checks this script itself
#
# Pieces, in order, each under its own time limit (a failing or timed-out piece is recorded, the next runs):
#   vlm_3b_hf      bench/bench_vlm_gpu.py: random-weight Qwen2.5-VL-3B, HF-generate rollout tokens/s, full
#                  fine-tuning update step, peak memory                        (CPU: --tiny)
#   vllm_test      pytest tests/samplers/test_vllm_sampler.py: the tiny VLM sampled by vLLM, behaviour log-probs
#                  vs re-scoring, weights pushed after a step                  (skips where vllm is not importable)
#   vlm_3b_vllm    bench/bench_vlm_gpu.py --sampler vllm --lora 16: vLLM rollout tokens/s and the time to push
#                  the merged 3.75 B weights into the engine after each step   (CPU: not run, needs vLLM + CUDA)
#   sd3_flow_grpo  bench/bench_sd3_gpu.py: one Flow-GRPO step of flow_grpo/sd3_5_medium_lora_gpu on a
#                  random-weight SD3.5-Medium-shaped pipeline                  (CPU: --tiny)
#   fsdp_1gpu      bench/fsdp_check.py: FSDP2 (configs/accelerate/fsdp.yaml, 1 process) train + exact resume
#                  through accelerate launch                                   (CPU: --cpu, 2 processes)
#
# PYTHON (default: python) runs the pieces; VLLM_PYTHON (default: PYTHON) runs the two vLLM pieces, for GPU
# nodes that keep vLLM (which pins its own torch) in an environment of its own with mmrl installed.
# OUT_DIR/results.json: {"mode", "device", "started", "seconds", "pieces": {name: {"status": ok | failed |
# timed_out | skipped, "rc", "seconds", "result": the piece's JSON or null, "log": its output file}}}.
set -u -o pipefail

MODE=gpu
if [[ "${1:-}" == "--cpu" ]]; then
  MODE=cpu
  shift
fi
OUT=${1:-runs/gpu_check}
PY=${PYTHON:-python}
VLLM_PY=${VLLM_PYTHON:-$PY}
cd "$(dirname "$0")/.." || exit 1
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
: > "$OUT/pieces.tsv"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [[ $MODE == cpu ]]; then
  export OMP_NUM_THREADS=1
fi
START=$(date +%s)

# run_piece NAME LIMIT_S COMMAND... : run COMMAND under `timeout`, output to OUT/NAME.log; the command is
# expected to write OUT/NAME.json (bench scripts' --json). One line per piece in OUT/pieces.tsv (name,
# status, exit code, milliseconds).
run_piece() {
  local name=$1 limit=$2
  shift 2
  local begin rc status
  begin=$(date +%s%N)
  echo "== $name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  case $rc in
    0) status=ok ;;
    124 | 137) status=timed_out ;;
    *) status=failed ;;
  esac
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$((($(date +%s%N) - begin) / 1000000))" >> "$OUT/pieces.tsv"
  echo "   $status (rc $rc); last lines:"
  tail -n 3 "$OUT/$name.log" | sed 's/^/   | /'
}

skip_piece() {  # skip_piece NAME REASON
  printf '%s\tskipped\t\t0\n' "$1" >> "$OUT/pieces.tsv"
  echo "$2" > "$OUT/$1.log"
  echo "== $1: skipped ($2)"
}

if [[ $MODE == gpu ]]; then
  run_piece vlm_3b_hf 140 "$PY" bench/bench_vlm_gpu.py --repeats 2 --json "$OUT/vlm_3b_hf.json"
  run_piece vllm_test 100 "$VLLM_PY" -m pytest -q -p no:cacheprovider tests/samplers/test_vllm_sampler.py -rs
  run_piece vlm_3b_vllm 140 "$VLLM_PY" bench/bench_vlm_gpu.py --sampler vllm --lora 16 --repeats 2 \
    --json "$OUT/vlm_3b_vllm.json"
  run_piece sd3_flow_grpo 120 "$PY" bench/bench_sd3_gpu.py --json "$OUT/sd3_flow_grpo.json"
  run_piece fsdp_1gpu 60 "$PY" bench/fsdp_check.py --json "$OUT/fsdp_1gpu.json"
else
  run_piece vlm_3b_hf 120 "$PY" bench/bench_vlm_gpu.py --tiny --repeats 1 --prompts 2 --group-size 2 \
    --max-new-tokens 8 --image-size 56 --json "$OUT/vlm_3b_hf.json"
  run_piece vllm_test 120 "$VLLM_PY" -m pytest -q -p no:cacheprovider tests/samplers/test_vllm_sampler.py -rs
  skip_piece vlm_3b_vllm "the vLLM sampler needs vllm and a CUDA device"
  run_piece sd3_flow_grpo 120 "$PY" bench/bench_sd3_gpu.py --tiny --json "$OUT/sd3_flow_grpo.json"
  run_piece fsdp_1gpu 180 "$PY" bench/fsdp_check.py --cpu --json "$OUT/fsdp_1gpu.json"
fi

"$PY" - "$OUT" "$MODE" "$START" << 'EOF'
"""Merge the pieces' status lines and JSON results into OUT/results.json."""
import datetime
import json
import re
import sys
import time
from pathlib import Path

out, mode, start = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
try:
    import torch
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
except ImportError:
    device = "unknown (torch not importable)"
pieces = {}
for line in (out / "pieces.tsv").read_text().splitlines():
    name, status, rc, milliseconds = line.split("\t")
    part = out / f"{name}.json"
    log = out / f"{name}.log"
    result = json.loads(part.read_text()) if status == "ok" and part.is_file() else None
    lines = [l for l in log.read_text().splitlines() if l.strip()]
    if rc == "5" and lines and re.fullmatch(r"\d+ skipped in .*", lines[-1]):
        status = "skipped"  # pytest's exit code when every test skipped (vllm not importable, no CUDA)
    if result is None and status in ("ok", "skipped"):  # pytest: its summary line and reasons
        result = {"summary": lines[-1] if lines else "", "skip_reasons": [l for l in lines if l.startswith("SKIPPED")]}
    pieces[name] = {"status": status, "rc": int(rc) if rc else None, "seconds": round(int(milliseconds) / 1000, 1),
                    "result": result, "log": str(log)}
results = {"mode": mode, "device": device, "seconds": round(time.time() - start, 1),
           "started": datetime.datetime.fromtimestamp(start).isoformat(timespec="seconds"), "pieces": pieces}
(out / "results.json").write_text(json.dumps(results, indent=1))
print(json.dumps({name: (p["status"], p["seconds"]) for name, p in pieces.items()}))
print(f"{out / 'results.json'} ({results['seconds']} s in all)")
EOF
