"""Meta-World manipulation tasks (Yu et al. 2019; Farama's ``metaworld`` 3.x) as mmrl envs.

Registered with gymnasium (``gymnasium.make(id, image_size=64, camera="corner")``):

- ``mmrl/MetaWorld-<Task>-v0``: one task, training instructions; the initial and goal positions
  come from Meta-World's own sampler seeded by ``reset(seed=)`` (tasks keep train and test seeds
  disjoint: see :mod:`mmrl.tasks.robot.metaworld`)
- ``mmrl/MetaWorld-<Task>-OODInstruction-v0``: the same task with paraphrases never trained on
- ``mmrl/MetaWorld-MT10-v0`` (``-OODInstruction-v0``): one of the ten MT10 tasks drawn per reset
- ``mmrl/MetaWorld-ML10-v0`` / ``mmrl/MetaWorld-ML10-OODTask-v0``: ML10's ten training tasks /
  its five held-out tasks (Meta-World's ML10 split), a task drawn per reset

for ``<Task>`` in :data:`TASK_IDS` (the MT10 tasks and the other ML10 tasks, in CamelCase:
``Reach``, ``PickPlace``, ``ButtonPressTopdown``, ...). Registering imports neither ``metaworld``
nor ``mujoco``: a missing ``metaworld`` is reported when an env is built (``pip install
'mmrl[metaworld]'``).
"""

from __future__ import annotations

import gymnasium

MT10_TASKS = ("reach", "push", "pick-place", "door-open", "drawer-open", "drawer-close", "button-press-topdown",
              "peg-insert-side", "window-open", "window-close")
"""Meta-World's MT10 benchmark (``metaworld.env_dict.MT10_V3``), without the ``-v3`` suffix."""
ML10_TRAIN_TASKS = ("reach", "push", "pick-place", "door-open", "drawer-close", "button-press-topdown",
                    "peg-insert-side", "window-open", "sweep", "basketball")
ML10_TEST_TASKS = ("drawer-open", "door-close", "shelf-place", "sweep-into", "lever-pull")
"""Meta-World's ML10 train / held-out task sets (``metaworld.env_dict.ML10_V3``)."""

TEMPLATES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # task: (training paraphrases, held-out paraphrases never trained on); lowercase letters and spaces only
    "reach": (("reach the red goal", "move the gripper to the red dot", "go to the target point"),
              ("bring the hand over to the small red marker", "touch the goal location with the gripper")),
    "push": (("push the puck to the goal", "slide the puck onto the green target", "move the puck to the goal"),
             ("shove the disc until it reaches the green marker", "nudge the round block to the target spot")),
    "pick-place": (("pick up the puck and place it at the goal", "grasp the puck and put it on the target",
                    "lift the puck to the goal"),
                   ("grab the disc and carry it to the marker", "take the round block over to the target")),
    "door-open": (("open the door", "pull the door open", "swing the door open"),
                  ("get the door to open wide", "turn the door on its hinge away from the frame")),
    "drawer-open": (("open the drawer", "pull the drawer out", "slide the drawer open"),
                    ("draw the drawer out towards you", "get the drawer to come out")),
    "drawer-close": (("close the drawer", "push the drawer shut", "slide the drawer closed"),
                     ("shut the drawer all the way", "press the drawer back in")),
    "button-press-topdown": (("press the button from the top", "push the button down", "press the red button"),
                             ("hit the button from above", "push down on the button until it clicks")),
    "peg-insert-side": (("insert the peg into the hole", "put the peg into the side hole", "push the peg in the hole"),
                        ("slot the stick sideways into the opening", "fit the peg into the box from the side")),
    "window-open": (("open the window", "slide the window open", "push the window open"),
                    ("move the window pane to open it", "get the window to slide open")),
    "window-close": (("close the window", "slide the window closed", "push the window shut"),
                     ("move the window pane to shut it", "get the window to slide closed")),
    "sweep": (("sweep the puck off the table", "push the puck off the edge", "sweep the block off the side"),
              ("brush the puck over the edge of the table", "knock the block off the table")),
    "basketball": (("put the ball in the hoop", "dunk the ball into the basket", "score the ball in the hoop"),
                   ("lift the ball and drop it through the ring", "get the ball into the net")),
    "door-close": (("close the door", "push the door shut", "swing the door closed"),
                   ("get the door back into its frame", "shut the open door")),
    "shelf-place": (("put the block on the shelf", "place the block on the shelf", "lift the block onto the shelf"),
                    ("set the cube down on the rack", "carry the block up onto the shelf")),
    "sweep-into": (("sweep the puck into the hole", "push the puck into the hole", "slide the block into the hole"),
                   ("brush the puck into the opening", "move the block until it falls in the hole")),
    "lever-pull": (("pull the lever up", "lift the lever", "raise the lever"),
                   ("turn the lever upwards", "push the handle of the lever up")),
}
TASKS = tuple(TEMPLATES)
"""The tasks this package wraps (the union of MT10 and ML10): instructions are written for each."""

SUITES: dict[str, tuple[str, ...]] = {"MT10": MT10_TASKS, "ML10": ML10_TRAIN_TASKS, "ML10-OODTask": ML10_TEST_TASKS}
"""Multi-task ids: ``mmrl/MetaWorld-<suite>-v0`` draws one of these tasks per reset."""

MAX_STEPS: dict[str, int] = {
    "reach": 100, "push": 120, "pick-place": 100, "door-open": 150, "drawer-open": 150, "drawer-close": 120,
    "button-press-topdown": 120, "peg-insert-side": 200, "window-open": 150, "window-close": 150, "sweep": 150,
    "basketball": 150, "door-close": 120, "shelf-place": 160, "sweep-into": 100, "lever-pull": 200,
}
"""Episode limit per task (Meta-World's own is 500): about 1.2–2× the longest successful scripted-expert
episode under DART noise 0.3 (8 seeds each, docs/metaworld.md); shorter episodes keep CPU rollouts cheap."""


def valid_task(task: str) -> str:
    """``task`` if this package wraps it; else a ValueError listing the valid names."""
    if task not in TEMPLATES:
        suggestion = [t for t in TASKS if t.replace("-", "") == task.lower().replace("_", "").replace("-", "")
                      .removesuffix("v3")]
        hint = f" (did you mean {suggestion[0]!r}?)" if suggestion else ""
        raise ValueError(f"unknown Meta-World task {task!r}{hint}; valid tasks: {', '.join(TASKS)}")
    return task


def camel(task: str) -> str:
    """``pick-place`` → ``PickPlace`` (the id spelling, as in ``mmrl/PickPlace-v0``)."""
    return "".join(part.capitalize() for part in task.split("-"))


def metaworld_env_id(task_or_suite: str, variant: str = "") -> str:
    """The registered id of a task (``reach``) or suite (``MT10``), optionally of a held-out variant."""
    name = task_or_suite if task_or_suite in SUITES else camel(valid_task(task_or_suite))
    return f"mmrl/MetaWorld-{name}{'-' + variant if variant else ''}-v0"


ENTRY_POINT = "mmrl.envs.metaworld.env:MetaWorldEnv"
ENV_IDS: list[str] = []


def _register(env_id: str, tasks: tuple[str, ...], instructions: str) -> None:
    if env_id not in gymnasium.registry:
        gymnasium.register(id=env_id, entry_point=ENTRY_POINT, kwargs={"tasks": tasks, "instructions": instructions})
    ENV_IDS.append(env_id)


for _task in TASKS:
    _register(metaworld_env_id(_task), (_task,), "train")
    _register(metaworld_env_id(_task, "OODInstruction"), (_task,), "ood")
_register(metaworld_env_id("MT10"), MT10_TASKS, "train")
_register(metaworld_env_id("MT10", "OODInstruction"), MT10_TASKS, "ood")
_register(metaworld_env_id("ML10"), ML10_TRAIN_TASKS, "train")
_register(metaworld_env_id("ML10-OODTask"), ML10_TEST_TASKS, "train")

__all__ = ["ENV_IDS", "MAX_STEPS", "ML10_TEST_TASKS", "ML10_TRAIN_TASKS", "MT10_TASKS", "SUITES", "TASKS", "TEMPLATES",
           "camel", "metaworld_env_id", "valid_task"]
