"""Task adapters over the table-top envs: examples are (env id, seed); the reward is the episode.

- ``sample_batch(split, n, rng)``: ``train``, ``val`` and ``test`` use the training variation
  (``mmrl/<Task>-v0``) with disjoint seed ranges (``val``: for choosing a checkpoint, e.g.
  ``checkpoint.best_metric: eval/val/success_rate``, so ``test`` stays unseen); ``ood_color``, ``ood_position``,
  ``ood_instruction``, ``ood_distractor`` use the held-out variations (``mmrl/<Task>-OOD<X>-v0``).
- ``reward(example, summary)``: score = the episode return, i.e. Φ(s_T) − Φ(s_0) of the env's
  potential (success counts 1, progress terms at most 1 together), so the range is [−1, 2]; a
  return outside it (an env bug) is clipped, the ``return`` component keeps it. Components
  ``success`` and ``return``. Anything but an episode summary of that example's env and seed, or a
  non-finite return, scores the floor −1 with the reason in ``info`` (never better than an episode).
- ``metrics``: ``success_rate`` (logged ``eval/success_rate``), ``return_mean``, ``length_mean``.
- ``reference_output(example)``: the scripted expert's demonstration of that episode (for BC),
  with DART-style noise injection (Laskey et al. 2017): the executed action is perturbed with
  ``demo_noise`` Gaussian noise, the recorded label is the clean expert action, so BC sees the
  states its own errors lead to. The executed actions and the per-step rewards are recorded too, so
  the same demonstrations are transitions for off-policy learners (``mmrl.algos.offpolicy``).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any
from dataclasses import dataclass

import gymnasium
import numpy as np

from mmrl.core.contracts import RewardResult
from mmrl.envs.robot import env_id
from mmrl.samplers.gym_runner import EpisodeSummary

SPLITS = {"train": "", "val": "", "test": "", "ood_color": "OODColor", "ood_position": "OODPosition",
          "ood_instruction": "OODInstruction", "ood_distractor": "OODDistractor"}
TEST_SEED_OFFSET = 1_000_000  # train seeds are < this, test / OOD seeds are >= it
VAL_SEED_OFFSET = 2 * TEST_SEED_OFFSET  # validation seeds: [2e6, 3e6), disjoint from train, test and OOD


def split_seed_start(split: str) -> int:
    """The first seed of ``split`` (each split draws from ``TEST_SEED_OFFSET`` seeds on from there)."""
    return {"train": 0, "val": VAL_SEED_OFFSET}.get(split, TEST_SEED_OFFSET)


@dataclass(frozen=True)
class RobotTaskConfig:
    image_size: int = 64
    """Camera image side in pixels (the policy's ``image_size`` must match)."""
    demo_noise: float = 0.3
    """Std of the Gaussian noise added to the executed expert action in demonstrations (labels stay clean)."""
    demo_cache: int = 4096
    """Demonstrations kept in memory (by env id and seed)."""


@dataclass(frozen=True)
class EpisodeExample:
    env_id: str
    seed: int


@dataclass(frozen=True)
class Demonstration:
    images: np.ndarray  # [T, H, W, 3] uint8
    proprio: np.ndarray  # [T, P] float32
    instruction: str
    actions: np.ndarray  # [T, A] float32: the clean expert action at each visited state
    success: bool
    executed_actions: np.ndarray  # [T, A] float32: the action actually executed (expert + DART noise, clipped)
    rewards: np.ndarray  # [T] float32: the env reward of each step (off-policy learners' transitions)


RETURN_RANGE = (-1.0, 2.0)
"""Range of Φ(s_T) − Φ(s_0): Φ ∈ [0, 2] (success 1, progress terms at most 1 together)."""


def finite_return(summary: EpisodeSummary) -> float | None:
    """The summary's return as a finite float, None when it is not one (NaN, inf, 10**400, text)."""
    try:
        value = float(summary.episode_return)
    except (TypeError, ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def episode_reward(example: EpisodeExample, output: object) -> RewardResult:
    """Score of one episode: its return Φ(s_T) − Φ(s_0), clipped to :data:`RETURN_RANGE`; total on any input.

    >>> episode_reward(EpisodeExample("mmrl/Reach-v0", 3), EpisodeSummary("mmrl/Reach-v0", 3, True, 1.5, 9)).score
    1.5
    >>> episode_reward(EpisodeExample("mmrl/Reach-v0", 3), "reach").score
    -1.0
    """
    floor = RETURN_RANGE[0]
    if not isinstance(output, EpisodeSummary):
        return RewardResult(floor, {"success": 0.0, "return": floor}, f"not an episode summary: {type(output).__name__}")
    if (output.env_id, output.seed) != (example.env_id, example.seed):
        return RewardResult(floor, {"success": 0.0, "return": floor},
                            f"episode of {output.env_id} seed {output.seed} scored for {example.env_id} seed {example.seed}")
    episode_return = finite_return(output)
    if episode_return is None:
        return RewardResult(floor, {"success": 0.0, "return": floor}, "non-finite episode return")
    success = float(output.success)
    return RewardResult(float(np.clip(episode_return, *RETURN_RANGE)), {"success": success, "return": episode_return},
                        "" if success else f"no success in {output.length} steps")


def episode_metrics(outputs: Sequence[object], results: Sequence[RewardResult]) -> dict[str, float]:
    """``success_rate``, ``return_mean`` and ``length_mean`` (0 when no output was an episode); when the episodes
    came from more than one task of a suite (``robot/metaworld-mt10-v0``), ``success_rate/<task>`` for each."""
    lengths = [o.length for o in outputs if isinstance(o, EpisodeSummary)]
    metrics = {"success_rate": float(np.mean([r.components["success"] for r in results])),
               "return_mean": float(np.mean([r.components["return"] for r in results])),
               "length_mean": float(np.mean(lengths)) if lengths else 0.0}
    tasks = [o.task if isinstance(o, EpisodeSummary) else "" for o in outputs]
    names = sorted({t for t in tasks if t})
    if len(names) > 1:  # a suite's episodes: success per task as well
        for name in names:
            metrics[f"success_rate/{name}"] = float(np.mean([r.components["success"]
                                                             for t, r in zip(tasks, results) if t == name]))
    return metrics


def demonstrate(env: gymnasium.Env, seed: int, noise: float) -> Demonstration:
    """One episode of ``env.unwrapped.expert_action()`` from ``reset(seed=seed)`` with DART noise injection:
    the executed action is the expert's plus ``noise``-std Gaussian noise, the recorded label the clean one."""
    rng = np.random.default_rng([seed, 7])
    obs, _ = env.reset(seed=seed)
    images, proprio, actions, executed_actions, rewards = [], [], [], [], []
    while True:
        expert = env.unwrapped.expert_action()
        images.append(obs["image"])
        proprio.append(obs["proprio"])
        actions.append(expert)
        executed = np.clip(expert + noise * rng.standard_normal(expert.shape), -1, 1)
        executed_actions.append(executed)
        obs, reward, terminated, truncated, info = env.step(executed.astype(np.float32))
        rewards.append(reward)
        if terminated or truncated:
            break
    return Demonstration(np.stack(images), np.stack(proprio).astype(np.float32), obs["instruction"],
                         np.stack(actions).astype(np.float32), bool(info["success"]),
                         np.stack(executed_actions).astype(np.float32), np.asarray(rewards, dtype=np.float32))


class EpisodeTask:
    """What the simulator tasks share: the output is an episode, its return Φ(s_T) − Φ(s_0) the reward;
    reference outputs are scripted-expert demonstrations (DART noise), cached by (env id, seed). A subclass
    draws its examples (``sample_batch``) and may add env arguments (``env_kwargs``).

    Every step is a real simulator step (:class:`~mmrl.core.contracts.SimulatorTask`): episodes count their
    length, demonstrations theirs, once per (env id, seed) (the same seed replays the same noisy episode)."""

    reward_range = RETURN_RANGE

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self._demos: OrderedDict[tuple[str, int], Demonstration] = OrderedDict()
        self._demo_steps: dict[tuple[str, int], int] = {}  # every demonstration run for reference_output
        self._env: dict[str, gymnasium.Env] = {}

    def env_kwargs(self) -> dict[str, Any]:
        """Arguments of ``gymnasium.make`` for the demonstration envs."""
        return {"image_size": self.cfg.image_size}

    def reward(self, example: EpisodeExample, output: object) -> RewardResult:
        return episode_reward(example, output)

    def metrics(self, examples: Sequence[EpisodeExample], outputs: Sequence[object],
                results: Sequence[RewardResult]) -> dict[str, float]:
        return episode_metrics(outputs, results)

    def reference_output(self, example: EpisodeExample) -> Demonstration:
        key = (example.env_id, example.seed)
        if key not in self._demos:
            self._demos[key] = self.demonstrate(example)
            self._demo_steps[key] = len(self._demos[key].rewards)
            if len(self._demos) > self.cfg.demo_cache:
                self._demos.popitem(last=False)
        return self._demos[key]

    # -- real simulator steps (SimulatorTask) ------------------------------------------------------
    def real_env_steps(self, outputs: Sequence[object]) -> int:
        """Σ length of the episodes among ``outputs`` (all real for the MuJoCo tasks)."""
        return sum(o.length for o in outputs if isinstance(o, EpisodeSummary))

    def demonstration_steps(self, examples: Sequence[EpisodeExample]) -> dict[tuple[str, int], int]:
        """Length of each distinct example's demonstration, by (env id, seed): from the runs of this task object,
        else run now (frames not kept: counting a warm start's thousands of demonstrations holds no images)."""
        steps: dict[tuple[str, int], int] = {}
        for example in examples:
            key = (example.env_id, example.seed)
            if key not in steps:
                known = self._demo_steps.get(key)
                steps[key] = known if known is not None else len(self.demonstrate(example).rewards)
        return steps

    def demonstrations_run(self) -> dict[tuple[str, int], int]:
        return dict(self._demo_steps)

    def simulator_data_env_steps(self) -> int:
        """0: the MuJoCo simulator is real, it was built from no data."""
        return 0

    def demonstrate(self, example: EpisodeExample) -> Demonstration:
        """Run the scripted expert (with noise injection) for one episode; record obs and labels."""
        if example.env_id not in self._env:
            self._env[example.env_id] = gymnasium.make(example.env_id, **self.env_kwargs(), disable_env_checker=True)
        return demonstrate(self._env[example.env_id], example.seed, self.cfg.demo_noise)


class RobotTask(EpisodeTask):
    def __init__(self, task: str, cfg: RobotTaskConfig):
        super().__init__(cfg)
        self.task, self.id = task, f"robot/{task}-v0"

    def sample_batch(self, split: str, n: int, rng: np.random.Generator) -> list[EpisodeExample]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; {self.id} has {', '.join(SPLITS)}")
        low = split_seed_start(split)
        seeds = rng.integers(low, low + TEST_SEED_OFFSET, size=n)
        return [EpisodeExample(env_id(self.task, SPLITS[split]), int(s)) for s in seeds]


def make_task_factory(task: str):
    def factory(cfg: RobotTaskConfig) -> RobotTask:
        return RobotTask(task, cfg)

    factory.__name__ = f"make_{task}_task"
    return factory
