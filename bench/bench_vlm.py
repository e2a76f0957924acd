"""The VLM path on CPU, tiny embedded Qwen2.5-VL: sampler throughput, GRPO step time, peak memory.

1. **Sampling**: sampled tokens/s of the policy's batched HF sampler (``VLMPolicy.rollout``:
   one ``generate`` call over all prompts × samples, KV cache) against the naive loop users write
   first (``model.generate`` once per prompt row, same processor inputs, same sampling settings).
   The two are interleaved and the medians compared, so both see the same machine load.
2. **GRPO step**: wall time of one training step of ``configs/vlm_sanity/tiny_cpu.yaml``
   (rollout + reward + advantages + ``ppo_epochs × minibatches`` updates) and the process's
   resident memory (RSS) peak during it, per ``prompts_per_step`` (group size 8). RSS is sampled
   every 5 ms by a thread and reported as the peak above the RSS before the step.

    python bench/bench_vlm.py [--repeats 5] [--batch-sizes 4,8,16]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time

import numpy as np
import psutil
import torch

from mmrl.core.config import load_config
from mmrl.core.registry import make_policy, make_task
from mmrl.core.rollout import SamplingParams
from mmrl.core.trainer import Trainer

QUIET = ["log.progress=false", "log.tensorboard=false"]


class PeakRSS:
    """Peak resident memory of this process while the context runs (sampled every 5 ms)."""

    def __enter__(self):
        self.process = psutil.Process()
        self.start = self.peak = self.process.memory_info().rss
        self.running = True
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _watch(self):
        while self.running:
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.005)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def naive_generate(policy, examples, group_size: int, sampling: SamplingParams, seed: int) -> int:
    """One ``model.generate`` per row; returns the number of sampled tokens up to EOS."""
    tokens = 0
    torch.manual_seed(seed)
    for example in examples:
        prompts = policy.encode([example])
        vision = {} if prompts.image_grid_thw is None else {"pixel_values": prompts.pixel_values,
                                                             "image_grid_thw": prompts.image_grid_thw}
        for _ in range(group_size):
            out = policy.model.generate(input_ids=prompts.input_ids, attention_mask=prompts.attention_mask,
                                        mm_token_type_ids=prompts.mm_token_type_ids, do_sample=True,
                                        temperature=sampling.temperature, top_k=0,
                                        max_new_tokens=sampling.max_new_tokens, eos_token_id=list(policy.eos_ids),
                                        pad_token_id=policy.rules.pad_id, suppress_tokens=policy.suppressed.tolist(),
                                        **vision)
            completion = out[0, prompts.input_ids.shape[1]:]
            ended = (torch.isin(completion, torch.tensor(policy.eos_ids))).nonzero()
            tokens += int(ended[0]) + 1 if len(ended) else completion.numel()
    return tokens


def sampling_benchmark(repeats: int, prompts: int, group_size: int) -> dict:
    cfg = load_config("vlm_sanity/tiny_cpu", QUIET)
    task = make_task(cfg.task.name, cfg.task.args)
    policy = make_policy(cfg.policy.name, cfg.policy.args).eval()
    examples = task.sample_batch("train", prompts, np.random.default_rng(0))
    sampling = SamplingParams(temperature=1.0, max_new_tokens=cfg.rollout.max_new_tokens)

    def ours(seed: int) -> int:
        return int(policy.rollout(examples, group_size, sampling, seed).mask.sum())

    def naive(seed: int) -> int:
        return naive_generate(policy, examples, group_size, sampling, seed)

    rates: dict = {ours: [], naive: []}
    for repeat in range(repeats + 1):  # repeat 0 warms up
        for fn in (ours, naive) if repeat % 2 else (naive, ours):
            start = time.perf_counter()
            tokens = fn(repeat)
            if repeat:
                rates[fn].append(tokens / (time.perf_counter() - start))
    ours_rate, naive_rate = statistics.median(rates[ours]), statistics.median(rates[naive])
    return {"rows": prompts * group_size, "ours_tok_s": ours_rate, "naive_tok_s": naive_rate,
            "speedup": ours_rate / naive_rate}


def step_benchmark(batch_sizes: list[int], repeats: int) -> list[dict]:
    results = []
    for prompts in batch_sizes:
        overrides = [*QUIET, f"rollout.prompts_per_step={prompts}", "warm_start.sft_steps=60",
                     "eval.num_examples=8"]
        with tempfile.TemporaryDirectory() as out:
            trainer = Trainer(load_config("vlm_sanity/tiny_cpu", overrides), out)
            times, peaks = [], []
            for repeat in range(repeats + 1):
                trainer.step += 1
                with PeakRSS() as rss:
                    start = time.perf_counter()
                    batch = trainer.collect()
                    advantages, returns, reference = trainer.advantages(batch)
                    trainer.update(batch.rollout, advantages, returns, reference)
                    elapsed = time.perf_counter() - start
                if repeat:  # repeat 0 warms up
                    times.append(elapsed)
                    peaks.append((rss.peak - rss.start) / 2**20)
            results.append({"prompts": prompts, "rows": prompts * trainer.cfg.rollout.group_size,
                            "step_s": statistics.median(times), "peak_rss_delta_mib": max(peaks),
                            "rss_mib": psutil.Process().memory_info().rss / 2**20})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=8, help="prompts in the sampling comparison")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--batch-sizes", default="4,8,16", help="prompts_per_step values for the GRPO step")
    args = parser.parse_args()
    torch.set_num_threads(1)
    s = sampling_benchmark(args.repeats, args.prompts, args.group_size)
    print(f"sampling, {s['rows']} rows (tiny Qwen2.5-VL, 56 px images, T=1, ≤24 new tokens), medians of "
          f"{args.repeats} interleaved runs:")
    print(f"  mmrl HF sampler (batched generate): {s['ours_tok_s']:8.0f} tok/s")
    print(f"  naive model.generate per row:       {s['naive_tok_s']:8.0f} tok/s")
    print(f"  speed-up: {s['speedup']:.1f}x")
    print("GRPO step of configs/vlm_sanity/tiny_cpu.yaml (group 8, 2 epochs x 2 minibatches), median of "
          f"{args.repeats}:")
    print(f"  {'prompts':>7} {'rows':>5} {'step s':>8} {'peak RSS +MiB':>14} {'RSS MiB':>8}")
    for r in step_benchmark([int(b) for b in args.batch_sizes.split(",")], args.repeats):
        print(f"  {r['prompts']:>7} {r['rows']:>5} {r['step_s']:>8.2f} {r['peak_rss_delta_mib']:>14.1f} "
              f"{r['rss_mib']:>8.0f}")


if __name__ == "__main__":
    main()
