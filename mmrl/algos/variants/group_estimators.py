"""Group-level outcome estimators from the seed papers: ``(AdvantageInputs, AlgoConfig) -> (A [N,T], None)``.

- ``polychromic``: the set-level (marginal) advantage of Polychromic PPO ("Polychromic Objectives for
  Reinforcement Learning", arXiv 2509.25424): a row is credited with the polychromic score
  f(s) = mean reward(s) · diversity(s) of the sets of ``set_size`` rows of its group that contain it.
- ``weighted_grpo``: Weighted GRPO ("Beyond Variance: Prompt-Efficient RLVR via Rare-Event Amplification and
  Bidirectional Pairing", arXiv 2602.03452): group-normalised advantages whose rare events are amplified,
  successes on hard-but-solvable prompts and failures on easy-but-brittle ones.

Rewards are success probabilities in [0, 1], as in ``outcome.py``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from mmrl.algos.advantages import ADVANTAGE_ESTIMATORS, AdvantageInputs, grpo_advantage
from mmrl.algos.config import AlgoConfig
from mmrl.algos.masked import group_mean_std
from mmrl.algos.variants.outcome import unit_rewards
from mmrl.algos.variants.params import declare_variant, variant_params

# -- Polychromic PPO ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolychromicParams:
    set_size: int = 4
    """n, the size of the sets the polychromic objective scores (paper: n = 4 in most runs; INFERRED here)."""
    max_sets: int = 20000
    """Refuse groups with more than this many n-subsets (every subset is scored: exact, no sampling)."""
    vine_states: int = 0
    """> 0: vine sampling (``polychromic_vine`` rollout hook, ``vine.py``): per round, up to this many groups each
    give a state inside one of their answers, re-rolled as a new group of continuations (0: off; INFERRED budget)."""
    vine_samples: int | None = None
    """Continuations drawn from each vine state, the set the polychromic score ranges over (None:
    ``rollout.samples_per_group``, the ordinary group's size; INFERRED)."""


declare_variant("polychromic", PolychromicParams, needs=("output_classes",))


def polychromic_score(rewards: Tensor, classes: Tensor) -> Tensor:
    """f(s) = mean_{y∈s} r(y) · d(s), d(s) = distinct outputs in s / |s| (rows [S, n] of rewards and output
    classes → [S]). The product is high only for sets that are both successful and diverse."""
    n = classes.shape[1]
    distinct = torch.tensor([len(set(row)) for row in classes.tolist()], dtype=rewards.dtype)
    return rewards.mean(1) * distinct / n


def set_marginal_advantage(rewards: Tensor, classes: Tensor, set_size: int, max_sets: int) -> Tensor:
    """One group's marginal set advantage ([G] rewards and output classes → [G]):

        A_i = mean_{s ∋ i} f(s) − mean_s f(s)      over every subset s of size n = min(set_size, G)

    (the "marginal advantage" of set RL: the expected score of the sets a generation belongs to, minus the
    average score of all sets). A group of one gets 0."""
    size = len(rewards)
    n = min(set_size, size)
    if size < 2:
        return torch.zeros_like(rewards)
    if math.comb(size, n) > max_sets:
        raise ValueError(f"polychromic: a group of {size} has {math.comb(size, n)} subsets of size {n}, more than "
                         f"algo.extra.polychromic.max_sets ({max_sets}); lower set_size or raise max_sets")
    subsets = torch.tensor(list(itertools.combinations(range(size), n)), dtype=torch.long)  # [S, n]
    scores = polychromic_score(rewards[subsets], classes[subsets])  # [S]
    member = torch.zeros(len(subsets), size, dtype=rewards.dtype).scatter_(1, subsets, 1.0)  # [S, G]
    return member.T @ scores / member.sum(0) - scores.mean()


@ADVANTAGE_ESTIMATORS.register("polychromic")
def polychromic_advantage(inp: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, None]:
    """Polychromic PPO's set-level advantage (arXiv 2509.25424, §4), per group, broadcast over the row's
    tokens: :func:`set_marginal_advantage` with diversity = distinct decoded outputs (exact equality; the
    paper's diversity is environment-specific, INFERRED for text). With ``vine_states`` > 0 the
    ``polychromic_vine`` hook adds groups of continuations from a common state inside a sampled answer (vine
    sampling, ``vine.py``); they are groups like any other here."""
    p = variant_params(cfg, "polychromic")
    if p.set_size < 2:
        raise ValueError(f"algo.extra.polychromic.set_size must be >= 2, got {p.set_size}")
    if inp.output_class is None:
        raise ValueError("polychromic needs each row's output class (AdvantageInputs.output_class; the trainer "
                         "provides it for the 'output_classes' need)")
    rewards = unit_rewards(inp.rewards, "polychromic").double()
    adv = torch.zeros_like(rewards)
    for g in torch.unique(inp.group_id).tolist():
        rows = (inp.group_id == g).nonzero().squeeze(1)
        adv[rows] = set_marginal_advantage(rewards[rows], inp.output_class[rows], p.set_size, p.max_sets)
    return adv.to(inp.rewards.dtype)[:, None] * inp.mask, None


# -- Weighted GRPO --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WeightedGrpoParams:
    positive_weight: float = 2.0
    """Factor on the advantage of a success in a hard-but-solvable group (INFERRED value)."""
    negative_weight: float = 2.0
    """Factor on the advantage of a failure in an easy-but-brittle group (INFERRED value)."""
    hard_below: float = 0.5
    """A group with 0 < success rate ≤ this is hard-but-solvable (q⁺; INFERRED threshold)."""
    easy_above: float = 0.5
    """A group with this ≤ success rate < 1 is easy-but-brittle (q⁻; INFERRED threshold)."""
    success_threshold: float = 1.0
    """A row succeeds when its outcome is ≥ this."""


declare_variant("weighted_grpo", WeightedGrpoParams)


@ADVANTAGE_ESTIMATORS.register("weighted_grpo")
def weighted_grpo_advantage(inp: AdvantageInputs, cfg: AlgoConfig) -> tuple[Tensor, None]:
    """Weighted GRPO (arXiv 2602.03452; weighting form INFERRED from the abstract): the GRPO advantage, with

        success in a hard-but-solvable group (0 < p̂_g ≤ hard_below):   A_i ← positive_weight · A_i
        failure in an easy-but-brittle group (easy_above ≤ p̂_g < 1):    A_i ← negative_weight · A_i

    p̂_g the group's success rate. GRPO's normalisation already gives a rare success a large A (√((1−p)/p));
    the weights amplify exactly the two rare events the paper pairs (a positive anchor and a negative one)."""
    p = variant_params(cfg, "weighted_grpo")
    if p.positive_weight < 0 or p.negative_weight < 0 or not 0 <= p.hard_below <= 1 or not 0 <= p.easy_above <= 1:
        raise ValueError(f"algo.extra.weighted_grpo: weights must be >= 0 and thresholds in [0, 1], got {p}")
    outcome = unit_rewards(inp.rewards, "weighted_grpo")
    adv, _ = grpo_advantage(inp, cfg)
    success = outcome >= p.success_threshold
    rate, _, _ = group_mean_std(success.double(), inp.group_id)
    hard = (rate > 0) & (rate <= p.hard_below)
    easy = (rate < 1) & (rate >= p.easy_above)
    factor = torch.ones_like(rate)
    factor = torch.where(hard & success, torch.full_like(rate, p.positive_weight), factor)
    factor = torch.where(easy & ~success, torch.full_like(rate, p.negative_weight), factor)
    return adv * factor.to(adv.dtype)[:, None], None
