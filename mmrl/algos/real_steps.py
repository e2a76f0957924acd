"""Real simulator steps per evaluation: the x-axis that matters for robots (issue 27).

Every run of a :class:`~mmrl.core.contracts.SimulatorTask` (the robot tasks) logs, at every evaluation
(step 0 included), two counts beside the held-out success:

- ``eval/real_env_steps``: every real simulator step the run has taken so far, whatever the learner:
  the training episodes it drew (each draw of the policy's sampler, kept or not by the other hooks;
  world-model episodes take none), the demonstrations it ran beyond its warm start's (e.g. an off-policy
  learner's offline data: ``algo.extra.wsrl.offline_demos``), and the real data its training simulator
  was built from (a learned world model's own data, ``robot/wm_reach-v0``). Evaluation episodes are
  not counted, for any run.
- ``eval/demo_env_steps``: the real steps of the scripted-expert demonstrations of the run's
  supervised warm start (``warm_start.sft_steps`` batches; each distinct (env, seed) once), reported
  apart because runs that share a warm start (the same cached weights) share them. 0 without a warm
  start of this run's own (``warm_start.init_from``, a ``pretrained`` policy). Counted as the warm start runs
  them and read from ``demonstration_steps.json`` beside its cached weights (a warm start cached before that
  file existed is replayed once to count them).

The counter is a rollout hook that is always built and innermost (registered after every other one,
so it sees every draw that reaches the policy), inert for tasks that are not simulators. It reports
through :meth:`RolloutHook.eval_metrics`, which the trainer merges into each evaluation's metrics.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from mmrl.algos.hooks import ROLLOUT_HOOKS, Draw, HookContext, HookSpec, RolloutHook
from mmrl.core.contracts import DEMONSTRATION_STEPS_FILE, SimulatorTask
from mmrl.core.rollout import Rollout, SamplingParams

REAL_STEPS = "eval/real_env_steps"
DEMO_STEPS = "eval/demo_env_steps"


def warm_start_demonstration_steps(task: SimulatorTask, ctx: HookContext) -> dict[str, int]:
    """The real steps of the warm start's demonstrations, by ``repr(key)``: read from ``demonstration_steps.json``
    beside the cached warm-start weights (the warm start writes it as it runs them), else, for a warm start cached
    before that file existed, counted by replaying them (thousands of short episodes: 10-30 s on one CPU core) and
    written there (the count is a function of the cache key's task and warm-start config)."""
    path = ctx.warm_start_dir / DEMONSTRATION_STEPS_FILE if ctx.warm_start_dir is not None else None
    if path is not None and path.is_file():
        return {key: int(steps) for key, steps in json.loads(path.read_text()).items()}
    steps = {repr(key): n for key, n in task.demonstration_steps(ctx.warm_start_examples()).items()}
    if path is not None and path.parent.is_dir() and ctx.engine.is_main:  # a cached warm start (warm_start.cache: true)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(steps))
        os.replace(tmp, path)
    return steps


class RealEnvSteps(RolloutHook):
    """Counts the real simulator steps of a run (see the module docstring)."""

    def __init__(self, ctx: HookContext):
        self.engine = ctx.engine
        self.task: SimulatorTask | None = ctx.task if isinstance(ctx.task, SimulatorTask) else None
        self.online: int | None = 0  # this process's training episodes' real steps; None: unknown (old checkpoint)
        self.restored: dict[str, int] = {}  # demonstrations beyond the warm start's run before a resume, by repr(key)
        self.warm_start: dict[str, int] = {}  # the warm start's demonstrations' steps, by repr(key)
        ws = ctx.cfg.warm_start
        if self.task is not None and ws.sft_steps > 0 and ws.init_from is None:
            self.warm_start = warm_start_demonstration_steps(self.task, ctx)

    def draw(self, examples: Sequence[Any], group_size: int, sampling: SamplingParams, seed: int,
             inner: Draw) -> Rollout:
        rollout = inner(examples, group_size, sampling, seed)
        if self.task is not None and self.online is not None:
            self.online += self.task.real_env_steps(rollout.outputs)
        return rollout

    def offline(self) -> dict[str, int]:
        """The demonstrations the run ran beyond its warm start's, on any process and before any resume, by
        ``repr(key)`` (each once: a key's demonstration is the same episode every time)."""
        assert self.task is not None
        (runs,) = self.engine.gather_objects([self.task.demonstrations_run()])
        ran = {repr(key): steps for part in runs for key, steps in part.items() if repr(key) not in self.warm_start}
        return self.restored | ran

    def offline_steps(self) -> int:
        return sum(self.offline().values())

    def eval_metrics(self) -> dict[str, float | None]:
        if self.task is None:
            return {}
        online = None if self.online is None else self.engine.sum(self.online)
        real = None if online is None else online + self.offline_steps() + self.task.simulator_data_env_steps()
        return {REAL_STEPS: None if real is None else float(real), DEMO_STEPS: float(sum(self.warm_start.values()))}

    def state_dict(self) -> dict[str, Any]:
        if self.task is None:
            return {}
        online = None if self.online is None else int(self.engine.sum(self.online))  # all processes' episodes
        return {"online": online, "offline": self.offline()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The saved total goes to the first process. A checkpoint from before the count existed holds none: the
        count is then unknown (logged null)."""
        online = state.get("online")
        self.online = None if online is None else (online if self.engine.rank == 0 else 0)
        self.restored = dict(state.get("offline", {}))


ROLLOUT_HOOKS.register("real_env_steps", HookSpec(lambda cfg: True, RealEnvSteps))
