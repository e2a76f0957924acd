"""Each prompt read once for its group (mmrl/policies/shared_prefix.py) against every row reading its own.

On the Spatial-SSRL recipe's tiny Qwen2.5-VL (configs/spatial_ssrl/tiny_cpu.yaml: 84 px images, 16 prompts
× group 8, ≤ 40 new tokens), interleaved, medians:

1. **sampling**: ``HFGenerateSampler`` with ``group_size=8`` (one prefill per prompt, cache expanded)
   against the same sampler over the 128 expanded rows (what the policy did before); both draw the
   same tokens from the same seed (checked here and in tests/policies/test_shared_prefix.py);
2. **re-scoring**: forward + backward of the log-probs of a 64-row minibatch (the recipe's update
   micro-batch) with each distinct prompt run once, against one forward over every row's prompt and
   completion; the log-probs agree to float rounding (checked here).

    python bench/bench_shared_prefix.py [--repeats 8] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from mmrl.core.config import load_config
from mmrl.core.registry import make_policy, make_task
from mmrl.core.rollout import SamplingParams
from mmrl.samplers.hf_generate import HFGenerateSampler


def interleaved(fns: dict, repeats: int) -> dict:
    """Median seconds of each function, run in alternating order after one warm-up call each."""
    for fn in fns.values():
        fn(0)
    times: dict = {name: [] for name in fns}
    names = list(fns)
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            fns[name](repeat + 1)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--minibatch", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config("spatial_ssrl/tiny_cpu", [])
    task = make_task(cfg.task.name, cfg.task.args)
    policy = make_policy(cfg.policy.name, cfg.policy.args)
    examples = task.sample_batch("train", args.prompts, np.random.default_rng(0))
    group = args.group_size
    sampling = SamplingParams(temperature=1.0, max_new_tokens=cfg.rollout.max_new_tokens)
    prompts = policy.encode(examples)
    rows = prompts.select(torch.arange(prompts.num_rows).repeat_interleave(group))
    sampler = HFGenerateSampler()

    def sample_shared(seed: int):
        return sampler.sample(policy.model, prompts, sampling, policy.rules, seed, 0, group_size=group)

    def sample_rows(seed: int):
        return sampler.sample(policy.model, rows, sampling, policy.rules, seed, 0)

    same = torch.equal(sample_shared(0).ids, sample_rows(0).ids)
    generation = interleaved({"shared": sample_shared, "rows": sample_rows}, args.repeats)

    policy.train()
    rollout = policy.rollout(examples, group, sampling, seed=0)
    order = torch.randperm(len(rollout.mask), generator=torch.Generator().manual_seed(0))
    batch = rollout.select(order[:args.minibatch])
    with torch.no_grad():
        exact = float(((policy.score(batch.payload).logp - policy.score(batch.payload, shared_prefix=False).logp)
                       * batch.mask).abs().max())

    def update(shared: bool):
        def run(_: int) -> None:
            policy.zero_grad(set_to_none=True)
            out = policy.score(batch.payload, shared_prefix=shared)
            ((out.logp * batch.mask).sum() / batch.mask.sum()).backward()
        return run

    scoring = interleaved({"shared": update(True), "rows": update(False)}, args.repeats)
    tokens = int(rollout.mask.sum())
    print(f"tiny Qwen2.5-VL, {args.prompts} prompts x {group}, {args.threads} thread(s), medians of {args.repeats}")
    print(f"sampling ({len(rollout.mask)} rows, {tokens} tokens; same tokens from one seed: {same}):")
    print(f"  one prefill per prompt {generation['shared']:.3f} s   every row {generation['rows']:.3f} s   "
          f"speed-up {generation['rows'] / generation['shared']:.2f}x")
    print(f"re-scoring forward + backward, {args.minibatch}-row minibatch (max |logp difference| {exact:.1e}):")
    print(f"  each prompt once       {scoring['shared']:.3f} s   every row {scoring['rows']:.3f} s   "
          f"speed-up {scoring['rows'] / scoring['shared']:.2f}x")


if __name__ == "__main__":
    main()
