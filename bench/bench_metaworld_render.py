"""Meta-World env steps/s with a frame per step: our renderer vs Meta-World's own ``render()`` vs a
bare ``mj_step`` loop on the same model, side by side in one run.

    OMP_NUM_THREADS=1 python bench/bench_metaworld_render.py --task reach --steps 200 --rounds 3

Measured in one process, interleaved round by round with the order turned by one each round (the
machine is shared: only ratios taken in the same run mean anything), medians over rounds; random
actions, a new episode every 100 steps. The cost of a frame depends on what is in it, so every loop
with a frame draws the same scenes: the bare loops start each episode from the physics state the
mmrl env's own reset reached (``mj_setState``), and follow the same actions (the bench raises if
their final states differ by more than 5e-3: the arm's joints agree exactly, a loose object may drift by
< 1e-3).

- ``bare physics``: Meta-World's model (same MJCF, same ``frame_skip`` 5) stepped with
  ``mujoco.mj_step`` after moving the mocap hand as Meta-World does: no reset, reward or observation.
- ``bare + mujoco.Renderer``: the same loop plus one frame per step from ``mujoco.Renderer`` with
  shadows, multisampling, reflections and skybox off, as the mmrl env draws (the floor for "a
  frame per step").
- ``metaworld step``: Meta-World's own ``step()`` (reward, observation), no frame.
- ``metaworld step + mujoco.Renderer``: Meta-World's ``reset()`` and ``step()`` as the mmrl env runs
  them (our model settings and quaternion) and the same ``mujoco.Renderer`` frame: the mmrl env less
  its own code, so the bare loop's lead over this row is Meta-World's step and reset.
- ``metaworld step + render()``: ``gymnasium.make("Meta-World/MT1", render_mode="rgb_array")``
  with Meta-World's defaults (4096 shadow map, 4x multisampling), ``render()`` every step.
- ``mmrl env``: ``gymnasium.make("mmrl/MetaWorld-<Task>-v0")``: Meta-World's step plus our
  :class:`~mmrl.envs.robot.rendering.SceneRenderer` frame in every observation, with the task
  module's ``Rotation`` pointed at :class:`~mmrl.envs.metaworld.env.MatrixQuaternion` (the same
  observation, a faster quaternion). ``metaworld step`` and ``metaworld step + render()`` run with
  scipy's ``Rotation`` put back, as Meta-World ships.

The issue's goals: ``mmrl env`` ≥ 10× Meta-World's render path and ≥ 0.9× the bare loop with a frame.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium
import numpy as np

import mmrl.envs  # noqa: F401  (registers mmrl/*; selects the GL backend before mujoco loads)
from mmrl.envs.metaworld import metaworld_env_id
from mmrl.envs.metaworld.env import FLAGS_OFF, build_simulator, import_metaworld
from mmrl.envs.robot.rendering import mujoco


def random_actions(steps: int) -> np.ndarray:
    return np.random.default_rng(0).uniform(-1, 1, (steps, 4)).astype(np.float32)


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
"""``cpu``: this process's CPU seconds (all its threads, the software renderer's included), which
other jobs on a shared machine disturb far less than wall-clock seconds."""


EPISODE = 100
"""Every loop restarts every ``EPISODE`` steps, from the mmrl env's own episode starts."""
STATE = mujoco.mjtState.mjSTATE_INTEGRATION


def episode_starts(env: gymnasium.Env, steps: int) -> list[np.ndarray]:
    """The full physics state at each episode start :func:`env_loop` will see (``reset(seed=0)``, then
    ``reset()`` every ``EPISODE`` steps), so that every loop draws the same scenes: the cost of a frame
    depends on what is in it."""
    env.reset(seed=0)
    starts = []
    for k in range(0, steps, EPISODE):
        if k:
            env.reset()
        sim = env.unwrapped.sim
        state = np.empty(mujoco.mj_stateSize(sim.model, STATE))
        mujoco.mj_getState(sim.model, sim.data, state, STATE)
        starts.append(state)
    return starts


def frame_renderer(model: Any, size: int) -> Any:
    """``mujoco.Renderer`` drawing the same scene as the mmrl env (shadows, reflections, skybox, haze off)."""
    renderer = mujoco.Renderer(model, size, size)
    for flag in FLAGS_OFF:
        renderer.scene.flags[flag] = 0
    return renderer


Timing = tuple[float, np.ndarray]
"""Steps/s, and the final ``qpos`` (to check that loops meant to visit the same states did)."""


def bare_loop(task: str, starts: list[np.ndarray], steps: int, size: int | None, camera: str,
              clock: Callable[[], float]) -> Timing:
    """mj_step × frame_skip after a mocap move, as Meta-World moves it, on a fresh MjData of Meta-World's
    model put in ``starts[i]`` at the start of episode i (no reset, no reward, no observation); ``size``:
    also draw a frame per step with ``mujoco.Renderer`` (None: physics only)."""
    sim = build_simulator(task)  # shadows, multisampling and reflections off in its model
    model = sim.model
    data = mujoco.MjData(model)
    renderer = frame_renderer(model, size) if size else None
    camera_id = model.camera(camera).id
    start = clock()
    for k, a in enumerate(random_actions(steps)):
        if k % EPISODE == 0:
            mujoco.mj_setState(model, data, starts[k // EPISODE], STATE)
            mujoco.mj_forward(model, data)
        data.mocap_pos[0] = np.clip(data.mocap_pos[0] + a[:3] * sim.action_scale, sim.mocap_low, sim.mocap_high)
        data.ctrl[:] = [a[3], -a[3]]
        mujoco.mj_step(model, data, nstep=sim.frame_skip)
        if renderer is not None:
            renderer.update_scene(data, camera_id)
            renderer.render()
    rate = steps / (clock() - start)
    if renderer is not None:
        renderer.close()
    sim.close()
    return rate, data.qpos.copy()


def metaworld_frame_loop(task: str, starts: list[np.ndarray], steps: int, size: int, camera: str,
                         clock: Callable[[], float]) -> Timing:
    """Meta-World's ``reset()`` and ``step()`` (as the mmrl env runs them: our model settings and
    quaternion) plus a ``mujoco.Renderer`` frame per step; after each reset the physics is put in
    ``starts[i]``, so the frames are the mmrl env's."""
    sim = build_simulator(task)
    sim.np_random = np.random.default_rng(0)  # Meta-World's goal sampler
    renderer = frame_renderer(sim.model, size)
    camera_id = sim.model.camera(camera).id
    start = clock()
    for k, a in enumerate(random_actions(steps)):
        if k % EPISODE == 0:
            sim.reset()
            mujoco.mj_setState(sim.model, sim.data, starts[k // EPISODE], STATE)
            mujoco.mj_forward(sim.model, sim.data)
        sim.step(a)
        renderer.update_scene(sim.data, camera_id)
        renderer.render()
    rate, final = steps / (clock() - start), sim.data.qpos.copy()
    renderer.close()
    sim.close()
    return rate, final


def env_loop(env: gymnasium.Env, steps: int, render: bool, clock: Callable[[], float]) -> Timing:
    """Steps/s of ``env`` with random actions, resetting every ``EPISODE`` steps; ``render``: call ``render()``
    after making Meta-World's GL context current (gymnasium's viewer assumes no other context exists:
    without this, its frames are drawn into whichever context was current last)."""
    env.reset(seed=0)
    viewer = env.unwrapped.mujoco_renderer._get_viewer("rgb_array") if render else None
    start = clock()
    for k, a in enumerate(random_actions(steps)):
        if k and k % EPISODE == 0:
            env.reset()
        env.step(a)
        if viewer is not None:
            viewer.make_context_current()
            frame = env.render()
            assert frame.shape[-1] == 3 and frame.std() > 1, "Meta-World's render() drew nothing"
    rate = steps / (clock() - start)
    return rate, getattr(env.unwrapped, "sim", env.unwrapped).data.qpos.copy()  # mmrl: .sim; Meta-World: itself


@contextlib.contextmanager
def scipy_rotation(module) -> Iterator[None]:
    """Meta-World's task module as shipped (scipy's ``Rotation``) for the duration."""
    from scipy.spatial.transform import Rotation

    ours = getattr(module, "Rotation", None)
    if ours is None:
        yield
        return
    module.Rotation = Rotation
    try:
        yield
    finally:
        module.Rotation = ours


def metaworld_env(task: str, size: int | None, camera: str) -> gymnasium.Env:
    """Meta-World's own MT1 env (its defaults: shadows and multisampling on); ``size``: rgb_array rendering."""
    import_metaworld()
    kwargs = {"render_mode": "rgb_array", "width": size, "height": size, "camera_name": camera} if size else {}
    return gymnasium.make("Meta-World/MT1", env_name=f"{task}-v3", seed=0, disable_env_checker=True, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="reach", help="Meta-World task (without -v3)")
    parser.add_argument("--steps", type=int, default=200, help="env steps per measurement")
    parser.add_argument("--render-steps", type=int, default=40,
                        help="steps per measurement of Meta-World's own render path (slow)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians are reported)")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--camera", default="corner")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall-clock seconds, or this process's CPU seconds (steadier on a shared machine)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    clock = CLOCKS[args.clock]
    size, task, steps = args.image_size, args.task, args.steps
    ours = gymnasium.make(metaworld_env_id(task), image_size=size, camera=args.camera, disable_env_checker=True)
    theirs = metaworld_env(task, size, args.camera)
    theirs_plain = metaworld_env(task, None, args.camera)
    task_module = sys.modules[type(ours.unwrapped.sim).__module__]
    starts = episode_starts(ours, steps)

    def as_shipped(measure: Callable[[], Timing]) -> Callable[[], Timing]:
        def run() -> Timing:
            with scipy_rotation(task_module):
                return measure()
        return run

    measurements: dict[str, Callable[[], Timing]] = {
        "bare physics": lambda: bare_loop(task, starts, steps, None, args.camera, clock),
        "bare + mujoco.Renderer": lambda: bare_loop(task, starts, steps, size, args.camera, clock),
        "metaworld step": as_shipped(lambda: env_loop(theirs_plain, steps, False, clock)),
        "metaworld step + mujoco.Renderer": lambda: metaworld_frame_loop(task, starts, steps, size, args.camera, clock),
        "metaworld step + render()": as_shipped(lambda: env_loop(theirs, args.render_steps, True, clock)),
        "mmrl env": lambda: env_loop(ours, steps, False, clock),  # the frame is in every observation
    }
    runs: dict[str, list[float]] = {name: [] for name in measurements}
    finals: dict[str, np.ndarray] = {}
    names = list(measurements)
    for r in range(args.rounds):  # the order turns by one each round: no row always follows the same one
        for name in names[r % len(names):] + names[:r % len(names)]:
            rate, finals[name] = measurements[name]()
            runs[name].append(rate)
    same_scenes = ("bare physics", "bare + mujoco.Renderer", "metaworld step + mujoco.Renderer", "mmrl env")
    for name in same_scenes[1:]:  # the comparison is fair only if the loops drew the same episodes
        gap = float(np.abs(finals[name] - finals[same_scenes[0]]).max())
        if gap > 5e-3:  # the arm agrees exactly; a loose object may drift < 1e-3 (Meta-World's reset
            # also writes model fields, e.g. its goal, that mj_setState does not carry)
            raise RuntimeError(f"{name!r} ended {gap:.2g} away from {same_scenes[0]!r}: the loops left the same episodes")
    medians = {k: statistics.median(v) for k, v in runs.items()}

    def ratio(name: str, base: str) -> float:  # median over rounds of same-round ratios
        return statistics.median(v / b for v, b in zip(runs[name], runs[base]))

    bases = ("bare + mujoco.Renderer", "metaworld step + render()")
    print(f"{'measurement':<34} {'steps/s':>9} " + " ".join(f"{'vs ' + b:>30}" for b in bases))
    for name, value in medians.items():
        print(f"{name:<34} {value:>9,.1f} " + " ".join(f"{ratio(name, b):>29.2f}x" for b in bases))
    print(f"({task}-v3, medians of {args.rounds} interleaved rounds, {size} px frames from camera {args.camera!r}, "
          f"{args.clock} clock)")
    ours.close()
    theirs.close()
    theirs_plain.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"medians": medians, "runs": runs, "args": vars(args)}, f, indent=1)


if __name__ == "__main__":
    main()
