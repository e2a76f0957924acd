"""Check that a code change leaves training bit-identical: run a few short seeded recipes with the
Python of each checkout, then compare their ``metrics.jsonl`` key by key (``perf/*`` excluded).

    # in the checkout before the change, then in the one after:
    python scripts/results/same_metrics.py run --out /tmp/before
    python scripts/results/same_metrics.py run --out /tmp/after
    python scripts/results/same_metrics.py compare /tmp/before /tmp/after

``run`` trains each recipe of RECIPES (a GRPO and a PPO text run, the tiny VLM, diffusion with the
Gaussian KL) for a few steps with ``OMP_NUM_THREADS=1``; ``compare`` prints every differing value
and exits 1 when any differs; keys that only one side logs (a new metric) are listed, not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

SHORT = ["log.progress=false", "log.tensorboard=false", "checkpoint.every=0"]
RECIPES = {
    "sanity_grpo": ["configs/sanity/tiny_cpu.yaml", "trainer.steps=6", "eval.every=3", "eval.num_examples=32"],
    "sanity_ppo": ["configs/sanity/ppo_tiny_cpu.yaml", "trainer.steps=6", "eval.every=3", "eval.num_examples=32"],
    "vlm_sanity": ["configs/vlm_sanity/tiny_cpu.yaml", "trainer.steps=3", "eval.every=3", "eval.num_examples=16",
                   "warm_start.sft_steps=10"],
    "flow_grpo": ["configs/flow_grpo/tiny_cpu.yaml", "trainer.steps=2", "eval.every=2"],
}


def run(out: Path) -> None:
    env = os.environ | {"OMP_NUM_THREADS": "1", "MMRL_CACHE": str(out / "cache")}
    for name, (recipe, *overrides) in RECIPES.items():
        print(f"== {name}", flush=True)
        subprocess.run([sys.executable, "-m", "mmrl.cli", "train", recipe, "--out", str(out / name), "--overwrite",
                        "--no-plot", *SHORT, *overrides], check=True, env=env)


def rows(path: Path) -> dict[int, dict]:
    return {r["step"]: {k: v for k, v in r.items() if not k.startswith("perf/")}
            for r in map(json.loads, path.read_text().splitlines())}


def compare(a: Path, b: Path) -> int:
    differences, only = 0, (set(), set())
    for name in sorted({p.parent.name for p in a.glob("*/metrics.jsonl")} | {p.parent.name for p in b.glob("*/metrics.jsonl")}):
        ra, rb = rows(a / name / "metrics.jsonl"), rows(b / name / "metrics.jsonl")
        same = 0
        for step in sorted(set(ra) | set(rb)):
            xa, xb = ra.get(step, {}), rb.get(step, {})
            for key in sorted(set(xa) & set(xb)):
                if xa[key] != xb[key]:
                    differences += 1
                    print(f"{name} step {step} {key}: {xa[key]} vs {xb[key]}")
                else:
                    same += 1
            only[0].update(set(xa) - set(xb))
            only[1].update(set(xb) - set(xa))
        print(f"{name}: {same} values equal")
    for side, keys in zip((a, b), only):
        if keys:
            print(f"keys only in {side}: {', '.join(sorted(keys))}")
    print("bit-identical" if differences == 0 else f"{differences} values differ")
    return int(differences > 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run").add_argument("--out", type=Path, required=True)
    cmp = sub.add_parser("compare")
    cmp.add_argument("a", type=Path)
    cmp.add_argument("b", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        run(args.out)
        return 0
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
