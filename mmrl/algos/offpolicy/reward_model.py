"""PRFT's reward predictor (Predicted Reward Fine-Tuning, seed #83): a model of the env reward, trained on
the offline data, whose predictions replace the env's rewards of the policy's own rollouts before they are
stored, so the online updates fine-tune on predicted rewards.

    obs ─ encoder (a copy of the policy's, its ``features``) ─ h ─ [h, a] → W → LayerNorm → ReLU → W → LN → ReLU → c (+ c)

It predicts the c per-env-step rewards of a decision (a whole chunk; c = 1 without chunks). Two targets:

- ``head="mse"``: the c outputs regress the offline episodes' ``chunk_rewards`` (mean squared error);
- ``head="success"`` (INFERRED: the abstract does not say how the reward is modelled): the reward is split
  into its dense part and a success bonus b paid once, at the env step that reaches the goal (the table-top
  potential's ``1·success``, b = 1). c outputs regress the dense part ``r − b·y`` (MSE), c more are logits
  of y = P(success at this step | h, a), trained by binary cross-entropy with the positives the terminal
  (successful) episodes' last steps; the prediction is ``r̂ = dense + b·σ(logit)``. One large reward per
  episode is what a regression on few demonstrations does not localise (it spreads it as a small mean);
  a classifier sees it as the rare positive class it is; its bonus is bounded by b. Measured on reach
  (docs/algorithms.md, PRFT): both heads fit held-out source-domain demonstrations; under the colour shift
  the ``success`` head's error stays near the mean predictor's, the ``mse`` head's is about 5 times it.

PRFT's point: under a domain shift the predicted reward is imperfect but still a useful signal, and it needs
no reward from the target domain. The model is frozen after the offline phase (trained in the source domain,
used in the target one), so relabelling at insertion is the same as relabelling every sampled transition,
and the buffer's Monte-Carlo returns (Cal-QL's bound) are those of the predicted rewards too. Termination
still comes from the env (the episode did end); the predictor replaces rewards only.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from mmrl.algos.offpolicy.buffer import TransitionBuffer, Transitions
from mmrl.algos.offpolicy.episodes import Episode

RewardHead = Literal["mse", "success"]


class RewardModel(nn.Module):
    """r̂(s, a) [B, c] of a decision: ``encoder`` (copied from the policy) and one MLP head; with
    ``head="success"`` the head also gives success logits and ``forward`` returns dense + bonus · P(success)."""

    def __init__(self, encoder: nn.Module, feature_size: int, action_size: int, chunk: int, width: int,
                 train_encoder: bool, head: RewardHead = "mse", success_bonus: float = 1.0):
        super().__init__()
        if head not in ("mse", "success"):
            raise ValueError(f"reward model head must be 'mse' or 'success', got {head!r}")
        self.encoder, self.width, self.train_encoder = encoder.requires_grad_(train_encoder), width, train_encoder
        self.head, self.chunk, self.success_bonus = head, chunk, success_bonus
        self.hidden = nn.ModuleList([nn.Linear(feature_size + action_size, width), nn.Linear(width, width)])
        self.out = nn.Linear(width, chunk * (2 if head == "success" else 1))

    @classmethod
    def from_policy(cls, policy: nn.Module, chunk: int, width: int, seed: int, train_encoder: bool,
                    head: RewardHead = "mse", success_bonus: float = 1.0) -> RewardModel:
        encoder = copy.deepcopy(policy).train()
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return cls(encoder, policy.feature_size, policy.decision_size, chunk, width, train_encoder, head,
                       success_bonus)

    def outputs(self, images: Tensor, proprio: Tensor, instruction: Tensor, actions: Tensor) -> Tensor:
        """The head's raw outputs [B, c] (``mse``) or [B, 2c] (``success``: dense rewards, then success logits)."""
        with torch.set_grad_enabled(self.train_encoder and torch.is_grad_enabled()):
            h = self.encoder.features(images, proprio, instruction)
        x = torch.cat([h, actions.clamp(-1, 1)], dim=-1)
        for layer in self.hidden:
            x = F.relu(F.layer_norm(layer(x), (self.width,)))
        return self.out(x)

    def forward(self, images: Tensor, proprio: Tensor, instruction: Tensor, actions: Tensor) -> Tensor:
        """The predicted per-env-step rewards [B, c]."""
        out = self.outputs(images, proprio, instruction, actions)
        if self.head == "mse":
            return out
        dense, logits = out[:, :self.chunk], out[:, self.chunk:]
        return dense + self.success_bonus * torch.sigmoid(logits)

    def success_probability(self, images: Tensor, proprio: Tensor, instruction: Tensor, actions: Tensor) -> Tensor:
        """P(success at each env step of the decision) [B, c] (``success`` head only)."""
        if self.head != "success":
            raise ValueError("success_probability needs the reward model's 'success' head")
        return torch.sigmoid(self.outputs(images, proprio, instruction, actions)[:, self.chunk:])


def success_labels(chunk_rewards: Tensor, terminal: Tensor) -> Tensor:
    """y [B, c]: 1 at the env step where a terminal (successful) episode reached its goal, else 0. That step is
    in the episode's last decision (``terminal``); inside its chunk, the last step with a non-zero reward (the
    steps past the episode's end are recorded as 0; the goal step carries the bonus, so it is not 0).

    >>> success_labels(torch.tensor([[0.1, 1.2, 0.0], [0.1, 0.2, 0.3]]), torch.tensor([1.0, 0.0]))
    tensor([[0., 1., 0.],
            [0., 0., 0.]])
    """
    c = chunk_rewards.shape[1]
    nonzero = (chunk_rewards != 0).float() * torch.arange(1, c + 1, dtype=torch.float32)
    last = nonzero.argmax(dim=1)  # index of the last non-zero step (0 when all are zero)
    return F.one_hot(last, c).float() * (terminal > 0).float()[:, None]


def reward_model_loss(model: RewardModel, batch: Transitions) -> Tensor:
    """The model's training loss on ``batch``: MSE to the rewards (``mse``), or MSE of the dense part
    ``r − b·y`` plus the success BCE (``success``)."""
    out = model.outputs(batch.images, batch.proprio, batch.instruction_ids, batch.actions)
    if model.head == "mse":
        return F.mse_loss(out, batch.chunk_rewards)
    y = success_labels(batch.chunk_rewards, batch.terminal)
    dense, logits = out[:, :model.chunk], out[:, model.chunk:]
    return F.mse_loss(dense, batch.chunk_rewards - model.success_bonus * y) + \
        F.binary_cross_entropy_with_logits(logits, y)


def train_reward_model(model: RewardModel, data: TransitionBuffer, steps: int, batch_size: int, lr: float,
                       seed: int) -> dict[str, float]:
    """``steps`` Adam updates of :func:`reward_model_loss`, on batches drawn from a generator seeded by
    ``seed``; returns the last batch's loss, the MSE of the model's reward prediction on all the data and that
    of predicting the data's mean reward (the baseline a useful model beats)."""
    optimizer = torch.optim.Adam([q for q in model.parameters() if q.requires_grad], lr=lr)
    generator = torch.Generator().manual_seed(seed)
    loss = torch.zeros(())
    for _ in range(steps):
        loss = reward_model_loss(model, data.sample(batch_size, generator))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return {"reward_model_loss": loss.item(), **reward_mse(model, data)}


@torch.no_grad()
def reward_mse(model: RewardModel, data: TransitionBuffer, batch: int = 256) -> dict[str, float]:
    """``reward_model_mse``: mean squared error of the model's per-step rewards on every sampleable transition of
    ``data``; ``reward_mean_mse``: that of predicting their mean (a model that does not beat it is no signal)."""
    a = data.arrays
    slots = a["sampleable"].nonzero().squeeze(1)
    was_training = model.training
    model.eval()
    errors = []
    for part in slots.split(batch):
        predicted = model(a["images"][part], a["proprio"][part], a["instruction_ids"][part], a["actions"][part])
        errors.append((predicted - a["chunk_rewards"][part]) ** 2)
    model.train(was_training)
    rewards = a["chunk_rewards"][slots]
    return {"reward_model_mse": float(torch.cat(errors).mean()),
            "reward_mean_mse": float(((rewards - rewards.mean()) ** 2).mean())}


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


@torch.no_grad()
def reward_fit(model: RewardModel, episodes: list[Episode]) -> dict[str, float]:
    """How well the model predicts the env's rewards of ``episodes`` (e.g. demonstrations it was not trained on,
    or of another split): ``mse`` of its per-decision rewards, ``mean_mse`` of predicting their mean (the
    baseline a useful model beats) and ``corr``, their Pearson correlation (ranking, what a critic needs)."""
    true = np.concatenate([e.rewards for e in episodes])
    predicted = np.concatenate([relabel(model, e)[0].rewards for e in episodes])
    return {"mse": float(((predicted - true) ** 2).mean()), "mean_mse": float(((true - true.mean()) ** 2).mean()),
            "corr": correlation(true, predicted)}


def correlation(true: np.ndarray, predicted: np.ndarray) -> float:
    """Pearson correlation of the env's and the predicted rewards (a prediction off in scale can still rank
    decisions); 0 when either is constant or there are fewer than two."""
    if len(true) < 2 or true.std() == 0 or predicted.std() == 0:
        return 0.0
    return float(np.corrcoef(true, predicted)[0, 1])
