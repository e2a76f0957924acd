"""Trajectories from the real MuJoCo table-top sim for training and testing the world model.

Each episode runs exactly ``steps`` env steps (stepping on after success, so every sequence has
the same length) under one behaviour:

- ``expert``: the scripted expert's clean actions (these episodes also form the reference pool
  the world-model env resets from: real first frame + the expert's actions, VLA-RFT §3.2);
- ``noisy``: the expert's action plus Gaussian noise of a std drawn from ``noise_levels``
  (states near the expert's, the ones a BC policy visits);
- ``random``: temporally correlated random actions (an AR(1) process, ρ = 0.8) for coverage.

:func:`warm_start_demonstrations` instead replays the BC warm start's own demonstration episodes
(behaviour ``demonstration``): the same seeds in the same order as the warm start drew them, the
same DART noise, so the frames are exactly the ones BC trained on (VLA-RFT trains its world model on
the policy's SFT data, so RFT adds no real-simulator step). These end on success (variable length):
``lengths`` holds each episode's real steps; frames after the end repeat the last one, actions are 0,
and the world model's loss ignores them.

Every env step here is a real-simulator step and is counted (``real_steps``: valid steps only).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BEHAVIOURS = ("expert", "noisy", "random")
DEMONSTRATION = "demonstration"


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
    lengths: np.ndarray  # [N] int64: real steps of each episode (≤ T; the rest is padding)

    @property
    def real_steps(self) -> int:
        return int(self.lengths.sum())

    def select(self, index) -> Trajectories:
        index = np.asarray(index)
        return Trajectories(self.images[index], self.proprio[index], self.actions[index], self.expert_actions[index],
                            [self.instructions[i] for i in index], self.seeds[index],
                            [self.behaviours[i] for i in index], self.success[index], self.lengths[index])


def concatenate(parts: list[Trajectories]) -> Trajectories:
    """One set of the episodes of ``parts`` (all of the same horizon T), in order."""
    return Trajectories(*(np.concatenate([getattr(p, k) for p in parts]) for k in
                          ("images", "proprio", "actions", "expert_actions")),
                        [s for p in parts for s in p.instructions], np.concatenate([p.seeds for p in parts]),
                        [b for p in parts for b in p.behaviours], np.concatenate([p.success for p in parts]),
                        np.concatenate([p.lengths for p in parts]))


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
                        np.asarray(out["success"], dtype=bool), np.full(len(seeds), steps, dtype=np.int64))


def warm_start_seeds(task: str, image_size: int, demo_noise: float, batches: int, batch_size: int,
                     seed: int) -> list[int]:
    """The distinct train seeds a BC warm start of ``batches`` × ``batch_size`` draws (first-use order):
    the same calls on the same generator as :func:`mmrl.core.warm_start.sft` (``task.sample_batch``)."""
    from mmrl.tasks.robot.tabletop import RobotTask, RobotTaskConfig

    sampler = RobotTask(task, RobotTaskConfig(image_size, demo_noise))
    rng = np.random.default_rng(seed)
    seeds: dict[int, None] = {}
    for _ in range(batches):
        seeds.update((ex.seed, None) for ex in sampler.sample_batch("train", batch_size, rng))
    return list(seeds)


def warm_start_demonstrations(task: str, image_size: int, demo_noise: float, seeds: list[int],
                              steps: int) -> Trajectories:
    """Replay the demonstrations of ``seeds`` exactly as :meth:`RobotTask.demonstrate` runs them (same
    reset, same DART noise generator ``default_rng([seed, 7])``), recording the *executed* actions and
    the final frame too; episodes end on success or at the time limit and are padded to ``steps``."""
    import gymnasium

    from mmrl.envs.robot import env_id

    env = gymnasium.make(env_id(task), image_size=image_size, disable_env_checker=True)
    out = {k: [] for k in ("images", "proprio", "actions", "expert", "instructions", "success", "lengths")}
    for seed in seeds:
        rng = np.random.default_rng([seed, 7])
        obs, _ = env.reset(seed=seed)
        images, proprio, actions, expert_actions = [obs["image"]], [obs["proprio"]], [], []
        while True:
            expert = env.unwrapped.expert_action()
            executed = np.clip(expert + demo_noise * rng.standard_normal(expert.shape), -1, 1).astype(np.float32)
            obs, _, terminated, truncated, info = env.step(executed)
            images.append(obs["image"])
            proprio.append(obs["proprio"])
            actions.append(executed)
            expert_actions.append(expert)
            if terminated or truncated:
                break
        length = len(actions)
        if length > steps:
            raise ValueError(f"demonstration of seed {seed} lasts {length} steps, more than the model's {steps}")
        pad = steps - length
        zeros = np.zeros((pad, *actions[0].shape), np.float32)
        out["images"].append(np.concatenate([np.stack(images), np.repeat(images[-1][None], pad, 0)]))
        out["proprio"].append(np.concatenate([np.stack(proprio), np.repeat(proprio[-1][None], pad, 0)]))
        out["actions"].append(np.concatenate([np.stack(actions), zeros]))
        out["expert"].append(np.concatenate([np.stack(expert_actions), zeros]))
        out["instructions"].append(obs["instruction"])
        out["success"].append(bool(info["success"]))
        out["lengths"].append(length)
    env.close()
    return Trajectories(np.stack(out["images"]), np.stack(out["proprio"]).astype(np.float32),
                        np.stack(out["actions"]).astype(np.float32), np.stack(out["expert"]).astype(np.float32),
                        out["instructions"], np.asarray(seeds, dtype=np.int64), [DEMONSTRATION] * len(seeds),
                        np.asarray(out["success"], dtype=bool), np.asarray(out["lengths"], dtype=np.int64))
