"""The Q critic: an ensemble of Q(s, a) heads on observation features of the critic's own encoder.

    obs ─ encoder (a copy of the policy's observation encoder, its ``features``) ─ h ─┬─ head_1([h, a]) ─ Q_1
                                                                                      ├─ ...
                                                                                      └─ head_E([h, a]) ─ Q_E

Why its own encoder, copied from the (warm-started) policy rather than heads on the policy's trunk:
the critic's TD / conservative gradients and the actor's gradients then never meet in shared weights
(no detach rules, the trainer's optimizer steps the policy only, the critic has its own), the target
network is a Polyak copy of the whole critic, and the copy starts from features that already locate the
objects (BC). The tiny VLA's encoder is 0.14 M parameters, so the copy costs nothing here; on a billions-
parameter VLA one would put the heads on the frozen VLA's hidden state instead (docs/vla.md).

The heads are E independent MLPs [h, a] → W → LayerNorm → ReLU → W → LayerNorm → ReLU → 1 evaluated as one
batched matrix product (LayerNorm in the critic: Ball et al. 2023, RLPD; INFERRED for WSRL's setting).
"""

from __future__ import annotations

import copy
import math
from typing import Protocol

import torch
from torch import Tensor, nn
from torch.nn import functional as F


class ObservationEncoder(Protocol):
    """A module mapping observations to features (``VLAPolicy.features``)."""

    def features(self, images: Tensor, proprio: Tensor, instruction: Tensor) -> Tensor:
        ...  # [B, H, W, 3] uint8, [B, P], [B, L] long → [B, hidden]


class EnsembleLinear(nn.Module):
    """E independent linear maps [E, B, in] → [E, B, out], initialised like ``nn.Linear`` per member."""

    def __init__(self, members: int, inputs: int, outputs: int):
        super().__init__()
        bound = 1.0 / math.sqrt(inputs)
        self.weight = nn.Parameter(torch.empty(members, inputs, outputs).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(members, 1, outputs).uniform_(-bound, bound))

    def forward(self, x: Tensor) -> Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


class QHeads(nn.Module):
    """E Q-heads on [features, action]: ``forward(h [B, F], actions [B, N, D]) → Q [E, B, N]``."""

    def __init__(self, members: int, features: int, action_size: int, width: int):
        super().__init__()
        self.members, self.width = members, width
        self.layers = nn.ModuleList([EnsembleLinear(members, features + action_size, width),
                                     EnsembleLinear(members, width, width), EnsembleLinear(members, width, 1)])

    def forward(self, h: Tensor, actions: Tensor) -> Tensor:
        b, n, _ = actions.shape
        x = torch.cat([h[:, None].expand(-1, n, -1), actions], dim=-1).reshape(1, b * n, -1)
        x = x.expand(self.members, -1, -1)
        for layer in self.layers[:-1]:
            x = F.relu(F.layer_norm(layer(x), (self.width,)))
        return self.layers[-1](x).view(self.members, b, n)


class Critic(nn.Module):
    """Q_1..Q_E(s, a): ``encoder`` (a module with ``features``) and :class:`QHeads`. Actions are used as the
    env executes them, clipped to [−1, 1]."""

    def __init__(self, encoder: nn.Module, feature_size: int, action_size: int, members: int, width: int):
        super().__init__()
        self.encoder = encoder
        self.heads = QHeads(members, feature_size, action_size, width)

    @classmethod
    def from_policy(cls, policy: nn.Module, feature_size: int, action_size: int, members: int, width: int,
                    seed: int) -> Critic:
        """A critic whose encoder is a copy of ``policy`` (read through its ``features``), heads seeded by ``seed``."""
        encoder = copy.deepcopy(policy).requires_grad_(True).train()
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return cls(encoder, feature_size, action_size, members, width)

    def features(self, images: Tensor, proprio: Tensor, instruction: Tensor) -> Tensor:
        return self.encoder.features(images, proprio, instruction)

    def q(self, h: Tensor, actions: Tensor) -> Tensor:
        """Q of features ``h`` [B, F] and ``actions`` [B, N, D] (or [B, D]) → [E, B, N] (or [E, B])."""
        single = actions.dim() == 2
        q = self.heads(h, (actions[:, None] if single else actions).clamp(-1, 1))
        return q.squeeze(2) if single else q
