"""ConRFT — Reinforced Fine-Tuning of VLAs via a consistency policy (Chen et al. 2025, "ConRFT: A Reinforced
Fine-tuning Method for VLA Models via Consistency Policy", RSS 2025; seed paper #90), as a loss hook of the one
trainer loop.

The policy's action head is a consistency model f_θ (``policy.args.action_head: consistency``,
:mod:`mmrl.policies.consistency`): a deterministic, differentiable actor ã = f_θ(σ_max z, σ_max | s). Its
objective is one formula in both stages, with stage-dependent weights:

    L_π = −η · E_s[ mean_i Q_i(s, ã) ] + β · L_BC,
    L_BC = E_{(s, a) ∈ demos, z, n}[ λ(σ_n) · mean_d (f_θ(a + σ_n z, σ_n | s) − a)² ]     (the consistency BC loss)

1. **Offline** (Cal-QL + BC, when the hook is built, before the first rollout): ``offline_steps`` updates of
   the Cal-QL critic (:meth:`ActorCritic.critic_step`, the conservative term without importance weights: the
   actor has no density) on the offline data (executed actions and rewards) and the actor loss with
   (β, η) = (``bc_weight``, ``q_weight``); L_BC on a batch of the demonstrations' **clean expert labels**
   (INFERRED: DART demonstrations execute label + noise; BC of the executed actions would teach the noise).
2. **Online** on the policy's own rollouts, from the first trainer step (no warm-up): every optimizer step,
   ``critic_updates`` TD updates on the online buffer (no conservative term: ConRFT's online critic is plain
   Q-learning) and the actor loss with (β, η) = (β_t, ``online_q_weight``),
   β_t = max(``online_bc_min``, ``online_bc_weight`` − ``online_bc_decay`` · (t − 1)) at trainer step t;
   L_BC still on the demonstrations (kept in memory, never in the online buffer).

ConRFT's online stage also learns from **human interventions** (HIL-SERL): a human takes over during online
episodes, and the corrections join the demonstration buffer. There is no human here; the task's scripted expert
stands in for one (``interventions`` p > 0, ``intervention_after`` k; :mod:`mmrl.algos.offpolicy.interventions`,
shared with EXPO-FT): each training episode is taken over with probability p after the policy's first k decisions
(greedy evaluations never), the online buffer stores the episodes as they were executed, and the expert's
decisions (its clean labels) join the BC data of L_BC. Metrics ``conrft/intervened_episode_frac`` (the step's
episodes) and ``conrft/intervened_decisions`` (the run's). INFERRED: the scripted expert for the human, when it
intervenes (a fixed decision index, or its first stall from there with ``intervention_trigger: stall``; never handing
back), and BC on every taken-over decision.

State, resume and single-process rules are WSRL's (:mod:`mmrl.algos.offpolicy.wsrl`); the demonstrations are
drawn again (seeded) on resume (with interventions, the BC data and the count are saved with the state, as the
corrections grow them) and the decay depends only on the trainer step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from mmrl.algos.hooks import HookContext
from mmrl.algos.offpolicy.buffer import TransitionBuffer, Transitions
from mmrl.algos.offpolicy.episodes import Episode
from mmrl.algos.offpolicy.interventions import InterventionParams, Interventions
from mmrl.algos.offpolicy.wsrl import WSRL, WSRLParams
from mmrl.algos.variants.params import declare_variant
from mmrl.core.scored import Scored
from mmrl.core.typed import ConfigError


@dataclass(frozen=True)
class ConRFTParams(WSRLParams, InterventionParams):
    """``algo.extra.conrft``: WSRL's critic / offline keys, ConRFT's actor weights (INFERRED where marked) and the
    scripted interventions' ``interventions`` (default 0: off) / ``intervention_after``
    (:class:`~mmrl.algos.offpolicy.interventions.InterventionParams`)."""

    auto_alpha: bool = False
    """No entropy temperature: the consistency actor has no log π (must stay false)."""
    actor_reduce: Literal["min", "mean"] = "mean"
    """Ensemble reduction in the actor's Q term (ConRFT's code: the mean over members)."""
    warmup_steps: int = 0
    """No collect-only steps: the online actor keeps its BC anchor on the demonstrations."""
    offline_actor_start: int = 0
    """The actor's BC + Q loss from the first offline update (ConRFT trains both together)."""
    bc_weight: float = 1.0
    """β offline (ConRFT's code default for the offline stage: 1.0)."""
    q_weight: float = 0.1
    """η offline (ConRFT's code default for the offline stage: 0.1)."""
    online_bc_weight: float = 0.5
    """β online at the first online step (ConRFT's online setting as we read the paper: 0.5)."""
    online_q_weight: float = 1.0
    """η online (ConRFT's online setting as we read the paper: 1.0)."""
    online_bc_decay: float = 0.0
    """β falls by this much per trainer step online (0: fixed; ConRFT's code decays β toward a floor)."""
    online_bc_min: float = 0.0
    """The floor of the decaying β."""
    online_cql_alpha: float = 0.0
    """Conservative term online (ConRFT: 0, plain Q-learning on the online data)."""
    bc_batch_size: int = 64
    """Demonstration decisions in each BC term (INFERRED; ConRFT's code: the demonstration half of a batch)."""

    def __post_init__(self) -> None:
        problems = self.intervention_problems()
        if problems:
            raise ConfigError("algo.extra.conrft: " + "; ".join(problems))


declare_variant("conrft", ConRFTParams)


class ConRFT(WSRL):
    NAME = "conrft"
    p: ConRFTParams

    bc_data: TransitionBuffer
    """The BC term's demonstrations (built with the offline phase, also when its result is read back) and the
    interventions' corrections."""

    def __init__(self, ctx: HookContext):
        super().__init__(ctx)
        self.interventions = Interventions(self.p, stream=90, prefix="conrft")
        self.interventions.install(ctx.policy, self.NAME)

    def online_cql_alpha(self) -> float:
        return self.p.online_cql_alpha

    def offline_phase(self) -> dict[str, float]:
        """Checks that the actor is a consistency policy, builds the BC data, then WSRL's offline phase (or its
        saved result) with :meth:`learner_step` as the update."""
        p = self.p
        if p.auto_alpha or p.backup_entropy:
            raise ValueError("algo.extra.conrft: auto_alpha and backup_entropy need log π, which the consistency "
                             "actor does not have; set both to false")
        if self.learner.has_logprob:
            raise ValueError(f"algo.offpolicy: conrft trains a consistency policy: set policy.args.action_head: "
                             f"consistency (or flow; got {self.ctx.cfg.policy.args.action_head!r})")
        self.bc_data = self.bc_buffer()
        return super().offline_phase()

    def bc_buffer(self) -> TransitionBuffer:
        """The demonstrations as BC data: the scripted expert's clean labels, and ``offline_files`` as stored (with
        room for the interventions' corrections)."""
        episodes: list[Episode] = self.offline_episodes(expert_labels=True)
        if not episodes:
            raise ValueError("algo.extra.conrft needs demonstrations for its BC term: offline_demos > 0 or "
                             "offline_files")
        room = self.p.correction_room(self.p.buffer_capacity)
        data = TransitionBuffer(sum(e.length for e in episodes) + 1 + room, self.ctx.cfg.algo.gamma, self.CHUNKED)
        for episode in episodes:
            data.add(episode)
        return data

    def actor_weights(self, step: int | None) -> tuple[float, float]:
        """(β, η): the offline weights when ``step`` is None, else β_t at trainer step t and the online η."""
        p = self.p
        if step is None:
            return p.bc_weight, p.q_weight
        beta = max(p.online_bc_min, p.online_bc_weight - p.online_bc_decay * (step - 1))
        return beta, p.online_q_weight

    def learner_step(self, batch: Transitions, generator: torch.Generator, cql_alpha: float,
                     step: int | None) -> tuple[torch.Tensor, dict[str, float]]:
        """One critic update, then ConRFT's actor loss −η·mean_i Q_i(s, ã) + β·L_BC (module docstring)."""
        policy, learner = self.ctx.policy, self.learner
        h_pi = policy.features(batch.images, batch.proprio, batch.instruction_ids)
        metrics = learner.critic_step(batch, h_pi.detach(), generator, cql_alpha, self.p.calibrated)
        actions, _ = policy.rsample_actions(h_pi, generator)
        q_pi = learner.q_for_actor(batch, actions)  # [E, B]
        q_term = -(q_pi.mean(0) if self.p.actor_reduce == "mean" else q_pi.min(0).values).mean()
        demos = self.bc_data.sample(self.p.bc_batch_size, generator)
        h_demo = policy.features(demos.images, demos.proprio, demos.instruction_ids)
        bc = policy.imitation_loss(h_demo, demos.actions, generator)  # the consistency (or flow-matching) BC loss
        beta, eta = self.actor_weights(step)
        loss = eta * q_term + beta * bc
        metrics |= {"loss/actor": loss.item(), "conrft/bc_loss": bc.item(), "conrft/q_policy": -q_term.item(),
                    "conrft/bc_weight": beta, "conrft/q_weight": eta}
        return loss, metrics

    def store(self, episode: Episode) -> None:
        """The episode into the online buffer as executed; its taken-over decisions join the BC data
        (:meth:`Interventions.record`)."""
        super().store(episode)
        self.interventions.record(episode, self.bc_data)

    def prepare(self, batch: Scored) -> None:
        self.interventions.begin_step()
        super().prepare(batch)

    def metrics(self) -> dict[str, float]:
        return super().metrics() | self.interventions.metrics()

    def extra_state(self) -> dict[str, Any]:
        """With interventions: their count and the BC data (it grows with them); else nothing (drawn again)."""
        if not self.interventions.on:
            return {}
        return self.interventions.state_dict() | {"bc_data": self.bc_data.state_dict()}

    def load_extra_state(self, saved: dict[str, Any]) -> None:
        if self.interventions.on:
            self.interventions.load_state_dict(saved)
            self.bc_data.load_state_dict(saved["bc_data"])
