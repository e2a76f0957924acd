"""PRFT's reward predictor (Predicted Reward Fine-Tuning, seed #83): a model of the env reward, trained on
the offline data, whose predictions replace the env's rewards of the policy's own rollouts before they are
stored, so the online updates fine-tune on predicted rewards.

    obs ─ encoder (a copy of the policy's, its ``features``) ─ h ─ [h, a] → W → LayerNorm → ReLU → W → LN → ReLU → c

It predicts the c per-env-step rewards of a decision (a whole chunk; c = 1 without chunks), trained by
mean squared error against the offline episodes' ``chunk_rewards``. PRFT's point: under a domain shift the
predicted reward is imperfect but still a useful signal, and it needs no reward from the target domain.
The model is frozen after the offline phase (trained in the source domain, used in the target one), so
relabelling at insertion is the same as relabelling every sampled transition, and the buffer's
Monte-Carlo returns (Cal-QL's bound) are those of the predicted rewards too. Termination (success) still
comes from the env: the predictor replaces rewards only.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from mmrl.algos.offpolicy.buffer import TransitionBuffer
from mmrl.algos.offpolicy.episodes import Episode


class RewardModel(nn.Module):
    """r̂(s, a) [B, c] of a decision: ``encoder`` (copied from the policy) and one MLP head."""

    def __init__(self, encoder: nn.Module, feature_size: int, action_size: int, chunk: int, width: int,
                 train_encoder: bool):
        super().__init__()
        self.encoder, self.width, self.train_encoder = encoder.requires_grad_(train_encoder), width, train_encoder
        self.hidden = nn.ModuleList([nn.Linear(feature_size + action_size, width), nn.Linear(width, width)])
        self.out = nn.Linear(width, chunk)

    @classmethod
    def from_policy(cls, policy: nn.Module, chunk: int, width: int, seed: int, train_encoder: bool) -> RewardModel:
        encoder = copy.deepcopy(policy).train()
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return cls(encoder, policy.feature_size, policy.decision_size, chunk, width, train_encoder)

    def forward(self, images: Tensor, proprio: Tensor, instruction: Tensor, actions: Tensor) -> Tensor:
        with torch.set_grad_enabled(self.train_encoder and torch.is_grad_enabled()):
            h = self.encoder.features(images, proprio, instruction)
        x = torch.cat([h, actions.clamp(-1, 1)], dim=-1)
        for layer in self.hidden:
            x = F.relu(F.layer_norm(layer(x), (self.width,)))
        return self.out(x)


def train_reward_model(model: RewardModel, data: TransitionBuffer, steps: int, batch_size: int, lr: float,
                       seed: int) -> dict[str, float]:
    """``steps`` Adam updates of the mean squared error to the data's per-step rewards, on batches drawn from a
    generator seeded by ``seed``; returns the MSE of the last batch and of predicting the data's mean reward
    (the baseline a useful model beats)."""
    optimizer = torch.optim.Adam([q for q in model.parameters() if q.requires_grad], lr=lr)
    generator = torch.Generator().manual_seed(seed)
    loss = torch.zeros(())
    for _ in range(steps):
        batch = data.sample(batch_size, generator)
        loss = F.mse_loss(model(batch.images, batch.proprio, batch.instruction_ids, batch.actions), batch.chunk_rewards)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    rewards = data.arrays["chunk_rewards"][data.arrays["sampleable"]]
    return {"reward_model_mse": loss.item(), "reward_mean_mse": float(((rewards - rewards.mean()) ** 2).mean())}


@torch.no_grad()
def relabel(model: RewardModel, episode: Episode) -> tuple[Episode, float]:
    """``episode`` with its rewards replaced by the model's predictions and the mean absolute error of the
    predictions against the env's rewards (a measurement only, not used for training). Env steps past a
    terminal episode's end inside its last chunk get a prediction too (the episode does not record where
    the chunk ended; chunk 1 has none)."""
    true = episode.rewards_in_chunks()
    ids = torch.from_numpy(np.asarray(episode.instruction_ids, dtype=np.int64))[None].expand(episode.length, -1)
    predicted = model(torch.from_numpy(np.ascontiguousarray(episode.images)), torch.from_numpy(episode.proprio),
                      ids, torch.from_numpy(episode.actions)).float().numpy()
    if predicted.shape != true.shape:
        raise ValueError(f"the reward model predicts chunks of {predicted.shape[1]} env steps, the episode has "
                         f"{true.shape[1]}")
    predicted = predicted.astype(np.float32)
    error = float(np.abs(predicted - true).mean())
    return dataclasses.replace(episode, rewards=predicted.sum(1), chunk_rewards=predicted), error

