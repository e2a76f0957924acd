"""DSRL — Diffusion Steering via RL in the latent-noise space (Wagenmaker, Nakamoto, Zhang, Park, Yagoub, Nagabandi,
Gupta, Levine 2025, "Steering Your Diffusion Policy with Latent Space RL", arXiv 2506.15799), on the VLA's flow
head (``policy.args.action_head: flow``, :mod:`mmrl.policies.flow_head`), as a loss hook of the one trainer loop.
It is the fine-tuning the CSP / TMRL seed paper (#98) does on flow / diffusion action heads.

The flow head turns noise into an action deterministically, a = g_θ(h, w) (``flow_steps`` Euler steps from x_0 = w).
DSRL keeps it **frozen** and learns where to start it: a latent actor π_w(w | h) over the noise,

    w = b · tanh(u),   u ~ N(μ_w(h), σ_w(h)²),   b = ``noise_bound``

(SAC's squashed Gaussian scaled to the box [−b, b]^D; log π_w in
:func:`~mmrl.algos.offpolicy.formulas.squashed_latent_logprob`). The executed action is g_θ(h, w), clipped to
[−1, 1] by the env. The noise-aliased variant (DSRL-NA, the paper's §4.2) learns two critics, so the replay buffer
keeps *executed actions* and data without latents (the demonstrations) stays usable:

1. Q^A(s, a): the ensemble critic of :class:`~mmrl.algos.offpolicy.learner.ActorCritic` on executed actions, with
   SAC's soft TD target through the latent actor and the frozen head (chunked as CO-RFT's for chunk > 1):

       y = r + γ (1 − d) ( min_{i ∈ M} Q̄^A_i(s', g_θ(h', w')) − α log π_w(w' | h') ),   w' ~ π_w(· | h')

2. Q^W(s, w): a latent critic (E heads on the frozen features h and w / b), distilled each update onto Q^A at the
   action the head makes of w (:func:`~mmrl.algos.offpolicy.formulas.latent_distillation_loss`, member i onto
   member i, no gradient into Q^A), for B noises w ~ N(0, I) clipped to the box and B noises w ~ π_w(· | h):

       L_W = Σ_i mean ( Q^W_i(h, w) − Q^A_i(s, g_θ(h, w)) )²

3. the latent actor: SAC's actor loss on Q^W, E_w[ α log π_w(w | h) − min_i Q^W_i(h, w) ] (``actor_reduce``),
   w reparameterised, and α tuned toward ``target_entropy`` (:func:`~mmrl.algos.offpolicy.formulas.temperature_loss`).

What stays frozen: the whole VLA (trunk, encoder and flow head). DSRL leaves the base policy's weights alone; the
latent actor and Q^W read the frozen trunk's features h, Q^A has its own encoder, a copy of the trunk trained by TD
(as every learner here). The learner steps its own optimizers and returns no loss to the trainer, whose
optimizer then sees zero gradients (the trainer's zero policy-gradient term) or none: with ``trainer.weight_decay``
0 (checked) AdamW leaves the VLA's weights bit for bit as they were.

Acting: the learner installs itself as the policy's ``action_selector`` (:class:`mmrl.core.contracts.ActionSelector`):
training rollouts sample w ~ π_w (the rollout's temperature τ scales σ_w), greedy evaluation (τ = 0) takes
w = b · tanh(μ_w(h)), and both execute g_θ(h, w). A fresh latent actor has μ_w = 0 and σ_w = 1/b (INFERRED: w ≈ N(0, I)
near the origin, the base's own noise), so before any update greedy DSRL is the flow head's greedy action g_θ(h, 0).

Phases: the recipe's warm start (flow-matching BC), an optional offline phase of ``offline_steps`` such updates on
the demonstrations (WSRL's, without Cal-QL: Q^A, Q^W and π_w pre-trained on the executed demonstrations), then
online updates on a buffer that keeps the demonstrations (``retain_offline``). Weights saved with a checkpoint are
the (unchanged) VLA's; the latent actor and both critics live in ``<run>/offpolicy/``; ``mmrl eval`` of the run
restores them and acts through π_w as the run did (:mod:`mmrl.algos.offpolicy.acting`; ``--without-learner``: the
flow head alone).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from mmrl.algos.hooks import HookContext
from mmrl.algos.offpolicy.buffer import Transitions
from mmrl.algos.offpolicy.co_rft import CORFT, CORFTParams
from mmrl.algos.offpolicy.critic import QHeads
from mmrl.algos.offpolicy.formulas import (actor_loss, latent_distillation_loss, squashed_latent_logprob,
                                           temperature_loss)
from mmrl.algos.offpolicy.learner import ActorCritic, ContinuousActor, CriticSettings
from mmrl.algos.offpolicy.wsrl import critic_settings
from mmrl.algos.variants.params import declare_variant
from mmrl.core.contracts import ActionSelector
from mmrl.core.rollout import derive_seed
from mmrl.core.typed import ConfigError

MAX_NOISE_BOUND = 10.0
"""The largest ``noise_bound``: the flow head saw noise of N(0, I) in BC (|z| < 4 for all but 6e-5 of its draws)."""


@dataclass(frozen=True)
class DSRLParams(CORFTParams):
    """``algo.extra.dsrl``: WSRL's critic / offline keys (no conservative term), CO-RFT's retained demonstrations
    and chunked backup, DSRL's latent actor and latent critic (INFERRED where marked)."""

    cql_alpha: float = 0.0
    """No conservative term offline (DSRL has none; must stay 0)."""
    online_cql_alpha: float = 0.0
    """No conservative term online (must stay 0)."""
    backup_entropy: bool = True
    """SAC's soft backup, − α log π_w(w' | h') in the TD target (DSRL trains π_w with SAC)."""
    noise_bound: float = 2.5
    """b: the latent actor's noise lives in [−b, b]^D (INFERRED: the base's N(0, I) noise falls inside it with
    probability 0.988 per number)."""
    latent_width: int = 256
    """Hidden width of the latent actor's MLP (SAC: 256)."""
    latent_lr: float = 3e-4
    """Adam lr of the latent actor (SAC: 3e-4)."""
    latent_critic_width: int = 256
    """Hidden width of each latent critic head Q^W_i."""
    latent_critic_lr: float = 3e-4
    """Adam lr of the latent critic (SAC's critic lr: 3e-4)."""

    def __post_init__(self) -> None:
        problems = []
        if self.cql_alpha != 0 or self.online_cql_alpha != 0:
            problems.append("cql_alpha and online_cql_alpha must be 0 (DSRL's critics have no conservative term)")
        if not (math.isfinite(self.noise_bound) and 0 < self.noise_bound <= MAX_NOISE_BOUND):
            problems.append(f"noise_bound must be in (0, {MAX_NOISE_BOUND}] (the flow head's noise is N(0, I)), got "
                            f"{self.noise_bound}")
        if self.offline_actor_start != 0:
            problems.append("offline_actor_start must be 0 (the latent actor trains from the first update; the VLA "
                            "stays frozen)")
        if self.latent_width < 1 or self.latent_critic_width < 1:
            problems.append(f"latent_width and latent_critic_width must be >= 1, got {self.latent_width}, "
                            f"{self.latent_critic_width}")
        if problems:
            raise ConfigError("algo.extra.dsrl: " + "; ".join(problems))


declare_variant("dsrl", DSRLParams)


@runtime_checkable
class FlowPolicy(ContinuousActor, Protocol):
    """What DSRL needs of the base policy (``VLAPolicy`` with ``action_head: flow``)."""

    action_selector: ActionSelector | None

    def flow_actions(self, h: Tensor, noise: Tensor) -> Tensor:
        ...  # g_θ(h, w): features [B, F] and noise [B, D] → decisions as stored [B, D]

    def executed_decisions(self, decision: Tensor) -> Tensor:
        ...  # stored decisions → executed actions in [−1, 1]


class LatentActor(nn.Module):
    """π_w(w | h): w = b · tanh(u), u ~ N(μ, σ²) from the frozen features h [B, F] (MLP → LayerNorm → ReLU → MLP →
    ReLU → μ, log σ, log σ squashed into ``log_std_range``). The output layer starts at zero weights: μ = 0 and
    σ = 1/b (clamped to the range), so w starts close to N(0, I) near the origin (INFERRED)."""

    def __init__(self, features: int, noise_size: int, width: int, bound: float,
                 log_std_range: tuple[float, float] = (-5.0, 1.0)):
        super().__init__()
        self.noise_size, self.bound, self.log_std_range = noise_size, bound, log_std_range
        self.net = nn.Sequential(nn.Linear(features, width), nn.LayerNorm(width), nn.ReLU(),
                                 nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 2 * noise_size))
        nn.init.zeros_(self.net[-1].weight)
        lo, hi = log_std_range
        start = min(max(-math.log(bound), lo + 0.05), hi - 0.05)
        with torch.no_grad():
            self.net[-1].bias.zero_()
            self.net[-1].bias[noise_size:] = math.atanh(2 * (start - lo) / (hi - lo) - 1)

    def forward(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """μ, log σ [B, D] of u given features ``h`` [B, F]."""
        mean, raw = self.net(h.float()).chunk(2, -1)
        lo, hi = self.log_std_range
        return mean, lo + (hi - lo) * (torch.tanh(raw) + 1) / 2

    def rsample(self, h: Tensor, generator: torch.Generator, temperature: float = 1.0) -> tuple[Tensor, Tensor | None]:
        """Noises w = b tanh(μ + τσε) [B, D] (reparameterised, ε from ``generator``) and log π_w(w | h) [B] (the
        density at τ = 1); τ = 0: the mode's image b tanh(μ) and None."""
        mean, log_std = self(h)
        if temperature == 0:
            return self.bound * torch.tanh(mean), None
        eps = torch.randn(mean.shape, generator=generator).to(mean.device)
        u = mean + temperature * log_std.exp() * eps
        return self.bound * torch.tanh(u), squashed_latent_logprob(u, mean, log_std, self.bound)


class LatentActorCritic(ActorCritic):
    """Q^A (the ensemble, its target and α of :class:`ActorCritic`, the TD target's a' = g_θ(h', w') with
    w' ~ π_w), the latent critic Q^W, the latent actor π_w and their optimizers (module docstring)."""

    policy: FlowPolicy

    def __init__(self, policy: FlowPolicy, s: CriticSettings, seed: int, p: DSRLParams):
        super().__init__(policy, s, seed)
        self.bound = p.noise_bound
        with torch.random.fork_rng():
            torch.manual_seed(derive_seed(seed, 2))
            self.latent_actor = LatentActor(policy.feature_size, self.action_size, p.latent_width, p.noise_bound)
            self.latent_critic = QHeads(s.ensemble_size, policy.feature_size, self.action_size, p.latent_critic_width)
        self.latent_optimizer = torch.optim.Adam(self.latent_actor.parameters(), lr=p.latent_lr)
        self.latent_critic_optimizer = torch.optim.Adam(self.latent_critic.parameters(), lr=p.latent_critic_lr)

    def next_action_density(self) -> bool:
        """The TD target's a' = g_θ(h', w') has the latent actor's density log π_w(w' | h') (the soft backup's)."""
        return True

    def next_actions(self, batch: Transitions, h_next: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """a' = g_θ(h', w') (stored form; the critic clips it as the env would), w' ~ π_w(· | h'), and log π_w(w' | h')."""
        w, logp = self.latent_actor.rsample(h_next, generator)
        return self.policy.flow_actions(h_next, w), logp

    def q_latent(self, h: Tensor, w: Tensor) -> Tensor:
        """Q^W_i(h, w) [E, B] of frozen features ``h`` [B, F] and noises ``w`` [B, D] (read as w / b ∈ [−1, 1])."""
        return self.latent_critic(h.float(), (w / self.bound)[:, None]).squeeze(2)

    @torch.no_grad()
    def act(self, h: Tensor, temperature: float, generator: torch.Generator) -> Tensor:
        """The DSRL policy's decisions [B, D] (as the payload stores them): g_θ(h, w), w ~ π_w(· | h) at ``temperature``
        (τ = 0: w = b tanh(μ_w(h)))."""
        w, _ = self.latent_actor.rsample(h, generator, temperature)
        return self.policy.flow_actions(h, w)

    def distill_step(self, batch: Transitions, h: Tensor, generator: torch.Generator) -> dict[str, float]:
        """One optimizer step of Q^W onto Q^A (:func:`latent_distillation_loss`) at B noises from N(0, I) clipped to
        the box and B from π_w; ``h``: the frozen features of the batch's states."""
        b = h.shape[0]
        with torch.no_grad():
            w_prior = torch.randn((b, self.action_size), generator=generator).to(h.device).clamp(-self.bound, self.bound)
            w_actor, _ = self.latent_actor.rsample(h, generator)
            w, hh = torch.cat([w_prior, w_actor]), torch.cat([h, h])
            actions = self.policy.executed_decisions(self.policy.flow_actions(hh, w))
            h_critic = self.critic.features(batch.images, batch.proprio, batch.instruction_ids)
            q_action = self.critic.q(torch.cat([h_critic, h_critic]), actions)  # [E, 2B]
        q_latent = self.q_latent(hh, w)
        loss = latent_distillation_loss(q_latent, q_action)
        self.latent_critic_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.latent_critic_optimizer.step()
        gap = (q_latent.detach() - q_action).abs()
        return {"loss/latent_distill": loss.item(), "dsrl/q_latent_gap": gap[:, b:].mean().item(),
                "dsrl/q_latent_gap_prior": gap[:, :b].mean().item()}

    def actor_step(self, h: Tensor, generator: torch.Generator) -> dict[str, float]:
        """One optimizer step of the latent actor (SAC's actor loss on Q^W) and of α; ``h``: frozen features."""
        alpha = self.alpha
        w, logp = self.latent_actor.rsample(h, generator)
        self.latent_critic.requires_grad_(False)  # the gradient reaches w only
        q = self.q_latent(h, w)
        self.latent_critic.requires_grad_(True)
        loss = actor_loss(q, logp, alpha, self.s.actor_reduce)
        self.latent_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.latent_optimizer.step()
        if self.s.auto_alpha:
            self.alpha_optimizer.zero_grad(set_to_none=True)
            temperature_loss(self.log_alpha, logp, self.target_entropy).backward()
            self.alpha_optimizer.step()
        return {"loss/actor": loss.item(), "critic/alpha": alpha, "dsrl/latent_entropy": -logp.detach().mean().item(),
                "dsrl/latent_abs": w.detach().abs().mean().item(), "dsrl/q_latent_policy": q.detach().mean().item()}

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"latent_actor": self.latent_actor.state_dict(),
                                       "latent_critic": self.latent_critic.state_dict(),
                                       "latent_optimizer": self.latent_optimizer.state_dict(),
                                       "latent_critic_optimizer": self.latent_critic_optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.latent_actor.load_state_dict(state["latent_actor"])
        self.latent_critic.load_state_dict(state["latent_critic"])
        self.latent_optimizer.load_state_dict(state["latent_optimizer"])
        self.latent_critic_optimizer.load_state_dict(state["latent_critic_optimizer"])


class DSRL(CORFT):
    """The learner (module docstring); also the policy's :class:`~mmrl.core.contracts.ActionSelector`."""

    NAME = "dsrl"
    p: DSRLParams
    learner: LatentActorCritic

    def __init__(self, ctx: HookContext):
        if ctx.cfg.trainer.weight_decay != 0:
            raise ValueError(f"algo.offpolicy: dsrl keeps the VLA frozen, but trainer.weight_decay "
                             f"{ctx.cfg.trainer.weight_decay} would shrink its weights at every trainer step: set it to 0")
        super().__init__(ctx)
        ctx.policy.action_selector = self  # after the offline phase: step 0's evaluation acts through π_w

    def build_learner(self) -> LatentActorCritic:
        policy, cfg = self.ctx.policy, self.ctx.cfg
        if not isinstance(policy, FlowPolicy):
            raise ValueError(f"algo.offpolicy: dsrl steers the noise of a policy with features / flow_actions / "
                             f"action_selector (the vla policy with action_head: flow); got {type(policy).__name__}")
        with torch.no_grad():  # fails now, clearly, for a head whose noise cannot be chosen
            try:
                policy.flow_actions(torch.zeros(1, policy.feature_size), torch.zeros(1, policy.decision_size))
            except ValueError as error:
                raise ValueError(f"algo.offpolicy: dsrl: {error}") from None
        return LatentActorCritic(policy, critic_settings(self.p, cfg.algo.gamma, self.CHUNKED),
                                 derive_seed(cfg.trainer.seed, 40), self.p)

    def __call__(self, images: Tensor, proprio: Tensor, instruction_ids: Tensor, h: Tensor, temperature: float,
                 generator: torch.Generator) -> Tensor:
        """The policy's decisions in rollouts: g_θ(h, w), w ~ π_w (:meth:`LatentActorCritic.act`)."""
        return self.learner.act(h, temperature, generator)

    def learner_step(self, batch: Transitions, generator: torch.Generator, cql_alpha: float,
                     step: int | None) -> tuple[None, dict[str, float]]:
        """One step each of Q^A (TD, Polyak), Q^W (distillation) and π_w (SAC's actor loss, α); nothing for the
        trainer's optimizer (the VLA is frozen)."""
        policy, learner = self.ctx.policy, self.learner
        with torch.no_grad():
            h = policy.features(batch.images, batch.proprio, batch.instruction_ids)
        metrics = learner.critic_step(batch, h, generator, cql_alpha, self.p.calibrated)
        metrics |= learner.distill_step(batch, h, generator)
        metrics |= learner.actor_step(h, generator)
        return None, metrics

    def metrics(self) -> dict[str, float]:
        """WSRL's, with the losses the trainer does not see (no loss is returned to it) averaged over the step."""
        out = super().metrics()
        return out | {key: value / self.count for key, value in self.sums.items() if key.startswith("loss/")}
