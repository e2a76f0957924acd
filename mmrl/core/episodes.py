"""Tool-using episodes (``algo.tool_turns``): several model turns, each tool call answered by the task.

An episode starts from one row of a first-turn rollout. While its latest output holds a call
(``task.call(example, output)`` is not None), the tool's result becomes the next turn of its context (a
:class:`~mmrl.core.contracts.FollowUp`: the earlier outputs as ``assistant`` turns, the results as ``user``
turns) and the policy answers again; the output without a call is the final answer. After ``max_calls``
answered calls, an output that calls again ends the episode, which then scores the floor of the task's reward
range. Each model turn is a row whose decisions are only that turn's tokens: the tool results are context.

The trainer's rollout hook (``tool_turns``, :mod:`mmrl.algos.variants.hooks`) and the held-out evaluation
(:mod:`mmrl.core.evaluate`) run the same loop, so a run's ``eval/accuracy`` is that of whole episodes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from mmrl.core.contracts import FollowUp, RewardResult, ToolTask, turns_of
from mmrl.core.rollout import Rollout, SamplingParams, derive_seed

Draw = Callable[[Sequence[Any], int, SamplingParams, int], Rollout]


@dataclass(frozen=True)
class ToolEpisodes:
    """Every model turn of one episode per row of a first-turn rollout (E episodes, N ≥ E rows)."""

    rollout: Rollout  # [N] rows: the first turns (rows 0..E−1, in their order), then later turns in draw order;
    # example_index / group_id of every row are those of its episode's first row
    episode: Tensor  # [N] long: the episode of each row (episode e's first turn is row e)
    final: Tensor  # [E] long: the row of each episode's last turn
    calls: Tensor  # [E] long: tool calls answered in each episode
    overran: Tensor  # [E] bool: the last turn called a tool again after ``max_calls`` calls
    max_calls: int

    @property
    def num_episodes(self) -> int:
        return int(self.final.numel())


def run_tool_episodes(first: Rollout, examples: Sequence[Any], task: ToolTask, draw: Draw, sampling: SamplingParams,
                      seed: int, max_calls: int) -> ToolEpisodes:
    """Continue every row of ``first`` (row i answers ``examples[first.example_index[i]]``) as an episode of up to
    ``max_calls`` tool calls; each later turn is drawn through ``draw`` (one sample per open episode, seeded from
    ``seed`` and the turn)."""
    episodes = first.num_rows
    parts, contexts = [first], [examples[i] for i in first.example_index.tolist()]
    outputs, owner = list(first.outputs), list(range(episodes))
    final, calls, overran = list(range(episodes)), [0] * episodes, [False] * episodes
    latest = range(episodes)
    for turn in itertools.count(1):  # ends: every turn answers at most one call per episode, at most max_calls
        asks: list[tuple[int, FollowUp]] = []  # (episode, the next turn's context)
        for row in latest:
            episode, context = owner[row], contexts[row]
            base = context.base if isinstance(context, FollowUp) else context
            result = task.call(base, outputs[row])
            if result is None:
                continue
            if calls[episode] == max_calls:
                overran[episode] = True
                continue
            calls[episode] += 1
            asks.append((episode, FollowUp(base, (*turns_of(context), ("assistant", str(outputs[row])),
                                                  ("user", result)))))
        if not asks:
            break
        drawn = draw([follow for _, follow in asks], 1, sampling, derive_seed(seed, 25, turn))
        which = drawn.example_index.tolist()  # row j answers asks[which[j]]
        episode_of = torch.tensor([asks[j][0] for j in which], dtype=torch.long)
        parts.append(drawn.replace(example_index=first.example_index[episode_of], group_id=first.group_id[episode_of]))
        start = len(outputs)
        latest = range(start, start + drawn.num_rows)
        for row, j in zip(latest, which):
            episode = asks[j][0]
            owner.append(episode)
            contexts.append(asks[j][1])
            final[episode] = row
        outputs += list(drawn.outputs)
    return ToolEpisodes(Rollout.concat(parts), torch.tensor(owner, dtype=torch.long),
                        torch.tensor(final, dtype=torch.long), torch.tensor(calls, dtype=torch.long),
                        torch.tensor(overran, dtype=torch.bool), max_calls)


def episode_results(episodes: ToolEpisodes, final_results: Sequence[RewardResult], floor: float) -> list[RewardResult]:
    """Each episode's verdict ([E]): its last turn's (``final_results[e]``), or the floor with the reason when it
    called a tool past its limit (components zero, so ``reward/<name>`` means stay comparable)."""
    verdicts = []
    for result, overran in zip(final_results, episodes.overran.tolist()):
        if overran:
            result = RewardResult(floor, {name: 0.0 for name in result.components},
                                  f"more than the {episodes.max_calls} tool calls allowed")
        verdicts.append(result)
    return verdicts


def tool_metrics(episodes: ToolEpisodes) -> dict[str, float]:
    """``tool_use_rate`` (share of episodes that called a tool), ``tool_calls_mean`` and ``tool_overrun_rate``."""
    calls = episodes.calls.double()
    return {"tool_use_rate": float((calls > 0).double().mean()), "tool_calls_mean": float(calls.mean()),
            "tool_overrun_rate": float(episodes.overran.double().mean())}
