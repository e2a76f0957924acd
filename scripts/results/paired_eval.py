"""Paired comparison of two policies on the same held-out examples: each example's score before and
after, the mean gain and its paired standard error, and how many examples got better or worse.

    OMP_NUM_THREADS=1 python scripts/results/paired_eval.py configs/curvebench/tiny_cpu.yaml \\
        --before warm_start --after runs/curvebench_r0 --component tree --num-examples 200

``--before`` / ``--after`` is a run folder (its latest checkpoint), a folder written by ``mmrl sft``,
or ``warm_start``: the recipe's own warm start (``mmrl.core.warm_start.build_initial_policy``,
from ``$MMRL_CACHE`` or trained there first). Examples: ``--num-examples`` of ``--split`` drawn
with ``--seed`` (the trainer's held-out set for the recipe's ``eval.num_examples`` and
``eval.seed``), greedy, ``rollout.max_new_tokens``. The score of an example is its reward
component ``--component`` (e.g. ``tree`` for CurveBench's rooted tree accuracy), a task metric of the
example alone ``--metric`` (e.g. ``success_rate``), or the whole reward without either; several,
comma-separated, are measured on the same answers (one JSON line each, named by ``measure``).

Why paired: both policies answer the same examples, so the standard error of the gain is that of
the per-example differences, sd(d) / sqrt(n), smaller than the two unpaired errors combined when
the examples' difficulty is shared.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import numpy as np
import torch

from mmrl.core.config import TrainConfig, load_config
from mmrl.core.evaluate import resolve, restore_run_learner, verify
from mmrl.core.registry import make_policy, make_task
from mmrl.core.rollout import SamplingParams
from mmrl.core.warm_start import build_initial_policy

WARM_START = "warm_start"


def load_policy(recipe: str, model: str, overrides: list[str]) -> tuple[TrainConfig, Any]:
    """The recipe's config and ``model``'s policy (``warm_start``: the recipe's warm start)."""
    if model == WARM_START:
        cfg = load_config(recipe, [*overrides, "log.progress=false"])
        return cfg, build_initial_policy(cfg)
    cfg, weights = resolve(recipe, model, overrides)
    policy = make_policy(cfg.policy.name, cfg.policy.args)
    if weights is not None:
        policy.load_weights(str(weights))
    return cfg, policy


@torch.no_grad()
def scores(policy: Any, task: Any, cfg: TrainConfig, examples: list[Any], components: list[str | None],
           metrics: list[str] = (), temperature: float = 0.0, seed: int = 0) -> dict[str, np.ndarray]:
    """[n] score of each example (in the order of ``examples``) per measure: the whole reward
    (component None, named ``reward``), a reward component, or a task metric computed on the example alone
    (``task.metrics([example], [output], [result])[name]``, e.g. a success rate that no component holds).
    ``temperature`` 0 answers greedily; above 0 one sample per example, drawn with ``seed``."""
    policy.eval()
    rollout = policy.rollout(examples, 1, SamplingParams(temperature, 1.0, cfg.rollout.max_new_tokens), seed)
    results = verify(task, cfg.task.name, rollout, examples)
    names = [c or "reward" for c in components] + list(metrics)
    out = {name: np.full(len(examples), math.nan) for name in names}
    for i, output, r in zip(rollout.example_index.tolist(), rollout.outputs, results):
        for component in components:
            if component is not None and component not in r.components:
                raise KeyError(f"--component {component!r}: the reward has components {sorted(r.components)}")
            out[component or "reward"][i] = r.components[component] if component is not None else r.score
        if metrics:
            alone = task.metrics([examples[i]], [output], [r])
            for name in metrics:
                if name not in alone:
                    raise KeyError(f"--metric {name!r}: the task's metrics are {sorted(alone)}")
                out[name][i] = alone[name]
    return out


def paired_summary(before: np.ndarray, after: np.ndarray) -> dict[str, float]:
    """Means with their standard errors, the mean gain with its paired standard error, and the
    number of examples whose score rose (``improved``) or fell (``worsened``)."""
    n, d = len(before), after - before
    def se(x: np.ndarray) -> float:
        return float(x.std(ddof=1) / math.sqrt(n))
    return {"n": n, "before": float(before.mean()), "before_se": se(before), "after": float(after.mean()),
            "after_se": se(after), "gain": float(d.mean()), "gain_se": se(d),
            "improved": int((d > 0).sum()), "worsened": int((d < 0).sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", help="the recipe both policies belong to, e.g. configs/curvebench/tiny_cpu.yaml")
    parser.add_argument("--before", required=True, help=f"run folder, mmrl sft folder, or {WARM_START}")
    parser.add_argument("--after", required=True, help=f"run folder, mmrl sft folder, or {WARM_START}")
    parser.add_argument("--component", help="reward component(s) to compare, comma-separated; 'reward' is the whole "
                                            "reward (the default when neither --component nor --metric is given)")
    parser.add_argument("--metric", help="task metric(s) of each example alone, comma-separated (e.g. success_rate)")
    parser.add_argument("--split", default="test", help="task split(s), comma-separated: each is paired on its own")
    parser.add_argument("--num-examples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1234, help="seed of the held-out examples (eval.seed)")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0: greedy (default); above 0 one sample per example, the same sampling seed for both")
    parser.add_argument("overrides", nargs="*", help="recipe overrides for both policies (right after the recipe)")
    args = parser.parse_args()
    components = [None if c == "reward" else c for c in args.component.split(",")] if args.component else []
    metrics = args.metric.split(",") if args.metric else []
    if not components and not metrics:
        components = [None]
    if args.temperature < 0:
        parser.error(f"--temperature must be >= 0, got {args.temperature}")
    splits = [split for split in args.split.split(",") if split]
    per_model = []  # per policy: {split: {measure: [n] scores}}
    for model in (args.before, args.after):
        cfg, policy = load_policy(args.recipe, model, args.overrides)
        task = make_task(cfg.task.name, cfg.task.args)
        if model != WARM_START:  # a run whose learner acts for its policy (EXPO-FT) is measured through it
            restore_run_learner(model, policy, task)
        per_split = {}
        for split in splits:
            examples = task.sample_batch(split, args.num_examples, np.random.default_rng(args.seed))
            per_split[split] = scores(policy, task, cfg, examples, components, metrics, args.temperature, args.seed)
        per_model.append(per_split)
    for split in splits:
        before, after = per_model[0][split], per_model[1][split]
        for name in before:
            summary = paired_summary(before[name], after[name])
            line = {k: round(v, 4) if isinstance(v, float) else v for k, v in summary.items()}
            label = ({"split": split} if len(splits) > 1 else {}) | ({"measure": name} if len(before) > 1 else {})
            print(json.dumps(label | line))


if __name__ == "__main__":
    main()
