"""Trajectories from the real MuJoCo table-top sim for training and testing the world model.

Each episode runs exactly ``steps`` env steps (stepping on after success, so every sequence has
the same length) under one behaviour:

- ``expert``: the scripted expert's clean actions (these episodes also form the reference pool
  the world-model env resets from: real first frame + the expert's actions, VLA-RFT §3.2);
- ``noisy``: the expert's action plus Gaussian noise of a std drawn from ``noise_levels``
  (states near the expert's, the ones a BC policy visits);
- ``random``: temporally correlated random actions (an AR(1) process, ρ = 0.8) for coverage.

Every env step here is a real-simulator step and is counted (``real_steps``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BEHAVIOURS = ("expert", "noisy", "random")


@dataclass
class Trajectories:
    """N episodes of T steps (frames and proprio have T + 1 entries: the first observation too)."""

    images: np.ndarray  # [N, T+1, H, W, 3] uint8
    proprio: np.ndarray  # [N, T+1, P] float32
    actions: np.ndarray  # [N, T, A] float32: executed actions
    expert_actions: np.ndarray  # [N, T, A] float32: the expert's clean action in each visited state
    instructions: list[str]
    seeds: np.ndarray  # [N] int64: the env's reset seed
    behaviours: list[str]
    success: np.ndarray  # [N] bool: success at any step

    @property
    def real_steps(self) -> int:
        return int(self.actions.shape[0] * self.actions.shape[1])

    def select(self, index) -> Trajectories:
        index = np.asarray(index)
        return Trajectories(self.images[index], self.proprio[index], self.actions[index], self.expert_actions[index],
                            [self.instructions[i] for i in index], self.seeds[index],
                            [self.behaviours[i] for i in index], self.success[index])


def behaviour_schedule(episodes: int, fractions: dict[str, float]) -> list[str]:
    """``episodes`` behaviour names in proportion to ``fractions`` (rounded; the rest are noisy)."""
    unknown = sorted(set(fractions) - set(BEHAVIOURS))
    if unknown:
        raise ValueError(f"unknown behaviours {unknown}; known: {list(BEHAVIOURS)}")
    counts = {b: int(round(fractions.get(b, 0.0) * episodes)) for b in BEHAVIOURS}
    counts["noisy"] = max(0, episodes - counts["expert"] - counts["random"])
    return [b for b in BEHAVIOURS for _ in range(counts[b])][:episodes]


def collect(task: str, image_size: int, seeds: np.ndarray, behaviours: list[str], steps: int,
            noise_levels: tuple[float, ...], rng_seed: int, env_variant: str = "") -> Trajectories:
    """Run one episode per (seed, behaviour) in ``mmrl/<Task><-variant>-v0`` for ``steps`` steps."""
    import gymnasium

    from mmrl.envs.robot import env_id

    if len(seeds) != len(behaviours):
        raise ValueError(f"{len(seeds)} seeds for {len(behaviours)} behaviours")
    env = gymnasium.make(env_id(task, env_variant), image_size=image_size, disable_env_checker=True).unwrapped
    rng = np.random.default_rng(rng_seed)
    out = {k: [] for k in ("images", "proprio", "actions", "expert", "instructions", "success")}
    for seed, behaviour in zip(seeds, behaviours):
        obs, _ = env.reset(seed=int(seed))
        images, proprio, actions, expert_actions, success = [obs["image"]], [obs["proprio"]], [], [], False
        noise = float(rng.choice(noise_levels)) if behaviour == "noisy" else 0.0
        correlated = rng.uniform(-1, 1, env.action_space.shape)
        for _ in range(steps):
            expert = env.expert_action()
            if behaviour == "random":
                correlated = 0.8 * correlated + 0.6 * rng.standard_normal(correlated.shape)
                action = correlated
            else:
                action = expert + noise * rng.standard_normal(expert.shape)
            action = np.clip(action, -1, 1).astype(np.float32)
            obs, _, terminated, _, info = env.step(action)
            success |= bool(info["success"])
            images.append(obs["image"])
            proprio.append(obs["proprio"])
            actions.append(action)
            expert_actions.append(expert)
        for key, value in (("images", images), ("proprio", proprio), ("actions", actions), ("expert", expert_actions)):
            out[key].append(np.stack(value))
        out["instructions"].append(obs["instruction"])
        out["success"].append(success)
    env.close()
    return Trajectories(np.stack(out["images"]), np.stack(out["proprio"]).astype(np.float32),
                        np.stack(out["actions"]).astype(np.float32), np.stack(out["expert"]).astype(np.float32),
                        out["instructions"], np.asarray(seeds, dtype=np.int64), list(behaviours),
                        np.asarray(out["success"], dtype=bool))
