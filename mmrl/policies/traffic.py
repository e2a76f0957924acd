"""A candidate-scoring traffic policy (RIFT's trainable mode-score head on a CPU scale).

    candidate features [G, F] ─┐
    agent context [X] (tiled) ─┴─ concat ─ MLP ─ logit [G] ─ softmax over the G candidates

The decision is the choice of one candidate (T = 1 decision per row): log π(i) = log softmax(z/τ)_i.
Examples are anything with ``features`` [G, F] and ``context`` [X] arrays (e.g.
``mmrl.tasks.driving.rift.RiftExample``); outputs are candidate indices (``int``).

Grouping (``group``):

- ``all_candidates`` (RIFT): with ``group_size == G`` and a temperature > 0 every candidate of a
  state is one row of the group, with its own log-prob; a group-relative advantage then compares
  the candidates' returns, and the clipped objective is averaged over all candidates (RIFT's loss).
- ``sample``: ``group_size`` candidates drawn from the softmax (with replacement), as GRPO samples.

A temperature of 0 picks the arg-max candidate (``group_size`` must be 1), for evaluation.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from torch.nn import functional as F

from mmrl.core.contracts import Policy, PolicyOutput
from mmrl.core.rollout import Rollout, SamplingParams

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class CandidateScorerConfig:
    candidate_features: int = 12
    """F: features per candidate (``mmrl.tasks.driving.rift_sim.CANDIDATE_FEATURES``)."""
    context_features: int = 5
    """X: agent-context features (``CONTEXT_FEATURES``)."""
    hidden: int = 64
    """Width of the MLP's hidden layers."""
    layers: int = 2
    """Hidden layers of the MLP."""
    group: Literal["all_candidates", "sample"] = "all_candidates"
    """How a group is formed at temperature > 0 (see the module docstring)."""
    init_seed: int = 0
    """Seed of the initial weights."""
    pretrained: str | None = None
    """A folder written by ``save_pretrained`` to start from."""


@dataclass(frozen=True)
class CandidatePayload:
    """What re-scoring needs (satisfies :class:`mmrl.core.rollout.Payload`)."""

    features: Tensor  # [N, G, F] float32
    context: Tensor  # [N, X] float32
    choice: Tensor  # [N] long
    temperature: float

    def select(self, index: Tensor) -> CandidatePayload:
        return CandidatePayload(self.features[index], self.context[index], self.choice[index], self.temperature)

    @classmethod
    def concat(cls, parts: Sequence[CandidatePayload]) -> CandidatePayload:
        if len({p.temperature for p in parts}) != 1:
            raise ValueError("cannot mix rollouts sampled at different temperatures")
        return cls(torch.cat([p.features for p in parts]), torch.cat([p.context for p in parts]),
                   torch.cat([p.choice for p in parts]), parts[0].temperature)


class CandidateScorerPolicy(Policy):
    def __init__(self, cfg: CandidateScorerConfig):
        super().__init__()
        if cfg.layers < 1 or cfg.hidden < 1:
            raise ValueError(f"layers and hidden must be >= 1, got {cfg.layers}, {cfg.hidden}")
        self.cfg = cfg
        width, layers = cfg.candidate_features + cfg.context_features, []
        for _ in range(cfg.layers):
            layers += [nn.Linear(width, cfg.hidden), nn.GELU()]
            width = cfg.hidden
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)
        self.register_buffer("_device_probe", torch.zeros(0), persistent=False)

    @classmethod
    def from_config(cls, cfg: CandidateScorerConfig) -> CandidateScorerPolicy:
        with torch.random.fork_rng():
            torch.manual_seed(cfg.init_seed)
            policy = cls(cfg)
        if cfg.pretrained is not None:
            policy.load_weights(cfg.pretrained)
        return policy

    def save_pretrained(self, path: str) -> None:
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, out / WEIGHTS_FILE)
        (out / CONFIG_FILE).write_text(json.dumps({"architecture": "mmrl.CandidateScorerPolicy", **asdict(self.cfg)},
                                                  indent=1))

    def load_weights(self, path: str) -> None:
        file = Path(path) / WEIGHTS_FILE
        if not file.is_file():
            raise FileNotFoundError(f"{file} not found: point at a folder written by save_pretrained")
        try:
            missing, unexpected = self.load_state_dict(load_file(file), strict=False)
        except RuntimeError as err:  # shape mismatch
            raise ValueError(f"{file} does not fit this config: {err}") from None
        if missing or unexpected:
            raise ValueError(f"{file} does not fit this config (missing {missing}, unexpected {unexpected})")

    @property
    def device(self) -> torch.device:
        return self._device_probe.device

    # -- network ---------------------------------------------------------------------------------
    def logits(self, features: Tensor, context: Tensor) -> Tensor:
        """Candidate scores [B, G] from features [B, G, F] and context [B, X]."""
        if features.shape[-1] != self.cfg.candidate_features or context.shape[-1] != self.cfg.context_features:
            raise ValueError(f"expected {self.cfg.candidate_features} candidate and {self.cfg.context_features} "
                             f"context features, got {features.shape[-1]} and {context.shape[-1]}")
        if not (torch.isfinite(features).all() and torch.isfinite(context).all()):
            raise ValueError("candidate features or context contain NaN or inf")
        x = torch.cat([features, context[:, None, :].expand(-1, features.shape[1], -1)], dim=-1)
        return self.mlp(x).squeeze(-1)

    def inputs(self, examples: Sequence[Any]) -> tuple[Tensor, Tensor]:
        features = torch.as_tensor(np.stack([e.features for e in examples]), dtype=torch.float32, device=self.device)
        context = torch.as_tensor(np.stack([e.context for e in examples]), dtype=torch.float32, device=self.device)
        return features, context

    def choose(self, features: np.ndarray, context: np.ndarray) -> int:
        """Greedy choice for one state (closed-loop driving): the arg-max candidate."""
        with torch.no_grad():
            f = torch.as_tensor(features, dtype=torch.float32, device=self.device)[None]
            c = torch.as_tensor(context, dtype=torch.float32, device=self.device)[None]
            return int(self.logits(f, c)[0].argmax())

    # -- the Policy contract ---------------------------------------------------------------------
    @torch.no_grad()
    def rollout(self, examples: Sequence[Any], group_size: int, sampling: SamplingParams, seed: int) -> Rollout:
        features, context = self.inputs(examples)
        logits = self.logits(features, context)  # [E, G]
        n_cand = logits.shape[1]
        if sampling.temperature == 0:
            if group_size != 1:
                raise ValueError(f"greedy (temperature 0) rollouts have one row per example, got group_size "
                                 f"{group_size}")
            choice, temperature = logits.argmax(1)[:, None], 1.0
        elif self.cfg.group == "all_candidates":
            if group_size != n_cand:
                raise ValueError(f"group: all_candidates needs rollout.group_size == the number of candidates "
                                 f"({n_cand}), got {group_size}")
            choice, temperature = torch.arange(n_cand).repeat(len(examples), 1), sampling.temperature
        else:
            gen = torch.Generator().manual_seed(seed)
            probs = F.softmax(logits.float().cpu() / sampling.temperature, dim=-1)
            choice = torch.multinomial(probs, group_size, replacement=True, generator=gen)
            temperature = sampling.temperature
        choice = choice.to(self.device)  # [E, K]
        logp = F.log_softmax(logits / temperature, dim=-1).gather(1, choice)  # [E, K]
        rows = choice.shape[1]
        index = torch.arange(len(examples)).repeat_interleave(rows)
        payload = CandidatePayload(features.cpu().repeat_interleave(rows, 0), context.cpu().repeat_interleave(rows, 0),
                                   choice.reshape(-1).cpu(), temperature)
        return Rollout(logp=logp.reshape(-1, 1).float().cpu(), mask=torch.ones(len(index), 1), group_id=index.clone(),
                       example_index=index, outputs=[int(c) for c in choice.reshape(-1).tolist()], payload=payload,
                       policy_version=self.version)

    def forward(self, rollout: Rollout, with_entropy: bool = False) -> PolicyOutput:
        p: CandidatePayload = rollout.payload
        logits = self.logits(p.features.to(self.device), p.context.to(self.device)) / p.temperature
        log_probs = F.log_softmax(logits, dim=-1)  # [N, G]
        logp = log_probs.gather(1, p.choice.to(self.device)[:, None])  # [N, 1]
        entropy = -(log_probs.exp() * log_probs).sum(-1, keepdim=True) if with_entropy else None
        return PolicyOutput(logp=logp, entropy=entropy)

    def sft_loss(self, examples: Sequence[Any], targets: Sequence[Any]) -> Tensor:
        """Cross-entropy of the rule-based driver's candidate (imitation pretraining)."""
        features, context = self.inputs(examples)
        target = torch.as_tensor([int(t) for t in targets], dtype=torch.long, device=self.device)
        return F.cross_entropy(self.logits(features, context), target)
