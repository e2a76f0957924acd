"""VAR vs the tiny diffusion models for online RL: sampling throughput and RL step time, same run,
interleaved, at matched reward evaluation (VAR-GRPO's argument, arXiv 2505.23331: next-scale
prediction samples fast, so online RL is cheap).

Each model samples ``--prompts`` × ``--group`` images of ``imagegen/shapes-v0`` with its recipe's
settings, every image is scored by the same task reward (OpenCV prompt checks + JPEG), then one
PPO-clip update re-scores the rollout's decisions (``trainer.micro_batch_size`` rows per call) and
steps AdamW:

- ``var`` (``configs/var/tiny_cpu.yaml``): 4 scales (1, 2, 4, 8 → 85 tokens), CFG 2, all tokens decisions,
  re-scored in ONE teacher-forced pass;
- ``ddim`` (``configs/ddpo/tiny_cpu.yaml``): 10 DDIM steps η = 1, CFG 3, first 5 steps decisions;
- ``flow`` (``configs/flow_grpo/tiny_cpu.yaml``): 10 SDE steps, CFG 3, first 5 steps decisions.

Reported per model: median sampling s, samples/s, reward s, update s, RL step s (= sum), and the
parameter count. Weights do not change the timings, so by default each model is pretrained for a
couple of steps only; ``--cached`` uses the cached, fully pretrained models (``$MMRL_CACHE``) and then
also reports their mean reward.

    python bench/bench_var.py [--repeats 5] [--prompts 8] [--group 8] [--cached] [--models var ddim] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import numpy as np
import torch

from mmrl.algos import POLICY_LOSSES, AlgoConfig, aggregate
from mmrl.models.imagegen_pretrain import cached_pipeline, pretrain
from mmrl.policies.diffusion import DiffusionConfig, DiffusionPolicy
from mmrl.policies.var import VARConfig, VARPolicy
from mmrl.core.registry import make_task
from mmrl.core.rollout import SamplingParams
from mmrl.models.var_pretrain import cached_var, pretrain_var

CLIP = {"var": 0.2, "ddim": 1e-4, "flow": 1e-4}  # the recipes' PPO clip ranges


def build_policies(tmp: str, cached: bool, names: list[str]) -> dict[str, torch.nn.Module]:
    def diffusion(kind: str, scheduler: str) -> DiffusionPolicy:
        config = f"assets/imagegen/{kind}_tiny.json"
        folder = cached_pipeline(config, progress=False) if cached else pretrain(config, f"{tmp}/{kind}",
                                                                                 progress=False, steps=2)
        return DiffusionPolicy.from_config(DiffusionConfig(pretrained=str(folder), scheduler=scheduler, num_steps=10,
                                                           train_window=(0, 5), guidance_scale=3.0))

    def var() -> VARPolicy:
        config = "assets/imagegen/var_tiny.json"
        folder = cached_var(config, progress=False) if cached else pretrain_var(config, f"{tmp}/var", progress=False,
                                                                                steps=2)
        return VARPolicy.from_config(VARConfig(pretrained=str(folder), guidance_scale=2.0))

    builders = {"var": var, "ddim": lambda: diffusion("ddim", "ddim"), "flow": lambda: diffusion("flow", "flow_match")}
    return {name: builders[name]() for name in names}


def rl_step(policy, task, examples: list, group: int, clip: float, optimizer, seed: int,
            micro_batch: int) -> dict[str, float]:
    """Seconds of sampling, reward and update of one GRPO step (group-normalised advantages)."""
    t0 = time.perf_counter()
    rollout = policy.rollout(examples, group, SamplingParams(temperature=1.0), seed)
    t1 = time.perf_counter()
    rows_examples = [examples[i] for i in rollout.example_index.tolist()]
    scores = torch.tensor([task.reward(e, o).score for e, o in zip(rows_examples, rollout.outputs)])
    t2 = time.perf_counter()
    grouped = scores.view(len(examples), group)
    adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).flatten()
    cfg = AlgoConfig(clip_low=clip, clip_high=clip)
    num_tokens = float(rollout.mask.sum())
    for idx in torch.arange(rollout.num_rows).split(micro_batch):
        rows = rollout.select(idx)
        out = policy(rows)
        loss_tok, _ = POLICY_LOSSES.get("ppo_clip")(out.logp, rows.logp, adv[idx, None] * rows.mask, rows.mask, cfg)
        aggregate(loss_tok, rows.mask, "token-mean", num_tokens=num_tokens).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    t3 = time.perf_counter()
    return {"sample_s": t1 - t0, "reward_s": t2 - t1, "update_s": t3 - t2, "step_s": t3 - t0,
            "reward_mean": float(scores.mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=32, help="rows per re-scoring call")
    parser.add_argument("--cached", action="store_true", help="use the cached fully pretrained models")
    parser.add_argument("--models", nargs="+", default=["var", "ddim", "flow"], choices=["var", "ddim", "flow"],
                        help="models to compare (var first: the ratios are against it)")
    parser.add_argument("--json", help="also write the medians to this JSON file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    task = make_task("imagegen/shapes-v0")
    examples = task.sample_batch("train", args.prompts, np.random.default_rng(0))
    with tempfile.TemporaryDirectory() as tmp:
        policies = build_policies(tmp, args.cached, args.models)
    optimizers = {k: torch.optim.AdamW([p for p in pol.parameters() if p.requires_grad], lr=1e-6)
                  for k, pol in policies.items()}
    records: dict[str, list[dict[str, float]]] = {k: [] for k in policies}
    names = list(policies)
    for repeat in range(args.repeats + 1):  # round 0 warms up
        order = names[repeat % len(names):] + names[:repeat % len(names)]  # rotate who goes first
        for name in order:
            result = rl_step(policies[name], task, examples, args.group, CLIP[name], optimizers[name], repeat,
                             args.micro_batch)
            if repeat:
                records[name].append(result)
    n = args.prompts * args.group
    table = {}
    for name, rows in records.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        med["samples_per_s"] = n / med["sample_s"]
        med["params"] = sum(p.numel() for p in policies[name].parameters() if p.requires_grad)
        table[name] = med
    print(f"{n} images per RL step ({args.prompts} prompts x {args.group}), {args.repeats} interleaved repeats, "
          f"1 thread, medians:")
    print(f"{'model':6} {'params':>8} {'sample s':>9} {'samples/s':>10} {'reward s':>9} {'update s':>9} "
          f"{'RL step s':>10}" + (f" {'reward':>7}" if args.cached else ""))
    for name, m in table.items():
        print(f"{name:6} {m['params']:>8d} {m['sample_s']:>9.3f} {m['samples_per_s']:>10.1f} {m['reward_s']:>9.3f} "
              f"{m['update_s']:>9.3f} {m['step_s']:>10.3f}" + (f" {m['reward_mean']:>7.3f}" if args.cached else ""))
    for other in [m for m in table if m != "var" and "var" in table]:
        print(f"VAR vs {other}: sampling {table[other]['sample_s'] / table['var']['sample_s']:.1f}x faster, "
              f"RL step {table[other]['step_s'] / table['var']['step_s']:.1f}x faster")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"images_per_step": n, "repeats": args.repeats, "medians": table}, f, indent=1)


if __name__ == "__main__":
    main()
