"""The shared off-policy update: critic ensemble + target + entropy temperature, one step at a time.

:class:`ActorCritic` owns the critic, its Polyak target, their optimizer and SAC's temperature α; the actor
is the run's policy, reached through :class:`ContinuousActor`. One call of :meth:`ActorCritic.update`
on a sampled batch of transitions does, in this order (SAC, Haarnoja et al. 2018, Alg. 1; the conservative
term of Cal-QL when ``cql_alpha`` > 0):

1. critic: L_Q = Σ_i mean_B (Q_i(s, a) − y)² + cql_alpha · Σ_i R_i   (y: :func:`td_target`; R: :func:`calql_penalty`),
   one optimizer step, then θ̄ ← (1 − τ) θ̄ + τ θ;
2. actor: L_π = :func:`actor_loss` on the updated critic, returned with its graph (the caller steps the
   policy: the trainer's optimizer online, an optimizer of the offline phase before the run);
3. temperature: one step of :func:`temperature_loss` on log α (when auto-tuned).

Learners with an actor objective of their own (ConRFT) call :meth:`ActorCritic.critic_step` and
:meth:`ActorCritic.q_for_actor` instead. A deterministic actor (``rsample_actions`` returns no log π: the
consistency head) has no entropy terms: no soft backup, no temperature, and Cal-QL's log-sum-exp without
importance weights (:func:`calql_penalty` with ``logp_policy`` None).

Every random draw (target members, a' ~ π(s'), CQL's actions, ã) comes from the ``generator`` passed in,
so an update depends only on the weights, the batch and that seed.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from mmrl.algos.offpolicy.buffer import Transitions
from mmrl.algos.offpolicy.critic import Critic
from mmrl.algos.offpolicy.formulas import (actor_loss, calql_penalty, chunk_td_target, polyak_update, td_target,
                                           temperature_loss)


@runtime_checkable
class ContinuousActor(Protocol):
    """A policy off-policy learners can train (``VLAPolicy`` with ``action_head: gaussian`` or ``consistency``)."""

    decision_size: int  # numbers in one decision (chunk · action dims)
    feature_size: int  # width of ``features``

    def features(self, images: Tensor, proprio: Tensor, instruction: Tensor) -> Tensor:
        ...  # observations → features h [B, F], with gradient

    def rsample_actions(self, h: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor | None]:
        ...  # reparameterised decisions [B, D] and log π [B] (None: a deterministic actor of (h, noise))

    def encode_instructions(self, texts: list[str]) -> Tensor:
        ...  # instruction texts → the word ids ``features`` reads [B, L]


@dataclass(frozen=True)
class CriticSettings:
    """The critic and entropy settings one learner passes to :class:`ActorCritic` (documented in its params)."""

    ensemble_size: int
    target_subset: int
    width: int
    lr: float
    tau: float
    gamma: float
    init_alpha: float
    auto_alpha: bool
    alpha_lr: float
    target_entropy: float | None
    backup_entropy: bool
    actor_reduce: str
    cql_samples: int
    cql_temperature: float
    chunked: bool = False
    """γ per env step and the chunked backup :func:`chunk_td_target` (CO-RFT); else γ per decision."""


class ActorCritic:
    def __init__(self, policy: Any, s: CriticSettings, seed: int):
        if not isinstance(policy, ContinuousActor):
            raise ValueError(f"off-policy learners need a policy with features / rsample_actions / "
                             f"encode_instructions (the vla policy); got {type(policy).__name__}")
        if not 1 <= s.target_subset <= s.ensemble_size:
            raise ValueError(f"target_subset must be in 1..ensemble_size ({s.ensemble_size}), got {s.target_subset}")
        self.policy, self.s = policy, s
        self.action_size = policy.decision_size
        with torch.no_grad():  # fails now, clearly, for a policy without a reparameterisable head
            _, probe_logp = policy.rsample_actions(torch.zeros(1, policy.feature_size), torch.Generator())
        self.has_logprob = probe_logp is not None
        if s.backup_entropy and not self.next_action_density():
            raise ValueError("backup_entropy needs log π(a'|s'): the policy's actor has none (consistency head)")
        self.critic = Critic.from_policy(policy, policy.feature_size, self.action_size, s.ensemble_size, s.width, seed)
        self.target = copy.deepcopy(self.critic).requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.critic.parameters(), lr=s.lr)
        self.log_alpha = torch.tensor(math.log(s.init_alpha), requires_grad=True)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=s.alpha_lr)
        self.target_entropy = -float(self.action_size) if s.target_entropy is None else s.target_entropy

    @property
    def alpha(self) -> float:
        return float(self.log_alpha.detach().exp())

    def update(self, batch: Transitions, generator: torch.Generator, cql_alpha: float,
               calibrated: bool) -> tuple[Tensor, dict[str, float]]:
        """One critic step (+ Polyak), one temperature step; returns SAC's actor loss (with graph) and metrics."""
        if not self.has_logprob:
            raise ValueError("SAC's actor loss needs log π: this policy's actor has none (consistency head; use "
                             "algo.offpolicy: conrft)")
        s, policy = self.s, self.policy
        alpha = self.alpha
        h_pi = policy.features(batch.images, batch.proprio, batch.instruction_ids)  # with grad: the actor's step
        metrics = self.critic_step(batch, h_pi.detach(), generator, cql_alpha, calibrated)
        actions, logp = policy.rsample_actions(h_pi, generator)
        policy_loss = actor_loss(self.q_for_actor(batch, actions), logp, alpha, s.actor_reduce)
        if s.auto_alpha:
            self.alpha_optimizer.zero_grad(set_to_none=True)
            temperature_loss(self.log_alpha, logp, self.target_entropy).backward()
            self.alpha_optimizer.step()
        metrics |= {"loss/actor": policy_loss.item(), "critic/alpha": alpha,
                    "policy/sample_entropy": -logp.detach().mean().item()}
        return policy_loss, metrics

    def critic_step(self, batch: Transitions, h_pi: Tensor, generator: torch.Generator, cql_alpha: float,
                    calibrated: bool) -> dict[str, float]:
        """One critic optimizer step on ``batch`` (TD + ``cql_alpha`` · Cal-QL term) and the Polyak update;
        ``h_pi``: the policy's features of s (no grad). Returns the metrics."""
        s, critic = self.s, self.critic
        y, h_next = self.targets(batch, generator)
        h = critic.features(batch.images, batch.proprio, batch.instruction_ids)
        q = critic.q(h, batch.actions)  # [E, B]
        td_loss = ((q - y[None]) ** 2).mean(1).sum()
        metrics = {"loss/critic_td": td_loss.item(), "critic/q_mean": q.detach().mean().item(),
                   "critic/td_abs_error": (q.detach() - y[None]).abs().mean().item(),
                   "critic/target_mean": y.mean().item()}
        loss = td_loss
        if cql_alpha > 0:
            penalty, cql_metrics = self.conservative_penalty(batch, h, h_pi, h_next, generator, calibrated)
            loss = loss + cql_alpha * penalty.sum()
            metrics |= {"loss/critic_cql": penalty.sum().item(), **{k: float(v) for k, v in cql_metrics.items()}}
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        polyak_update(self.target, critic, s.tau)
        return metrics

    def q_for_actor(self, batch: Transitions, actions: Tensor) -> Tensor:
        """Q_i(s, ã) [E, B] of the batch's states and the actor's ``actions`` [B, D], with gradient to ã only
        (the critic's encoder and heads are held fixed)."""
        critic = self.critic
        with torch.no_grad():
            h_now = critic.features(batch.images, batch.proprio, batch.instruction_ids)
        critic.heads.requires_grad_(False)  # the actor's gradient reaches ã only, not the critic
        q_pi = critic.q(h_now, actions)
        critic.heads.requires_grad_(True)
        return q_pi

    @torch.no_grad()
    def targets(self, batch: Transitions, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """TD targets y [B] (a' ~ π(s'), a random subset of the target members; per decision or chunked) and the
        policy's features of s'."""
        s, policy = self.s, self.policy
        h_next = policy.features(batch.next_images, batch.next_proprio, batch.instruction_ids)
        a_next, logp_next = self.next_actions(batch, h_next, generator)
        members = torch.randperm(s.ensemble_size, generator=generator)[:s.target_subset]
        next_features = self.target.features(batch.next_images, batch.next_proprio, batch.instruction_ids)
        next_q = self.target.q(next_features, a_next)[members]  # [M, B]
        alpha = self.alpha if s.backup_entropy else 0.0
        if logp_next is None:  # a deterministic actor: no entropy backup (refused at construction)
            logp_next = torch.zeros_like(batch.rewards)
        if s.chunked:
            return chunk_td_target(batch.chunk_rewards, batch.terminal, next_q, logp_next, s.gamma, alpha), h_next
        return td_target(batch.rewards, batch.terminal, next_q, logp_next, s.gamma, alpha), h_next

    def next_action_density(self) -> bool:
        """Whether :meth:`next_actions` returns log π(a'|s') (the soft backup needs it): here, whether the policy's
        head has a density (DSRL's latent actor has one of its own)."""
        return self.has_logprob

    def next_actions(self, batch: Transitions, h_next: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor | None]:
        """The TD target's a' [B, D] at the batch's successor states and log π(a'|s') [B] (None: no density):
        a' ~ π(·|s') from the policy's features ``h_next`` (EXPO-FT's learner selects it instead)."""
        return self.policy.rsample_actions(h_next, generator)

    @torch.no_grad()
    def data_values(self, batch: Transitions) -> Tensor:
        """Q_i(s, a) of the batch's own actions [E, B] (for measurements)."""
        return self.critic.q(self.critic.features(batch.images, batch.proprio, batch.instruction_ids), batch.actions)

    def conservative_penalty(self, batch: Transitions, h: Tensor, h_pi: Tensor, h_next: Tensor,
                             generator: torch.Generator, calibrated: bool) -> tuple[Tensor, dict[str, Tensor]]:
        """Cal-QL's R_i on ``batch`` (``calibrated`` false: plain CQL(H)); ``h`` the critic's features (grad),
        ``h_pi`` / ``h_next`` the policy's features of s / s' (no grad)."""
        n, b, d = self.s.cql_samples, len(batch.rewards), self.action_size
        with torch.no_grad():
            a_pi, logp_pi = self.policy.rsample_actions(h_pi.repeat_interleave(n, 0), generator)
            a_nx, logp_nx = self.policy.rsample_actions(h_next.repeat_interleave(n, 0), generator)
            a_unif = torch.rand((b, n, d), generator=generator).to(h.device) * 2 - 1
        critic = self.critic
        def per_state(logp: Tensor | None) -> Tensor | None:
            return None if logp is None else logp.view(b, n)

        return calql_penalty(critic.q(h, batch.actions), critic.q(h, a_unif), critic.q(h, a_pi.view(b, n, d)),
                             per_state(logp_pi), critic.q(h, a_nx.view(b, n, d)), per_state(logp_nx),
                             batch.mc_returns if calibrated else None, d, self.s.cql_temperature)

    # -- exact resume ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"critic": self.critic.state_dict(), "target": self.target.state_dict(),
                "optimizer": self.optimizer.state_dict(), "log_alpha": self.log_alpha.detach().clone(),
                "alpha_optimizer": self.alpha_optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.critic.load_state_dict(state["critic"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])
