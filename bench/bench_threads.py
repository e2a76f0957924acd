"""Step time of a recipe at 1 and at 2 torch threads, on an idle machine and on one kept busy.

Torch's default is one math thread per core. On a 2-core machine shared with other processes (tests,
another run, an editor) those threads spin against them, and a tiny model's step gets many times
slower; ``trainer.threads`` (default 1) is the setting this measures. Each configuration trains the
recipe for ``--steps`` steps (no evaluation, no checkpoints) and reports the median ``perf/step_s`` of
its steps after the first; "loaded" starts ``--load`` busy-looping processes beside it (as many as
cores by default). The configurations run interleaved, ``--repeats`` times; ratios are against
1 thread idle, from the same run.

    python bench/bench_threads.py [--recipe sanity/tiny_cpu] [--steps 12] [--repeats 2]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mmrl.core.logging import read_metrics


def busy() -> None:
    while True:
        pass


def step_times(recipe: str, threads: int, steps: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        env = os.environ | {"MMRL_CACHE": str(Path(tmp) / "cache")}
        env.pop("OMP_NUM_THREADS", None)  # trainer.threads decides
        subprocess.run([sys.executable, "-m", "mmrl.cli", "train", recipe, "--out", str(Path(tmp) / "run"),
                        "--no-plot", f"trainer.threads={threads}", f"trainer.steps={steps}", "eval.every=0",
                        "eval.num_examples=8", "checkpoint.every=0", "log.progress=false", "log.tensorboard=false",
                        "warm_start.sft_steps=5"], check=True, env=env, stdout=subprocess.DEVNULL)
        return [r["perf/step_s"] for r in read_metrics(Path(tmp) / "run") if "perf/step_s" in r][1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="sanity/tiny_cpu")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--load", type=int, default=os.cpu_count() or 2, help="busy processes when loaded")
    args = parser.parse_args()
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.repeats):
        for loaded in (False, True):
            workers = [mp.Process(target=busy, daemon=True) for _ in range(args.load if loaded else 0)]
            for w in workers:
                w.start()
            time.sleep(0.5 if workers else 0)
            try:
                for threads in (1, 2):
                    key = ("loaded" if loaded else "idle", threads)
                    times.setdefault(key, []).extend(step_times(args.recipe, threads, args.steps))
            finally:
                for w in workers:
                    w.terminate()
    base = statistics.median(times[("idle", 1)])
    print(f"{args.recipe}: median seconds per step ({os.cpu_count()} cores; loaded = {args.load} busy processes)")
    print("| machine | threads | s/step | vs 1 thread idle |\n|---|---|---|---|")
    for (machine, threads), values in sorted(times.items()):
        median = statistics.median(values)
        print(f"| {machine} | {threads} | {median:.3f} | {median / base:.2f}x |")


if __name__ == "__main__":
    main()
