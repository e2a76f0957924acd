"""A recipe's held-out result over training seeds and torch thread counts, each from an empty cache.

    python scripts/results/seed_range.py configs/spatial_ssrl/tiny_cpu.yaml --out runs/demo_range \\
        --seeds 0 1 2 --threads 1 2 --metric eval/accuracy

For each (seed, threads) it runs ``mmrl train RECIPE --out OUT/s<seed>_t<threads> trainer.seed=<seed>
warm_start.seed=<seed> trainer.threads=<threads>`` with ``MMRL_CACHE=OUT/cache_s<seed>_t<threads>``
(deleted first: the warm start is trained afresh, as on a new machine), then prints the metric at step 0
(the warm start) and at the last step, per run and as a range, and writes OUT/summary.json. A run whose
folder already holds its last step is not run again (``--rerun`` forces it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from mmrl.core.logging import read_metrics


def run(recipe: str, out: Path, seed: int, threads: int, overrides: list[str], rerun: bool,
        fresh_caches: set[Path] | None = None) -> list[dict]:
    """One run. With ``fresh_caches`` (a set of caches already emptied by this invocation) every seed at a
    thread count shares one cache, emptied before its first run; otherwise each run has its own."""
    name = f"s{seed}_t{threads}"
    folder = out / name
    cache = out / (f"cache_t{threads}" if fresh_caches is not None else f"cache_{name}")
    if rerun or not (folder / "metrics.jsonl").is_file() or not (folder / "checkpoints").is_dir():
        if fresh_caches is None or cache not in fresh_caches:
            shutil.rmtree(cache, ignore_errors=True)
            if fresh_caches is not None:
                fresh_caches.add(cache)
        env = os.environ | {"MMRL_CACHE": str(cache), "OMP_NUM_THREADS": str(threads)}
        subprocess.run([sys.executable, "-m", "mmrl.cli", "train", recipe, "--out", str(folder), "--overwrite",
                        "--no-plot", f"trainer.seed={seed}", f"warm_start.seed={seed}", f"trainer.threads={threads}",
                        "log.progress=false", *overrides], check=True, env=env)
    return read_metrics(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--metric", default="eval/reward_mean")
    parser.add_argument("--rerun", action="store_true")
    parser.add_argument("--cache-per-threads", action="store_true",
                        help="share one cache (emptied first) across the seeds of a thread count: for recipes whose "
                             "pretrained start does not depend on the seed (imagegen, VAR), trained once per thread count")
    parser.add_argument("overrides", nargs="*", help="dotted overrides for every run")
    args = parser.parse_args()
    table, fresh = {}, (set() if args.cache_per_threads else None)
    for threads in args.threads:
        for seed in args.seeds:
            evals = [r for r in run(args.recipe, args.out, seed, threads, args.overrides, args.rerun, fresh) if args.metric in r]
            table[f"s{seed}_t{threads}"] = {"seed": seed, "threads": threads, "step": evals[-1]["step"],
                                            "before": evals[0][args.metric], "after": evals[-1][args.metric]}
    (args.out / "summary.json").write_text(json.dumps(table, indent=1))
    print(f"| seed | threads | {args.metric} step 0 | last step |\n|---|---|---|---|")
    for row in table.values():
        print(f"| {row['seed']} | {row['threads']} | {row['before']:.3f} | {row['after']:.3f} (step {row['step']}) |")
    before, after = [r["before"] for r in table.values()], [r["after"] for r in table.values()]
    gains = [r["after"] - r["before"] for r in table.values()]
    print(f"range over {len(table)} runs: step 0 {min(before):.3f}-{max(before):.3f}, last {min(after):.3f}-"
          f"{max(after):.3f}, gain {min(gains):+.3f} to {max(gains):+.3f}")


if __name__ == "__main__":
    main()
