"""Value-based, off-policy fine-tuning of embodied policies (issue 27), through the trainer's hooks.

An off-policy learner is a registered :class:`~mmrl.algos.hooks.LossHook` factory in
:data:`OFFPOLICY_LEARNERS`, chosen by ``algo.offpolicy`` (with ``algo.policy_loss: none``): its ``prepare``
stores each step's episodes in a replay buffer, its ``update_term`` does critic updates from buffer
samples and returns the actor loss, which the trainer backpropagates and steps. The trainer stays one
loop: collect → store → sample → update.

Pieces shared by the family:

- :mod:`~mmrl.algos.offpolicy.episodes`: :class:`Episode` and the episode file format (offline data:
  scripted-expert demonstrations, logged rollouts — the ``episode_log`` rollout hook, ``rollout.log_episodes``);
- :mod:`~mmrl.algos.offpolicy.buffer`: :class:`TransitionBuffer` (seeded sampling, exact ``state_dict``);
- :mod:`~mmrl.algos.offpolicy.formulas`: TD target, Cal-QL's conservative term, SAC actor / temperature
  losses, Polyak averaging (pure functions);
- :mod:`~mmrl.algos.offpolicy.critic` and :mod:`~mmrl.algos.offpolicy.learner`: the Q ensemble and
  :class:`ActorCritic`, one update of critic, target, actor loss and α;
- :mod:`~mmrl.algos.offpolicy.interventions`: :class:`Interventions`, the scripted expert's takeovers standing in
  for human interventions (EXPO-FT's and ConRFT's ``interventions`` / ``intervention_after``).

Learners: ``wsrl`` (WSRL, seed #57: Cal-QL offline → warm-up rollouts → online SAC without offline data);
``co_rft`` (CO-RFT, seed #97: chunked TD over whole action chunks, γ per env step, offline on demonstrations,
then fine-tuning on a buffer that keeps them); ``conrft`` (ConRFT, seed #90: a consistency-policy actor, Cal-QL +
consistency BC offline, then Q-learning with a decaying BC weight online); ``expo_ft`` (EXPO-FT, seed #89: a
bounded edit actor on the base VLA's decisions, Q-guided selection over base samples and their edits for acting and
for the TD target, the base trained by BC only); ``dsrl`` (DSRL, the fine-tuning of the CSP / TMRL seed #98: SAC
over the noise a frozen flow head starts from, with an action critic Q^A and a latent critic Q^W distilled from it).
"""

from __future__ import annotations

from collections.abc import Callable

from mmrl.algos.hooks import LOSS_HOOKS, ROLLOUT_HOOKS, HookContext, HookSpec, LossHook
from mmrl.algos.offpolicy.buffer import TransitionBuffer, Transitions, chunked_return_to_go, discounted_return_to_go
from mmrl.algos.offpolicy.co_rft import CORFT, CORFTParams
from mmrl.algos.offpolicy.conrft import ConRFT, ConRFTParams
from mmrl.algos.offpolicy.dsrl import DSRL, DSRLParams, LatentActor, LatentActorCritic
from mmrl.algos.offpolicy.expo_ft import EXPOFT, EXPOFTParams, EditActor, OnTheFlyCritic
from mmrl.algos.offpolicy.episodes import (Episode, episode_from_demonstration, episodes_from_rollout, read_episodes,
                                           write_episodes)
from mmrl.algos.offpolicy.interventions import InterventionParams, Interventions
from mmrl.algos.offpolicy.formulas import (actor_loss, calql_penalty, chunk_td_target, latent_distillation_loss,
                                           polyak_update, q_guided_choice, squashed_latent_logprob,
                                           tanh_gaussian_logprob, td_target, temperature_loss)
from mmrl.algos.offpolicy.learner import ActorCritic, ContinuousActor, CriticSettings
from mmrl.algos.offpolicy.episode_log import EpisodeLog, read_logged_episodes
from mmrl.algos.offpolicy.wsrl import WSRL, WSRLParams
from mmrl.core.registry import Registry

OFFPOLICY_LEARNERS: Registry[Callable[[HookContext], LossHook]] = Registry("off-policy learner")
OFFPOLICY_LEARNERS.register("wsrl", WSRL)
OFFPOLICY_LEARNERS.register("co_rft", CORFT)
OFFPOLICY_LEARNERS.register("conrft", ConRFT)
OFFPOLICY_LEARNERS.register("expo_ft", EXPOFT)
OFFPOLICY_LEARNERS.register("dsrl", DSRL)
LEARNERS_WITHOUT_LOGPROB = frozenset({"conrft", "expo_ft", "dsrl"})
"""Learners that need no log π of the run's policy (a deterministic actor such as the consistency head; EXPO-FT's
base, trained by BC only, whose edit actor has a density of its own; DSRL's frozen flow head, whose latent actor
has one): the only ones a policy without
log-probabilities may train with (checked when the recipe is loaded)."""

LOSS_HOOKS.register("offpolicy", HookSpec(lambda cfg: cfg.algo.offpolicy is not None,
                                          lambda ctx: OFFPOLICY_LEARNERS.get(ctx.cfg.algo.offpolicy)(ctx)))
ROLLOUT_HOOKS.register("episode_log", HookSpec(lambda cfg: cfg.rollout.log_episodes, EpisodeLog))

__all__ = ["OFFPOLICY_LEARNERS", "LEARNERS_WITHOUT_LOGPROB", "CORFT", "DSRL", "DSRLParams", "LatentActor",
           "LatentActorCritic", "latent_distillation_loss", "squashed_latent_logprob", "EXPOFT", "EXPOFTParams", "EditActor",
           "OnTheFlyCritic", "q_guided_choice", "tanh_gaussian_logprob", "ConRFT", "ConRFTParams", "WSRL", "ActorCritic", "CORFTParams", "ContinuousActor", "CriticSettings", "Episode", "EpisodeLog",
           "InterventionParams", "Interventions",
           "TransitionBuffer", "Transitions", "WSRLParams", "actor_loss", "calql_penalty", "chunk_td_target", "chunked_return_to_go", "discounted_return_to_go",
           "episode_from_demonstration", "episodes_from_rollout", "polyak_update", "read_episodes",
           "read_logged_episodes", "td_target", "temperature_loss", "write_episodes"]
