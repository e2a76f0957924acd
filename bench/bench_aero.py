"""AERO vs GRPO at equal updates: samples generated, rows trained and wall clock, interleaved.

    OMP_NUM_THREADS=1 python bench/bench_aero.py [OUT_DIR]

Runs (GRPO, AERO) pairs of 30-step sanity runs for seeds 0, 1, 2 alternately (the `grpo` and `aero`
arms of `mmrl sweep`) and prints the AERO / GRPO ratio of each quantity per pair and its median.
"""
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import transformers

from mmrl.core.config import load_config
from mmrl.experiments.sweep import SWEEP_ARMS
from mmrl.core.trainer import Trainer

transformers.utils.logging.disable_progress_bar()
base = ["trainer.steps=30", "eval.every=0", "eval.num_examples=16", "checkpoint.every=0", "log.progress=false",
        "log.tensorboard=false"]
out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="bench_aero_"))
res = {"grpo": [], "aero": []}
for rep in range(3):
    for arm in ("grpo", "aero"):
        cfg = load_config("sanity/tiny_cpu", [*base, *SWEEP_ARMS.get(arm).overrides, f"trainer.seed={rep}"])
        t = Trainer(cfg, out / f"{arm}_{rep}", overwrite=True)
        start = time.perf_counter()
        t.train()
        rows = [json.loads(l) for l in (out / f"{arm}_{rep}" / "metrics.jsonl").open()][1:]
        res[arm].append({"wall_s": time.perf_counter() - start,
                         "median_step_s": statistics.median(r["perf/step_s"] for r in rows),
                         "median_rollout_s": statistics.median(r["perf/rollout_s"] for r in rows),
                         "generated": sum(r["rollout/generated"] for r in rows),
                         "trained": sum(r["rollout/trained_rows"] for r in rows)})
        print(arm, rep, res[arm][-1], flush=True)
for key in ("wall_s", "median_step_s", "median_rollout_s", "generated", "trained"):
    ratios = [a[key] / g[key] for a, g in zip(res["aero"], res["grpo"])]
    print(f"aero/grpo {key}: " + ", ".join(f"{r:.3f}" for r in ratios), f"median {statistics.median(ratios):.3f}")
