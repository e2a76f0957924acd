"""Episodes of an embodied policy as off-policy data, and their file format (``.npz``, format 1).

An :class:`Episode` is one row of a VLA rollout, or one scripted-expert demonstration, at the level of the
policy's *decisions* (one decision = one action chunk of ``chunk`` env steps):

- ``images`` [T, H, W, 3] uint8 and ``proprio`` [T, P] float32: the observation each decision was made from;
- ``instruction_ids`` [L] int64: the instruction's hashed word ids (0 = padding; the policy's hashing);
- ``actions`` [T, D] float32: the decision the env executed (D = chunk · action dims, clipped to [−1, 1]);
- ``rewards`` [T] float32: the env reward summed over each decision's chunk;
- ``chunk_rewards`` [T, c] float32 (optional): each env step's reward inside the decision's chunk of c
  steps, 0 after the episode ended (their row sums are ``rewards``); what chunked TD (CO-RFT) discounts
  step by step. Absent (data of format 1): the chunk is treated as one step, ``rewards[:, None]``;
- ``intervened`` [T] bool (optional, not written to files): decisions a scripted expert took over during the
  rollout (EXPO-FT's interventions); their ``actions`` are the expert's;
- ``terminal``: the episode ended by reaching its goal, so nothing is bootstrapped after the last decision.
  A non-terminal episode was cut by a time limit: its last observation has no recorded successor, so its
  last decision is an observation only, not a transition (bootstrapping at time limits, Pardo et al. 2018).

File format 2 (:func:`write_episodes` / :func:`read_episodes`, which also reads format 1, without
``chunk_rewards``): one ``numpy.savez_compressed`` archive,
no pickles, the episodes' decisions concatenated in order:

=================== ================== ================================================
key                 shape / dtype      meaning
=================== ================== ================================================
``format``          [] int64           1
``lengths``         [E] int64          decisions per episode (≥ 1)
``terminal``        [E] bool           see above
``instruction_ids`` [E, L] int64       zero-padded to the longest instruction
``images``          [ΣT, H, W, 3] uint8
``proprio``         [ΣT, P] float32
``actions``         [ΣT, D] float32    in [−1, 1]
``rewards``         [ΣT] float32
``chunk_rewards``   [ΣT, c] float32    format 2; c = 1 where the source had no chunks
=================== ================== ================================================

Sources: :func:`episodes_from_rollout` (logged rollouts of a run: the rollout hook ``episode_log`` or a
script), :func:`episode_from_demonstration` (a task's scripted-expert demonstration that records the
executed actions and rewards, e.g. ``robot/reach-v0``'s ``reference_output``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
from torch import Tensor

FORMAT_VERSION = 2
READABLE_FORMATS = (1, 2)


@dataclass(frozen=True)
class Episode:
    images: np.ndarray  # [T, H, W, 3] uint8
    proprio: np.ndarray  # [T, P] float32
    instruction_ids: np.ndarray  # [L] int64
    actions: np.ndarray  # [T, D] float32
    rewards: np.ndarray  # [T] float32
    terminal: bool
    chunk_rewards: np.ndarray | None = None  # [T, c] float32, rows summing to ``rewards``
    intervened: np.ndarray | None = None  # [T] bool: the env's scripted expert took these decisions (a takeover)

    @property
    def length(self) -> int:
        return len(self.rewards)

    def rewards_in_chunks(self) -> np.ndarray:
        """[T, c] per-env-step rewards of each decision (``rewards[:, None]`` when none were recorded)."""
        if self.chunk_rewards is None:
            return np.asarray(self.rewards, dtype=np.float32)[:, None]
        return np.asarray(self.chunk_rewards, dtype=np.float32)


@runtime_checkable
class RecordedDemonstration(Protocol):
    """What :func:`episode_from_demonstration` reads (``mmrl.tasks.robot.Demonstration`` has it)."""

    images: np.ndarray  # [T, H, W, 3] uint8
    proprio: np.ndarray  # [T, P]
    instruction: str
    executed_actions: np.ndarray  # [T, A] the actions the env executed
    rewards: np.ndarray  # [T] per env step
    success: bool


@runtime_checkable
class LabelledDemonstration(RecordedDemonstration, Protocol):
    """A recorded demonstration that also keeps the expert's clean action labels (DART: the executed action is
    the label plus noise; ``mmrl.tasks.robot.Demonstration`` has both)."""

    actions: np.ndarray  # [T, A] the expert's label at each visited state


def episode_from_demonstration(demo: RecordedDemonstration, instruction_ids: np.ndarray, chunk: int,
                               expert_labels: bool = False) -> Episode:
    """Env steps → decisions of ``chunk`` steps: the observation at each chunk's first step, the chunk's
    executed actions concatenated (the last one repeated past the end, as the runner pads an episode that
    ends mid-chunk), its rewards summed and kept per step (``chunk_rewards``, 0 past the end).
    ``instruction_ids``: the instruction as the policy hashes it. ``expert_labels``: the expert's clean labels
    instead of the executed actions (behaviour-cloning data; the demonstration must be a
    :class:`LabelledDemonstration`)."""
    if expert_labels and not isinstance(demo, LabelledDemonstration):
        raise ValueError(f"expert labels asked of a demonstration without them ({type(demo).__name__} has no "
                         f"'actions')")
    steps = len(demo.rewards)
    starts = np.arange(0, steps, chunk)
    index = np.minimum(starts[:, None] + np.arange(chunk)[None], steps - 1)  # [T, chunk]
    executed = np.asarray(demo.actions if expert_labels else demo.executed_actions, dtype=np.float32)
    per_step = np.asarray(demo.rewards, dtype=np.float32)
    in_chunk = np.pad(per_step, (0, len(starts) * chunk - steps)).reshape(len(starts), chunk)
    return Episode(np.asarray(demo.images)[starts], np.asarray(demo.proprio, dtype=np.float32)[starts],
                   np.asarray(instruction_ids, dtype=np.int64), np.clip(executed[index].reshape(len(starts), -1), -1, 1),
                   in_chunk.sum(1).astype(np.float32), bool(demo.success), in_chunk)


class ObservationPayload(Protocol):
    """The rollout payload fields :func:`episodes_from_rollout` reads (``VLAPayload`` has them)."""

    images: Tensor  # [N, T, H, W, 3] uint8
    proprio: Tensor  # [N, T, P]
    instruction_ids: Tensor  # [N, L]
    actions: Tensor  # [N, T, D] float: the sampled decisions (before the policy's squashing / clipping)
    chunk_rewards: Tensor | None  # [N, T, chunk]: env rewards inside each decision


def clipped(decisions: Tensor) -> Tensor:
    """The env's execution of unsquashed Gaussian decisions: clipped to [−1, 1]."""
    return decisions.clamp(-1, 1)


def executed_by(policy: Any) -> Callable[[Tensor], Tensor]:
    """The policy's map from stored decisions to executed actions (``executed_decisions``), else :func:`clipped`."""
    return getattr(policy, "executed_decisions", clipped)


def episodes_from_rollout(rollout: Any, executed: Callable[[Tensor], Tensor] = clipped) -> list[Episode]:
    """One :class:`Episode` per row of a rollout of a continuous-action embodied policy: its payload's
    observations and the decisions as the env executed them (``executed``: the policy's
    ``executed_decisions``, e.g. tanh of a squashed head; default: clipped to [−1, 1]), ``step_rewards``
    over the valid decisions (and the payload's ``chunk_rewards`` when it has them), terminal when the row's
    episode summary reports success."""
    payload: ObservationPayload = rollout.payload
    if not payload.actions.is_floating_point():
        raise ValueError("episodes need continuous decisions (policy.args.action_head: gaussian); "
                         "this rollout holds discrete action tokens")
    if rollout.step_rewards is None:
        raise ValueError("episodes need per-decision rewards: the rollout has no step_rewards (not an env rollout)")
    in_chunk = getattr(payload, "chunk_rewards", None)
    intervened = getattr(payload, "intervened", None)
    episodes = []
    for row in range(rollout.num_rows):
        t = int(rollout.mask[row].sum())
        episodes.append(Episode(payload.images[row, :t].numpy(), payload.proprio[row, :t].float().numpy(),
                                payload.instruction_ids[row].long().numpy(),
                                executed(payload.actions[row, :t].float()).clamp(-1, 1).numpy(),
                                rollout.step_rewards[row, :t].float().numpy(), bool(rollout.outputs[row].success),
                                None if in_chunk is None else in_chunk[row, :t].float().numpy(),
                                None if intervened is None else intervened[row, :t].numpy() > 0))
    return episodes


def write_episodes(path: str | Path, episodes: Sequence[Episode]) -> Path:
    """Write ``episodes`` to ``path`` (format 1, atomically); returns the path."""
    if not episodes:
        raise ValueError(f"no episodes to write to {path}")
    path = Path(path)
    width = max(len(e.instruction_ids) for e in episodes)
    arrays = {
        "format": np.int64(FORMAT_VERSION),
        "lengths": np.array([e.length for e in episodes], dtype=np.int64),
        "terminal": np.array([e.terminal for e in episodes], dtype=bool),
        "instruction_ids": np.stack([np.pad(e.instruction_ids, (0, width - len(e.instruction_ids)))
                                     for e in episodes]).astype(np.int64),
        "images": np.concatenate([e.images for e in episodes]).astype(np.uint8),
        "proprio": np.concatenate([e.proprio for e in episodes]).astype(np.float32),
        "actions": np.concatenate([e.actions for e in episodes]).astype(np.float32),
        "rewards": np.concatenate([e.rewards for e in episodes]).astype(np.float32),
        "chunk_rewards": chunk_rewards_array(episodes, path),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        np.savez_compressed(f, **arrays)
    os.replace(tmp, path)
    return path


def chunk_rewards_array(episodes: Sequence[Episode], path: Path) -> np.ndarray:
    """[ΣT, c] of all episodes; all must have the same chunk width c (1 for those without)."""
    parts = [e.rewards_in_chunks() for e in episodes]
    widths = {p.shape[1] for p in parts}
    if len(widths) != 1:
        raise ValueError(f"{path}: episodes with chunk_rewards of different chunk widths {sorted(widths)}")
    return np.concatenate(parts).astype(np.float32)


EPISODE_KEYS = ("format", "lengths", "terminal", "instruction_ids", "images", "proprio", "actions", "rewards")


def read_episodes(path: str | Path) -> list[Episode]:
    """The episodes of a format-1 or -2 file; a missing file, key or a shape that does not add up raises a
    ``ValueError`` naming the file and the key."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"episode file {path} not found (write one with mmrl.algos.offpolicy.write_episodes)")
    with np.load(path, allow_pickle=False) as data:
        missing = [k for k in EPISODE_KEYS if k not in data.files]
        if missing:
            raise ValueError(f"{path}: not an episode file, missing keys {missing} (format {FORMAT_VERSION} has "
                             f"{list(EPISODE_KEYS)})")
        arrays = {k: data[k] for k in EPISODE_KEYS}
        version = int(arrays["format"])
        if version >= 2 and "chunk_rewards" not in data.files:
            raise ValueError(f"{path}: format {version} needs the key 'chunk_rewards'")
        in_chunk = data["chunk_rewards"] if version >= 2 else None
    if version not in READABLE_FORMATS:
        raise ValueError(f"{path}: key 'format' is {version}; this mmrl reads formats {list(READABLE_FORMATS)}")
    lengths = arrays["lengths"]
    if lengths.ndim != 1 or (lengths < 1).any():
        raise ValueError(f"{path}: key 'lengths' must be [E] with every length >= 1")
    total = int(lengths.sum())
    for key in ("images", "proprio", "actions", "rewards"):
        if len(arrays[key]) != total:
            raise ValueError(f"{path}: key {key!r} has {len(arrays[key])} rows, 'lengths' sums to {total}")
    for key in ("terminal", "instruction_ids"):
        if len(arrays[key]) != len(lengths):
            raise ValueError(f"{path}: key {key!r} has {len(arrays[key])} rows for {len(lengths)} episodes")
    if not np.isfinite(arrays["actions"]).all() or np.abs(arrays["actions"]).max(initial=0) > 1:
        raise ValueError(f"{path}: key 'actions' must be finite and in [-1, 1]")
    if not np.isfinite(arrays["rewards"]).all():
        raise ValueError(f"{path}: key 'rewards' must be finite")
    if in_chunk is not None and (in_chunk.ndim != 2 or len(in_chunk) != total or not np.isfinite(in_chunk).all()
                                 or not np.allclose(in_chunk.sum(1), arrays["rewards"], atol=1e-4)):
        raise ValueError(f"{path}: key 'chunk_rewards' must be finite, [{total}, chunk], its rows summing to 'rewards'")
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return [Episode(arrays["images"][a:b], arrays["proprio"][a:b], arrays["instruction_ids"][i],
                    arrays["actions"][a:b], arrays["rewards"][a:b], bool(arrays["terminal"][i]),
                    None if in_chunk is None else in_chunk[a:b])
            for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
