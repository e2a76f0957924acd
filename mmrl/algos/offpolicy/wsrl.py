"""WSRL — Warm-start RL (Zhou et al. 2025, "Efficient Online Reinforcement Learning Fine-Tuning Need Not
Retain Offline Data", ICLR 2025; seed paper #57), as a loss hook of the one trainer loop.

Three phases:

1. **Offline pre-training** (when the hook is built, before the first rollout): Cal-QL (Nakamoto et al.
   2023) on offline episodes — ``offline_demos`` scripted-expert demonstrations of the task's train split
   (``task.reference_output``, which must record executed actions and rewards) and any ``offline_files``
   (:mod:`mmrl.algos.offpolicy.episodes`): ``offline_steps`` updates of critic + actor
   (:meth:`ActorCritic.update` with the calibrated conservative term), the actor with an optimizer of this
   phase (Adam, ``trainer.lr``, ``trainer.grad_clip``) from ``offline_actor_start`` on. The result
   (critic, target, α, policy weights) is written to ``<run>/offpolicy/offline.pt``; a resumed run reads it
   instead of training again.
2. **Warm-up**: the first ``warmup_steps`` trainer steps only collect: the pre-trained policy's rollouts
   seed a *fresh* online buffer (the offline data is dropped). WSRL's point: these few rollouts
   re-calibrate the offline Q-function to the online distribution, so the offline data need not be kept.
3. **Online** Q-learning on the online buffer only, without the conservative term (SAC with the pre-trained
   critic and policy): every trainer optimizer step, ``critic_updates`` critic updates on batches of the
   online buffer, then the actor loss of the last one is returned to the trainer, which backpropagates it
   and steps the policy with its own optimizer.

PRFT option (``reward_model``, seed #83): a reward predictor trained on the offline data in phase 1 replaces
the env's rewards of every stored rollout (:mod:`mmrl.algos.offpolicy.reward_model`).

How it fits the loop (``trainer.update``): ``prepare(batch)`` stores the step's episodes; ``update_term``
is called once per (epoch, minibatch) optimizer step; run it with ``algo.policy_loss: none`` so the
policy-gradient term is zero (the advantage estimator's output is unused). Updates per step =
``trainer.ppo_epochs`` × ``trainer.minibatches``. Single process only (each process would learn its own
critic from its own rows).

State (exact resume): the online buffer, critic, target, optimizers, α and counters are saved with each
checkpoint to ``<run>/offpolicy/state_step_<n>.pt`` (the trainer state names the file; the last
``checkpoint.keep_last`` are kept).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from mmrl.algos.hooks import HookContext, LossHook, UpdateIndex
from mmrl.algos.offpolicy.buffer import TransitionBuffer, Transitions
from mmrl.algos.offpolicy.episodes import (Episode, RecordedDemonstration, episode_from_demonstration,
                                           episodes_from_rollout, executed_by, read_episodes)
from mmrl.algos.offpolicy.learner import ActorCritic, CriticSettings
from mmrl.algos.offpolicy.reward_model import RewardModel, correlation, relabel, train_reward_model
from mmrl.algos.variants.params import declare_variant, variant_params
from mmrl.core.rollout import derive_seed
from mmrl.core.scored import Scored

STATE_DIR = "offpolicy"
OFFLINE_FILE = "offline.pt"


@dataclass(frozen=True)
class WSRLParams:
    """``algo.extra.wsrl``. Defaults: the papers' where they carry over to the tiny VLA, else INFERRED."""

    # -- critic (Cal-QL / SAC; REDQ's subset min) ------------------------------------------------
    ensemble_size: int = 2
    """Q heads E (SAC / Cal-QL: 2; WSRL uses a 10-member ensemble online, REDQ-style)."""
    target_subset: int = 2
    """Target members M of the min in the TD target (clipped double Q: M = E = 2; REDQ: M = 2 of E = 10)."""
    critic_width: int = 256
    """Hidden width of each Q head (Cal-QL: 256)."""
    critic_lr: float = 3e-4
    """Adam lr of the critic (Cal-QL / SAC: 3e-4)."""
    tau: float = 0.005
    """Polyak rate of the target critic (SAC: 0.005)."""
    batch_size: int = 128
    """Transitions per update (Cal-QL: 256; INFERRED 128 for CPU)."""
    buffer_capacity: int = 50_000
    """Decisions the online buffer holds (the offline buffer holds exactly its data)."""
    init_alpha: float = 0.01
    """Initial entropy temperature α (INFERRED for rewards of the potential's scale, returns ≤ 2)."""
    auto_alpha: bool = True
    """Tune α toward ``target_entropy`` (SAC v2)."""
    alpha_lr: float = 3e-4
    target_entropy: float | None = None
    """H̄; None: −(decision size) (SAC's −dim A)."""
    backup_entropy: bool = False
    """Subtract α log π(a'|s') in the TD target (SAC: true; Cal-QL / CQL code: false)."""
    actor_reduce: Literal["min", "mean"] = "min"
    """Ensemble reduction in the actor loss (SAC: min; REDQ: mean)."""
    critic_updates: int = 1
    """Critic updates per trainer optimizer step (the update-to-data knob; the actor is updated once)."""
    # -- offline phase (Cal-QL) --------------------------------------------------------------------
    offline_demos: int = 64
    """Scripted-expert episodes of the task's train split in the offline data (``task.reference_output``)."""
    offline_files: tuple[str, ...] = ()
    """Episode files (:mod:`mmrl.algos.offpolicy.episodes`, e.g. logged rollouts of earlier runs) added to it."""
    offline_steps: int = 300
    """Cal-QL updates before the first rollout (Cal-QL: 1 M; INFERRED for the tiny budget)."""
    offline_actor_start: int = 0
    """Offline updates before the actor starts moving (the critic first learns the BC policy's values)."""
    cql_alpha: float = 1.0
    """Weight of the conservative term offline (Cal-QL: 5 on AntMaze, 1 on Adroit / kitchen)."""
    cql_samples: int = 4
    """Actions per state of each kind (uniform, π(s), π(s')) in the log-sum-exp (CQL: 10)."""
    cql_temperature: float = 1.0
    """τ of the log-sum-exp (CQL: 1)."""
    calibrated: bool = True
    """Cal-QL's lower bound by the data's Monte-Carlo return; false gives plain CQL(H)."""
    # -- warm-up ------------------------------------------------------------------------------------
    warmup_steps: int = 1
    """Trainer steps whose rollouts only seed the online buffer (WSRL: 5,000 env steps; INFERRED one step)."""
    # -- PRFT: predicted rewards ----------------------------------------------------------------------
    reward_model: bool = False
    """PRFT (seed #83): train a reward predictor on the offline data and store the policy's rollouts with
    its predicted rewards instead of the env's (:mod:`mmrl.algos.offpolicy.reward_model`)."""
    reward_model_steps: int = 500
    """Adam updates of the reward model (INFERRED for the tiny budget)."""
    reward_model_lr: float = 1e-3
    reward_model_width: int = 256
    reward_model_train_encoder: bool = True
    """Fine-tune the reward model's copy of the policy's encoder (false: heads on its frozen features)."""
    reward_model_head: Literal["mse", "success"] = "mse"
    """``mse``: one regression of the whole reward; ``success`` (INFERRED): a dense-reward regression plus a
    success classifier, r̂ = dense + b·P(success) (:mod:`mmrl.algos.offpolicy.reward_model`); under reach's
    colour shift its predictions stayed far closer to the env's rewards (docs/algorithms.md, PRFT)."""
    reward_model_success_bonus: float = 1.0
    """b: the reward paid once at the step that reaches the goal (the table-top potential's ``1·success``)."""


declare_variant("wsrl", WSRLParams)


def critic_settings(p: WSRLParams, gamma: float, chunked: bool = False) -> CriticSettings:
    return CriticSettings(p.ensemble_size, p.target_subset, p.critic_width, p.critic_lr, p.tau, gamma,
                          p.init_alpha, p.auto_alpha, p.alpha_lr, p.target_entropy, p.backup_entropy, p.actor_reduce,
                          p.cql_samples, p.cql_temperature, chunked)


class WSRL(LossHook):
    NAME = "wsrl"
    """The learner's registered name and its ``algo.extra`` section."""
    CHUNKED = False
    """γ per env step and chunked TD backups (CO-RFT) instead of γ per decision."""

    def __init__(self, ctx: HookContext):
        if ctx.engine.world_size != 1:
            raise ValueError(f"algo.offpolicy: {self.NAME} runs in one process (got {ctx.engine.world_size}): each "
                             f"process would learn its own critic from its own rows")
        if ctx.out is None:
            raise ValueError(f"algo.offpolicy: {self.NAME} keeps its offline result and state in the run folder: "
                             f"give one")
        self.ctx, cfg = ctx, ctx.cfg
        self.p: WSRLParams = variant_params(cfg.algo, self.NAME)
        if self.p.reward_model and self.p.offline_steps == 0:
            raise ValueError(f"algo.extra.{self.NAME}.reward_model is trained in the offline phase: set "
                             f"offline_steps > 0 (and give offline data)")
        self.reward_model: RewardModel | None = None
        self.relabel_error: list[float] = []
        self.relabel_corr: float | None = None
        self.folder = Path(ctx.out) / STATE_DIR
        self.learner = self.build_learner()
        self.buffer = TransitionBuffer(self.p.buffer_capacity, cfg.algo.gamma, self.CHUNKED)
        self.steps, self.env_steps, self.saved = 0, 0, []
        self.sums: dict[str, float] = {}
        self.count = 0
        self.offline_data: list[Episode] = []
        self.offline_metrics = self.offline_phase()
        self.seed_online_buffer()

    def build_learner(self) -> ActorCritic:
        """The critic ensemble, its target and α around the run's policy (SAC's :class:`ActorCritic`)."""
        cfg = self.ctx.cfg
        return ActorCritic(self.ctx.policy, critic_settings(self.p, cfg.algo.gamma, self.CHUNKED),
                           derive_seed(cfg.trainer.seed, 40))

    def seed_online_buffer(self) -> None:
        """What the online buffer starts with: nothing (WSRL drops the offline data)."""

    def online_cql_alpha(self) -> float:
        """Weight of the conservative term in online updates (WSRL: 0, plain SAC)."""
        return 0.0

    def learner_step(self, batch: Transitions, generator: torch.Generator, cql_alpha: float,
                     step: int | None) -> tuple[torch.Tensor | None, dict[str, float]]:
        """One critic update on ``batch`` and the actor loss (with graph) for it: SAC's
        (:meth:`ActorCritic.update`). ``step``: the trainer step online, None in the offline phase. A learner that
        steps an actor of its own and leaves the policy alone returns None for the loss (DSRL)."""
        return self.learner.update(batch, generator, cql_alpha, self.p.calibrated)

    # -- phase 1 --------------------------------------------------------------------------------
    def offline_episodes(self, expert_labels: bool = False) -> list[Episode]:
        """The offline data: ``offline_demos`` scripted-expert demonstrations (their executed actions, or with
        ``expert_labels`` their clean labels) and the ``offline_files`` episodes."""
        p, policy, task = self.p, self.ctx.policy, self.ctx.task
        episodes: list[Episode] = []
        if p.offline_demos:
            rng = np.random.default_rng(derive_seed(self.ctx.cfg.trainer.seed, 43))
            for example in task.sample_batch("train", p.offline_demos, rng):
                demo = task.reference_output(example)
                if not isinstance(demo, RecordedDemonstration):
                    raise ValueError(f"algo.extra.{self.NAME}.offline_demos: {self.ctx.cfg.task.name}'s reference_output "
                                     f"({type(demo).__name__}) records no executed actions / rewards; set it to 0 "
                                     f"and give offline_files")
                action_dims = demo.executed_actions.shape[1]
                ids = policy.encode_instructions([demo.instruction])[0].numpy()
                episodes.append(episode_from_demonstration(demo, ids, policy.decision_size // action_dims,
                                                           expert_labels))
        for path in p.offline_files:
            episodes += read_episodes(path)
        for episode in episodes:
            if episode.actions.shape[1] != policy.decision_size:
                raise ValueError(f"algo.extra.{self.NAME}: an offline episode has decisions of {episode.actions.shape[1]} "
                                 f"numbers, the policy's are {policy.decision_size} (chunk · action dims)")
        return episodes

    def offline_phase(self) -> dict[str, float]:
        """Cal-QL pre-training of critic and policy, or its saved result (see the module docstring)."""
        p, cfg, policy, path = self.p, self.ctx.cfg, self.ctx.policy, self.folder / OFFLINE_FILE
        if path.is_file():
            saved = torch.load(path, weights_only=True)
            self.learner.load_state_dict(saved["learner"])
            if "reward_model" in saved:
                self.reward_model = RewardModel.from_policy(policy, int(saved["reward_model_chunk"]),
                                                            p.reward_model_width, 0, p.reward_model_train_encoder,
                                                            p.reward_model_head, p.reward_model_success_bonus)
                self.reward_model.load_state_dict(saved["reward_model"])
                self.reward_model.requires_grad_(False).eval()
            policy.load_state_dict(saved["policy"])
            return {k: float(v) for k, v in saved["metrics"].items()}
        if p.offline_steps == 0:
            return {}
        episodes = self.offline_episodes()
        if not episodes:
            raise ValueError(f"algo.extra.{self.NAME}.offline_steps > 0 needs offline data: offline_demos or "
                             f"offline_files")
        self.offline_data = episodes
        data = TransitionBuffer(sum(e.length for e in episodes) + 1, cfg.algo.gamma, self.CHUNKED)
        for episode in episodes:
            data.add(episode)
        reward_metrics = self.train_reward_model(data) if p.reward_model else {}
        optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.trainer.lr)
        sums: dict[str, float] = {}
        for k in range(p.offline_steps):
            generator = torch.Generator().manual_seed(derive_seed(cfg.trainer.seed, 41, k))
            loss, metrics = self.learner_step(data.sample(p.batch_size, generator), generator, p.cql_alpha, None)
            if loss is not None and k >= p.offline_actor_start:  # None: the learner stepped its own actor (DSRL)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.trainer.grad_clip)
                optimizer.step()
            if k >= p.offline_steps - min(50, p.offline_steps):  # the metrics of the last 50 updates
                for key, value in metrics.items():
                    sums[key] = sums.get(key, 0.0) + value / min(50, p.offline_steps)
        policy.zero_grad(set_to_none=True)
        result = {f"offline/{key.split('/', 1)[1]}": value for key, value in sums.items()}
        result |= {"offline/transitions": float(len(data)), "offline/episodes": float(len(episodes))}
        result |= {f"offline/{k}": v for k, v in reward_metrics.items()}
        saved = {"learner": self.learner.state_dict(), "policy": policy.state_dict(),
                 "metrics": {k: torch.tensor(v) for k, v in result.items()}}
        if self.reward_model is not None:
            saved |= {"reward_model": self.reward_model.state_dict(),
                      "reward_model_chunk": torch.tensor(data.arrays["chunk_rewards"].shape[1])}
        save_atomic(saved, path)
        return result

    def train_reward_model(self, data: TransitionBuffer) -> dict[str, float]:
        """PRFT's reward predictor on the offline data (encoder copied from the warm-started policy), then frozen."""
        p, seed = self.p, self.ctx.cfg.trainer.seed
        chunk = data.arrays["chunk_rewards"].shape[1]
        self.reward_model = RewardModel.from_policy(self.ctx.policy, chunk, p.reward_model_width, derive_seed(seed, 44),
                                                    p.reward_model_train_encoder, p.reward_model_head,
                                                    p.reward_model_success_bonus)
        metrics = train_reward_model(self.reward_model, data, p.reward_model_steps, p.batch_size, p.reward_model_lr,
                                     derive_seed(seed, 45))
        self.reward_model.requires_grad_(False).eval()
        return metrics

    # -- phases 2 and 3 -------------------------------------------------------------------------
    def prepare(self, batch: Scored) -> None:
        """Store the step's episodes in the online buffer."""
        self.steps += 1
        self.relabel_error, true, predicted = [], [], []
        for episode in episodes_from_rollout(batch.rollout, executed_by(self.ctx.policy)):
            if self.reward_model is not None:  # PRFT: store the predicted rewards, not the env's
                true.append(episode.rewards)
                episode, error = relabel(self.reward_model, episode)
                self.relabel_error.append(error)
                predicted.append(episode.rewards)
            self.store(episode)
        self.relabel_corr = correlation(np.concatenate(true), np.concatenate(predicted)) if true else None
        self.env_steps += sum(int(o.length) for o in batch.rollout.outputs)
        self.sums, self.count = {}, 0

    def store(self, episode: Episode) -> None:
        """Keep one of the step's episodes: into the online buffer."""
        self.buffer.add(episode)

    def update_term(self, index: UpdateIndex) -> tuple[torch.Tensor, dict[str, float]] | None:
        if self.steps <= self.p.warmup_steps:
            return None
        for k in range(self.p.critic_updates):
            seed = derive_seed(self.ctx.cfg.trainer.seed, index.step, index.epoch, index.minibatch, k, 42)
            generator = torch.Generator().manual_seed(seed)
            loss, metrics = self.learner_step(self.buffer.sample(self.p.batch_size, generator), generator,
                                              self.online_cql_alpha(), index.step)
            for key, value in metrics.items():
                self.sums[key] = self.sums.get(key, 0.0) + value
            self.count += 1
        if loss is None:  # the learner stepped its own actor (DSRL): nothing for the trainer's optimizer
            return None
        return loss, {"loss/actor": metrics["loss/actor"], "loss/critic_td": metrics["loss/critic_td"]}

    def metrics(self) -> dict[str, float]:
        out = {key: value / self.count for key, value in self.sums.items() if not key.startswith("loss/")}
        out |= {"offpolicy/buffer_transitions": float(len(self.buffer)), "offpolicy/env_steps": float(self.env_steps),
                "offpolicy/online": float(self.steps > self.p.warmup_steps)}
        if self.relabel_error:
            out["prft/reward_abs_error"] = sum(self.relabel_error) / len(self.relabel_error)
        if self.relabel_corr is not None:
            out["prft/reward_corr"] = self.relabel_corr
        if self.steps == 1:
            out |= self.offline_metrics
        return out

    # -- exact resume ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        name = f"state_step_{self.steps}.pt"
        save_atomic({"learner": self.learner.state_dict(), "buffer": self.buffer.state_dict(),
                     "counters": torch.tensor([self.steps, self.env_steps]), **self.extra_state()}, self.folder / name)
        self.saved = [n for n in self.saved if n != name] + [name]
        keep = self.ctx.cfg.checkpoint.keep_last
        while keep > 0 and len(self.saved) > keep:
            (self.folder / self.saved.pop(0)).unlink(missing_ok=True)
        return {"file": name, "saved": list(self.saved)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "file" not in state:
            raise ValueError(f"the checkpoint holds no state of algo.offpolicy: {self.NAME} (written by another "
                             f"recipe?)")
        saved = torch.load(self.folder / state["file"], weights_only=True)
        self.learner.load_state_dict(saved["learner"])
        self.buffer.load_state_dict(saved["buffer"])
        self.steps, self.env_steps = (int(x) for x in saved["counters"])
        self.saved = list(state["saved"])
        self.load_extra_state(saved)

    def extra_state(self) -> dict[str, Any]:
        """More tensors a subclass keeps in each state file (``torch.save``-able with ``weights_only``)."""
        return {}

    def load_extra_state(self, saved: dict[str, Any]) -> None:
        """Restore :meth:`extra_state` from a state file."""


def save_atomic(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)

