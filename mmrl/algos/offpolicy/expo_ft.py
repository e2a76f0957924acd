"""EXPO-FT — an edit actor and Q-guided action selection on a pretrained VLA (Dong, Hung, Gao, Sadigh, Finn 2026,
"EXPO-FT: Sample-Efficient Reinforcement Learning Finetuning for Vision-Language-Action Models", arXiv 2605.25477;
seed paper #89), built on EXPO (Dong, Li, Sadigh, Finn 2025, "EXPO: Stable Reinforcement Learning with Expressive
Policies", arXiv 2507.07986), as a loss hook of the one trainer loop.

Two policies act together. The **base** policy is the run's VLA (any continuous head: Gaussian, squashed, chunked,
consistency); it is never asked to maximise Q, only to imitate (EXPO's stability argument: value gradients through
an expressive head are unstable). A small **edit actor** π_e(u | h, a) reads the base's features h and a base
decision a and proposes a bounded residual

    ã = clip(a + β · tanh(u), −1, 1),   u ~ N(μ_e(h, a), σ_e(h, a)²),   β = ``edit_scale``.

The **on-the-fly policy** (Q-guided sampling) draws N = ``num_candidates`` base decisions a_1..a_N ~ π_base(·|s),
edits each, and executes the candidate of highest Q among the 2N (:func:`~mmrl.algos.offpolicy.formulas.q_guided_choice`,
ensemble reduced by ``select_reduce``). The same selection at s' gives the TD target's a' (selected with the online
critic, evaluated by the target members' min: double Q learning):

    y = Σ_{k<c} γ^k r_{t+k} + γ^c (1 − d) min_{i ∈ M} Q̄_i(s_{t+c}, a'),   a' = argmax_{a ∈ cands(s_{t+c})} Q(s_{t+c}, a)

(the chunked backup of CO-RFT: the critic is a Q over whole action chunks, γ per env step; for chunk 1 it is the
plain TD target). Per update, on a batch of the replay buffer:

1. critic: one TD step (no conservative term: EXPO has none) and the Polyak update;
2. edit actor: SAC's actor loss on the edited base sample, E[α log π_e(e | h, a) − Q(s, clip(a + β e))], with
   e = tanh(u) and α tuned toward ``target_entropy`` (the density of the *normalised* edit e ∈ (−1, 1)^D, so the
   target entropy does not depend on β; INFERRED), stepped by its own Adam (``edit_lr``);
3. base: behaviour cloning (``VLAPolicy.imitation_loss``) of the buffer's executed decisions (demonstrations and
   the selected, executed decisions of the policy's rollouts: the base is distilled toward what the on-the-fly
   policy did; INFERRED, EXPO trains its base by imitation on its whole buffer) or, with ``bc_data:
   demonstrations``, of the demonstrations' clean expert labels only; returned (× ``bc_weight``) to the trainer,
   which steps the policy with its optimizer.

Phases: the recipe's warm start (BC); an offline phase of ``offline_steps`` such updates on the demonstrations
(WSRL's, without Cal-QL) before the first rollout, so step 0's evaluation is already the on-the-fly policy; then
online updates on a buffer that keeps the demonstrations (``retain_offline``, EXPO's offline data in the buffer).

Acting through the selection: the learner installs itself as the policy's ``action_selector``
(:class:`mmrl.core.contracts.ActionSelector`), which ``VLAPolicy.rollout`` calls in place of sampling its head,
for training rollouts and the trainer's held-out evaluations alike (greedy, τ = 0: the candidates are the base's
greedy decision and its mean edit β tanh(μ_e); INFERRED). Weights saved with a checkpoint are the base VLA's; the
edit actor and critic live in ``<run>/offpolicy/``; ``mmrl eval`` of the run restores them and evaluates through the
selection, as the run did (:mod:`mmrl.algos.offpolicy.acting`; ``--without-learner``: the base alone).

Interventions (``interventions`` p > 0; the paper's human takeovers, with the task's scripted expert standing in for
the human; :mod:`mmrl.algos.offpolicy.interventions`, shared with ConRFT): in each training rollout every episode is
taken over with probability p after the policy's first ``intervention_after`` decisions, the env's
``expert_action()`` acting closed loop from then on. The expert's decisions are what the payload stores there
(flagged), so they enter the replay buffer like every executed decision and, with ``bc_data: demonstrations``, the
base's BC data too. Their env steps are real steps of the same episodes, so ``eval/real_env_steps`` counts them.
Metrics ``expo/intervened_episode_frac``, ``expo/intervened_decisions``. When the human intervenes is INFERRED (a
fixed decision index, or the first stall from it on with ``intervention_trigger: stall``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from mmrl.algos.hooks import HookContext
from mmrl.algos.offpolicy.buffer import TransitionBuffer, Transitions
from mmrl.algos.offpolicy.co_rft import CORFT, CORFTParams
from mmrl.algos.offpolicy.episodes import Episode
from mmrl.algos.offpolicy.formulas import actor_loss, q_guided_choice, tanh_gaussian_logprob, temperature_loss
from mmrl.algos.offpolicy.interventions import InterventionParams, Interventions
from mmrl.algos.offpolicy.learner import ActorCritic, ContinuousActor, CriticSettings
from mmrl.algos.offpolicy.wsrl import critic_settings
from mmrl.algos.variants.params import declare_variant
from mmrl.core.contracts import ActionSelector
from mmrl.core.rollout import derive_seed
from mmrl.core.scored import Scored
from mmrl.core.typed import ConfigError


@dataclass(frozen=True)
class EXPOFTParams(CORFTParams, InterventionParams):
    """``algo.extra.expo_ft``: WSRL's critic / offline keys (no conservative term), CO-RFT's retained
    demonstrations, EXPO-FT's edit actor and selection (INFERRED where marked), and the scripted interventions'
    ``interventions`` / ``intervention_after`` (:class:`~mmrl.algos.offpolicy.interventions.InterventionParams`)."""

    cql_alpha: float = 0.0
    """No conservative term offline (EXPO has none; must stay 0)."""
    online_cql_alpha: float = 0.0
    """No conservative term online (must stay 0)."""
    offline_actor_start: int = 0
    """Offline updates before the base's BC steps start (the critic and edit actor always train)."""
    num_candidates: int = 4
    """N base samples per state, each also edited: 2N candidates (INFERRED for CPU; EXPO samples several)."""
    edit_scale: float = 0.2
    """β: an edit moves each action dimension by at most this (actions live in [−1, 1]; INFERRED)."""
    edit_width: int = 256
    """Hidden width of the edit actor's MLP (a light-weight Gaussian policy, EXPO)."""
    edit_lr: float = 3e-4
    """Adam lr of the edit actor (SAC: 3e-4)."""
    select_reduce: Literal["min", "mean"] = "mean"
    """Ensemble reduction of the Q that ranks the candidates (INFERRED: the mean, as ConRFT's actor)."""
    bc_data: Literal["buffer", "demonstrations"] = "buffer"
    """What the base imitates: the buffer's executed decisions (demonstrations + selected online decisions) or
    the demonstrations' clean expert labels only."""
    bc_batch_size: int = 64
    """Demonstration decisions per BC term with ``bc_data: demonstrations`` (the buffer's BC uses the TD batch)."""
    bc_weight: float = 1.0
    """Weight of the base's BC loss in what the trainer backpropagates."""

    def __post_init__(self) -> None:
        problems = []
        if self.cql_alpha != 0 or self.online_cql_alpha != 0:
            problems.append("cql_alpha and online_cql_alpha must be 0 (EXPO-FT's critic has no conservative term)")
        if self.backup_entropy:
            problems.append("backup_entropy must be false (the on-the-fly policy's a' has no density)")
        if self.num_candidates < 1:
            problems.append(f"num_candidates must be >= 1, got {self.num_candidates}")
        if not 0 < self.edit_scale <= 2:
            problems.append(f"edit_scale must be in (0, 2] (actions live in [-1, 1]), got {self.edit_scale}")
        if self.warmup_steps != 0:
            problems.append("warmup_steps must be 0 (the buffer already holds the demonstrations)")
        problems += self.intervention_problems()
        if problems:
            raise ConfigError("algo.extra.expo_ft: " + "; ".join(problems))


declare_variant("expo_ft", EXPOFTParams)


@runtime_checkable
class EditablePolicy(ContinuousActor, Protocol):
    """What EXPO-FT needs of the base policy (``VLAPolicy`` with a continuous head has it)."""

    action_selector: ActionSelector | None

    def sample_actions(self, h: Tensor, temperature: float, generator: torch.Generator) -> Tensor:
        ...  # decisions as stored [B, D]; τ = 0 greedy

    def executed_decisions(self, decision: Tensor) -> Tensor:
        ...  # stored decisions → executed actions in [−1, 1]

    def stored_decisions(self, executed: Tensor) -> Tensor:
        ...  # executed actions → decisions as stored

    def imitation_loss(self, h: Tensor, actions: Tensor, generator: torch.Generator | None = None) -> Tensor:
        ...  # behaviour cloning of executed actions [B, D]


class EditActor(nn.Module):
    """π_e(u | h, a): a Gaussian over u [B, D] from [features, base decision] (MLP → LayerNorm → ReLU → MLP → ReLU →
    μ, log σ); the normalised edit is e = tanh(u). The output layer starts at zero: μ = 0 (no edit on average) and
    log σ at the middle of ``log_std_range``."""

    def __init__(self, features: int, action_size: int, width: int, log_std_range: tuple[float, float] = (-5.0, 1.0)):
        super().__init__()
        self.action_size, self.log_std_range = action_size, log_std_range
        self.net = nn.Sequential(nn.Linear(features + action_size, width), nn.LayerNorm(width), nn.ReLU(),
                                 nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 2 * action_size))
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def forward(self, h: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """μ, log σ [B, D] of u given features ``h`` [B, F] and base decisions ``actions`` [B, D]."""
        mean, raw = self.net(torch.cat([h, actions], -1)).chunk(2, -1)
        lo, hi = self.log_std_range
        return mean, lo + (hi - lo) * (torch.tanh(raw) + 1) / 2

    def rsample(self, h: Tensor, actions: Tensor, generator: torch.Generator,
                temperature: float = 1.0) -> tuple[Tensor, Tensor | None]:
        """Normalised edits e = tanh(μ + τσε) [B, D] (reparameterised, ε from ``generator``) and log π_e(e) [B] at
        τ = 1; τ = 0: the mean edit tanh(μ) and None."""
        mean, log_std = self(h, actions)
        if temperature == 0:
            return torch.tanh(mean), None
        noise = torch.randn(mean.shape, generator=generator).to(mean.device)
        u = mean + temperature * log_std.exp() * noise
        return torch.tanh(u), tanh_gaussian_logprob(u, mean, log_std)


class OnTheFlyCritic(ActorCritic):
    """The critic ensemble and α of :class:`ActorCritic`, the edit actor, and EXPO's on-the-fly policy: the TD
    target's a' is its Q-guided choice (:meth:`next_actions`)."""

    policy: EditablePolicy

    def __init__(self, policy: EditablePolicy, s: CriticSettings, seed: int, p: EXPOFTParams):
        super().__init__(policy, s, seed)
        with torch.random.fork_rng():
            torch.manual_seed(derive_seed(seed, 1))
            self.edit_actor = EditActor(policy.feature_size, self.action_size, p.edit_width)
        self.edit_optimizer = torch.optim.Adam(self.edit_actor.parameters(), lr=p.edit_lr)
        self.num_candidates, self.edit_scale, self.select_reduce = p.num_candidates, p.edit_scale, p.select_reduce

    def edited(self, actions: Tensor, edits: Tensor) -> Tensor:
        """clip(a + β e, −1, 1): executed base decisions [B, D] moved by normalised edits [B, D]."""
        return (actions + self.edit_scale * edits).clamp(-1, 1)

    @torch.no_grad()
    def propose(self, h: Tensor, temperature: float, generator: torch.Generator) -> Tensor:
        """The candidates [B, 2N, D] (executed form) at features ``h`` [B, F]: N base samples at ``temperature``
        and their edits (first the N base decisions, then the N edited ones). τ = 0: N = 1, the greedy base
        decision and its mean edit."""
        b, n, d = h.shape[0], self.num_candidates if temperature > 0 else 1, self.action_size
        hs = h.repeat_interleave(n, 0)
        base = self.policy.executed_decisions(self.policy.sample_actions(hs, temperature, generator)).float()
        edits, _ = self.edit_actor.rsample(hs, base, generator, temperature)
        return torch.cat([base.view(b, n, d), self.edited(base, edits).view(b, n, d)], 1)

    @torch.no_grad()
    def select(self, images: Tensor, proprio: Tensor, instruction_ids: Tensor, h: Tensor, temperature: float,
               generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """The on-the-fly policy's decision [B, D] (executed form) at these observations and whether it was an
        edited candidate [B] bool: the candidates of :meth:`propose` ranked by the online critic."""
        candidates = self.propose(h, temperature, generator)
        q = self.critic.q(self.critic.features(images, proprio, instruction_ids), candidates)  # [E, B, 2N]
        chosen, index = q_guided_choice(candidates, q, self.select_reduce)
        return chosen, index >= candidates.shape[1] // 2

    def next_actions(self, batch: Transitions, h_next: Tensor, generator: torch.Generator) -> tuple[Tensor, None]:
        """a' = the Q-guided choice at s' (sampled candidates, τ = 1); no density."""
        chosen, _ = self.select(batch.next_images, batch.next_proprio, batch.instruction_ids, h_next, 1.0, generator)
        return chosen, None

    def edit_step(self, batch: Transitions, h: Tensor, generator: torch.Generator) -> dict[str, float]:
        """One optimizer step of the edit actor (SAC's actor loss on an edited base sample) and of α; ``h``: the
        base policy's features of the batch's states (no grad)."""
        alpha, critic = self.alpha, self.critic
        with torch.no_grad():
            base = self.policy.executed_decisions(self.policy.sample_actions(h, 1.0, generator)).float()
            h_critic = critic.features(batch.images, batch.proprio, batch.instruction_ids)
            q_base = critic.q(h_critic, base)
        edits, logp = self.edit_actor.rsample(h, base, generator)
        critic.heads.requires_grad_(False)  # the gradient reaches the edit only
        q_edit = critic.q(h_critic, self.edited(base, edits))  # [E, B]
        critic.heads.requires_grad_(True)
        loss = actor_loss(q_edit, logp, alpha, self.s.actor_reduce)
        self.edit_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.edit_optimizer.step()
        if self.s.auto_alpha:
            self.alpha_optimizer.zero_grad(set_to_none=True)
            temperature_loss(self.log_alpha, logp, self.target_entropy).backward()
            self.alpha_optimizer.step()
        return {"loss/actor": loss.item(), "critic/alpha": alpha, "expo/edit_entropy": -logp.detach().mean().item(),
                "expo/edit_abs": (self.edit_scale * edits.detach()).abs().mean().item(),
                "expo/q_edit_gain": (q_edit.detach().mean(0) - q_base.mean(0)).mean().item()}

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"edit_actor": self.edit_actor.state_dict(),
                                       "edit_optimizer": self.edit_optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.edit_actor.load_state_dict(state["edit_actor"])
        self.edit_optimizer.load_state_dict(state["edit_optimizer"])


class EXPOFT(CORFT):
    """The learner (module docstring); also the policy's :class:`~mmrl.core.contracts.ActionSelector`."""

    NAME = "expo_ft"
    p: EXPOFTParams
    learner: OnTheFlyCritic

    bc_data: TransitionBuffer | None = None
    """The demonstrations' clean labels (``bc_data: demonstrations``), built with the offline phase."""

    def __init__(self, ctx: HookContext):
        super().__init__(ctx)
        self.selections = [0, 0]  # sampled decisions of this step's rollouts: [edited chosen, all]
        self.edited_frac = 0.0  # the last step's share of edited choices (logged)
        ctx.policy.action_selector = self  # after the offline phase: step 0's evaluation acts through it
        self.interventions = Interventions(self.p, stream=89, prefix="expo")
        self.interventions.install(ctx.policy, self.NAME)

    def build_learner(self) -> OnTheFlyCritic:
        policy = self.ctx.policy
        if not isinstance(policy, EditablePolicy):
            raise ValueError(f"algo.offpolicy: expo_ft edits and selects the decisions of a policy with "
                             f"action_selector / sample_actions / stored_decisions / imitation_loss (the vla policy "
                             f"with a continuous head); got {type(policy).__name__}")
        cfg = self.ctx.cfg
        return OnTheFlyCritic(policy, critic_settings(self.p, cfg.algo.gamma, self.CHUNKED),
                              derive_seed(cfg.trainer.seed, 40), self.p)

    def offline_phase(self) -> dict[str, float]:
        """The demonstrations' clean labels as BC data when asked, then WSRL's offline phase (or its saved result)
        with :meth:`learner_step` as the update."""
        if self.p.bc_data == "demonstrations":
            episodes = self.offline_episodes(expert_labels=True)
            if not episodes:
                raise ValueError("algo.extra.expo_ft.bc_data: demonstrations needs offline_demos > 0 or offline_files")
            room = self.p.correction_room(self.p.buffer_capacity)
            self.bc_data = TransitionBuffer(sum(e.length for e in episodes) + 1 + room, self.ctx.cfg.algo.gamma,
                                            self.CHUNKED)
            for episode in episodes:
                self.bc_data.add(episode)
        return super().offline_phase()

    def store(self, episode: Episode) -> None:
        """The episode into the online buffer; its taken-over decisions are counted and, with ``bc_data:
        demonstrations``, join the BC data (:meth:`Interventions.record`)."""
        super().store(episode)
        self.interventions.record(episode, self.bc_data)

    def __call__(self, images: Tensor, proprio: Tensor, instruction_ids: Tensor, h: Tensor, temperature: float,
                 generator: torch.Generator) -> Tensor:
        """The policy's decisions in rollouts: the on-the-fly policy's choice, as the payload stores decisions."""
        chosen, edited = self.learner.select(images, proprio, instruction_ids, h, temperature, generator)
        if temperature > 0:  # training rollouts (the greedy evaluation is not counted)
            self.selections[0] += int(edited.sum())
            self.selections[1] += len(edited)
        return self.ctx.policy.stored_decisions(chosen)

    def learner_step(self, batch: Transitions, generator: torch.Generator, cql_alpha: float,
                     step: int | None) -> tuple[Tensor, dict[str, float]]:
        """One critic step (TD with the selected a'), one edit-actor step, and the base's BC loss (returned)."""
        policy, learner, p = self.ctx.policy, self.learner, self.p
        h = policy.features(batch.images, batch.proprio, batch.instruction_ids)  # with grad: the base's BC
        metrics = learner.critic_step(batch, h.detach(), generator, cql_alpha, p.calibrated)
        metrics |= learner.edit_step(batch, h.detach(), generator)
        if self.bc_data is None:
            bc = policy.imitation_loss(h, batch.actions, generator)
        else:
            demos = self.bc_data.sample(p.bc_batch_size, generator)
            bc = policy.imitation_loss(policy.features(demos.images, demos.proprio, demos.instruction_ids),
                                       demos.actions, generator)
        metrics["expo/bc_loss"] = bc.item()
        return p.bc_weight * bc, metrics

    def prepare(self, batch: Scored) -> None:
        self.interventions.begin_step()
        super().prepare(batch)
        self.edited_frac = self.selections[0] / max(self.selections[1], 1)
        self.selections = [0, 0]

    def metrics(self) -> dict[str, float]:
        return super().metrics() | {"expo/edited_chosen_frac": self.edited_frac} | self.interventions.metrics()

    def extra_state(self) -> dict[str, Any]:
        """The interventions' count and the BC data (it grows with them)."""
        out: dict[str, Any] = self.interventions.state_dict()
        if self.bc_data is not None:
            out["bc_data"] = self.bc_data.state_dict()
        return out

    def load_extra_state(self, saved: dict[str, Any]) -> None:
        self.interventions.load_state_dict(saved)
        if self.bc_data is not None:
            self.bc_data.load_state_dict(saved["bc_data"])
