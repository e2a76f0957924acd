"""Env throughput with rendering, next to a bare MuJoCo loop on the same model, and VLA inference.

    MUJOCO_GL=egl OMP_NUM_THREADS=1 python bench/bench_envs.py --steps 300 --rounds 3 --num-envs 8

Measured in one process, interleaved round by round (the machine is shared: only ratios taken in
the same run mean anything), medians over rounds:

- ``bare``: ``mujoco.mj_step`` × 5 substeps + ``mujoco.Renderer`` at the env's image size, on the
  same MJCF, moving the mocap end effector as the env does — the floor an env cannot beat.
- ``bare x1, shared GL context``: the same loop drawn with the envs' ``SceneRenderer``.
- ``env x1``: ``gymnasium.make("mmrl/Push-v0")`` stepped with random actions (reset on episode end).
- ``sync xN`` / ``async xN``: ``SyncVectorEnv`` / ``AsyncVectorEnv`` of N push envs; env steps/s
  summed over the sub-envs. "vs bare" is then the throughput per env step relative to the bare
  loop (the issue's target: >= 0.9x); one sync vector env runs on one core, the async one on N.
- ``policy bB``: decisions/s of the tiny VLA's ``decide`` (encode + sample + log-prob + value) on a
  batch of B observations.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import gymnasium
import numpy as np
import torch

import mmrl.envs  # noqa: F401  (registers mmrl/*; selects the GL backend before mujoco loads)
from mmrl.envs.robot.rendering import SceneRenderer, mujoco
from mmrl.envs.robot.tabletop import RULES, mjcf_path

ENV_ID = "mmrl/Push-v0"


def bare_loop(steps: int, size: int, shared_context: bool = False) -> float:
    """mj_step × 5 + one frame per step; ``shared_context``: draw with the envs' SceneRenderer
    (isolates the gymnasium wrapper's own overhead) instead of ``mujoco.Renderer``."""
    model = mujoco.MjModel.from_xml_path(str(mjcf_path("push.xml")))
    data = mujoco.MjData(model)
    renderer = SceneRenderer(model, size, size) if shared_context else mujoco.Renderer(model, size, size)
    camera = model.camera("top").id
    ee = model.body("ee").mocapid[0]
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for _ in range(steps):
        delta = rng.uniform(-1, 1, 2) * RULES["push"].max_delta
        for _ in range(5):
            data.mocap_pos[ee, :2] = np.clip(data.mocap_pos[ee, :2] + delta / 5, -0.25, 0.25)
            mujoco.mj_step(model, data)
        if shared_context:
            renderer.render(model, data, camera)
        else:
            renderer.update_scene(data, camera)
            renderer.render()
    rate = steps / (time.perf_counter() - start)
    renderer.close()
    return rate


def single_env(env: gymnasium.Env, steps: int) -> float:
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    start = time.perf_counter()
    for _ in range(steps):
        _, _, term, trunc, _ = env.step(rng.uniform(-1, 1, 2).astype(np.float32))
        if term or trunc:
            env.reset()
    return steps / (time.perf_counter() - start)


def vector_env(env: gymnasium.vector.VectorEnv, steps: int) -> float:
    """Env steps per second over all sub-envs (autoreset: the vector env resets finished episodes)."""
    rng = np.random.default_rng(0)
    env.reset(seed=list(range(env.num_envs)))
    start = time.perf_counter()
    for _ in range(steps):
        env.step(rng.uniform(-1, 1, (env.num_envs, 2)).astype(np.float32))
    return steps * env.num_envs / (time.perf_counter() - start)


def policy_decisions(batch: int, steps: int) -> float:
    from mmrl.policies.vla import VLAConfig, VLAPolicy, instruction_ids

    policy = VLAPolicy.from_config(VLAConfig()).eval()
    obs, _ = gymnasium.make(ENV_ID, disable_env_checker=True).reset(seed=0)
    images = torch.from_numpy(np.repeat(obs["image"][None], batch, 0))
    proprio = torch.from_numpy(np.repeat(obs["proprio"][None], batch, 0))
    ids, _ = instruction_ids([obs["instruction"]] * batch, policy.cfg.vocab_buckets)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        start = time.perf_counter()
        for _ in range(steps):
            h = policy.features(images, proprio, ids)
            decision = policy.sample_actions(h, 1.0, generator)
            policy.action_logprob(h, decision, 1.0)
            policy.value(h)
    return batch * steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300, help="env steps per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians are reported)")
    parser.add_argument("--num-envs", type=int, default=8, help="sub-envs of the vector envs")
    parser.add_argument("--async-envs", type=int, default=2, help="sub-envs of the AsyncVectorEnv (one process each)")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    size, n = args.image_size, args.num_envs
    spec = gymnasium.spec(ENV_ID)  # a spec, not an id: spawned workers have no mmrl/* registrations
    make = lambda: gymnasium.make(spec, image_size=size, disable_env_checker=True)  # noqa: E731
    env = make()
    sync = gymnasium.vector.SyncVectorEnv([make] * n)
    asyn = gymnasium.vector.AsyncVectorEnv([make] * args.async_envs, context="spawn", shared_memory=False)  # fork + GL state crashes
    runs: dict[str, list[float]] = {}
    try:
        for _ in range(args.rounds):
            for name, fn in ((f"bare x1 ({size}px)", lambda: bare_loop(args.steps, size)),
                             ("bare x1, shared GL context", lambda: bare_loop(args.steps, size, shared_context=True)),
                             ("env x1", lambda: single_env(env, args.steps)),
                             (f"sync x{n}", lambda: vector_env(sync, max(args.steps // n, 20))),
                             (f"async x{args.async_envs}", lambda: vector_env(asyn, max(args.steps // 2, 20))),
                             ("policy b1 (decisions/s)", lambda: policy_decisions(1, 100)),
                             ("policy b32 (decisions/s)", lambda: policy_decisions(32, 20))):
                runs.setdefault(name, []).append(fn())
    finally:
        sync.close()
        asyn.close()
    medians = {k: statistics.median(v) for k, v in runs.items()}
    bare, shared = runs[f"bare x1 ({size}px)"], runs["bare x1, shared GL context"]

    def ratio(values: list[float], base: list[float]) -> float:  # median over rounds of same-round ratios
        return statistics.median(v / b for v, b in zip(values, base))

    print(f"{'measurement':<28} {'steps/s':>10} {'vs bare':>8} {'vs bare (shared ctx)':>21}")
    for name, value in medians.items():
        cols = "" if name.startswith("policy") else f"{ratio(runs[name], bare):>7.2f}x {ratio(runs[name], shared):>20.2f}x"
        print(f"{name:<28} {value:>10,.0f} {cols}")
    print(f"(medians of {args.rounds} interleaved rounds, {size} px images, rendering every step)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"medians": medians, "runs": runs, "args": vars(args)}, f, indent=1)


if __name__ == "__main__":
    main()
