"""Task adapters over the Meta-World envs: ``robot/metaworld-<task>-v0``, ``robot/metaworld-mt10-v0``,
``robot/metaworld-ml10-v0``; examples are (env id, seed), the reward is the episode.

Splits (``sample_batch(split, n, rng)``), as RL4VLA studies generalisation:

- ``train``: seeds in ``[0, train_seeds)``: a finite set of initial/goal layouts (Meta-World's own
  sampler, seeded), as a demonstration data set is finite; BC and RL draw from it.
- ``test``: seeds from ``TEST_SEED_OFFSET`` on, disjoint from every training seed: held-out
  initial and goal positions of the same tasks.
- ``val``: seeds from ``VAL_SEED_OFFSET`` on, disjoint from both, training instructions: for choosing
  a checkpoint (``checkpoint.best_metric: eval/val/success_rate``) without looking at ``test``.
- ``ood_instruction``: test seeds with instruction paraphrases never trained on
  (``mmrl/MetaWorld-<Task>-OODInstruction-v0``).
- ``ood_task`` (``robot/metaworld-ml10-v0`` only): ML10's five held-out tasks.

Reward, metrics and demonstrations are the table-top tasks' (:mod:`mmrl.tasks.robot.tabletop`): the
score is the episode return Φ(s_T) − Φ(s_0) (within [−1, 2]); demonstrations run Meta-World's
scripted expert (``metaworld.policies``) with DART noise injection. Building a task imports nothing
from ``metaworld``; its first demonstration or rollout does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mmrl.envs.metaworld import metaworld_env_id, valid_task
from mmrl.tasks.robot.tabletop import TEST_SEED_OFFSET, EpisodeExample, EpisodeTask, split_seed_start


@dataclass(frozen=True)
class MetaWorldTaskConfig:
    image_size: int = 64
    """Camera image side in pixels (the policy's ``image_size`` must match)."""
    camera: str = "corner"
    """Meta-World camera of the demonstrations; the policy's ``env_kwargs.camera`` must name the same one."""
    train_seeds: int = 200
    """Distinct training layouts (seeds 0..train_seeds−1); test seeds start at 1,000,000."""
    demo_noise: float = 0.3
    """Std of the Gaussian noise added to the executed expert action in demonstrations (labels stay clean)."""
    demo_cache: int = 4096
    """Demonstrations kept in memory (by env id and seed)."""


class MetaWorldTask(EpisodeTask):
    def __init__(self, task_id: str, split_env_ids: dict[str, str], cfg: MetaWorldTaskConfig):
        if not 1 <= cfg.train_seeds <= TEST_SEED_OFFSET:
            raise ValueError(f"train_seeds must be in 1..{TEST_SEED_OFFSET}, got {cfg.train_seeds}")
        super().__init__(cfg)
        self.id, self.split_env_ids = task_id, dict(split_env_ids)

    def env_kwargs(self) -> dict[str, Any]:
        return {"image_size": self.cfg.image_size, "camera": self.cfg.camera}

    def sample_batch(self, split: str, n: int, rng: np.random.Generator) -> list[EpisodeExample]:
        if split not in self.split_env_ids:
            raise ValueError(f"unknown split {split!r}; {self.id} has {', '.join(self.split_env_ids)}")
        if split == "train":
            seeds = rng.integers(0, self.cfg.train_seeds, size=n)
        else:
            low = split_seed_start(split)
            seeds = rng.integers(low, low + TEST_SEED_OFFSET, size=n)
        return [EpisodeExample(self.split_env_ids[split], int(s)) for s in seeds]


def split_env_ids(task_or_suite: str) -> dict[str, str]:
    """Env id per split of a task (``reach``) or suite (``MT10``, ``ML10``)."""
    train = metaworld_env_id(task_or_suite)
    if task_or_suite == "ML10":
        return {"train": train, "val": train, "test": train, "ood_task": metaworld_env_id("ML10-OODTask")}
    return {"train": train, "val": train, "test": train, "ood_instruction": metaworld_env_id(task_or_suite, "OODInstruction")}


def make_metaworld_task_factory(task_or_suite: str):
    """A factory for ``robot/metaworld-<task or suite, lowercase>-v0``."""
    if task_or_suite not in ("MT10", "ML10"):
        valid_task(task_or_suite)
    task_id = f"robot/metaworld-{task_or_suite.lower()}-v0"

    def factory(cfg: MetaWorldTaskConfig) -> MetaWorldTask:
        return MetaWorldTask(task_id, split_env_ids(task_or_suite), cfg)

    factory.__name__ = f"make_metaworld_{task_or_suite.lower().replace('-', '_')}_task"
    return factory


__all__ = ["MetaWorldTask", "MetaWorldTaskConfig", "make_metaworld_task_factory", "split_env_ids"]
