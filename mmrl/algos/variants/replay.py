"""Rows kept across steps and trained again (RoRecomp's compensation batches, the bandit scheduler's reuse of
historical rollouts), and the pickled state files of hooks whose state holds examples.

A :class:`StoredGroup` is some rows of one prompt's group: the example, the decoded outputs, and each row's
behaviour log-probabilities log μ(y_t), taken when the rows were stored (before the step's update, so from the
weights that drew them). :func:`replay_groups` turns stored groups back into scored rows: the outputs are
re-tokenised by ``Policy.rollout_from_outputs`` and π_old is set to the stored log μ, so PPO's ratio
π_θ / μ is the importance weight from the policy that drew a row to the current one, clipped like any other
(the mechanism of EAPO's replay, ``mmrl/algos/variants/guidance.py``). Replayed rows are re-verified (the
verifier is deterministic, so the score is the stored one) and shaped as the trainer shapes any row.

Hook state that holds examples (arbitrary frozen dataclasses, images included) is not JSON: such hooks pickle
it to ``<run>/hook_state/<hook>/step_<n>.rank<r>.pkl`` with :func:`save_state_file` and keep only the file name in the
checkpoint's ``trainer_state.json``; the newest ``checkpoint.keep_last`` files are kept.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mmrl.core.rollout import Rollout, SamplingParams
from mmrl.core.scored import Scored


@dataclass(frozen=True)
class StoredGroup:
    """Rows of one prompt's group kept for a later step."""

    example: Any
    outputs: tuple[str, ...]
    logp: tuple[tuple[float, ...], ...]  # per row, the behaviour log-probs of its decisions
    step: int  # the training step that drew the rows


def store_groups(policy: Any, examples: Sequence[Any], rows: Sequence[Sequence[str]], sampling: SamplingParams,
                 step: int) -> list[StoredGroup]:
    """``rows[g]`` (outputs answering ``examples[g]``) as stored groups, with the current weights' log-probs of
    each output re-tokenised as replay will tokenise it (one no-grad forward over the rows)."""
    flat_examples = [examples[g] for g, outputs in enumerate(rows) for _ in outputs]
    flat_outputs = [str(o) for outputs in rows for o in outputs]
    if not flat_outputs:
        return []
    scored = policy.rollout_from_outputs(flat_examples, flat_outputs, sampling)
    lengths = scored.mask.sum(1).long().tolist()
    logps = [tuple(scored.logp[i, :lengths[i]].tolist()) for i in range(len(flat_outputs))]
    groups, start = [], 0
    for g, outputs in enumerate(rows):
        end = start + len(outputs)
        if end > start:
            groups.append(StoredGroup(examples[g], tuple(flat_outputs[start:end]), tuple(logps[start:end]), step))
        start = end
    return groups


def stored_logp(logps: Sequence[Sequence[float]], mask: Tensor) -> Tensor:
    """The stored log-probs as an [N, T] tensor aligned with ``mask`` (the outputs re-tokenised now); a length
    that differs from the mask's is an error (the tokeniser changed under the buffer)."""
    out = torch.zeros_like(mask)
    for i, logp in enumerate(logps):
        n = int(mask[i].sum())
        if n != len(logp):
            raise ValueError(f"a replayed output has {n} decisions now but {len(logp)} when it was stored")
        out[i, :n] = torch.tensor(logp, dtype=out.dtype)
    return out


def replay_groups(policy: Any, score: Callable[[Rollout, list[Any]], Scored], groups: Sequence[StoredGroup],
                  sampling: SamplingParams) -> Scored:
    """Stored groups as scored rows (group g answers ``groups[g].example``), π_old = the stored log μ."""
    examples = [g.example for g in groups]
    index = torch.tensor([i for i, g in enumerate(groups) for _ in g.outputs], dtype=torch.long)
    rows = policy.rollout_from_outputs([examples[i] for i in index.tolist()],
                                       [o for g in groups for o in g.outputs], sampling)
    logp = stored_logp([lp for g in groups for lp in g.logp], rows.mask)
    return score(rows.replace(logp=logp, example_index=index, group_id=index.clone()), examples)


def append_groups(batch: Scored, more: Scored | None) -> Scored:
    """``batch`` followed by ``more``'s groups (other examples), renumbered after ``batch``'s."""
    if more is None or not more.examples:
        return batch
    return Scored.merge([batch, more], len(batch.examples) + len(more.examples))


def save_state_file(folder: Path, step: int, rank: int, state: Any, keep_last: int) -> dict[str, int]:
    """Pickle ``state`` atomically to ``folder/step_<step>.rank<rank>.pkl`` (each process keeps its own); keep
    the process's newest ``keep_last`` files (0: all). Returns what the checkpoint records: the step (the main
    process writes ``trainer_state.json``; each process finds its own file from the step and its rank)."""
    folder.mkdir(parents=True, exist_ok=True)
    name = f"step_{step}.rank{rank}.pkl"
    tmp = folder / f".{name}.tmp"
    with open(tmp, "wb") as f:
        pickle.dump(state, f)
    os.replace(tmp, folder / name)
    if keep_last > 0:
        files = sorted(folder.glob(f"step_*.rank{rank}.pkl"), key=lambda p: int(p.name[5:].split(".")[0]))
        for old in files[:-keep_last]:
            if old.name != name:
                old.unlink(missing_ok=True)
    return {"file_step": step}


def load_state_file(folder: Path, state: dict[str, Any], rank: int, what: str) -> Any:
    """What :func:`save_state_file` wrote for this process at the step the checkpoint recorded."""
    if "file_step" not in state:
        raise ValueError(f"the checkpoint holds no state of {what} (written by another recipe?)")
    with open(folder / f"step_{state['file_step']}.rank{rank}.pkl", "rb") as f:
        return pickle.load(f)


HOOK_STATE_DIR = "hook_state"
