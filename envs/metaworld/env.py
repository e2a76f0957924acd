"""One gymnasium env over one or several Meta-World tasks, observed like our table-top envs.

Observation (a dict, as :class:`mmrl.envs.robot.TabletopEnv`, so the ``vla`` policy and the gym
runner take it unchanged):

- ``image``: RGB [image_size, image_size, 3] uint8 from Meta-World camera ``camera``, drawn with
  our :class:`~mmrl.envs.robot.rendering.SceneRenderer` (one GL context per scene file and size;
  the model's shadow map, multisampling and reflections, and the scene's skybox, are turned off). Meta-World's ``corner``
  camera looks at the table upside down (its MJCF up axis points at the floor); its frames are
  turned 180° so that up is up.
- ``proprio``: the hand's x, y, z scaled from Meta-World's hand space to [−1, 1], and the gripper
  opening (0 closed … 1 open) as 2·g − 1.
- ``instruction``: a paraphrase of the episode's task, drawn per reset from the training or the
  held-out templates.

Action: Meta-World's own, 4-D in [−1, 1]: end-effector x, y, z deltas (× 1 cm) and gripper effort.
The token VLA reads it as OpenVLA's 256 uniform bins per dimension over [−1, 1] and executes the
bin centres, exactly as on ``mmrl/Reach-v0`` (the bins live in the policy, the env sees floats).

Reward (RL4VLA's potential-based shaping, as on our table-top tasks): r_t = Φ(s_t) − Φ(s_{t−1})
with Φ = 1·success + 0.5·(Meta-World's v2 dense reward / 10), so an episode returns
Φ(s_T) − Φ(s_0) ∈ [−0.5, 1.5]; ``info["success"]`` is Meta-World's. The episode terminates on
success and is truncated after ``max_steps`` (default :data:`~mmrl.envs.metaworld.MAX_STEPS`).

Seeding: ``reset(seed=s)`` seeds this env's generator, which draws the task (multi-task ids), the
instruction and a seed for Meta-World's own initial/goal sampler (``seeded_rand_vec``), so one
seed is one episode start. Bad actions (wrong shape, NaN/inf) raise before the simulator moves.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from mmrl.envs.metaworld import MAX_STEPS, TEMPLATES, valid_task
from mmrl.envs.robot.rendering import mujoco, shared_renderer
from mmrl.envs.robot.tabletop import checked_action

INSTRUCTION_CHARS = "abcdefghijklmnopqrstuvwxyz "
CAMERAS = ("corner", "corner2", "corner3", "corner4", "topview", "behindGripper", "gripperPOV")
"""Meta-World's cameras (``xyz_base.xml``)."""
UPSIDE_DOWN_CAMERAS = ("corner",)
"""Cameras whose MJCF up axis points at the floor: their frames are turned 180°."""
FLAGS_OFF = (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION, mujoco.mjtRndFlag.mjRND_SKYBOX,
             mujoco.mjtRndFlag.mjRND_HAZE)
"""Scene flags our frames turn off: with the 67k-triangle Sawyer on a software renderer, the skybox alone
costs ~40% of a 64 px frame (measured: 9 → 5.6 ms), and shadows/reflections are off in the model too."""
HAND_LOW = np.array([-0.525, 0.348, -0.0525])
HAND_HIGH = np.array([0.525, 1.025, 0.7])
"""Meta-World's hand space (``SawyerXYZEnv._HAND_SPACE``): proprio scales it to [−1, 1]."""
INSTALL_HINT = "pip install 'mmrl[metaworld]' (metaworld==3.1.1, which needs mujoco==3.3.0)"


def import_metaworld() -> Any:
    """The ``metaworld`` module, or an ImportError that says how to install it."""
    try:
        return importlib.import_module("metaworld")
    except ImportError as err:
        raise ImportError(f"the Meta-World envs need the metaworld package: {INSTALL_HINT} ({err})") from err


class MatrixQuaternion:
    """What Meta-World's task modules ask of scipy's ``Rotation``, at MuJoCo's speed.

    22 of its v3 task modules turn an object's rotation matrix into the quaternion of their
    observation with ``Rotation.from_matrix(xmat).as_quat()`` on every step, and that one scipy call
    (its input checks and determinant) is ~30% of a Meta-World ``step()`` here. This computes the same
    quaternion with ``mujoco.mju_mat2Quat`` and gives it scipy's layout and sign: (x, y, z, w), the
    component scipy's branch picks (the largest of m00, m11, m22 and the trace) non-negative. Anything
    else asked of it raises AttributeError, so a Meta-World that used ``Rotation`` otherwise would fail
    loudly, not observe something different.
    """

    __slots__ = ("_quat",)

    def __init__(self, quat: np.ndarray):
        self._quat = quat

    @classmethod
    def from_matrix(cls, matrix: Any) -> MatrixQuaternion:
        m = np.asarray(matrix, dtype=np.float64).reshape(3, 3)
        wxyz = np.empty(4)
        mujoco.mju_mat2Quat(wxyz, m.ravel())
        quat = wxyz[[1, 2, 3, 0]]
        branch = int(np.argmax((m[0, 0], m[1, 1], m[2, 2], m[0, 0] + m[1, 1] + m[2, 2])))
        return cls(-quat if quat[branch] < 0 else quat)

    def as_quat(self) -> np.ndarray:
        return self._quat.copy()


def use_fast_quaternions(sim: Any) -> None:
    """Point the ``Rotation`` of ``sim``'s task module at :class:`MatrixQuaternion` (tasks that do not
    use scipy's ``Rotation`` are left alone)."""
    from scipy.spatial.transform import Rotation

    module = sys.modules[type(sim).__module__]
    if getattr(module, "Rotation", None) is Rotation:
        module.Rotation = MatrixQuaternion


def build_simulator(task: str) -> Any:
    """A Meta-World v3 env for ``task`` with the goal in its observation (the scripted experts read it)
    and Meta-World's initial/goal sampler driven by the env's own generator (``seeded_rand_vec``)."""
    metaworld = import_metaworld()
    sim = metaworld.env_dict.ALL_V3_ENVIRONMENTS[f"{task}-v3"]()
    use_fast_quaternions(sim)  # the same observation; scipy's call was ~30% of a Meta-World step()
    sim._partially_observable = False
    sim.__dict__.pop("sawyer_observation_space", None)  # a cached_property computed for the partial view
    sim._set_task_called = True  # we sample goals ourselves, per seed, instead of from a task list
    sim._freeze_rand_vec = False
    sim.seeded_rand_vec = True
    model = sim.model
    model.vis.quality.shadowsize = 0  # no shadow map and no multisampling: ~30x faster frames on a CPU
    model.vis.quality.offsamples = 0
    model.mat_reflectance[:] = 0.0
    return sim


def scripted_expert(task: str) -> Any:
    """Meta-World's scripted policy for ``task`` (``metaworld.policies.ENV_POLICY_MAP``)."""
    policies = importlib.import_module("metaworld.policies")
    return policies.ENV_POLICY_MAP[f"{task}-v3"]()


class MetaWorldEnv(gymnasium.Env):
    """Meta-World task(s) with an image, proprio and instruction observation; see the module docstring."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 80}

    def __init__(self, tasks: tuple[str, ...] | str, instructions: str = "train", image_size: int = 64,
                 camera: str = "corner", max_steps: int | None = None, render_mode: str | None = None):
        tasks = (tasks,) if isinstance(tasks, str) else tuple(tasks)
        if not tasks:
            raise ValueError("tasks must name at least one Meta-World task")
        self.tasks = tuple(valid_task(t) for t in tasks)
        if instructions not in ("train", "ood"):
            raise ValueError(f"instructions must be 'train' or 'ood', got {instructions!r}")
        if not 16 <= image_size <= 256:
            raise ValueError(f"image_size must be in 16..256, got {image_size}")
        if camera not in CAMERAS:
            raise ValueError(f"unknown Meta-World camera {camera!r}; cameras: {', '.join(CAMERAS)}")
        if max_steps is not None and not 1 <= max_steps <= 500:
            raise ValueError(f"max_steps must be in 1..500 (Meta-World's own limit), got {max_steps}")
        self.instructions, self.image_size, self.camera = instructions, image_size, camera
        self.max_steps_override, self.render_mode = max_steps, render_mode
        self._sims: dict[str, Any] = {}
        self._experts: dict[str, Any] = {}
        self.task = self.tasks[0]
        self.sim = self._simulator(self.task)  # built now: a missing metaworld fails at construction
        self.action_space = spaces.Box(-1.0, 1.0, (4,), dtype=np.float32)
        self.observation_space = spaces.Dict({
            "image": spaces.Box(0, 255, (image_size, image_size, 3), dtype=np.uint8),
            "proprio": spaces.Box(-1.0, 1.0, (4,), dtype=np.float32),
            "instruction": spaces.Text(max_length=80, min_length=1, charset=INSTRUCTION_CHARS),
        })
        self.instruction = ""
        self._flat_obs = np.zeros(39)
        self._steps, self._potential, self._max_steps = 0, 0.0, MAX_STEPS[self.task]

    def _simulator(self, task: str) -> Any:
        if task not in self._sims:
            self._sims[task] = build_simulator(task)
        return self._sims[task]

    # -- observation -------------------------------------------------------------------------------
    def _render(self) -> np.ndarray:
        model = self.sim.model
        renderer = shared_renderer(f"metaworld:{self.sim.model_name}", model, self.image_size, self.image_size)
        for flag in FLAGS_OFF:
            renderer.scene.flags[flag] = 0
        frame = renderer.render(model, self.sim.data, model.camera(self.camera).id)
        return np.ascontiguousarray(frame[::-1, ::-1]) if self.camera in UPSIDE_DOWN_CAMERAS else frame

    def _observation(self) -> dict:
        hand, gripper = self._flat_obs[:3], self._flat_obs[3]
        proprio = np.append(2 * (hand - HAND_LOW) / (HAND_HIGH - HAND_LOW) - 1, 2 * gripper - 1)
        return {"image": self._render(), "proprio": np.clip(proprio, -1, 1).astype(np.float32),
                "instruction": self.instruction}

    def render(self) -> np.ndarray | None:
        return self._render() if self.render_mode == "rgb_array" else None

    # -- episode -----------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        rng = self.np_random
        self.task = self.tasks[int(rng.integers(len(self.tasks)))]
        self.sim = self._simulator(self.task)
        self.sim.np_random = np.random.default_rng(int(rng.integers(2 ** 63)))  # Meta-World's goal sampler
        self._flat_obs, _ = self.sim.reset()
        train_templates, ood_templates = TEMPLATES[self.task]
        templates = train_templates if self.instructions == "train" else ood_templates
        self.instruction = templates[int(rng.integers(len(templates)))]
        self._steps = 0
        self._max_steps = self.max_steps_override or MAX_STEPS[self.task]
        metaworld_reward, info = self.sim.evaluate_state(self._flat_obs, np.zeros(4, dtype=np.float32))
        self._potential = self._potential_of(metaworld_reward, bool(info["success"]))
        return self._observation(), {"success": False, "task": self.task, "potential": self._potential}

    @staticmethod
    def _potential_of(metaworld_reward: float, success: bool) -> float:
        """Φ = 1·success + 0.5·(Meta-World's dense reward in [0, 10]) / 10."""
        return float(success) + 0.05 * float(np.clip(metaworld_reward, 0.0, 10.0))

    def check_action(self, action: Any) -> np.ndarray:
        """The action as float32 [4] clipped to [−1, 1]; raises on a wrong shape or NaN/inf."""
        return checked_action(action, (4,), "end-effector dx, dy, dz and gripper effort in [-1, 1]")

    def step(self, action: Any):
        a = self.check_action(action)  # before the simulator moves
        self._flat_obs, metaworld_reward, _, _, info = self.sim.step(a)
        self._steps += 1
        success = bool(info["success"])
        potential = self._potential_of(metaworld_reward, success)
        reward, self._potential = potential - self._potential, potential
        truncated = self._steps >= self._max_steps and not success
        return self._observation(), float(reward), success, truncated, {"success": success, "task": self.task,
                                                                        "potential": potential}

    def sim_state(self) -> tuple:
        """Everything a step changes (for tests: a refused step leaves it untouched)."""
        data = self.sim.data
        return (data.qpos.copy(), data.qvel.copy(), data.mocap_pos.copy(), float(data.time), self._steps,
                self._potential, self.sim.curr_path_length)

    def expert_action(self) -> np.ndarray:
        """Meta-World's scripted expert's action in the current state, float32 [4] in [−1, 1]."""
        if self.task not in self._experts:
            self._experts[self.task] = scripted_expert(self.task)
        with warnings.catch_warnings():  # "Constant(s) may be too high": its gains saturate, as intended
            warnings.simplefilter("ignore", UserWarning)
            action = self._experts[self.task].get_action(self._flat_obs)
        return np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0)

    def close(self) -> None:
        for sim in self._sims.values():
            sim.close()
        self._sims.clear()
