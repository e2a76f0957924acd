"""Table-top MuJoCo tasks for VLA policies: reach, push, pick-and-place (``mmrl/<Name>-v0``).

One :class:`TabletopEnv` (a real ``gymnasium.Env``) runs any of the three :class:`TaskRules` in a
:class:`Variation` (colours, positions, instruction templates, distractors). Observation: a dict
of ``image`` (RGB from an overhead camera, ``image_size`` px), ``proprio`` (end-effector x, y, z
and the grasp flag) and ``instruction`` (text). Action: end-effector deltas in [−1, 1]
(x, y for reach and push; x, y, z, grip for pick-and-place) scaled by ``max_delta`` metres.

Reward (RL4VLA, Liu et al. 2025, §3: potential-based): r_t = Φ(s_t) − Φ(s_{t−1}), so the return
of an episode is Φ(s_T) − Φ(s_0) and shaping leaves the optimal policy unchanged (Ng et al. 1999).
Φ = 1·success + task-specific progress terms below (each ≤ 1 in total); ``info["success"]``.
An episode terminates on success and is truncated after ``max_steps`` steps.

Bad input never corrupts the simulation: a wrong-shape or non-finite action raises before any
state changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from mmrl.envs.robot.rendering import mujoco, shared_renderer

COLORS: dict[str, tuple[float, float, float]] = {
    "red": (0.9, 0.1, 0.1), "green": (0.1, 0.8, 0.1), "blue": (0.15, 0.3, 0.95),
    # held out (OOD colours): never seen in training
    "yellow": (0.95, 0.9, 0.1), "magenta": (0.9, 0.1, 0.85), "cyan": (0.1, 0.9, 0.9),
}
TRAIN_COLORS = ("red", "green", "blue")
OOD_COLORS = ("yellow", "magenta", "cyan")
INSTRUCTION_CHARS = "abcdefghijklmnopqrstuvwxyz "


def mjcf_path(name: str) -> Path:
    """``assets/robot/<name>`` of the checkout, or of the installed package (mmrl.assets)."""
    from mmrl.core.paths import assets_dir

    return assets_dir() / "robot" / name


def checked_action(action: Any, shape: tuple[int, ...], meaning: str) -> np.ndarray:
    """``action`` as float32 of ``shape`` clipped to [−1, 1], checked before any simulator state changes: a
    wrong shape or a NaN / inf is a ValueError that names ``meaning`` and says the state is unchanged."""
    a = np.asarray(action, dtype=np.float32)
    if a.shape != tuple(shape):
        raise ValueError(f"action must have shape {tuple(shape)} ({meaning}), got shape {a.shape}; "
                         f"the simulation state is unchanged")
    if not np.isfinite(a).all():
        raise ValueError(f"action must be finite, got {a.tolist()}; check the policy's outputs (NaN weights?); "
                         f"the simulation state is unchanged")
    return np.clip(a, -1.0, 1.0)


@dataclass(frozen=True)
class Variation:
    """Where and how a task's episodes are drawn (one per registered env id)."""

    colors: tuple[str, ...]
    """Colours the object is drawn from (names in COLORS)."""
    radius: tuple[float, float]
    """Object distance from the table centre, uniform in [min, max] metres (angle uniform)."""
    templates: tuple[str, ...]
    """Instruction templates; ``{color}`` is the object's colour."""
    distractor: bool = False
    """Add a second object of another colour (the instruction names the right one)."""


@dataclass(frozen=True)
class State:
    """What the rules and the scripted expert read (all positions are [3] world coordinates)."""

    ee: np.ndarray
    obj: np.ndarray
    goal: np.ndarray
    grasped: bool
    start_ee_obj: float  # distances at reset: progress terms are normalised by them
    start_obj_goal: float


def _dist(a: np.ndarray, b: np.ndarray, dims: int = 3) -> float:
    return float(np.linalg.norm(a[:dims] - b[:dims]))


def _progress(d: float, d0: float) -> float:
    """1 − d/d0 clipped to [0, 1]: 0 at the start distance, 1 at the goal."""
    return float(np.clip(1.0 - d / max(d0, 1e-6), 0.0, 1.0))


@dataclass(frozen=True)
class TaskRules:
    """A task: its MJCF, action layout, success test, potential and scripted expert."""

    name: str
    mjcf: str
    action_dims: int
    max_steps: int
    max_delta: float  # metres per step at |action| = 1
    ee_start_z: float
    object_z: float

    def success(self, s: State) -> bool:
        if self.name == "reach":
            return _dist(s.ee, s.obj, 2) < 0.03
        if self.name == "push":
            return _dist(s.obj, s.goal, 2) < 0.035
        return _dist(s.obj, s.goal, 2) < 0.035 and s.obj[2] < 0.03 and not s.grasped

    def potential(self, s: State) -> float:
        """Φ(s): 1·success + progress (reach: 0.5·approach; push: 0.2·approach + 0.5·puck-to-goal;
        pick-and-place: 0.2·approach + 0.2·grasped + 0.3·object-to-goal while grasped)."""
        done = float(self.success(s))
        approach = _progress(_dist(s.ee, s.obj, 2), s.start_ee_obj)
        if self.name == "reach":
            return done + 0.5 * approach
        if self.name == "push":
            return done + 0.2 * approach + 0.5 * _progress(_dist(s.obj, s.goal, 2), s.start_obj_goal)
        carry = _progress(_dist(s.obj, s.goal, 2), s.start_obj_goal) if s.grasped else 0.0
        return done + 0.2 * approach + 0.2 * float(s.grasped) + 0.3 * carry

    def expert_action(self, s: State) -> np.ndarray:
        """The scripted expert's action in [−1, 1]^action_dims for state ``s``."""
        if self.name == "reach":
            return self._toward(s.ee, s.obj)
        if self.name == "push":
            return self._push(s)
        return self._pick(s)

    def _toward(self, ee: np.ndarray, point: np.ndarray, dims: int = 2) -> np.ndarray:
        return np.clip((point[:dims] - ee[:dims]) / self.max_delta, -1.0, 1.0).astype(np.float32)

    def _push(self, s: State) -> np.ndarray:
        to_goal = s.goal[:2] - s.obj[:2]
        direction = to_goal / max(np.linalg.norm(to_goal), 1e-6)
        rel = s.ee[:2] - s.obj[:2]
        along = float(rel @ direction)  # < 0: the pusher is behind the puck
        side = rel - along * direction
        behind = s.obj[:2] - 0.045 * direction
        if along < -0.02 and np.linalg.norm(side) < 0.012:
            target = s.obj[:2] + 0.03 * direction  # aligned behind: push through the puck
        elif along < -0.015:
            target = behind  # behind the puck: slide sideways into line
        else:
            # in front of or beside the puck: go around it on the side the pusher is on
            normal = side / max(np.linalg.norm(side), 1e-6) if np.linalg.norm(side) > 1e-4 else \
                np.array([-direction[1], direction[0]])
            target = s.obj[:2] + 0.06 * normal - 0.045 * direction
        return np.clip((target - s.ee[:2]) / self.max_delta, -1.0, 1.0).astype(np.float32)

    def _pick(self, s: State) -> np.ndarray:
        hover = 0.08
        if not s.grasped:
            if _dist(s.ee, s.obj, 2) > 0.01:
                target, grip = np.array([*s.obj[:2], hover]), -1.0
                if _dist(s.ee, s.obj, 2) < 0.03:
                    target[2] = s.ee[2]  # close enough above: finish xy at this height
            else:
                target, grip = np.array([*s.obj[:2], s.obj[2]]), -1.0
                if _dist(s.ee, s.obj) < 0.015:
                    grip = 1.0
        elif _dist(s.obj, s.goal, 2) > 0.01:
            target, grip = np.array([*s.goal[:2], hover]), 1.0
            if s.ee[2] < hover - 0.02:
                target[:2] = s.ee[:2]  # lift first
        else:
            target, grip = np.array([*s.goal[:2], self.object_z + 0.004]), 1.0
            if s.obj[2] < 0.03:
                grip = -1.0
        move = np.clip((target - s.ee) / self.max_delta, -1.0, 1.0)
        return np.array([*move, grip], dtype=np.float32)


RULES = {
    "reach": TaskRules("reach", "reach.xml", action_dims=2, max_steps=30, max_delta=0.012, ee_start_z=0.04,
                       object_z=0.02),
    "push": TaskRules("push", "push.xml", action_dims=2, max_steps=50, max_delta=0.02, ee_start_z=0.02,
                      object_z=0.02),
    "pick_place": TaskRules("pick_place", "pick_place.xml", action_dims=4, max_steps=50, max_delta=0.025,
                            ee_start_z=0.08, object_z=0.018),
}


class TabletopEnv(gymnasium.Env):
    """A table-top task (``rules``) in a variation; see the module docstring."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}
    n_substeps = 5  # 5 × 10 ms physics steps per env step

    def __init__(self, task: str, variation: Variation, image_size: int = 64, render_mode: str | None = None):
        if task not in RULES:
            raise ValueError(f"unknown table-top task {task!r}; known: {sorted(RULES)}")
        if not 16 <= image_size <= 256:
            raise ValueError(f"image_size must be in 16..256, got {image_size}")
        self.rules, self.variation, self.image_size, self.render_mode = RULES[task], variation, image_size, render_mode
        path = mjcf_path(self.rules.mjcf)
        if not path.is_file():
            raise FileNotFoundError(f"MJCF file {path} is missing; reinstall mmrl or restore assets/robot/")
        self.model = mujoco.MjModel.from_xml_path(str(path))
        self.data = mujoco.MjData(self.model)
        self._mjcf_key = str(path)
        self._camera = self.model.camera("top").id
        self._ee_mocap = self.model.body("ee").mocapid[0]
        self._goal_mocap = self.model.body("goal").mocapid[0] if task != "reach" else -1
        self._object_geom = self.model.geom("object").id
        self._distractor_geom = self.model.geom("distractor").id
        self._free_object = task == "pick_place"
        self.action_space = spaces.Box(-1.0, 1.0, (self.rules.action_dims,), dtype=np.float32)
        self.observation_space = spaces.Dict({
            "image": spaces.Box(0, 255, (image_size, image_size, 3), dtype=np.uint8),
            "proprio": spaces.Box(-1.0, 1.0, (4,), dtype=np.float32),
            "instruction": spaces.Text(max_length=80, min_length=1, charset=INSTRUCTION_CHARS),
        })
        self.instruction = ""
        self.grasped, self._grasp_offset = False, np.zeros(3)
        self._steps, self._potential = 0, 0.0
        self._start = (1.0, 1.0)

    # -- state ----------------------------------------------------------------------------------
    def _object_pos(self, name: str = "object") -> np.ndarray:
        return self.data.body(name).xpos.copy()

    def state(self) -> State:
        goal = self.data.mocap_pos[self._goal_mocap].copy() if self._goal_mocap >= 0 else np.zeros(3)
        return State(ee=self.data.mocap_pos[self._ee_mocap].copy(), obj=self._object_pos(), goal=goal,
                     grasped=self.grasped, start_ee_obj=self._start[0], start_obj_goal=self._start[1])

    def sim_state(self) -> tuple:
        """Everything a step changes (for tests: a refused step leaves it untouched)."""
        return (self.data.qpos.copy(), self.data.qvel.copy(), self.data.mocap_pos.copy(), float(self.data.time),
                self.grasped, self._steps, self._potential)

    def _observation(self) -> dict:
        ee = self.data.mocap_pos[self._ee_mocap]
        proprio = np.array([ee[0] / 0.3, ee[1] / 0.3, ee[2] / 0.3, float(self.grasped)], dtype=np.float32)
        return {"image": self._render(self.image_size), "proprio": np.clip(proprio, -1.0, 1.0),
                "instruction": self.instruction}

    def _render(self, size: int) -> np.ndarray:
        renderer = shared_renderer(self._mjcf_key, self.model, size, size)
        return renderer.render(self.model, self.data, self._camera)

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array":
            return None
        return self._render(self.image_size)

    # -- episode ------------------------------------------------------------------------------------
    def _place(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = self.variation.radius
        r, angle = rng.uniform(lo, hi), rng.uniform(0, 2 * np.pi)
        obj = np.array([r * np.cos(angle), r * np.sin(angle)])
        if self.rules.name == "reach":
            return obj, np.zeros(2)
        # goal on the far side of the centre, 0.1–0.16 m from the object
        for _ in range(100):
            goal_angle = angle + np.pi + rng.uniform(-0.8, 0.8)
            goal = rng.uniform(0.0, 0.08) * np.array([np.cos(goal_angle), np.sin(goal_angle)])
            if 0.1 <= np.linalg.norm(goal - obj) <= 0.2:
                return obj, goal
        return obj, -obj / max(np.linalg.norm(obj), 1e-6) * 0.05

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        rng = self.np_random
        v, rules = self.variation, self.rules
        mujoco.mj_resetData(self.model, self.data)
        color = v.colors[int(rng.integers(len(v.colors)))]
        self.model.geom_rgba[self._object_geom, :3] = COLORS[color]
        obj, goal = self._place(rng)
        ee = rng.uniform(-0.04, 0.04, size=2)
        self.data.mocap_pos[self._ee_mocap] = [*ee, rules.ee_start_z]
        if self._goal_mocap >= 0:
            self.data.mocap_pos[self._goal_mocap, :2] = goal
        self._set_object("object", obj)
        if v.distractor:
            other = [c for c in (TRAIN_COLORS if color in TRAIN_COLORS else v.colors) if c != color]
            self.model.geom_rgba[self._distractor_geom, :3] = COLORS[other[int(rng.integers(len(other)))]]
            for _ in range(100):
                place = rng.uniform(-0.15, 0.15, size=2)
                if np.linalg.norm(place - obj) > 0.08 and np.linalg.norm(place - goal) > 0.07 \
                        and np.linalg.norm(place - ee) > 0.05:
                    break
            self._set_object("distractor", place)
        else:
            self._set_object("distractor", None)
        self.instruction = v.templates[int(rng.integers(len(v.templates)))].format(color=color)
        self.grasped, self._grasp_offset, self._steps = False, np.zeros(3), 0
        mujoco.mj_forward(self.model, self.data)
        s = self.state()
        self._start = (_dist(s.ee, s.obj, 2), _dist(s.obj, s.goal, 2))
        s = self.state()
        self._potential = rules.potential(s)
        return self._observation(), {"success": False, "potential": self._potential}

    def _set_object(self, name: str, xy: np.ndarray | None) -> None:
        """Put body ``name`` at ``xy`` on the table (None: hide it under the table)."""
        body = self.model.body(name)
        z = self.rules.object_z if xy is not None else -1.0
        pos = np.array([*(xy if xy is not None else (0.0, 0.0)), z])
        if body.mocapid[0] >= 0:
            self.data.mocap_pos[body.mocapid[0]] = pos
            return
        joint = self.model.jnt_qposadr[body.jntadr[0]]
        if self._free_object and name == "object":
            self.data.qpos[joint:joint + 7] = [*pos, 1, 0, 0, 0]
        else:  # x/y slide joints around the body's MJCF position (its z is the table height)
            self.data.qpos[joint:joint + 2] = pos[:2] if xy is not None else (5.0, 5.0)  # far out of view

    def check_action(self, action) -> np.ndarray:
        """The action as float32 [action_dims], clipped to [−1, 1]; raises on a wrong shape or NaN/inf."""
        meaning = f"end-effector deltas{' + grip' if self.rules.action_dims == 4 else ''} in [-1, 1]"
        return checked_action(action, self.action_space.shape, meaning)

    def step(self, action):
        a = self.check_action(action)  # before touching any state
        rules = self.rules
        ee_start = self.data.mocap_pos[self._ee_mocap].copy()
        delta = np.zeros(3)
        delta[:2] = a[:2] * rules.max_delta
        if rules.action_dims == 4:
            delta[2] = a[2] * rules.max_delta
        target = ee_start + delta
        target[:2] = np.clip(target[:2], -0.25, 0.25)
        target[2] = np.clip(target[2], 0.015, 0.15) if rules.action_dims == 4 else ee_start[2]
        if rules.action_dims == 4:
            self._update_grasp(a[3] > 0.0)
        for k in range(self.n_substeps):
            self.data.mocap_pos[self._ee_mocap] = ee_start + (k + 1) / self.n_substeps * (target - ee_start)
            self._hold_grasped()
            mujoco.mj_step(self.model, self.data)
        self._hold_grasped()
        mujoco.mj_forward(self.model, self.data)
        self._steps += 1
        s = self.state()
        potential = rules.potential(s)
        reward, self._potential = potential - self._potential, potential
        success = rules.success(s)
        truncated = self._steps >= rules.max_steps and not success
        return self._observation(), float(reward), success, truncated, {"success": success, "potential": potential}

    def _update_grasp(self, close: bool) -> None:
        if not close:
            self.grasped = False
        elif not self.grasped and _dist(self.data.mocap_pos[self._ee_mocap], self._object_pos()) < 0.03:
            self.grasped = True
            self._grasp_offset = self._object_pos() - self.data.mocap_pos[self._ee_mocap]

    def _hold_grasped(self) -> None:
        """A magnetic gripper: while grasped the cube follows the gripper rigidly."""
        if not self.grasped:
            return
        adr = self.model.jnt_qposadr[self.model.body("object").jntadr[0]]
        vadr = self.model.jnt_dofadr[self.model.body("object").jntadr[0]]
        self.data.qpos[adr:adr + 3] = self.data.mocap_pos[self._ee_mocap] + self._grasp_offset
        self.data.qpos[adr + 3:adr + 7] = (1, 0, 0, 0)
        self.data.qvel[vadr:vadr + 6] = 0.0

    def expert_action(self) -> np.ndarray:
        """The scripted expert's action in the current state."""
        return self.rules.expert_action(self.state())
