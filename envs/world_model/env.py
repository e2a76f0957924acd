"""The learned simulator as gymnasium envs: ``mmrl/WM-<Task>-v0`` (VLA-RFT, Li et al. 2025, §3.2).

``reset(seed=)`` draws one state of the world model's *reference pool* (real first frames of
scripted-expert episodes collected in MuJoCo, with their instruction and the expert's actions);
the same seed gives the same state, so GRPO groups start from one real frame. ``step`` advances
the world model's latent under the action and decodes the next frame (the observation) and the
proprio head's estimate; no MuJoCo call is made. An episode lasts the pool's ``T`` steps (the
real task's time limit) and ends with ``terminated`` (a fixed-horizon task, the reward is complete).

Reward (trajectory level, on the last step only; 0 before): VLA-RFT's verified reward
    r = −(1/T) Σ_t [ MAE(x̂_t^π, x̂_t^e) + (1 − SSIM(x̂_t^π, x̂_t^e)) ]   ∈ [−3, 0]
between the world model's frames under the policy's actions (x̂^π) and under the expert's
actions (x̂^e) from the same first frame (LPIPS is replaced by 1 − SSIM: no download). The
learned simulator has no success signal: ``info["success"]`` is always False; success is
measured in the real simulator (the task adapter's eval splits).

:class:`WorldModelVectorEnv` steps many episodes in one batched forward pass (the
``vector_entry_point`` of the ids); :class:`WorldModelEnv` is the single env (``check_env``).

Bad input raises before any state changes: actions of the wrong shape, non-finite or outside
[−1, 1]; a checkpoint whose image size, action dims or task differ from the env's (both named).
"""

from __future__ import annotations

from pathlib import Path

import gymnasium
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from mmrl.envs.world_model.metrics import frame_distance, mae, ssim
from mmrl.envs.world_model.model import POOL_FILE, LatentWorldModel, load_world_model, read_config

INSTRUCTION_CHARS = "abcdefghijklmnopqrstuvwxyz "
ACTION_TOLERANCE = 1e-5
DEFAULT_RECIPES = {"reach": "configs/world_model/reach_tiny.yaml"}


def check_compatible(path: str | Path, task: str, image_size: int, action_dims: int) -> None:
    """Raise naming both sides when the checkpoint at ``path`` does not fit the env."""
    cfg = read_config(path)
    for name, env_value, model_value in (("task", task, cfg.task), ("image_size", image_size, cfg.image_size),
                                         ("action_dims", action_dims, cfg.action_dims)):
        if env_value != model_value:
            raise ValueError(f"world model {path} has {name}={model_value!r} but the env has {name}={env_value!r}; "
                             f"train a world model for this env (mmrl train-world-model) or change the env's {name}")


def resolve_checkpoint(task: str, world_model: str | None) -> Path:
    """The checkpoint folder: ``world_model`` (a folder or a recipe), or the task's default recipe."""
    from mmrl.envs.world_model.training import resolve_world_model

    if world_model is None:
        if task not in DEFAULT_RECIPES:
            raise ValueError(f"no default world model for task {task!r}; pass world_model=<folder or recipe>")
        world_model = DEFAULT_RECIPES[task]
    return resolve_world_model(str(world_model))


class WorldModelSim:
    """Batched core shared by both envs: latent states, reference rollouts and the reward."""

    def __init__(self, task: str, world_model: str | None, image_size: int, action_dims: int):
        path = resolve_checkpoint(task, world_model)
        check_compatible(path, task, image_size, action_dims)
        self.path, self.model = path, load_world_model(path)
        pool_file = path / POOL_FILE
        if not pool_file.is_file():
            raise FileNotFoundError(f"{pool_file} missing: the world model has no reference pool to reset from")
        with np.load(pool_file) as pool:
            self.first_frames = pool["first_frames"]
            self.first_proprio = pool["first_proprio"].astype(np.float32)
            self.expert_actions = pool["expert_actions"].astype(np.float32)
            self.instructions = [str(s) for s in pool["instructions"]]
        self.horizon = self.expert_actions.shape[1]
        self._reference: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.first_frames)

    def check_actions(self, actions: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        a = np.asarray(actions, dtype=np.float32)
        if a.shape != shape:
            raise ValueError(f"world-model env actions must have shape {shape} (end-effector deltas in [-1, 1]), "
                             f"got {a.shape}; the env state is unchanged")
        if not np.isfinite(a).all():
            raise ValueError(f"world-model env actions must be finite, got {a.tolist()}; the env state is unchanged")
        if np.abs(a).max(initial=0.0) > 1.0 + ACTION_TOLERANCE:
            raise ValueError(f"world-model env actions must lie in the action space [-1, 1], got values up to "
                             f"{np.abs(a).max():.4g}; clip them (the world model never saw such actions); "
                             f"the env state is unchanged")
        return np.clip(a, -1.0, 1.0)

    @torch.no_grad()
    def start(self, index: np.ndarray) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        """Latents, first frames (real) and proprio for pool states ``index``."""
        frames = self.first_frames[index]
        return self.model.encode(torch.from_numpy(frames)), frames, self.first_proprio[index]

    @torch.no_grad()
    def advance(self, z: torch.Tensor, actions: np.ndarray, index: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """Next latents, their decoded frames [B, 3, H, W] in [0, 1] and proprio [B, P] (clipped to [−1, 1])
        of episodes started from pool states ``index``."""
        z = self.model.step(z, torch.from_numpy(actions))
        proprio = self.model.proprio(z).clamp(-1, 1).numpy().astype(np.float32)
        return z, self.model.decode(z, torch.from_numpy(self.first_frames[index])), proprio

    @torch.no_grad()
    def reference(self, index: int) -> torch.Tensor:
        """The world model's frames [T, 3, H, W] under the expert's actions from pool state ``index``."""
        if index not in self._reference:
            first = torch.from_numpy(self.first_frames[index:index + 1])
            z = self.model.encode(first)
            frames = []
            for t in range(self.horizon):
                z = self.model.step(z, torch.from_numpy(self.expert_actions[index, t:t + 1]))
                frames.append(self.model.decode(z, first)[0])
            self._reference[index] = torch.stack(frames)
        return self._reference[index]

    def reward(self, index: int, frames: list[torch.Tensor]) -> tuple[float, dict]:
        """−mean_t (MAE + 1 − SSIM) of the policy's frames [3, H, W] against the expert reference."""
        predicted, reference = torch.stack(frames), self.reference(index)[:len(frames)]
        distance = frame_distance(predicted, reference).mean().item()
        return -distance, {"frame_mae": mae(predicted, reference).mean().item(),
                           "frame_ssim": ssim(predicted, reference).mean().item()}


def observation_space(image_size: int) -> spaces.Dict:
    return spaces.Dict({
        "image": spaces.Box(0, 255, (image_size, image_size, 3), dtype=np.uint8),
        "proprio": spaces.Box(-1.0, 1.0, (4,), dtype=np.float32),
        "instruction": spaces.Text(max_length=80, min_length=1, charset=INSTRUCTION_CHARS),
    })


class WorldModelEnv(gymnasium.Env):
    """One episode at a time in the learned simulator (see the module docstring)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}

    def __init__(self, task: str = "reach", world_model: str | None = None, image_size: int = 64,
                 action_dims: int = 2, render_mode: str | None = None):
        self.sim = WorldModelSim(task, world_model, image_size, action_dims)
        self.task, self.image_size, self.render_mode = task, image_size, render_mode
        self.action_space = spaces.Box(-1.0, 1.0, (action_dims,), dtype=np.float32)
        self.observation_space = observation_space(image_size)
        self._index, self._t, self._z, self._frames = 0, 0, None, []
        self._image = np.zeros((image_size, image_size, 3), dtype=np.uint8)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._index = int(self.np_random.integers(len(self.sim)))
        z, frames, proprio = self.sim.start(np.array([self._index]))
        self._z, self._t, self._frames, self._image = z, 0, [], frames[0]
        return ({"image": frames[0], "proprio": np.clip(proprio[0], -1, 1), "instruction": self.sim.instructions[self._index]},
                {"success": False, "pool_index": self._index})

    def step(self, action):
        if self._z is None:
            raise RuntimeError("call reset() before step()")
        a = self.sim.check_actions(action, self.action_space.shape)
        self._z, frame, proprio = self.sim.advance(self._z, a[None], np.array([self._index]))
        self._frames.append(frame[0])
        self._t += 1
        self._image = LatentWorldModel.to_uint8(frame)[0].numpy()
        info = {"success": False, "pool_index": self._index}
        done = self._t >= self.sim.horizon
        reward = 0.0
        if done:
            reward, extra = self.sim.reward(self._index, self._frames)
            info |= extra
        obs = {"image": self._image, "proprio": proprio[0], "instruction": self.sim.instructions[self._index]}
        return obs, float(reward), done, False, info

    def render(self) -> np.ndarray | None:
        return self._image.copy() if self.render_mode == "rgb_array" else None


class WorldModelVectorEnv(VectorEnv):
    """``num_envs`` episodes stepped in one batched world-model call (autoreset: next step)."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, num_envs: int, task: str = "reach", world_model: str | None = None, image_size: int = 64,
                 action_dims: int = 2, render_mode: str | None = None):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.sim = WorldModelSim(task, world_model, image_size, action_dims)
        self.num_envs, self.render_mode = num_envs, render_mode
        self.single_action_space = spaces.Box(-1.0, 1.0, (action_dims,), dtype=np.float32)
        self.single_observation_space = observation_space(image_size)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self._rngs = [np.random.default_rng() for _ in range(num_envs)]
        self._index = np.zeros(num_envs, dtype=int)
        self._t = np.zeros(num_envs, dtype=int)
        self._frames: list[list[torch.Tensor]] = [[] for _ in range(num_envs)]
        self._needs_reset = np.zeros(num_envs, dtype=bool)
        self._z = None
        self._images = np.zeros((num_envs, image_size, image_size, 3), dtype=np.uint8)
        self._proprio = np.zeros((num_envs, 4), dtype=np.float32)

    def _start(self, envs: np.ndarray) -> None:
        for i in envs:
            self._index[i] = int(self._rngs[i].integers(len(self.sim)))
            self._t[i], self._frames[i] = 0, []
        z, frames, proprio = self.sim.start(self._index[envs])
        self._z[envs] = z
        self._images[envs], self._proprio[envs] = frames, np.clip(proprio, -1, 1)

    def _obs(self) -> dict:
        return {"image": self._images.copy(), "proprio": self._proprio.copy(),
                "instruction": tuple(self.sim.instructions[i] for i in self._index)}

    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None):
        seeds = seed if isinstance(seed, (list, tuple)) else \
            [None if seed is None else seed + i for i in range(self.num_envs)]
        if len(seeds) != self.num_envs:
            raise ValueError(f"reset got {len(seeds)} seeds for {self.num_envs} envs")
        # the same seed as WorldModelEnv.reset(seed=s) gives the same pool state
        self._rngs = [np.random.Generator(np.random.PCG64(s)) if s is not None else np.random.default_rng()
                      for s in seeds]
        self._z = torch.zeros(self.num_envs, self.sim.model.cfg.latent)
        self._start(np.arange(self.num_envs))
        self._needs_reset[:] = False
        return self._obs(), {"success": np.zeros(self.num_envs, dtype=bool)}

    def step(self, actions):
        if self._z is None:
            raise RuntimeError("call reset() before step()")
        a = self.sim.check_actions(actions, self.action_space.shape)
        z, frames, proprio = self.sim.advance(self._z, a, self._index)
        self._z, self._proprio = z, proprio
        self._images = LatentWorldModel.to_uint8(frames).numpy()
        self._t += 1
        rewards, done = np.zeros(self.num_envs), np.zeros(self.num_envs, dtype=bool)
        for i in range(self.num_envs):
            if self._needs_reset[i]:
                continue
            self._frames[i].append(frames[i])
            if self._t[i] >= self.sim.horizon:
                rewards[i], _ = self.sim.reward(int(self._index[i]), self._frames[i])
                done[i] = True
        restart = np.flatnonzero(self._needs_reset)
        if len(restart):  # NEXT_STEP autoreset: the step after an episode ended is a reset
            self._start(restart)
        self._needs_reset = done
        info = {"success": np.zeros(self.num_envs, dtype=bool)}
        return self._obs(), rewards, done, np.zeros(self.num_envs, dtype=bool), info
