"""Supervised learning curve of a recipe's policy: held-out greedy metrics after N SFT steps, for
several N, in one run.

    OMP_NUM_THREADS=1 python scripts/results/sft_probe.py configs/vie/tiny_cpu.yaml --at 160 320 480
    OMP_NUM_THREADS=1 python scripts/results/sft_probe.py configs/spatial_ssrl/tiny_cpu.yaml \\
        task.args.image_size=56 --at 120 280

Recipe overrides come before ``--at``. The steps are the recipe's own warm start
(``mmrl.core.warm_start.sft``): the same generator seed (``warm_start.seed``), data order, batch
size, learning rate and optional vision pretraining, run on to the largest ``--at``. So at the
recipe's ``warm_start.sft_steps`` the weights are the warm start RL starts from (for the same
``OMP_NUM_THREADS``), and later steps are the "continue SFT instead of RL" baseline with the same
optimizer. With ``task.args`` overrides it asks whether a setting is learnable by supervision at all.

Held-out set: the trainer's (``eval.num_examples`` examples of ``eval.split`` drawn with
``eval.seed``), greedy, ``rollout.max_new_tokens``. Besides the task's metrics it prints
``distinct_outputs``, the number of different greedy outputs: 1 means one answer for every input.
One JSON line per evaluation; ``--json`` also writes them to a file.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmrl.core.config import TrainConfig, load_config
from mmrl.core.evaluate import rollout_metrics, verify
from mmrl.core.registry import make_policy, make_task
from mmrl.core.rollout import SamplingParams
from mmrl.core.warm_start import sft


@torch.no_grad()
def held_out(policy: Any, task: Any, cfg: TrainConfig, examples: list[Any]) -> dict[str, float]:
    """The task's metrics on ``examples`` for greedy outputs, plus how many outputs differ."""
    policy.eval()
    rollout = policy.rollout(examples, 1, SamplingParams(0.0, 1.0, cfg.rollout.max_new_tokens), cfg.eval.seed)
    metrics = rollout_metrics(task, examples, rollout, verify(task, cfg.task.name, rollout, examples))
    policy.train()
    return metrics | {"distinct_outputs": len(set(rollout.outputs))}


def sft_curve(cfg: TrainConfig, at: list[int]) -> list[dict[str, float]]:
    """Run the recipe's supervised warm start to ``max(at)`` steps, evaluating after each step in ``at``."""
    task, policy = make_task(cfg.task.name, cfg.task.args), make_policy(cfg.policy.name, cfg.policy.args)
    examples = task.sample_batch(cfg.eval.split, cfg.eval.num_examples, np.random.default_rng(cfg.eval.seed))
    start, rows = time.perf_counter(), []

    def evaluate(step: int, loss: float) -> None:
        if step in at:
            rows.append(report(step, held_out(policy, task, cfg, examples) | ({"loss": loss} if step else {}), start))

    sft(policy, cfg, steps=max(at), on_step=evaluate)
    return rows


def report(step: int, metrics: dict[str, float], start: float) -> dict[str, float]:
    """Print one evaluation as a JSON line and return it."""
    row = {"sft_steps": step, **{k: round(v, 4) for k, v in metrics.items()},
           "seconds": round(time.perf_counter() - start)}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", help="a VLM recipe with a warm start, e.g. configs/vie/tiny_cpu.yaml")
    parser.add_argument("--at", type=int, nargs="+", required=True, help="SFT step counts to evaluate after")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    parser.add_argument("overrides", nargs="*", help="recipe overrides, e.g. task.args.image_size=56")
    args = parser.parse_args()
    if min(args.at) < 0:
        parser.error("--at: step counts must be >= 0")
    cfg = load_config(args.recipe, [*args.overrides, "log.progress=false"])
    rows = sft_curve(cfg, sorted(set(args.at)))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
