"""``mmrl eval``: a task's held-out metrics for a saved model, without training.

    mmrl eval curvebench/easy-v0 --model /models/Qwen3-VL-8B        # an HF folder, task defaults
    mmrl eval curvebench/easy-v0 --model runs/curvebench --k 4      # a run: its policy config + latest checkpoint
    mmrl eval configs/vie/tiny_cpu.yaml --model runs/vie_sft         # a recipe's task and policy, these weights

The metrics are the trainer's held-out ones (``reward_mean`` and the task's ``metrics``), computed
by the same functions, so a number printed here equals the ``eval/<metric>`` a run logs for the
same weights, examples, temperature and seed.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmrl.core.config import (ConfigError, TrainConfig, apply_overrides, build, read_recipe, resolve_recipe, to_dict,
                              validate)
from mmrl.core.contracts import Policy, RewardResult
from mmrl.core.logging import HeldOutSample
from mmrl.core.rollout import Rollout, SamplingParams, derive_seed

RUN_CONFIG = "config.yaml"


def verify(task: Any, task_id: str, rollout: Rollout, examples: Sequence[Any]) -> list[RewardResult]:
    """The task's verdict on every row of ``rollout`` (row i answers ``examples[example_index[i]]``).

    A task with a batched ``reward_batch(examples, outputs)`` (one example per output) is asked once
    for all rows; otherwise ``reward(example, output)`` is asked row by row.
    """
    rows = [examples[i] for i in rollout.example_index.tolist()]
    outputs = list(rollout.outputs)
    batched = getattr(task, "reward_batch", None)
    if batched is not None:
        try:
            results = list(batched(rows, outputs))
        except Exception as err:  # a reward must be total; say which task broke it
            raise RuntimeError(f"{task_id}.reward_batch raised on {len(outputs)} outputs: {err}") from err
        if len(results) != len(outputs):
            raise RuntimeError(f"{task_id}.reward_batch returned {len(results)} results for {len(outputs)} outputs")
        return results
    results = []
    for example, output in zip(rows, outputs):
        try:
            results.append(task.reward(example, output))
        except Exception as err:  # a reward must be total; say which task and output broke it
            raise RuntimeError(f"{task_id}.reward raised on output {output!r}: {err}") from err
    return results


def rollout_metrics(task: Any, examples: Sequence[Any], rollout: Rollout,
                    results: Sequence[RewardResult]) -> dict[str, float]:
    """``reward_mean`` and the task's own metrics over one rollout of ``examples``."""
    metrics = {"reward_mean": float(np.mean([r.score for r in results]))}
    metrics |= task.metrics([examples[i] for i in rollout.example_index.tolist()], rollout.outputs, results)
    return metrics


def pass_at_k(scores: torch.Tensor, example_index: torch.Tensor, num_examples: int, threshold: float) -> float:
    """Share of examples with at least one of their samples scoring ≥ ``threshold`` ([N] scores and
    example indices; with n = k samples this is the pass@k estimator of Chen et al. 2021)."""
    passes = torch.zeros(num_examples, dtype=torch.float64).index_add_(0, example_index,
                                                                       (scores >= threshold).double())
    return float((passes > 0).double().mean())


def held_out_sets(task: Any, cfg: TrainConfig) -> list[tuple[str, list[Any]]]:
    """The held-out examples of ``eval.split`` and of each of ``eval.extra_splits``, drawn once from
    ``eval.seed`` (the same for every split and every evaluation of the run)."""
    return [(split, task.sample_batch(split, cfg.eval.num_examples, np.random.default_rng(cfg.eval.seed)))
            for split in (cfg.eval.split, *cfg.eval.extra_splits)]


def evaluate_sets(policy: Policy, task: Any, cfg: TrainConfig, engine: Any, sets: Sequence[tuple[str, list[Any]]],
                  step: int) -> tuple[dict[str, float], list[tuple[str, HeldOutSample]]]:
    """Greedy held-out metrics: ``eval/<metric>`` on ``eval.split``, ``eval/<split>/<metric>`` on each of
    ``eval.extra_splits``; and the first outputs of each split (for ``samples.jsonl`` and the trackers)."""
    metrics, samples = {}, []
    for index, (split, examples) in enumerate(sets):
        prefix = "eval/" if index == 0 else f"eval/{split}/"
        values, shown = held_out_metrics(policy, task, cfg, engine, examples, step, index)
        metrics |= {prefix + key: value for key, value in values.items()}
        samples += [(split, sample) for sample in shown]
    return metrics, samples


@torch.no_grad()
def held_out_metrics(policy: Policy, task: Any, cfg: TrainConfig, engine: Any, all_examples: Sequence[Any], step: int,
                     index: int) -> tuple[dict[str, float], list[HeldOutSample]]:
    """The trainer's held-out metrics on one split (``index`` 0 is ``eval.split``, which also gets pass@k):
    each process evaluates its share at ``eval.temperature``; the means are over all processes' examples.
    Also returns this process's first ``log.num_samples`` outputs (the same examples at every evaluation)."""
    e = cfg.eval
    examples = all_examples[engine.rank::engine.world_size]
    seed = derive_seed(e.seed, step, engine.rank) if index == 0 else derive_seed(e.seed, step, engine.rank, 100 + index)
    rollout = policy.rollout(examples, 1, SamplingParams(e.temperature, 1.0, cfg.rollout.max_new_tokens), seed)
    results = verify(task, cfg.task.name, rollout, examples)
    samples = [HeldOutSample(examples[i], output, result) for i, output, result
               in zip(rollout.example_index.tolist()[:cfg.log.num_samples], rollout.outputs, results)]
    metrics = rollout_metrics(task, examples, rollout, results)
    if e.pass_k and index == 0:
        sampled = policy.rollout(examples, e.pass_k, SamplingParams(e.pass_temperature, 1.0, cfg.rollout.max_new_tokens),
                                 derive_seed(e.seed, step, engine.rank, 1))
        scores = torch.tensor([r.score for r in verify(task, cfg.task.name, sampled, examples)], dtype=torch.float64)
        metrics[f"pass@{e.pass_k}"] = pass_at_k(scores, sampled.example_index, len(examples), e.pass_threshold)
        metrics[f"mean@{e.pass_k}"] = float(scores.mean())
    n, total = len(results), engine.sum(len(results))
    return {key: engine.sum(value * n) / total for key, value in metrics.items()}, samples


@dataclass(frozen=True)
class EvalSettings:
    split: str = "test"
    num_examples: int = 128
    seed: int = 1234
    """Seed of the held-out examples (the trainer's ``eval.seed``)."""
    temperature: float = 0.0
    """0: greedy, as the trainer's evaluation."""
    max_new_tokens: int = 32
    k: int = 1
    """> 1: also draw k samples per example at ``pass_temperature``: ``pass@k`` and ``mean@k``."""
    pass_temperature: float = 1.0
    pass_threshold: float = 1.0


@torch.no_grad()
def evaluate_policy(policy: Policy, task: Any, task_id: str, s: EvalSettings) -> dict[str, float]:
    """Held-out metrics of ``policy`` on ``s.num_examples`` examples of ``s.split`` (one process)."""
    policy.eval()
    examples = task.sample_batch(s.split, s.num_examples, np.random.default_rng(s.seed))
    rollout = policy.rollout(examples, 1, SamplingParams(s.temperature, 1.0, s.max_new_tokens), s.seed)
    metrics = rollout_metrics(task, examples, rollout, verify(task, task_id, rollout, examples))
    if s.k > 1:
        sampled = policy.rollout(examples, s.k, SamplingParams(s.pass_temperature, 1.0, s.max_new_tokens), s.seed + 1)
        scores = torch.tensor([r.score for r in verify(task, task_id, sampled, examples)], dtype=torch.float64)
        metrics[f"pass@{s.k}"] = pass_at_k(scores, sampled.example_index, len(examples), s.pass_threshold)
        metrics[f"mean@{s.k}"] = float(scores.mean())
    return metrics


def resolve(target: str, model: str | None, overrides: Sequence[str], policy_name: str = "vlm"
            ) -> tuple[TrainConfig, Path | None]:
    """The config to build the task and policy from, and the weights to load into the policy.

    - ``model`` is a run folder (``config.yaml`` + ``checkpoints/``: its latest intact checkpoint) or a
      folder written by ``mmrl sft`` / ``mmrl bc`` (``config.yaml``, its weights): the policy is the
      folder's; the task is ``target``'s: a task id (the folder's task args when it is the folder's
      task, else the task's defaults), or a recipe, whose policy must then be the folder's;
    - otherwise ``target`` names the config: a recipe (its policy, then ``model``'s weights loaded into
      it), or a registered task id (``policy_name`` built from ``model``: ``pretrained=<model>``).
    Overrides apply last.
    """
    from mmrl.core import checkpoint as ckpt
    from mmrl.core.registry import TASKS, load_plugins

    load_plugins()
    is_task = target in TASKS.names()
    model_dir = Path(model) if model else None
    if model_dir is not None and not model_dir.is_dir():
        raise FileNotFoundError(f"--model {model}: no such folder")
    weights: Path | None = model_dir
    if model_dir is not None and (model_dir / RUN_CONFIG).is_file():
        data = read_recipe(model_dir / RUN_CONFIG)
        if (model_dir / ckpt.PROGRAM_FILE).is_file():  # a multi-stage run: its last stage's result
            weights = ckpt.final_policy(model_dir)
            if weights is None:
                raise FileNotFoundError(f"--model {model}: the multi-stage run has not finished its last stage")
        elif (model_dir / "checkpoints").is_dir():
            latest = ckpt.latest_checkpoint(model_dir)
            if latest is None:
                raise FileNotFoundError(f"--model {model}: the run has no checkpoint yet")
            weights = latest / "policy"
        if is_task and data.get("task", {}).get("name") != target:
            data["task"] = {"name": target, "args": {}}
        elif not is_task:
            data = recipe_with_policy_of(target, data, model_dir)
    elif is_task:
        if model_dir is None:
            raise ConfigError(f"mmrl eval {target}: give the weights with --model DIR (an HF folder or a run)")
        data = {"task": {"name": target, "args": {}}, "policy": {"name": policy_name, "args": {"pretrained": model}}}
        weights = None  # the policy loads them itself
    else:
        data = read_recipe(resolve_recipe(target))
    return validate(build(TrainConfig, apply_overrides(data, list(overrides)))), weights


def recipe_with_policy_of(recipe: str, run_data: dict, run: Path) -> dict:
    """The recipe's config, when its policy is the one the run (or sft folder) trained; a
    :class:`ConfigError` when they differ (the run's weights would not fit the recipe's policy)."""
    data = read_recipe(resolve_recipe(recipe))
    theirs, ours = validate(build(TrainConfig, run_data)).policy, validate(build(TrainConfig, data)).policy
    if to_dict(theirs) != to_dict(ours):
        differ = sorted(k for k in {*to_dict(ours)["args"], *to_dict(theirs)["args"]}
                        if to_dict(ours)["args"].get(k) != to_dict(theirs)["args"].get(k))
        what = f"policy.args {', '.join(differ)}" if theirs.name == ours.name else \
            f"policy {ours.name!r} vs {theirs.name!r}"
        raise ConfigError(f"mmrl eval {recipe} --model {run}: the recipe's policy differs from the one {run} trained "
                          f"({what}); evaluate a task id instead (e.g. mmrl eval {data['task']['name']} "
                          f"--model {run}) or a recipe with the run's policy")
    return data


def evaluate_target(target: str, model: str | None, overrides: Sequence[str], splits: Sequence[str],
                    s: EvalSettings, policy_name: str = "vlm", max_new_tokens: int | None = None
                    ) -> dict[str, dict[str, float]]:
    """Build the task and policy (:func:`resolve`), load the weights, evaluate every split."""
    from mmrl.core.registry import make_policy, make_task

    cfg, weights = resolve(target, model, overrides, policy_name)
    task = make_task(cfg.task.name, cfg.task.args)
    try:
        policy = make_policy(cfg.policy.name, cfg.policy.args)
        if weights is not None:
            policy.load_weights(str(weights))
    except OSError as err:  # e.g. transformers' "no file named model.safetensors ... found"
        if model is None:
            raise
        raise FileNotFoundError(f"--model {model}: not a model folder that {cfg.policy.name!r} can load "
                                f"({' '.join(str(err).split())})") from None
    # pass@k samples and threshold as the config's evaluation defines them (a run's own settings)
    s = dataclasses.replace(s, max_new_tokens=max_new_tokens or cfg.rollout.max_new_tokens,
                            pass_temperature=cfg.eval.pass_temperature, pass_threshold=cfg.eval.pass_threshold)
    return {split: evaluate_policy(policy, task, cfg.task.name, dataclasses.replace(s, split=split))
            for split in splits}


def run_eval(args: Any) -> str:
    """``mmrl eval`` (arguments of :func:`mmrl.cli.build_parser`): a printable table, JSON when asked."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    splits = [split for split in args.split.split(",") if split]
    if args.num_examples < 1 or args.k < 1:
        raise ConfigError(f"--num-examples and --k must be >= 1, got {args.num_examples} and {args.k}")
    settings = EvalSettings(num_examples=args.num_examples, seed=args.seed, temperature=args.temperature, k=args.k)
    results = evaluate_target(args.target, args.model, args.overrides, splits, settings, args.policy,
                              args.max_new_tokens)
    if args.json:
        Path(args.json).write_text(json.dumps({"target": args.target, "model": args.model,
                                               "settings": dataclasses.asdict(settings), "metrics": results},
                                              indent=2))
    lines = [f"{args.target}: {args.num_examples} examples per split, temperature {args.temperature}, "
             f"seed {args.seed}" + (f", model {args.model}" if args.model else "")]
    for split, metrics in results.items():
        lines.append(f"[{split}]")
        lines += [f"  {key:<28} {value:.4f}" for key, value in metrics.items()]
    return "\n".join(lines)
