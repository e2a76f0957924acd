"""``rollout.log_episodes``: every training step's rollouts written as episode files, the offline data of a
later run (``algo.extra.wsrl.offline_files``).

Files: ``<run>/episodes/step_<n>.rank<r>.npz`` (format of :mod:`mmrl.algos.offpolicy.episodes`). A resumed
run writes the steps after its checkpoint again, identically, so the files stay those of one run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmrl.algos.hooks import HookContext, RolloutHook
from mmrl.algos.offpolicy.episodes import Episode, episodes_from_rollout, executed_by, read_episodes, write_episodes
from mmrl.core.scored import Scored

EPISODES_DIR = "episodes"


class EpisodeLog(RolloutHook):
    def __init__(self, ctx: HookContext):
        if ctx.out is None:
            raise ValueError("rollout.log_episodes needs a run folder to write its episodes to")
        self.folder, self.rank, self.step = ctx.out / EPISODES_DIR, ctx.engine.rank, 0
        self.executed = executed_by(ctx.policy)

    def finish(self, batch: Scored) -> Scored:
        self.step += 1
        write_episodes(self.folder / f"step_{self.step}.rank{self.rank}.npz", episodes_from_rollout(batch.rollout, self.executed))
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = state["step"]


def read_logged_episodes(run: Path, last_step: int) -> list[Episode]:
    """The episodes a run logged in steps 1..``last_step``, in step then process order."""
    files = sorted(Path(run, EPISODES_DIR).glob("step_*.rank*.npz"),
                   key=lambda p: tuple(int(x) for x in p.name[5:-4].split(".rank")))
    return [e for path in files if int(path.name[5:].split(".")[0]) <= last_step for e in read_episodes(path)]
