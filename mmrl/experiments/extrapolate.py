"""``mmrl extrapolate``: predict a later checkpoint from early ones (RELEX rank-1, or plain linear).

RELEX (REinforcement Learning EXtrapolation; seed abstract "RLVR weight trajectories are extremely
low-rank and highly predictable", code github.com/weizhepei/RELEX, not retrievable here): the
parameter deltas of RLVR are captured by a rank-1 subspace whose magnitude grows near-linearly in
the step. Per weight tensor W (viewed as a matrix: [out, in]; a vector as [1, n]; higher-rank
tensors as [shape[0], −1]) with initial value W_0 and observed checkpoints W_{s_1..s_m}:

    D_j = W_{s_j} − W_0                                  (deltas)
    D_m = σ u vᵀ + …,  P = u vᵀ                          (top singular pair of the last delta; ‖P‖_F = 1)
    c_j = ⟨D_j, P⟩_F,  c_0 = 0                           (magnitude along the rank-1 direction)
    c(s) ≈ a + b·s                                       (least squares over (0, 0), (s_j, c_j))
    Ŵ_T = W_0 + c(T)·P                                   (the prediction: the off-direction part of
                                                          the deltas, optimisation noise, is dropped)

Tensors that did not move (frozen weights) and non-float buffers are copied from W_0. The exact
RELEX choices (which checkpoint defines the subspace, whether the origin enters the fit) were not
retrievable: these are INFERRED from the abstract.

``--method linear`` is the plain weight extrapolation of "Linear evolution" (seed #10: weights and
log-probs evolve near-linearly in the RL step): every weight on its own least-squares line through
(0, W_0) and the observed (s_j, W_{s_j}), read at T — the full deltas, noise included. (The same
paper's logits extrapolation, which combines two models' logits at sampling time, is
``mmrl eval --extrapolate-logits``: :mod:`mmrl.policies.logits_extrapolation`.)

    mmrl extrapolate runs/x --observe 10,20 --target 60 --out runs/x_relex

evaluates the initial policy, the last observed checkpoint, the prediction and (when the run has
it) the trained checkpoint of the target step on the run's held-out set, and reports the weight-space
distance of the prediction to the trained checkpoint (``OUT/extrapolation.json``).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mmrl.core import checkpoint as ckpt
from mmrl.core.config import ConfigError, TrainConfig, load_config
from mmrl.core.contracts import Policy
from mmrl.core.rollout import SamplingParams
from mmrl.core.run_folder import mark_written, prepare_atomic_out


def as_matrix(t: Tensor) -> Tensor:
    """The 2-D view used for the rank-1 subspace (vectors as one row, ≥ 3-D as [shape[0], −1])."""
    if t.dim() == 1:
        return t.reshape(1, -1)
    if t.dim() == 2:
        return t
    return t.reshape(t.shape[0], -1)


def rank1_direction(delta: Tensor) -> Tensor | None:
    """P = u vᵀ from the top singular pair of ``delta`` (same shape, ‖P‖_F = 1); None for a zero delta."""
    matrix = as_matrix(delta.double())
    if not torch.any(matrix != 0):
        return None
    u, _, vh = torch.linalg.svd(matrix, full_matrices=False)
    return (u[:, :1] @ vh[:1, :]).reshape(delta.shape)


def linear_fit(steps: list[float], values: list[float]) -> tuple[float, float]:
    """Least-squares (a, b) of values ≈ a + b·steps."""
    x, y = np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)
    b = float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())
    return float(y.mean() - b * x.mean()), b


def rank1_extrapolate(initial: dict[str, Tensor], observed: list[tuple[int, dict[str, Tensor]]],
                      target: int) -> tuple[dict[str, Tensor], dict[str, float]]:
    """Ŵ_T for every tensor (formula in the module docstring) and the fit's summary statistics.

    ``observed`` are (step, state dict) pairs in increasing step order, steps > 0.
    """
    steps = check_steps(observed, target)
    predicted, captured, total = {}, 0.0, 0.0
    for name, w0 in initial.items():
        if not torch.is_floating_point(w0):
            predicted[name] = w0.clone()
            continue
        deltas = [(state[name].double() - w0.double()) for _, state in observed]
        direction = rank1_direction(deltas[-1])
        if direction is None:
            predicted[name] = w0.clone()
            continue
        coefficients = [float((d * direction).sum()) for d in deltas]
        a, b = linear_fit([0.0, *steps], [0.0, *coefficients])
        predicted[name] = (w0.double() + (a + b * target) * direction).to(w0.dtype)
        captured += coefficients[-1] ** 2  # energy of the last delta inside its rank-1 direction
        total += float((deltas[-1] ** 2).sum())
    return predicted, {"rank1_energy_fraction": captured / total if total else 1.0}


def linear_extrapolate(initial: dict[str, Tensor], observed: list[tuple[int, dict[str, Tensor]]],
                       target: int) -> tuple[dict[str, Tensor], dict[str, float]]:
    """Ŵ_T = W̄ + b·(T − s̄) per weight: least squares over (0, W_0) and the observed (s_j, W_{s_j})."""
    steps = check_steps(observed, target)
    x = torch.tensor([0.0, *steps], dtype=torch.float64)
    x_centred = x - x.mean()
    predicted = {}
    for name, w0 in initial.items():
        if not torch.is_floating_point(w0):
            predicted[name] = w0.clone()
            continue
        values = torch.stack([w0.double(), *(state[name].double() for _, state in observed)])  # [m + 1, ...]
        mean = values.mean(0)
        slope = torch.tensordot(x_centred, values - mean, dims=1) / (x_centred ** 2).sum()
        predicted[name] = (mean + slope * (target - float(x.mean()))).to(w0.dtype)
    return predicted, {}


def check_steps(observed: list[tuple[int, dict[str, Tensor]]], target: int) -> list[int]:
    """The observed steps (increasing, > 0, before ``target``), else a ValueError."""
    steps = [s for s, _ in observed]
    if not steps or steps != sorted(set(steps)) or steps[0] <= 0:
        raise ValueError(f"observed steps must be increasing and > 0, got {steps}")
    if target <= steps[-1]:
        raise ValueError(f"the target step ({target}) must lie beyond the last observed step ({steps[-1]})")
    return steps


METHODS = {"rank1": rank1_extrapolate, "linear": linear_extrapolate}
"""``mmrl extrapolate --method``: RELEX's rank-1 extrapolation, or every weight on its own line (#10)."""


def relative_distance(a: dict[str, Tensor], b: dict[str, Tensor], origin: dict[str, Tensor]) -> float:
    """‖a − b‖ / ‖b − origin‖ over all float tensors (0: a is b; 1: as far from b as the origin)."""
    num = sum(float(((a[k].double() - b[k].double()) ** 2).sum()) for k in b if torch.is_floating_point(b[k]))
    den = sum(float(((b[k].double() - origin[k].double()) ** 2).sum()) for k in b if torch.is_floating_point(b[k]))
    return (num / den) ** 0.5 if den else 0.0


def held_out_metrics(policy: Policy, task: Any, cfg: TrainConfig) -> dict[str, float]:
    """``eval/reward_mean`` and the task's metrics on the run's held-out set (one process, as the trainer)."""
    examples = task.sample_batch(cfg.eval.split, cfg.eval.num_examples, np.random.default_rng(cfg.eval.seed))
    sampling = SamplingParams(cfg.eval.temperature, 1.0, cfg.rollout.max_new_tokens)
    rollout = policy.rollout(examples, 1, sampling, cfg.eval.seed)
    answered = [examples[i] for i in rollout.example_index.tolist()]
    results = [task.reward(ex, out) for ex, out in zip(answered, rollout.outputs)]
    metrics = {"reward_mean": float(np.mean([r.score for r in results]))}
    metrics |= task.metrics(answered, rollout.outputs, results)
    return {f"eval/{k}": float(v) for k, v in metrics.items()}


def checkpoint_policy_dir(run: Path, step: int) -> Path:
    path = ckpt.checkpoint_dir(run, step) / "policy"
    if not path.is_dir():
        have = sorted(int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("step_*") if p.is_dir())
        raise FileNotFoundError(f"{run} has no checkpoint of step {step} (have {have}); train with "
                                f"checkpoint.every dividing the steps you observe and checkpoint.keep_last=0")
    return path


def run_extrapolate(run: str | Path, observe: str, target: int, out: str | Path, overwrite: bool = False,
                    method: str = "rank1") -> str:
    """The ``mmrl extrapolate`` command: predict, save ``OUT/policy``, evaluate, write ``OUT/extrapolation.json``."""
    import transformers

    from mmrl.core.registry import make_task
    from mmrl.core.warm_start import build_initial_policy

    transformers.utils.logging.disable_progress_bar()
    run, out = Path(run), Path(out)
    if not (run / "config.yaml").is_file():
        raise FileNotFoundError(f"{run} is not a run folder (no config.yaml)")
    try:
        steps = [int(s) for s in observe.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--observe {observe!r}: give comma-separated steps, e.g. 10,20") from None
    if method not in METHODS:
        raise ConfigError(f"--method {method!r}: choose one of {', '.join(METHODS)}")
    prepare_atomic_out(out, overwrite, "mmrl extrapolate")
    cfg = load_config(str(run / "config.yaml"))
    task = make_task(cfg.task.name, cfg.task.args)
    initial = build_initial_policy(cfg).eval()  # the warm start: rebuilt (or read from the cache) from the config

    def at(step: int) -> Policy:
        policy = copy.deepcopy(initial)
        policy.load_weights(str(checkpoint_policy_dir(run, step)))
        return policy

    initial_state = {k: v.detach().clone() for k, v in initial.state_dict().items()}
    observed = [(s, at(s).state_dict()) for s in steps]
    predicted_state, fit = METHODS[method](initial_state, observed, target)
    predicted = copy.deepcopy(initial)
    predicted.load_state_dict(predicted_state)
    out.mkdir(parents=True, exist_ok=True)
    predicted.save_pretrained(str(out / "policy"))

    report: dict[str, Any] = {"run": str(run), "method": method, "observed_steps": steps, "target_step": target, **fit,
                              "eval": {"initial": held_out_metrics(initial, task, cfg),
                                       f"observed_step_{steps[-1]}": held_out_metrics(at(steps[-1]), task, cfg),
                                       f"predicted_step_{target}": held_out_metrics(predicted, task, cfg)}}
    if (ckpt.checkpoint_dir(run, target) / "policy").is_dir():
        trained = at(target)
        report["eval"][f"trained_step_{target}"] = held_out_metrics(trained, task, cfg)
        trained_state = trained.state_dict()
        report["weight_distance_to_trained"] = {
            "predicted": relative_distance(predicted_state, trained_state, initial_state),
            f"observed_step_{steps[-1]}": relative_distance(observed[-1][1], trained_state, initial_state)}
    (out / "extrapolation.json").write_text(json.dumps(report, indent=1))
    mark_written(out, "extrapolate")
    energy = f" (rank-1 energy of the last delta {fit['rank1_energy_fraction']:.3f})" if method == "rank1" else ""
    lines = [f"{method} extrapolation of {run} from steps {steps} to step {target}{energy}:"]
    for name, metrics in report["eval"].items():
        lines.append(f"  {name:<24} " + "  ".join(f"{k.removeprefix('eval/')} {v:.3f}" for k, v in metrics.items()))
    for name, d in report.get("weight_distance_to_trained", {}).items():
        lines.append(f"  ‖W − W_trained‖ / ‖W_trained − W_0‖, {name}: {d:.3f}")
    lines.append(f"predicted policy: {out / 'policy'}")
    return "\n".join(lines)
