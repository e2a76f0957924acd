"""VLA-RFT task (Li et al. 2025): train in the learned simulator, evaluate in the real MuJoCo sim.

``robot/wm_reach-v0``:

- ``sample_batch("train")``: episodes of ``mmrl/WM-Reach-v0`` (the world-model env; the seed
  picks one real first frame of its reference pool, so a GRPO group shares it);
- ``test`` and the ``ood_*`` splits: the *real* MuJoCo ids of ``robot/reach-v0`` (same seeds,
  same held-out variations), so ``eval/success_rate`` is measured in the real simulator;
- ``reward``: world-model episodes score their trajectory-level reward −(MAE + 1 − SSIM) ∈ [−3, 0]
  (success component 0: the learned simulator has none); real episodes score as ``robot/reach-v0``
  (return Φ_T − Φ_0 ∈ [−1, 2], success);
- ``reference_output``: the scripted expert's demonstration of the episode's seed in the real
  simulator (the BC warm start, as ``robot/reach-v0``);
- ``metrics`` add ``real_env_steps_rl``: real-simulator steps the RL phase consumed beyond the
  warm start, i.e. the world model's own training data (0 real steps are taken during RFT; a world
  model trained on the warm start's demonstrations counts only what it collected on top of them).

Real steps (:class:`~mmrl.core.contracts.SimulatorTask`): world-model episodes take none; the world model's own
data (the same count as ``real_env_steps_rl``) is ``simulator_data_env_steps``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import gymnasium
import numpy as np

from mmrl.core.contracts import RewardResult
from mmrl.envs.robot import env_id
from mmrl.samplers.gym_runner import EpisodeSummary
from mmrl.tasks.robot.tabletop import EpisodeExample, RobotTask, RobotTaskConfig, episode_reward, finite_return

DEFAULT_WORLD_MODEL = "configs/world_model/reach_tiny.yaml"


@dataclass(frozen=True)
class WorldModelTaskConfig:
    image_size: int = 64
    """Camera image side in pixels (the policy's and the world model's ``image_size`` must match)."""
    demo_noise: float = 0.3
    """DART noise of the real-simulator demonstrations used by the BC warm start."""
    demo_cache: int = 4096
    """Demonstrations kept in memory."""
    world_model: str = DEFAULT_WORLD_MODEL
    """A world-model folder (``mmrl train-world-model --out``) or a recipe (trained on first use, cached)."""


def world_model_env_id(task: str, world_model: str) -> str:
    """``mmrl/WM-Reach-v0`` for the default model; an extra registered id for any other checkpoint."""
    from mmrl.envs.world_model import wm_env_id
    from mmrl.envs.world_model.env import DEFAULT_RECIPES

    base = wm_env_id(task)
    if world_model == DEFAULT_RECIPES.get(task):
        return base
    key = hashlib.sha256(str(Path(world_model).resolve()).encode()).hexdigest()[:8]
    custom = base.replace("-v0", f"-{key}-v0")
    if custom not in gymnasium.registry:
        spec = gymnasium.spec(base)
        gymnasium.register(id=custom, entry_point=spec.entry_point, vector_entry_point=spec.vector_entry_point,
                           kwargs={**spec.kwargs, "world_model": world_model})
    return custom


def world_model_own_steps(train_log: dict) -> int:
    """Real-simulator steps of a world model's data beyond the BC warm start's demonstrations (those
    are counted once, for BC). Logs written before ``demonstration_env_steps`` existed hold none.

    >>> world_model_own_steps({"real_env_steps": 14775, "demonstration_env_steps": 13275})
    1500
    """
    return int(train_log["real_env_steps"]) - int(train_log.get("demonstration_env_steps", 0))


class WorldModelRFTTask(RobotTask):
    reward_range = (-3.0, 2.0)

    def __init__(self, task: str, cfg: WorldModelTaskConfig):
        from mmrl.envs.world_model.training import resolve_world_model

        super().__init__(task, RobotTaskConfig(cfg.image_size, cfg.demo_noise, cfg.demo_cache))
        self.id, self.wm_cfg = f"robot/wm_{task}-v0", cfg
        folder = resolve_world_model(cfg.world_model)  # trains the default recipe on first use
        from mmrl.envs.world_model.env import check_compatible

        check_compatible(folder, task, cfg.image_size, 2 if task != "pick_place" else 4)
        self.wm_env_id = world_model_env_id(task, cfg.world_model)
        log = folder / "train_log.json"
        self.world_model_real_steps = world_model_own_steps(json.loads(log.read_text())) if log.is_file() else 0

    def sample_batch(self, split: str, n: int, rng: np.random.Generator) -> list[EpisodeExample]:
        examples = super().sample_batch(split, n, rng)
        if split != "train":
            return examples  # the real simulator
        return [EpisodeExample(self.wm_env_id, ex.seed) for ex in examples]

    def real_example(self, example: EpisodeExample) -> EpisodeExample:
        return EpisodeExample(env_id(self.task), example.seed) if example.env_id == self.wm_env_id else example

    def reward(self, example: EpisodeExample, output: object) -> RewardResult:
        if example.env_id != self.wm_env_id:
            return episode_reward(example, output)
        if not isinstance(output, EpisodeSummary):
            return RewardResult(-3.0, {"success": 0.0, "return": -3.0}, f"not an episode summary: {type(output).__name__}")
        if (output.env_id, output.seed) != (example.env_id, example.seed):
            return RewardResult(-3.0, {"success": 0.0, "return": -3.0},
                                f"episode of {output.env_id} seed {output.seed} scored for {example.env_id} seed {example.seed}")
        episode_return = finite_return(output)
        if episode_return is None:
            return RewardResult(-3.0, {"success": 0.0, "return": -3.0}, "non-finite episode return")
        score = float(np.clip(episode_return, -3.0, 0.0))
        return RewardResult(score, {"success": 0.0, "return": score},
                            f"world-model frame distance to the expert's imagined rollout {-score:.4f}")

    def metrics(self, examples: Sequence[EpisodeExample], outputs: Sequence[object],
                results: Sequence[RewardResult]) -> dict[str, float]:
        return {**super().metrics(examples, outputs, results), "real_env_steps_rl": float(self.world_model_real_steps)}

    def reference_output(self, example: EpisodeExample):
        return super().reference_output(self.real_example(example))

    def demonstration_steps(self, examples: Sequence[EpisodeExample]) -> dict[tuple[str, int], int]:
        """As ``robot/reach-v0``'s: demonstrations run in the real simulator (world-model examples map to it)."""
        return super().demonstration_steps([self.real_example(ex) for ex in examples])

    def real_env_steps(self, outputs: Sequence[object]) -> int:
        """Σ length of the real-simulator episodes among ``outputs``; world-model episodes take no real step."""
        return super().real_env_steps([o for o in outputs if isinstance(o, EpisodeSummary)
                                       and o.env_id != self.wm_env_id])

    def simulator_data_env_steps(self) -> int:
        """The world model's own real-simulator data beyond the warm start's demonstrations."""
        return self.world_model_real_steps


def make_wm_task_factory(task: str):
    def factory(cfg: WorldModelTaskConfig) -> WorldModelRFTTask:
        return WorldModelRFTTask(task, cfg)

    factory.__name__ = f"make_wm_{task}_task"
    return factory
