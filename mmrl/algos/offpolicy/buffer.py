"""A ring buffer of decision-level transitions (s, a, r, s', terminal, Monte-Carlo return-to-go).

Episodes are stored whole, in order, one slot per decision: the slot holds the observation (image,
proprio, instruction ids), the executed decision, its reward (summed over the chunk and per env step inside
it), ``terminal`` and the discounted return-to-go of the rest of the episode (Cal-QL's lower bound):
``G_t = Σ_k γ^k r_{t+k}`` over decisions, or with ``chunked`` (CO-RFT's chunked TD, γ per env step) over
env steps, ``G_t = Σ_{k<c} γ^k r_{t,k} + γ^c G_{t+1}``. The successor observation
of slot ``i`` is slot ``i + 1`` (mod capacity), so each image is stored once. Invariant: the last slot of
an inserted episode is either terminal (no successor needed) or an observation only (``sampleable``
false: a time-limit cut whose successor was never observed). Because slots are overwritten in insertion
order, a sampleable slot's successor is never overwritten before the slot itself.

Sampling is uniform over sampleable slots from a ``torch.Generator`` the caller seeds, so a draw depends
only on the buffer's contents and the seed. :meth:`state_dict` holds tensors only (``torch.save`` with
``weights_only=True`` reads it back) and restores the buffer exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from mmrl.algos.offpolicy.episodes import Episode


@dataclass(frozen=True)
class Transitions:
    """A sampled batch of B transitions."""

    images: Tensor  # [B, H, W, 3] uint8
    proprio: Tensor  # [B, P]
    instruction_ids: Tensor  # [B, L] long
    actions: Tensor  # [B, D]
    rewards: Tensor  # [B] summed over the chunk
    chunk_rewards: Tensor  # [B, c] per env step inside the chunk (c = 1 for unchunked data)
    terminal: Tensor  # [B] float {0, 1}
    next_images: Tensor  # [B, H, W, 3] uint8 (the slot's own image where terminal: never used)
    next_proprio: Tensor  # [B, P]
    mc_returns: Tensor  # [B] discounted return-to-go of the data


def discounted_return_to_go(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """G_t = r_t + γ G_{t+1}, G_T = 0 ([T] → [T])."""
    out, running = np.zeros(len(rewards), dtype=np.float64), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return out.astype(np.float32)


def chunked_return_to_go(chunk_rewards: np.ndarray, gamma: float) -> np.ndarray:
    """G_t = Σ_{k<c} γ^k r_{t,k} + γ^c G_{t+1}, G_T = 0: the env-step return-to-go at each decision's first
    step ([T, c] → [T]; the zeros past an episode's end add nothing)."""
    t, c = chunk_rewards.shape
    return discounted_return_to_go(np.asarray(chunk_rewards, dtype=np.float64).reshape(-1), gamma)[::c][:t]


class TransitionBuffer:
    """``capacity`` decision slots; arrays are allocated at the first insert (shapes from that episode).
    ``chunked``: ``gamma`` is per env step and the return-to-go discounts inside chunks (CO-RFT); else per
    decision. Both keep per-step ``chunk_rewards``; unchunked buffers accept episodes without them (c = 1
    data in a wider buffer is stored as [r, 0, ..., 0], same sum)."""

    FIELDS = ("images", "proprio", "instruction_ids", "actions", "rewards", "chunk_rewards", "terminal", "sampleable",
              "mc_returns")

    def __init__(self, capacity: int, gamma: float, chunked: bool = False):
        if capacity < 2:
            raise ValueError(f"buffer capacity must be >= 2, got {capacity}")
        self.capacity, self.gamma, self.chunked = capacity, gamma, chunked
        self.arrays: dict[str, Tensor] = {}
        self.next_slot, self.size, self.episodes_added = 0, 0, 0

    def __len__(self) -> int:
        """Sampleable transitions held."""
        return int(self.arrays["sampleable"].sum()) if self.arrays else 0

    def allocate(self, episode: Episode, words: int) -> None:
        c = self.capacity
        self.arrays = {
            "images": torch.zeros((c, *episode.images.shape[1:]), dtype=torch.uint8),
            "proprio": torch.zeros((c, episode.proprio.shape[1]), dtype=torch.float32),
            "instruction_ids": torch.zeros((c, words), dtype=torch.long),
            "actions": torch.zeros((c, episode.actions.shape[1]), dtype=torch.float32),
            "rewards": torch.zeros(c, dtype=torch.float32),
            "chunk_rewards": torch.zeros((c, episode.rewards_in_chunks().shape[1]), dtype=torch.float32),
            "terminal": torch.zeros(c, dtype=torch.bool),
            "sampleable": torch.zeros(c, dtype=torch.bool),
            "mc_returns": torch.zeros(c, dtype=torch.float32),
        }

    def add(self, episode: Episode, words: int = 16) -> None:
        """Insert one episode (``words``: instruction width kept, fixed at the first insert)."""
        t = episode.length
        if t > self.capacity:
            raise ValueError(f"an episode of {t} decisions does not fit a buffer of capacity {self.capacity}")
        if not self.arrays:
            self.allocate(episode, max(words, len(episode.instruction_ids)))
        a = self.arrays
        for key, value in (("images", episode.images), ("proprio", episode.proprio), ("actions", episode.actions)):
            if tuple(value.shape[1:]) != tuple(a[key].shape[1:]):
                raise ValueError(f"episode {key} have shape {tuple(value.shape[1:])} per decision, the buffer holds "
                                 f"{tuple(a[key].shape[1:])}: all episodes must come from the same env and policy")
        in_chunk = self.chunk_rewards_of(episode)
        ids = np.trim_zeros(np.asarray(episode.instruction_ids), "b")
        if len(ids) > a["instruction_ids"].shape[1]:
            raise ValueError(f"an instruction of {len(ids)} words exceeds the buffer's {a['instruction_ids'].shape[1]}")
        slots = (self.next_slot + torch.arange(t)) % self.capacity
        a["images"][slots] = torch.from_numpy(np.ascontiguousarray(episode.images))
        a["proprio"][slots] = torch.from_numpy(np.asarray(episode.proprio, dtype=np.float32))
        a["instruction_ids"][slots] = 0
        a["instruction_ids"][slots, :len(ids)] = torch.from_numpy(ids.astype(np.int64))
        a["actions"][slots] = torch.from_numpy(np.asarray(episode.actions, dtype=np.float32))
        a["rewards"][slots] = torch.from_numpy(np.asarray(episode.rewards, dtype=np.float32))
        a["chunk_rewards"][slots] = torch.from_numpy(in_chunk)
        a["mc_returns"][slots] = torch.from_numpy(chunked_return_to_go(in_chunk, self.gamma) if self.chunked
                                                  else discounted_return_to_go(episode.rewards, self.gamma))
        a["terminal"][slots] = False
        a["sampleable"][slots] = True
        if episode.terminal:
            a["terminal"][slots[-1]] = True
        else:  # cut by a time limit: the last observation's successor was never seen
            a["sampleable"][slots[-1]] = False
        self.next_slot = int((self.next_slot + t) % self.capacity)
        self.size = min(self.size + t, self.capacity)
        self.episodes_added += 1

    def chunk_rewards_of(self, episode: Episode) -> np.ndarray:
        """The episode's [T, c] rewards in the buffer's chunk width (checked against the first episode's)."""
        in_chunk = episode.rewards_in_chunks()
        width = self.arrays["chunk_rewards"].shape[1]
        if in_chunk.shape[1] == width:
            return in_chunk
        if in_chunk.shape[1] == 1 and not self.chunked:
            return np.pad(in_chunk, ((0, 0), (0, width - 1)))
        raise ValueError(f"an episode has rewards for chunks of {in_chunk.shape[1]} env steps, the buffer holds "
                         f"chunks of {width}: chunked TD needs per-step rewards of the policy's chunk (episode "
                         f"files of format 2 or the policy's own rollouts and demonstrations)")

    def sample(self, batch_size: int, generator: torch.Generator) -> Transitions:
        """``batch_size`` transitions uniformly (with replacement) over the sampleable slots."""
        if len(self) == 0:
            raise ValueError("cannot sample from an empty transition buffer")
        a = self.arrays
        candidates = a["sampleable"].nonzero().squeeze(1)
        slots = candidates[torch.randint(len(candidates), (batch_size,), generator=generator)]
        following = torch.where(a["terminal"][slots], slots, (slots + 1) % self.capacity)
        return Transitions(a["images"][slots], a["proprio"][slots], a["instruction_ids"][slots], a["actions"][slots],
                           a["rewards"][slots], a["chunk_rewards"][slots], a["terminal"][slots].float(), a["images"][following],
                           a["proprio"][following], a["mc_returns"][slots])

    def state_dict(self) -> dict[str, Tensor]:
        counters = torch.tensor([self.capacity, self.next_slot, self.size, self.episodes_added], dtype=torch.long)
        return {"counters": counters, "gamma": torch.tensor(self.gamma, dtype=torch.float64),
                **{f"array.{k}": v for k, v in self.arrays.items()}}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        capacity, self.next_slot, self.size, self.episodes_added = (int(x) for x in state["counters"])
        if capacity != self.capacity or float(state["gamma"]) != self.gamma:
            raise ValueError(f"buffer state of capacity {capacity}, γ {float(state['gamma'])} loaded into a buffer of "
                             f"capacity {self.capacity}, γ {self.gamma}")
        self.arrays = {k: state[f"array.{k}"].clone() for k in self.FIELDS if f"array.{k}" in state}
        if self.arrays and "chunk_rewards" not in self.arrays:  # saved before per-step rewards were kept
            self.arrays["chunk_rewards"] = self.arrays["rewards"][:, None].clone()
