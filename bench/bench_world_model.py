"""World-model env steps/s vs MuJoCo env steps/s (with rendering) in the same run, and memory.

    MMRL_CACHE=/tmp/mmrl_cache_wm OMP_NUM_THREADS=1 python bench/bench_world_model.py --steps 300 --rounds 3

Interleaved round by round (the machine is shared: only ratios taken in one run mean anything),
medians over rounds, env steps/s summed over sub-envs, random actions in [−1, 1]:

- ``mujoco x1`` / ``mujoco sync xN``: ``mmrl/Reach-v0`` (5 physics substeps + a 64 px render per step),
  one env, and a ``SyncVectorEnv`` of N;
- ``world model x1`` / ``world model xN``: ``mmrl/WM-Reach-v0`` (one latent step + decode + proprio
  head per step), the single env and the batched ``WorldModelVectorEnv`` of N (one forward pass).

Memory: the world model's parameter bytes, its reference pool's bytes, and the process's peak RSS.
``--world-model`` picks the checkpoint (default: the default recipe, trained on first use).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

import gymnasium
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import mmrl.envs  # noqa: F401  (registers mmrl/*)
from mmrl.envs.world_model import WorldModelVectorEnv


def steps_per_s(env, steps: int, num_envs: int, rng: np.random.Generator) -> float:
    """Env steps per second (× num_envs for vector envs) under random actions."""
    env.reset(seed=0)
    shape = env.action_space.shape
    start = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(rng.uniform(-1, 1, shape).astype(np.float32))
        if num_envs == 1 and (terminated or truncated):
            env.reset()
    return steps * num_envs / (time.perf_counter() - start)


def build_envs(world_model: str | None, num_envs: int, size: int) -> dict[str, tuple[object, int]]:
    kwargs = {} if world_model is None else {"world_model": world_model}
    make_real = lambda: gymnasium.make("mmrl/Reach-v0", image_size=size, disable_env_checker=True)  # noqa: E731
    return {
        "mujoco x1": (make_real(), 1),
        f"mujoco sync x{num_envs}": (SyncVectorEnv([make_real] * num_envs, autoreset_mode=AutoresetMode.NEXT_STEP),
                                     num_envs),
        "world model x1": (gymnasium.make("mmrl/WM-Reach-v0", image_size=size, disable_env_checker=True, **kwargs), 1),
        f"world model x{num_envs}": (WorldModelVectorEnv(num_envs, image_size=size, **kwargs), num_envs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="steps per measurement (vector: per sub-env)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--world-model", default=None, help="world-model folder or recipe")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    envs = build_envs(args.world_model, args.num_envs, args.image_size)
    rng = np.random.default_rng(0)
    results = {name: [] for name in envs}
    for _ in range(args.rounds):
        for name, (env, n) in envs.items():
            results[name].append(steps_per_s(env, args.steps if n == 1 else max(1, args.steps // 10), n, rng))
    sim = envs["world model x1"][0].unwrapped.sim
    table = {name: statistics.median(v) for name, v in results.items()}
    memory = {"world_model_param_mb": sum(p.numel() * p.element_size() for p in sim.model.parameters()) / 2 ** 20,
              "reference_pool_mb": (sim.first_frames.nbytes + sim.expert_actions.nbytes) / 2 ** 20,
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    base = table["mujoco x1"]
    for name, value in table.items():
        print(f"{name:22s} {value:10.1f} env steps/s   ({value / base:5.2f}x mujoco x1)")
    print(", ".join(f"{k} {v:.1f}" for k, v in memory.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps_per_s": table, "memory": memory, "args": vars(args)}, f, indent=1)


if __name__ == "__main__":
    main()
