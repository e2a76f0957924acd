"""Overhead of mmrl's update step over a bare PPO-clip update on the same batch.

Both sides take one rollout of the sanity recipe (16 prompts × 8 samples) and run the same number
of optimizer steps on it. The baseline is the loop one would write by hand: forward, masked
token-mean PPO-clip loss, backward, clip, AdamW step. mmrl's ``Trainer.update`` adds the
registries, global-denominator aggregation, entropy, reference KL, metrics and the NaN guard.
Reported: median seconds per optimizer step for each (the two interleaved) and their ratio.

    python bench/bench_update.py [--repeats 20] [--kl]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from mmrl.core.config import load_config
from mmrl.core.trainer import Trainer


def bare_update(policy, rollout, advantages, optimizer, clip: float = 0.2) -> None:
    out = policy(rollout)
    ratio = torch.exp(out.logp - rollout.logp)
    loss_tok = -torch.minimum(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages)
    loss = (loss_tok * rollout.mask).sum() / rollout.mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--kl", action="store_true", help="also keep a reference model and a KL term")
    args = parser.parse_args()
    overrides = ["log.progress=false", "log.tensorboard=false", "trainer.ppo_epochs=1", "trainer.minibatches=1", "trainer.micro_batch_size=128",
                 "warm_start.sft_steps=60", f"algo.kl_coef={0.05 if args.kl else 0.0}",
                 f"trainer.ref_model={'copy' if args.kl else 'none'}"]
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(load_config("sanity/tiny_cpu", overrides), out)
        trainer.step = 1
        batch = trainer.collect()
        advantages, returns, reference = trainer.advantages(batch)
        bare_optimizer = torch.optim.AdamW(trainer.policy.parameters(), lr=1e-6)

        def mmrl_step() -> None:
            trainer.update(batch.rollout, advantages, returns, reference)

        def bare_step() -> None:
            bare_update(trainer.policy, batch.rollout, advantages, bare_optimizer)

        # Interleaved, medians: the two sides see the same machine load.
        times: dict = {mmrl_step: [], bare_step: []}
        for repeat in range(args.repeats + 1):
            for fn in (mmrl_step, bare_step) if repeat % 2 else (bare_step, mmrl_step):
                start = time.perf_counter()
                fn()
                if repeat:  # the first round warms up
                    times[fn].append(time.perf_counter() - start)
        mmrl_s, bare_s = (statistics.median(times[fn]) for fn in (mmrl_step, bare_step))
    tokens = int(batch.rollout.mask.sum())
    print(f"batch: {batch.rollout.num_rows} samples, {tokens} tokens; reference KL: {args.kl}")
    print(f"bare PPO-clip update   {bare_s * 1e3:8.1f} ms/step")
    print(f"mmrl Trainer.update    {mmrl_s * 1e3:8.1f} ms/step")
    print(f"ratio mmrl / bare      {mmrl_s / bare_s:8.2f}")


if __name__ == "__main__":
    main()
