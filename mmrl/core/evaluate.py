"""``mmrl eval``: a task's held-out metrics for a saved model, without training.

    mmrl eval curvebench/easy-v0 --model /models/Qwen3-VL-8B        # an HF folder, task defaults
    mmrl eval curvebench/easy-v0 --model runs/curvebench --k 4      # a run: its policy config + latest checkpoint
    mmrl eval sanity/tiny_cpu --model runs/sanity --k 16 --n 64 --plot   # pass@1..16 from 64 samples, PNG curve
    mmrl eval configs/vie/tiny_cpu.yaml --model runs/vie_sft         # a recipe's task and policy, these weights
    mmrl eval sanity/tiny_cpu --model runs/sanity --base runs/sanity/checkpoints/step_20/policy \
        --extrapolate-logits 1.5                                     # sample from z_base + 1.5·(z − z_base)
    mmrl eval configs/data/tiny_cpu.yaml --model runs/data_vqa --base warm_start --extrapolate-logits 2 --k 8
                                                                     # the base: the run's cached warm start

The metrics are the trainer's held-out ones (``reward_mean`` and the task's ``metrics``), computed
by the same functions, so a number printed here equals the ``eval/<metric>`` a run logs for the
same weights, examples, temperature and seed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmrl.core.config import (ConfigError, TrainConfig, apply_overrides, build, read_recipe, resolve_recipe, to_dict,
                              validate)
from mmrl.core.contracts import Policy, RewardResult
from mmrl.core.episodes import episode_results, run_tool_episodes, tool_metrics
from mmrl.core.logging import HeldOutSample
from mmrl.core.rollout import Rollout, SamplingParams, derive_seed

RUN_CONFIG = "config.yaml"
WARM_START_BASE = "warm_start"
"""``--base warm_start``: the cached warm start RL started from (a folder of that name is given as ``./warm_start``)."""


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


def answer(policy: Policy, task: Any, task_id: str, examples: Sequence[Any], group_size: int,
           sampling: SamplingParams, seed: int, tool_turns: int) -> tuple[Rollout, list[RewardResult], dict[str, float]]:
    """``group_size`` answers per example and their verdicts. With ``tool_turns`` > 0 (``algo.tool_turns``) each
    answer is the last turn of an episode of up to that many tool calls (:mod:`mmrl.core.episodes`), and the
    metrics ``tool_use_rate``, ``tool_calls_mean``, ``tool_overrun_rate`` come with it; else a plain rollout."""
    rollout = policy.rollout(examples, group_size, sampling, seed)
    if tool_turns == 0:
        return rollout, verify(task, task_id, rollout, examples), {}
    episodes = run_tool_episodes(rollout, examples, task, policy.rollout, sampling, seed, tool_turns)
    finals = episodes.rollout.select(episodes.final)
    results = episode_results(episodes, verify(task, task_id, finals, examples), float(task.reward_range[0]))
    return finals, results, tool_metrics(episodes)


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


def unbiased_pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. 2021 (Codex, eq. 1): the probability that k of n samples, c of them correct, drawn without
    replacement include a correct one, 1 − C(n−c, k)/C(n, k), as the stable product
    1 − Π_{i=n−c+1}^{n} (1 − k/i) (no huge binomials). n = 5, c = 2, k = 2 gives 0.7.

    >>> round(unbiased_pass_at_k(5, 2, 2), 12)
    0.7
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pass_at_k_curve(scores: torch.Tensor, example_index: torch.Tensor, num_examples: int, ks: Sequence[int],
                    threshold: float) -> dict[int, float]:
    """{k: mean over examples of :func:`unbiased_pass_at_k`} from the same n samples per example ([N] scores
    and example indices; a sample is correct when its score is ≥ ``threshold``). Every example must have the
    same n ≥ max(ks)."""
    n = torch.zeros(num_examples, dtype=torch.long).index_add_(0, example_index, torch.ones_like(example_index))
    c = torch.zeros(num_examples, dtype=torch.long).index_add_(0, example_index, (scores >= threshold).long())
    if num_examples == 0 or int(n.min()) != int(n.max()) or int(n.min()) < max(ks):
        raise ValueError(f"pass@k needs the same n >= {max(ks)} samples for every example, got n from "
                         f"{int(n.min()) if num_examples else 0} to {int(n.max()) if num_examples else 0}")
    return {k: float(np.mean([unbiased_pass_at_k(int(ni), int(ci), k) for ni, ci in zip(n, c)])) for k in ks}


def curve_ks(k: int) -> list[int]:
    """The k of a pass@k curve: 1, 2, 4, ... below K, then K."""
    return [2 ** i for i in range(k.bit_length()) if 2 ** i < k] + [k]


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
    tools = cfg.algo.tool_turns
    rollout, results, tool_use = answer(policy, task, cfg.task.name, examples, 1,
                                        SamplingParams(e.temperature, 1.0, cfg.rollout.max_new_tokens), seed, tools)
    samples = [HeldOutSample(examples[i], output, result) for i, output, result
               in zip(rollout.example_index.tolist()[:cfg.log.num_samples], rollout.outputs, results)]
    metrics = rollout_metrics(task, examples, rollout, results) | tool_use
    if e.pass_k and index == 0:
        sampled, verdicts, _ = answer(policy, task, cfg.task.name, examples, e.pass_k,
                                      SamplingParams(e.pass_temperature, 1.0, cfg.rollout.max_new_tokens),
                                      derive_seed(e.seed, step, engine.rank, 1), tools)
        scores = torch.tensor([r.score for r in verdicts], dtype=torch.float64)
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
    """> 1: also draw n samples per example at ``pass_temperature``: ``pass@k'`` for k' in 1, 2, 4, ..., k
    (Chen et al.'s unbiased estimator from the same n samples) and ``mean@n``."""
    n: int | None = None
    """Samples per example for pass@k (≥ k; None: n = k, where pass@k is "any of the k samples passes")."""
    pass_temperature: float = 1.0
    pass_threshold: float = 1.0
    tool_turns: int = 0
    """> 0: answers are the last turns of episodes of up to this many tool calls (a run's ``algo.tool_turns``)."""


@torch.no_grad()
def evaluate_policy(policy: Policy, task: Any, task_id: str, s: EvalSettings) -> dict[str, float]:
    """Held-out metrics of ``policy`` on ``s.num_examples`` examples of ``s.split`` (one process)."""
    policy.eval()
    examples = task.sample_batch(s.split, s.num_examples, np.random.default_rng(s.seed))
    rollout, results, tool_use = answer(policy, task, task_id, examples, 1,
                                        SamplingParams(s.temperature, 1.0, s.max_new_tokens), s.seed, s.tool_turns)
    metrics = rollout_metrics(task, examples, rollout, results) | tool_use
    n = s.k if s.n is None else s.n
    if s.k > 1 or n > 1:
        sampled, verdicts, _ = answer(policy, task, task_id, examples, n,
                                      SamplingParams(s.pass_temperature, 1.0, s.max_new_tokens), s.seed + 1,
                                      s.tool_turns)
        scores = torch.tensor([r.score for r in verdicts], dtype=torch.float64)
        curve = pass_at_k_curve(scores, sampled.example_index, len(examples), curve_ks(s.k), s.pass_threshold)
        metrics |= {f"pass@{k}": value for k, value in curve.items()}
        metrics[f"mean@{n}"] = float(scores.mean())
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
            data = recipe_with_policy_of(target, data, model_dir, overrides)
    elif is_task:
        if model_dir is None:
            raise ConfigError(f"mmrl eval {target}: give the weights with --model DIR (an HF folder or a run)")
        data = {"task": {"name": target, "args": {}}, "policy": {"name": policy_name, "args": {"pretrained": model}}}
        weights = None  # the policy loads them itself
    else:
        data = read_recipe(resolve_recipe(target))
    return validate(build(TrainConfig, apply_overrides(data, list(overrides)))), weights


def recipe_with_policy_of(recipe: str, run_data: dict, run: Path, overrides: Sequence[str] = ()) -> dict:
    """The recipe's config with ``overrides`` applied, when its policy is then the one the run (or sft
    folder) trained; a :class:`ConfigError` when they differ (the run's weights would not fit the
    recipe's policy)."""
    data = apply_overrides(read_recipe(resolve_recipe(recipe)), list(overrides))
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


def load_policy(target: str, model: str | None, overrides: Sequence[str], policy_name: str,
                flag: str = "--model") -> tuple[TrainConfig, Policy]:
    """The config (:func:`resolve`) and its policy with ``model``'s weights loaded."""
    from mmrl.core.registry import make_policy

    cfg, weights = resolve(target, model, overrides, policy_name)
    try:
        policy = make_policy(cfg.policy.name, cfg.policy.args)
        if weights is not None:
            policy.load_weights(str(weights))
    except OSError as err:  # e.g. transformers' "no file named model.safetensors ... found"
        if model is None:
            raise
        raise FileNotFoundError(f"{flag} {model}: not a model folder that {cfg.policy.name!r} can load "
                                f"({' '.join(str(err).split())})") from None
    return cfg, policy


def base_folder(base: str, model: str | None, cfg: TrainConfig) -> str:
    """The folder ``--base`` names: itself, or for ``warm_start`` the warm start cached for the ``--model`` run's
    own config (else ``cfg``'s), i.e. the policy its RL started from."""
    if base != WARM_START_BASE:
        return base
    from mmrl.core.warm_start import warm_start_path

    if model is not None and (Path(model) / RUN_CONFIG).is_file():
        cfg = validate(build(TrainConfig, read_recipe(Path(model) / RUN_CONFIG)))
    if cfg.warm_start.init_from is not None:
        return cfg.warm_start.init_from
    if cfg.warm_start.sft_steps == 0:
        raise ConfigError("--base warm_start: the config has no warm start (warm_start.sft_steps is 0); give a "
                          "folder as --base")
    path = warm_start_path(cfg)
    if not path.is_dir():
        raise FileNotFoundError(f"--base warm_start: no cached warm start for this config ({path}); train the recipe "
                                f"once (mmrl train), or write one with `mmrl sft RECIPE --out DIR` and give --base DIR")
    return str(path)


def acting_learner_of(model: str | None) -> str | None:
    """The off-policy learner that acts for the policy of the run folder ``model`` (EXPO-FT's Q-guided choice, DSRL's
    latent actor: :mod:`mmrl.algos.offpolicy.acting`), or None (not a run, or its checkpoints' weights are the whole
    policy)."""
    run = Path(model) if model else None
    if run is None or not (run / RUN_CONFIG).is_file() or not (run / "checkpoints").is_dir():
        return None
    from mmrl.algos.offpolicy.acting import ACTING_LEARNERS

    name = read_recipe(run / RUN_CONFIG).get("algo", {}).get("offpolicy")
    return name if name in ACTING_LEARNERS else None


def restore_run_learner(model: str | None, policy: Policy, task: Any) -> str | None:
    """When ``model`` is a run whose learner acts for its policy (:func:`acting_learner_of`): that learner rebuilt
    onto ``policy`` (which holds the run's latest checkpoint) with the same checkpoint's state, and its name;
    else None and nothing changes."""
    name = acting_learner_of(model)
    if name is None:
        return None
    from mmrl.algos.offpolicy.acting import restore_acting_learner
    from mmrl.core import checkpoint as ckpt

    run = Path(model)
    latest = ckpt.latest_checkpoint(run)
    if (run / ckpt.PROGRAM_FILE).is_file() or latest is None:
        raise ConfigError(f"--model {model}: its {name} learner acts for the policy, but the folder has no single "
                          f"run's checkpoint to restore it from; evaluate the saved weights alone (mmrl eval "
                          f"--without-learner)")
    run_cfg = validate(build(TrainConfig, read_recipe(run / RUN_CONFIG)))
    restore_acting_learner(run, run_cfg, policy, task, ckpt.read_state(latest))
    return name


def evaluate_target(target: str, model: str | None, overrides: Sequence[str], splits: Sequence[str],
                    s: EvalSettings, policy_name: str = "vlm", max_new_tokens: int | None = None,
                    extrapolate_logits: float | None = None, base: str | None = None,
                    through_learner: bool = True) -> dict[str, dict[str, float]]:
    """Build the task and policy (:func:`resolve`), load the weights, evaluate every split. With
    ``extrapolate_logits`` α, sample from z_base + α·(z − z_base), the base being ``base``'s weights in the same
    policy (:mod:`mmrl.policies.logits_extrapolation`; ``warm_start``: :func:`base_folder`). A run whose learner
    acts for its policy (:func:`acting_learner_of`) is evaluated through that learner, restored from the same
    checkpoint, unless ``through_learner`` is False (the saved weights alone)."""
    from mmrl.core.registry import make_task

    if (extrapolate_logits is None) != (base is None):
        raise ConfigError("--extrapolate-logits ALPHA and --base BASE go together")
    cfg, policy = load_policy(target, model, overrides, policy_name)
    task = make_task(cfg.task.name, cfg.task.args)
    if through_learner:
        restore_run_learner(model, policy, task)
    # pass@k samples and threshold as the config's evaluation defines them (a run's own settings)
    s = dataclasses.replace(s, max_new_tokens=max_new_tokens or cfg.rollout.max_new_tokens,
                            pass_temperature=cfg.eval.pass_temperature, pass_threshold=cfg.eval.pass_threshold,
                            tool_turns=cfg.algo.tool_turns)
    with contextlib.ExitStack() as stack:
        if extrapolate_logits is not None:
            from mmrl.policies.logits_extrapolation import logits_extrapolation

            _, base_policy = load_policy(target, base_folder(base, model, cfg), overrides, policy_name, "--base")
            stack.enter_context(logits_extrapolation(policy, base_policy, extrapolate_logits))
        return {split: evaluate_policy(policy, task, cfg.task.name, dataclasses.replace(s, split=split))
                for split in splits}


def run_eval(args: Any) -> str:
    """``mmrl eval`` (arguments of :func:`mmrl.cli.build_parser`): a printable table, JSON when asked."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    splits = [split for split in args.split.split(",") if split]
    if args.num_examples < 1 or args.k < 1:
        raise ConfigError(f"--num-examples and --k must be >= 1, got {args.num_examples} and {args.k}")
    if args.n is not None and args.n < args.k:
        raise ConfigError(f"--n (samples per example, {args.n}) must be >= --k ({args.k})")
    settings = EvalSettings(num_examples=args.num_examples, seed=args.seed, temperature=args.temperature, k=args.k,
                            n=args.n)
    through = None if args.without_learner else acting_learner_of(args.model)
    results = evaluate_target(args.target, args.model, args.overrides, splits, settings, args.policy,
                              args.max_new_tokens, args.extrapolate_logits, args.base, not args.without_learner)
    if args.json:
        Path(args.json).write_text(json.dumps({"target": args.target, "model": args.model,
                                               "settings": dataclasses.asdict(settings), "metrics": results},
                                              indent=2))
    lines = [f"{args.target}: {args.num_examples} examples per split, temperature {args.temperature}, "
             f"seed {args.seed}" + (f", model {args.model}" if args.model else "")
             + (f", logits extrapolated from {args.base} with alpha {args.extrapolate_logits}"
                if args.extrapolate_logits is not None else "")
             + (f", acting through the run's {through} learner (--without-learner: the saved weights alone)"
                if through else "")]
    for split, metrics in results.items():
        lines.append(f"[{split}]")
        lines += [f"  {key:<28} {value:.4f}" for key, value in metrics.items()]
        curve = pass_curve(metrics)
        if len(curve) > 1:
            n = settings.k if settings.n is None else settings.n
            lines.append(f"  pass@k curve (n = {n} samples per example): "
                         + "  ".join(f"k={k}: {value:.3f}" for k, value in curve))
    if args.plot:
        lines.append(f"pass@k curve: {plot_pass_curves(results, args.plot, args.target)}")
    return "\n".join(lines)


def pass_curve(metrics: dict[str, float]) -> list[tuple[int, float]]:
    """The (k, pass@k) points of a split's metrics, by k."""
    return sorted((int(key.split("@")[1]), value) for key, value in metrics.items() if key.startswith("pass@"))


def plot_pass_curves(results: dict[str, dict[str, float]], path: str | Path, title: str) -> Path:
    """A PNG of pass@k against k (log₂ axis), one line per split."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.0, 3.6))
    for split, metrics in results.items():
        curve = pass_curve(metrics)
        if curve:
            ks, values = zip(*curve)
            ax.plot(ks, values, "o-", label=split)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k")
    ax.set_ylim(0.0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
