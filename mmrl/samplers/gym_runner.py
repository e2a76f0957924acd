"""Run episodes of gymnasium vector envs with a policy's decision function; record them as arrays.

One row = one episode, ``T`` = decisions (a decision is one action chunk of ``chunk`` env steps).
The runner knows nothing of mmrl's envs or tasks: examples only need ``env_id: str`` and
``seed: int`` (:class:`EnvExample`), and rows of the same example start from the same initial
state (``reset(seed=)``), which is what GRPO's same-init groups need.

Episodes are run in batches of at most ``num_envs`` sub-envs in a ``SyncVectorEnv`` or
``AsyncVectorEnv`` (subprocesses), kept in a pool keyed by the batch's env ids so that envs (and
their renderers) are built once. Observation dicts must hold ``image`` [H, W, 3] uint8,
``proprio`` [P] float and ``instruction`` (text).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import gymnasium
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv


class EnvExample(Protocol):
    env_id: str
    seed: int


@dataclass(frozen=True)
class EpisodeSummary:
    """What ``task.reward`` scores: the outcome of one episode."""

    env_id: str
    seed: int
    success: bool
    episode_return: float  # Σ_t r_t (for potential-based rewards: Φ(s_T) − Φ(s_0))
    length: int  # env steps taken
    task: str = ""  # the env's reset ``info["task"]`` where it has one (a multi-task suite draws it per reset)


@dataclass
class EpisodeBatch:
    """N recorded episodes, decisions padded to the longest (``mask``)."""

    images: np.ndarray  # [N, T, H, W, 3] uint8: the observation each decision was made from
    proprio: np.ndarray  # [N, T, P] float32
    instructions: list[str]  # [N]
    records: dict[str, np.ndarray]  # each [N, T, ...]: what the decision function returned per decision
    step_rewards: np.ndarray  # [N, T] float32: env reward summed over each decision's chunk
    dones: np.ndarray  # [N, T] float32: 1 at the decision after which the episode ended
    mask: np.ndarray  # [N, T] float32: 1 for real decisions
    summaries: list[EpisodeSummary]
    frames: list[list[np.ndarray]] | None = None  # per episode, every env step's image (videos)
    chunk_rewards: np.ndarray | None = None  # [N, T, chunk] float32: each env step's reward inside the chunk
    # (0 after the episode ended); ``step_rewards`` is its sum over the chunk (chunked TD, CO-RFT)
    intervened: np.ndarray | None = None  # [N, T] float32: 1 where the env's scripted expert took the decision
    # (``takeover_after``); None when no takeover was asked
    expert_actions: np.ndarray | None = None  # [N, T, chunk, A] float32: what the expert executed there (0 elsewhere)


# decide(images [B,H,W,3] uint8, proprio [B,P], instructions [B]) -> (actions [B, chunk, A], records {k: [B, ...]})
DecideFn = Callable[[np.ndarray, np.ndarray, list[str]], tuple[np.ndarray, dict[str, np.ndarray]]]


class GymRunner:
    def __init__(self, num_envs: int, vector_mode: Literal["sync", "async"], env_kwargs: dict | None = None):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.num_envs, self.vector_mode, self.env_kwargs = num_envs, vector_mode, dict(env_kwargs or {})
        self._pool: dict[tuple[str, ...], VectorEnv] = {}

    def vector_env(self, env_ids: tuple[str, ...]) -> VectorEnv:
        if env_ids not in self._pool:
            for env_id in set(env_ids):
                if env_id not in gymnasium.registry:
                    raise gymnasium.error.NameNotFound(f"environment {env_id!r} is not registered; import the "
                                                       f"package that registers it (mmrl.envs for mmrl/*)")
            kwargs = self.env_kwargs

            def make(env_id: str):
                # The spec (with its entry point) travels to AsyncVectorEnv's spawned workers, which
                # have not imported the package that registered the id.
                spec = gymnasium.spec(env_id)
                return lambda: gymnasium.make(spec, disable_env_checker=True, **kwargs)

            fns = [make(env_id) for env_id in env_ids]
            first = gymnasium.spec(env_ids[0])
            if len(set(env_ids)) == 1 and first.vector_entry_point is not None:
                # a natively batched env (e.g. mmrl/WM-*: one world-model call steps every episode)
                self._pool[env_ids] = gymnasium.make_vec(first, num_envs=len(env_ids),
                                                         vectorization_mode="vector_entry_point", **kwargs)
            elif self.vector_mode == "sync":
                self._pool[env_ids] = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.NEXT_STEP)
            else:  # spawn, not fork: a forked child inherits this process's OpenGL state and crashes
                self._pool[env_ids] = AsyncVectorEnv(fns, autoreset_mode=AutoresetMode.NEXT_STEP, context="spawn",
                                                      shared_memory=False)  # Text obs read back as "aaa…" from shared memory
        return self._pool[env_ids]

    def __deepcopy__(self, memo: dict) -> GymRunner:
        """A copy of a policy (the trainer's frozen reference) gets its own, empty env pool."""
        return GymRunner(self.num_envs, self.vector_mode, self.env_kwargs)

    def close(self) -> None:
        for env in self._pool.values():
            env.close()
        self._pool.clear()

    def run(self, env_ids: Sequence[str], seeds: Sequence[int], decide: DecideFn, chunk: int,
            max_decisions: int, record_frames: bool = False,
            takeover_after: Sequence[int] | None = None, stall_window: int | None = None) -> EpisodeBatch:
        """Run one episode per (env id, seed) for at most ``max_decisions`` decisions.

        ``takeover_after[i]`` = k >= 0: from episode i's decision k on (after the policy's first k decisions), the
        env's scripted expert acts instead (``env.unwrapped.expert_action()``, closed loop at every env step of a
        chunk; ``decide`` is still called for every row and its actions for those rows are discarded); −1: never.
        With ``stall_window`` w the expert takes over at the first decision d >= k whose episode gained no reward
        over its last w decisions (sum <= 0; :class:`mmrl.core.contracts.Takeovers`), and keeps control. The batch
        then records ``intervened`` and ``expert_actions``."""
        if takeover_after is not None and len(takeover_after) != len(env_ids):
            raise ValueError(f"takeover_after has {len(takeover_after)} entries for {len(env_ids)} episodes")
        if stall_window is not None and stall_window < 1:
            raise ValueError(f"stall_window must be >= 1 decisions, got {stall_window}")
        parts = [self._run_batch(tuple(env_ids[i:i + self.num_envs]), list(seeds[i:i + self.num_envs]), decide,
                                 chunk, max_decisions, record_frames,
                                 None if takeover_after is None else np.asarray(takeover_after[i:i + self.num_envs]),
                                 stall_window)
                 for i in range(0, len(env_ids), self.num_envs)]
        return concat_batches(parts)

    @staticmethod
    def expert_actions(env: VectorEnv, env_ids: tuple[str, ...]) -> np.ndarray:
        """Every sub-env's scripted expert action now [n, A] (``expert_action()`` of the env)."""
        try:
            return np.stack([np.asarray(a, dtype=np.float32) for a in env.call("expert_action")])
        except AttributeError as err:
            raise ValueError(f"envs {sorted(set(env_ids))} have no expert_action(): an expert takeover needs a "
                             f"scripted expert in the env") from err

    def _run_batch(self, env_ids: tuple[str, ...], seeds: list[int], decide: DecideFn, chunk: int,
                   max_decisions: int, record_frames: bool, takeover: np.ndarray | None = None,
                   stall_window: int | None = None) -> EpisodeBatch:
        env = self.vector_env(env_ids)
        n = len(env_ids)
        obs, reset_info = env.reset(seed=[int(s) for s in seeds])
        tasks = episode_tasks(reset_info, n)
        instructions = [str(x) for x in obs["instruction"]]
        active = np.ones(n, dtype=bool)
        returns, lengths, success = np.zeros(n), np.zeros(n, dtype=int), np.zeros(n, dtype=bool)
        images, proprio, records, rewards, dones, masks, in_chunk = [], [], [], [], [], [], []
        intervened, expert_chunks = [], []
        taken = np.zeros(n, dtype=bool)  # episodes the expert has taken over (it keeps control)
        frames = [[obs["image"][i]] for i in range(n)] if record_frames else None
        for decision in range(max_decisions):
            if not active.any():
                break
            actions, record = decide(obs["image"], obs["proprio"].astype(np.float32), instructions)
            if actions.shape[:2] != (n, chunk):
                raise ValueError(f"decide returned actions of shape {actions.shape}, expected ({n}, {chunk}, A)")
            images.append(obs["image"])
            proprio.append(obs["proprio"].astype(np.float32))
            records.append(record)
            masks.append(active.astype(np.float32))
            reward, done = np.zeros(n, dtype=np.float32), np.zeros(n, dtype=np.float32)
            per_step = np.zeros((n, chunk), dtype=np.float32)
            expert_rows = None
            if takeover is not None:
                due = (takeover >= 0) & (decision >= takeover)
                if stall_window is not None:  # due, and no reward gained over the last w decisions
                    stalled = (np.sum(rewards[-stall_window:], axis=0) <= 0 if decision >= stall_window
                               else np.zeros(n, dtype=bool))
                    due &= taken | stalled
                taken |= due & active
                expert_rows = taken & active
            if expert_rows is not None:
                intervened.append(expert_rows.astype(np.float32))
                expert_chunks.append(np.zeros(actions.shape, dtype=np.float32))
            for k in range(chunk):
                was_active = active.copy()
                step_actions = actions[:, k]
                if expert_rows is not None and expert_rows.any():
                    expert = self.expert_actions(env, env_ids)
                    step_actions = np.where(expert_rows[:, None], expert, step_actions).astype(actions.dtype)
                    expert_chunks[-1][:, k] = np.where((expert_rows & was_active)[:, None], expert, 0.0)
                obs, r, terminated, truncated, info = env.step(step_actions)
                per_step[:, k] = np.where(was_active, r, 0.0)
                reward += np.where(was_active, r, 0.0).astype(np.float32)
                ended = was_active & (terminated | truncated)
                returns += np.where(was_active, r, 0.0)
                lengths += was_active
                success |= ended & np.asarray(info["success"], dtype=bool)
                if frames is not None:
                    for i in np.flatnonzero(was_active):
                        frames[i].append(obs["image"][i])
                done[ended] = 1.0
                active &= ~ended
                if not active.any():
                    break
            rewards.append(reward)
            in_chunk.append(per_step)
            dones.append(done)
        t = len(masks)
        if active.any():  # the decision budget ran out before the env's own time limit
            dones[-1][active] = 1.0
        summaries = [EpisodeSummary(env_ids[i], int(seeds[i]), bool(success[i]), float(returns[i]), int(lengths[i]),
                                    tasks[i]) for i in range(n)]
        stack = lambda xs: np.stack(xs, axis=1)  # noqa: E731  T × [N, ...] → [N, T, ...]
        return EpisodeBatch(
            images=stack(images), proprio=stack(proprio), instructions=instructions,
            records={k: stack([r[k] for r in records]) for k in records[0]} if t else {},
            step_rewards=stack(rewards), dones=stack(dones), mask=stack(masks), summaries=summaries, frames=frames,
            chunk_rewards=stack(in_chunk) if t else np.zeros((n, 0, chunk), dtype=np.float32),
            intervened=None if takeover is None else stack(intervened) if t else np.zeros((n, 0), dtype=np.float32),
            expert_actions=None if takeover is None or not t else stack(expert_chunks))


def episode_tasks(reset_info: dict, n: int) -> list[str]:
    """Each sub-env's ``info["task"]`` from a vector env's reset, "" where it reported none."""
    if "task" not in reset_info:
        return [""] * n
    present = reset_info.get("_task", np.ones(n, dtype=bool))
    return [str(reset_info["task"][i]) if present[i] else "" for i in range(n)]


def concat_batches(parts: Sequence[EpisodeBatch]) -> EpisodeBatch:
    """Stack episode batches row-wise, zero-padding the decision axis."""
    t_max = max(p.mask.shape[1] for p in parts)

    def pad(x: np.ndarray) -> np.ndarray:
        return np.pad(x, [(0, 0), (0, t_max - x.shape[1])] + [(0, 0)] * (x.ndim - 2))

    return EpisodeBatch(
        images=np.concatenate([pad(p.images) for p in parts]),
        proprio=np.concatenate([pad(p.proprio) for p in parts]),
        instructions=[s for p in parts for s in p.instructions],
        records={k: np.concatenate([pad(p.records[k]) for p in parts]) for k in parts[0].records},
        step_rewards=np.concatenate([pad(p.step_rewards) for p in parts]),
        dones=np.concatenate([pad(p.dones) for p in parts]),
        mask=np.concatenate([pad(p.mask) for p in parts]),
        summaries=[s for p in parts for s in p.summaries],
        frames=None if parts[0].frames is None else [f for p in parts for f in p.frames],
        chunk_rewards=None if any(p.chunk_rewards is None for p in parts)
        else np.concatenate([pad(p.chunk_rewards) for p in parts]),
        intervened=None if any(p.intervened is None for p in parts)
        else np.concatenate([pad(p.intervened) for p in parts]),
        expert_actions=None if any(p.expert_actions is None for p in parts)
        else np.concatenate([pad(p.expert_actions) for p in parts]))
