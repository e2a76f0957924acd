"""EBFT: feature matching as the reward of a policy gradient (docs/algorithms.md, "Paper variants").

Energy-based fine-tuning (seed #9, "Matching Features, Not Tokens: Energy-Based Fine-Tuning of Language
Models", arXiv 2603.12248) fits sequence-level statistics of the completion distribution: the objective
‖E_{y∼π}[φ(y)] − φ(y*)‖² between the mean feature of the policy's samples and the feature of the reference
answer, optimised on-policy by a policy gradient, with no verifier. Its gradient is E_y[r(y)·∇log π(y)] with

    r(y_i) = 2⟨φ_i, φ*⟩ − 2⟨φ_i, mean_{j≠i} φ_j⟩          (leave-one-out estimate of E[φ] over the group)

which for unit-norm features equals, up to a constant of the group (removed by its baseline),

    r_i = −‖φ_i − φ*‖² + γ·mean_{j≠i} ‖φ_i − φ_j‖²        γ = 1

— closeness to the reference minus how much the sample repeats its group (γ = 0: the plain −distance).
Registered as the ``ebft`` rollout hook (``algo.ebft``): it replaces each row's reward before the advantage
estimator (``algo.advantage``: GRPO by default, so the group baseline is there).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F

from mmrl.algos.hooks import ROLLOUT_HOOKS, HookContext, HookSpec, RolloutHook
from mmrl.algos.variants.distillation import frozen_copy
from mmrl.algos.variants.params import declare_variant, variant_params
from mmrl.core.scored import Scored
from mmrl.core.typed import ConfigError


@dataclass(frozen=True)
class EbftParams:
    features: str = "hidden"
    """hidden: the mean last hidden state over the answer's tokens, from a frozen copy of the initial policy
    (a fixed feature network: a moving one would let the policy change the features instead of its answers;
    INFERRED, the paper's feature network was not readable) | char_ngram: hashed character n-gram counts of the
    answer text (model-free, any text policy, the VLM included)."""
    diversity: float = 1.0
    """γ of the group diversity term; 1 is the exact gradient of the feature-matching objective."""
    coef: float = 1.0
    """Weight of the feature-matching reward."""
    outcome_coef: float = 0.0
    """Weight of the verifier's reward added to it (0: the abstract's "without a task-specific verifier")."""
    ngram: int = 3
    """char_ngram: n-grams of 1..ngram characters."""
    buckets: int = 256
    """char_ngram: hash buckets (the feature dimension)."""


declare_variant("ebft", EbftParams)


def char_ngram_features(texts: Sequence[str], ngram: int, buckets: int) -> Tensor:
    """[n, buckets] counts of each text's character n-grams (n = 1..``ngram``), hashed with CRC-32 into
    ``buckets`` bins (deterministic across processes and runs)."""
    features = torch.zeros(len(texts), buckets, dtype=torch.float32)
    for row, text in enumerate(texts):
        for n in range(1, ngram + 1):
            for start in range(len(text) - n + 1):
                features[row, zlib.crc32(f"{n}:{text[start:start + n]}".encode()) % buckets] += 1.0
    return features


def feature_matching_rewards(features: Tensor, reference: Tensor, group_id: Tensor, diversity: float) -> Tensor:
    """r_i = −‖φ_i − φ*_i‖² + γ·mean_{j≠i, same group} ‖φ_i − φ_j‖², with every feature L2-normalised
    (features [N, D] of the samples, reference [N, D] the feature of each row's reference answer, group_id [N]
    → [N]). A group of one has no diversity term; a zero feature (empty answer) stays zero."""
    phi, target = F.normalize(features.double(), dim=-1), F.normalize(reference.double(), dim=-1)
    rewards = -((phi - target) ** 2).sum(-1)
    if diversity:
        same = group_id[:, None] == group_id[None, :]
        same.fill_diagonal_(False)
        pairwise = torch.cdist(phi, phi) ** 2  # [N, N]
        others = same.double().sum(1)
        spread = (pairwise * same.double()).sum(1) / others.clamp(min=1)
        rewards = rewards + diversity * torch.where(others > 0, spread, torch.zeros_like(spread))
    return rewards.to(features.dtype)


Encoder = Callable[[Sequence[Any], Sequence[Any]], Tensor]


class Ebft(RolloutHook):
    """EBFT (seed #9): each row's reward becomes ``coef`` · :func:`feature_matching_rewards` against the task's
    reference answer for its prompt (+ ``outcome_coef`` × the verifier's reward); the advantage estimator and
    the objective stay the recipe's (on-policy policy gradient). The verifier still scores every row, for the
    logged ``reward/*`` only.

    Not built: the paper's strided block-parallel sampling from nested prefixes (an efficiency device: more
    rollouts per forward), and its KL regulariser (the recipe's ``algo.kl_coef``)."""

    def __init__(self, ctx: HookContext):
        self.ctx, self.params = ctx, variant_params(ctx.cfg.algo, "ebft")
        self.encode = self.encoder(ctx)
        self.distance = self.reward = 0.0

    def encoder(self, ctx: HookContext) -> Encoder:
        p = self.params
        if p.features == "char_ngram":
            if p.ngram < 1 or p.buckets < 1:
                raise ConfigError(f"algo.extra.ebft: ngram and buckets must be >= 1, got {p.ngram}, {p.buckets}")
            return lambda examples, outputs: char_ngram_features([str(o) for o in outputs], p.ngram, p.buckets)
        if p.features != "hidden":
            raise ConfigError(f"algo.extra.ebft.features must be hidden or char_ngram, got {p.features!r}")
        network, size = frozen_copy(ctx.policy), ctx.cfg.trainer.micro_batch_size

        def hidden(examples: Sequence[Any], outputs: Sequence[Any]) -> Tensor:
            with ctx.engine.autocast():
                parts = [network.completion_features(examples[i:i + size], outputs[i:i + size]).float().cpu()
                         for i in range(0, len(outputs), size)]
            return torch.cat(parts)

        probe = ctx.task.sample_batch("train", 1, np.random.default_rng(0))
        hidden(probe, [ctx.task.reference_output(probe[0])])  # a policy without hidden features fails now
        return hidden

    def finish(self, batch: Scored) -> Scored:
        p, rollout = self.params, batch.rollout
        index = rollout.example_index.tolist()
        rows = [batch.examples[i] for i in index]
        references = [self.ctx.task.reference_output(e) for e in batch.examples]
        phi = self.encode(rows, list(rollout.outputs))
        target = self.encode(batch.examples, references)[rollout.example_index]
        matching = feature_matching_rewards(phi, target, rollout.group_id, p.diversity)
        distance = ((F.normalize(phi.double(), dim=-1) - F.normalize(target.double(), dim=-1)) ** 2).sum(-1)
        rewards = (p.coef * matching + p.outcome_coef * batch.rewards.double()).to(batch.rewards.dtype)
        self.distance, self.reward = float(distance.mean()), float(matching.mean())
        return dataclasses.replace(batch, rewards=rewards)

    def metrics(self) -> dict[str, float]:
        engine = self.ctx.engine
        return {"rollout/ebft_distance": engine.mean(self.distance), "rollout/ebft_reward": engine.mean(self.reward)}


ROLLOUT_HOOKS.register("ebft", HookSpec(lambda cfg: cfg.algo.ebft, Ebft))
