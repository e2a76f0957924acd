"""MuJoCo table-top environments for VLA policies (``mmrl.envs.robot``).

Registered with gymnasium as ``mmrl/<Task>-v0`` (training distribution) and one id per held-out
variation, as in RL4VLA's generalisation study (vision, semantics, execution):

- ``mmrl/<Task>-OODColor-v0``: object colours never seen in training (vision)
- ``mmrl/<Task>-OODPosition-v0``: objects farther out than any training layout (execution)
- ``mmrl/<Task>-OODInstruction-v0``: paraphrased instructions (semantics)
- ``mmrl/<Task>-OODDistractor-v0``: a second object of another colour (vision + semantics)

for ``<Task>`` in Reach, Push, PickPlace. ``gymnasium.make(id, image_size=64)``.
"""

from __future__ import annotations

import gymnasium

from mmrl.envs.robot.rendering import BACKEND, RendererUnavailableError, select_backend
from mmrl.envs.robot.tabletop import (COLORS, OOD_COLORS, RULES, TRAIN_COLORS, State, TabletopEnv, TaskRules,
                                      Variation)

TRAIN_RADIUS = (0.06, 0.15)
OOD_RADIUS = (0.16, 0.2)

TEMPLATES = {
    "reach": (("reach the {color} ball", "move to the {color} ball", "touch the {color} ball"),
              ("go over to the {color} sphere", "put the gripper on top of the {color} sphere")),
    "push": (("push the {color} puck onto the white disc", "slide the {color} puck to the white disc",
              "move the {color} puck onto the goal"),
             ("shove the {color} disk until it covers the white circle", "nudge the {color} token to the target")),
    "pick_place": (("put the {color} cube on the plate", "pick up the {color} cube and place it on the plate",
                    "move the {color} cube onto the plate"),
                   ("grab the {color} block and drop it on the white dish", "lift the {color} box onto the target")),
}
TASK_NAMES = {"reach": "Reach", "push": "Push", "pick_place": "PickPlace"}


def variations(task: str) -> dict[str, Variation]:
    """The training variation ("") and the held-out ones, by id suffix."""
    train_templates, ood_templates = TEMPLATES[task]
    base = Variation(colors=TRAIN_COLORS, radius=TRAIN_RADIUS, templates=train_templates)
    return {
        "": base,
        "OODColor": Variation(OOD_COLORS, TRAIN_RADIUS, train_templates),
        "OODPosition": Variation(TRAIN_COLORS, OOD_RADIUS, train_templates),
        "OODInstruction": Variation(TRAIN_COLORS, TRAIN_RADIUS, ood_templates),
        "OODDistractor": Variation(TRAIN_COLORS, TRAIN_RADIUS, train_templates, distractor=True),
    }


def env_id(task: str, variant: str = "") -> str:
    return f"mmrl/{TASK_NAMES[task]}{'-' + variant if variant else ''}-v0"


ENV_IDS: list[str] = []
for _task in RULES:
    for _variant, _variation in variations(_task).items():
        _id = env_id(_task, _variant)
        if _id not in gymnasium.registry:
            gymnasium.register(id=_id, entry_point=TabletopEnv,
                               kwargs={"task": _task, "variation": _variation})
        ENV_IDS.append(_id)

__all__ = ["BACKEND", "COLORS", "ENV_IDS", "OOD_COLORS", "RULES", "RendererUnavailableError", "State",
           "TRAIN_COLORS", "TabletopEnv", "TaskRules", "Variation", "env_id", "select_backend", "variations"]
