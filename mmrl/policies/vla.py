"""A tiny vision-language-action policy that trains on CPU, with a shared actor-critic trunk.

    image [H,W,3] ─ conv encoder + spatial soft-argmax ─┐
    instruction ─ hashed word embeddings, mean-pooled ──┼─ MLP trunk ─ h ─┬─ action head ─ chunk of actions
    proprio [P] ─ linear ───────────────────────────────┘                 └─ value head ─ V(s)

Action heads (``action_head``):

- ``tokens``: OpenVLA-style discretised actions (Kim et al. 2024, §3): each action dimension of
  each chunk step is one of ``bins`` = 256 uniform bins over [−1, 1] (the bin centre is executed);
  the tokens of one decision are predicted in parallel from ``h`` (OpenVLA-OFT's parallel
  decoding), and log π(decision) = Σ over the decision's action tokens of log softmax(logits/τ).
- ``gaussian``: a Gaussian chunk head with a learned, state-dependent noise scale (VLA-RFT's
  σ-network, Li et al. 2025): a ~ N(μ(h), (τ·σ(h))²) per dimension; log π = Σ_dims log N.
  With ``squash: tanh`` (SAC's bounded actions, Haarnoja et al. 2018, app. C) the sample u of that
  Gaussian is executed as a = tanh(u) ∈ (−1, 1) and log π(a) = Σ_dims [log N(u) − log(1 − tanh²(u))];
  the payload stores u, so re-scoring is exact (no atanh of a saturated action).
- ``consistency``: a consistency-model head (:mod:`mmrl.policies.consistency`; ConRFT, seed #90):
  a = f_θ(σ_max z, σ_max, h) in ``consistency_steps`` evaluations from Gaussian noise, a deterministic,
  differentiable function of (h, z) with **no log-probability**. It trains by behaviour cloning
  (``sft_loss``: the consistency BC loss) and by off-policy learners that need no density
  (``algo.offpolicy: conrft``); the on-policy objectives are refused when the recipe is loaded
  (:meth:`VLAConfig.decisions_without_logprob`). The rollout's recorded log-probs are zeros.
- ``flow``: a conditional flow-matching head (:mod:`mmrl.policies.flow_head`; π0's action expert, CSP / TMRL's
  seed #98 fine-tunes one with DSRL): a = g_θ(h, z), ``flow_steps`` Euler steps of a velocity net v_θ(x, τ, h)
  from the noise z ~ N(0, τ_s² I) (τ_s the rollout's temperature; greedy: z = 0), a deterministic, differentiable
  function of (h, z) with **no log-probability**, trained by behaviour cloning with the flow-matching loss and by
  the off-policy learners that need no density (``algo.offpolicy: dsrl`` steers its noise; ``conrft``,
  ``expo_ft`` use it as they use the consistency head).

Context smoothing (``context_smoothing``, CSP, seed #98; :mod:`mmrl.policies.context_smoothing`): behaviour
cloning sees the image / proprio noised by one forward-diffusion step at a level t ~ U{0..K−1}, embedded into the
trunk. With ``timestep_policy`` (TMRL) each decision is a pair (t, a): t ~ π(t | x) on the clean context, then
a ~ π(a | x_t, t) on the context noised to t (noise seeded per decision, stored in the payload), so
log π(decision) = log π(a | x_t, t) + log π(t | x); greedy decoding (τ = 0) acts at t = 0. The value head reads
the clean context.

A decision is one action chunk of ``chunk`` env steps, executed open loop (action chunking,
Zhao et al. 2023). The value head reads the same pre-action features ``h`` (RL4VLA's value head on
the hidden state before the first action token: MLP h → 128 → GELU → 1).

The policy imports gymnasium only (through :mod:`mmrl.samplers.gym_runner`); examples carry an
``env_id`` and a ``seed``. Behaviour cloning (:meth:`VLAPolicy.sft_loss`) takes demonstrations
with ``images [T,H,W,3]``, ``proprio [T,P]``, ``instruction`` and expert ``actions [T,A]``.

Wrapping a pretrained VLA (e.g. an OpenVLA-style HF checkpoint on a GPU) keeps this interface:
``rollout`` → the same runner with a ``decide`` that calls the model's processor + ``generate``
over the 7 action tokens (their summed log-probs and the hidden state before the first action
token for the value head); ``forward`` re-scores the stored observations and action tokens with
teacher forcing. See docs/vla.md.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from torch.nn import functional as F

from mmrl.core.contracts import ActionSelector, Policy, PolicyOutput, TakeoverPlan, Takeovers
from mmrl.core.rollout import Rollout, SamplingParams, derive_seed
from mmrl.core.typed import ConfigError
from mmrl.policies.consistency import ConsistencyHead, NoiseLevels
from mmrl.policies.context_smoothing import ContextSmoothing, alpha_bars, context_noise, noise_context
from mmrl.policies.flow_head import FlowHead
from mmrl.samplers.gym_runner import EpisodeBatch, GymRunner

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
BC_TANH_MARGIN = 0.05
"""Behaviour cloning of a tanh-squashed head fits atanh(a) of the expert's action a clipped to ±(1 − this):
saturated expert actions (±1, 68 % of reach's labels) would otherwise have an infinite pre-squash target
(INFERRED: measured on reach, BC 120 steps, test success 0.25 at 0.05 against 0.17 at 1e-3; atanh(0.95) ≈ 1.83)."""
FLOW_BC_STREAM = 100
"""The seed stream of the flow head's BC draws (τ, z): ``derive_seed(init_seed, FLOW_BC_STREAM, draw)``."""


@dataclass(frozen=True)
class VLAConfig:
    action_dims: int = 2
    """Action dimensions of the env (reach/push: 2 end-effector deltas; pick-and-place: 4 with grip)."""
    action_head: Literal["tokens", "gaussian", "consistency", "flow"] = "tokens"
    """Discretised action tokens (OpenVLA), a Gaussian chunk head with a learned σ (VLA-RFT), a consistency
    model of the chunk (ConRFT) or a flow-matching model of it (π0; DSRL). The last two have no log-probability:
    off-policy learners only."""
    bins: int = 256
    """Bins per action dimension of the token head (OpenVLA: 256)."""
    chunk: int = 1
    """Actions per decision (action chunking); one decision = ``chunk`` env steps."""
    image_size: int = 64
    """Side of the square RGB observation (must match the env's ``image_size``)."""
    proprio_dims: int = 4
    channels: tuple[int, ...] = (16, 32, 32)
    """Conv encoder widths (first layer stride 2, 5×5; then 3×3, strides 2, 1)."""
    hidden: int = 128
    """Width of the trunk and of the instruction embedding."""
    vocab_buckets: int = 512
    """Instruction words are hashed (crc32) into this many embedding rows: no vocabulary file,
    and unseen words (paraphrases) still map to a row."""
    value_head: bool = True
    """Critic on the pre-action features (PPO with GAE)."""
    log_std_init: float = -1.0
    """Gaussian head: initial log σ (the σ-net's bias)."""
    log_std_range: tuple[float, float] = (-3.0, 0.5)
    """Gaussian head: log σ is squashed into this range."""
    squash: Literal["none", "tanh"] = "none"
    """Gaussian head: execute the sample as is (clipped to [−1, 1] by the env step) or as tanh(sample)
    with the change-of-variables term in log π (SAC's bounded actions)."""
    consistency_levels: NoiseLevels = field(default_factory=NoiseLevels)
    """Consistency head: σ_min, σ_max, σ_data, ρ and the N training levels (Song et al. 2023 / EDM defaults)."""
    consistency_steps: int = 1
    """Consistency head: network evaluations per sampled decision (1: one-step generation)."""
    consistency_width: int = 128
    """Consistency head: hidden width of F_θ (INFERRED for the tiny VLA)."""
    flow_steps: int = 10
    """Flow head: Euler steps from the noise to the action (π0: 10)."""
    flow_width: int = 128
    """Flow head: hidden width of the velocity net v_θ (INFERRED for the tiny VLA)."""
    max_decisions: int = 50
    """Decisions per episode at most (the env's time limit usually ends it first)."""
    num_envs: int = 32
    """Episodes stepped together in one vector env (larger batches run in several rounds)."""
    vector_mode: Literal["sync", "async"] = "sync"
    """gymnasium ``SyncVectorEnv`` (one process) or ``AsyncVectorEnv`` (a subprocess per env)."""
    env_kwargs: dict = field(default_factory=dict)
    """Extra ``gymnasium.make`` arguments; ``image_size`` is always passed."""
    init_seed: int = 0
    """Seed of the initial weights."""
    pretrained: str | None = None
    """A folder written by ``save_pretrained`` (e.g. by ``mmrl bc``) to start from."""
    context_smoothing: ContextSmoothing | None = None
    """CSP (seed #98, :mod:`mmrl.policies.context_smoothing`): behaviour cloning noises the chosen inputs at a
    level t ~ U{0..K−1} and conditions the trunk on t (an embedding added to the proprio projection). None: off."""
    timestep_policy: Literal["none", "fixed", "learned"] = "none"
    """TMRL: how rollouts choose each decision's context level t (needs ``context_smoothing``). ``none``: t = 0
    (plain RL on the CSP policy); ``fixed``: t ~ U{0..K−1} (log π(t) = −log K); ``learned``: a categorical head
    π(t | x) on the clean context, trained with the actions by the policy gradient. Greedy decoding (τ = 0,
    evaluation) always uses t = 0, the exact context (INFERRED; see docs/vla.md)."""

    def __post_init__(self) -> None:
        if self.timestep_policy != "none" and self.context_smoothing is None:
            raise ConfigError(f"policy.args.timestep_policy: {self.timestep_policy} chooses a context level and "
                              f"needs policy.args.context_smoothing (e.g. {{levels: 10}})")
        if self.timestep_policy != "none" and self.action_head in ("consistency", "flow"):
            raise ConfigError("policy.args.timestep_policy needs an action head with log π (tokens or gaussian): "
                              "the timestep's log-probability is trained with the actions' by the policy gradient")

    @property
    def modulates_timestep(self) -> bool:
        """Whether rollouts choose a context level per decision (TMRL: ``timestep_policy`` fixed or learned)."""
        return self.timestep_policy != "none"

    def decisions_without_logprob(self) -> str | None:
        """Why this head's decisions have no log-probability (the consistency and flow heads), else None: the
        recipe loader then refuses every objective that reads log π (:class:`mmrl.core.contracts.LogprobFreeConfig`)."""
        if self.action_head in ("consistency", "flow"):
            return f"policy.args.action_head: {self.action_head} samples actions without a log-probability"
        return None

    def discrete_decisions(self) -> str | None:
        """Why this head's decisions are discrete (the token head), else None: the recipe loader then refuses the
        off-policy learners (:class:`mmrl.core.contracts.DiscreteDecisionConfig`)."""
        if self.action_head == "tokens":
            return "policy.args.action_head: tokens samples discrete action tokens"
        return None


def tanh_log_abs_det(u: Tensor) -> Tensor:
    """log |d tanh(u)/du| = log(1 − tanh²(u)) = 2 (log 2 − u − softplus(−2u)), elementwise and stable for
    large |u| (the direct form is log 0 = −inf once tanh(u) rounds to ±1; SAC's reference code)."""
    return 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))


def squashed_entropy_estimate(gaussian_entropy: Tensor, u: Tensor) -> Tensor:
    """H[tanh(u)] = H[u] + E[log(1 − tanh²(u))] has no closed form: this is its one-sample estimate at the
    stored samples ``u`` [B, D] (``gaussian_entropy`` [B], the Gaussian's summed entropy) → [B]."""
    return gaussian_entropy + tanh_log_abs_det(u).sum(-1)


def unscored_logprob(h: Tensor) -> Tensor:
    """The consistency and flow heads' stand-in for log π in :meth:`VLAPolicy.forward`: zeros [B], kept in the graph
    (0 · Σ h) so the trainer's zero policy-gradient term of an off-policy run backpropagates like any other
    head's. Objectives that would read it are refused when the recipe is loaded."""
    return h.float().sum(-1) * 0.0


def instruction_ids(texts: Sequence[str], buckets: int) -> tuple[Tensor, Tensor]:
    """Hashed word ids [B, L] long (0 = padding) and mask [B, L] of instructions."""
    words = [t.lower().split() for t in texts]
    length = max(1, max(len(w) for w in words))
    ids = torch.zeros(len(texts), length, dtype=torch.long)
    for i, ws in enumerate(words):
        ids[i, :len(ws)] = torch.tensor([1 + zlib.crc32(w.encode()) % (buckets - 1) for w in ws], dtype=torch.long)
    return ids, (ids > 0).float()


def tokenize_actions(actions: Tensor, bins: int) -> Tensor:
    """Continuous actions in [−1, 1] → bin indices (uniform bins, OpenVLA) ([...] → [...] long)."""
    return ((actions.clamp(-1, 1) + 1) / 2 * bins).long().clamp(0, bins - 1)


def detokenize_actions(tokens: Tensor, bins: int) -> Tensor:
    """Bin indices → bin centres −1 + (2k + 1)/bins."""
    return -1.0 + (2 * tokens.float() + 1) / bins


def run_episode_groups(policy: Any, examples: Sequence[Any], group_size: int, decide: Any,
                       record_frames: bool, takeovers: Takeovers | None = None) -> EpisodeBatch:
    """Each example's episode ``group_size`` times through ``policy.runner`` (``decide`` picks the actions;
    ``policy.cfg.chunk`` steps a decision, at most ``policy.cfg.max_decisions``; ``takeovers``: the scripted
    expert's, :meth:`GymRunner.run`), the policy in eval mode meanwhile. Shared by the env policies
    (``vla``, ``vla_vlm``)."""
    env_ids = [ex.env_id for ex in examples for _ in range(group_size)]
    seeds = [ex.seed for ex in examples for _ in range(group_size)]
    was_training = policy.training
    policy.eval()
    try:
        return policy.runner.run(env_ids, seeds, decide, policy.cfg.chunk, policy.cfg.max_decisions, record_frames,
                                 None if takeovers is None else takeovers.after,
                                 None if takeovers is None else takeovers.stall_window)
    finally:
        policy.train(was_training)


def episode_rollout(batch: EpisodeBatch, num_examples: int, group_size: int, payload: Any, version: int,
                    with_values: bool) -> Rollout:
    """The :class:`Rollout` of an env policy's episodes: a row per episode, a column per decision, the behaviour
    log-probs (and values) the policy recorded in ``batch.records``, per-decision rewards and dones."""
    mask = torch.from_numpy(batch.mask)
    example_index = torch.arange(num_examples).repeat_interleave(group_size)
    values = torch.from_numpy(batch.records["value"]) * mask if with_values else None
    return Rollout(logp=torch.from_numpy(batch.records["logp"]).float() * mask, mask=mask,
                   group_id=example_index.clone(), example_index=example_index, outputs=batch.summaries,
                   payload=payload, policy_version=version, values=values,
                   step_rewards=torch.from_numpy(batch.step_rewards) * mask, dones=torch.from_numpy(batch.dones) * mask)


class SpatialSoftArgmax(nn.Module):
    """Expected (x, y) image coordinates of each channel's softmax (Levine et al. 2016, §4.2)."""

    def forward(self, features: Tensor) -> Tensor:  # [B, C, H, W] → [B, 2C]
        b, c, h, w = features.shape
        probs = features.flatten(2).softmax(-1).view(b, c, h, w)
        ys = torch.linspace(-1, 1, h, device=features.device)
        xs = torch.linspace(-1, 1, w, device=features.device)
        return torch.cat([(probs.sum(2) * xs).sum(-1), (probs.sum(3) * ys).sum(-1)], dim=1)


@dataclass(frozen=True)
class VLAPayload:
    """What re-scoring needs. Satisfies :class:`mmrl.core.rollout.Payload`."""

    images: Tensor  # [N, T, H, W, 3] uint8
    proprio: Tensor  # [N, T, P] float32
    instruction_ids: Tensor  # [N, L] long (0 = padding)
    actions: Tensor  # [N, T, chunk·A]: long bins (tokens head) or float raw samples (gaussian head)
    mask: Tensor  # [N, T] float
    temperature: float
    chunk_rewards: Tensor | None = None  # [N, T, chunk] float: env rewards inside each decision (off-policy data)
    timesteps: Tensor | None = None  # [N, T] long: TMRL's chosen context level t per decision (0 at padding)
    context_seeds: Tensor | None = None  # [N, T] long: the seed of each decision's context noise ε
    intervened: Tensor | None = None  # [N, T] float: 1 where the env's scripted expert took the decision

    def select(self, index: Tensor) -> VLAPayload:
        def pick(x: Tensor | None) -> Tensor | None:
            return None if x is None else x[index]

        return VLAPayload(self.images[index], self.proprio[index], self.instruction_ids[index], self.actions[index],
                          self.mask[index], self.temperature, pick(self.chunk_rewards), pick(self.timesteps),
                          pick(self.context_seeds), pick(self.intervened))

    @classmethod
    def concat(cls, parts: Sequence[VLAPayload]) -> VLAPayload:
        if len({p.temperature for p in parts}) != 1:
            raise ValueError("cannot mix rollouts sampled at different temperatures")
        t_max = max(p.mask.shape[1] for p in parts)
        l_max = max(p.instruction_ids.shape[1] for p in parts)

        def pad_t(x: Tensor) -> Tensor:
            return F.pad(x, [0, 0] * (x.dim() - 2) + [0, t_max - x.shape[1]])

        def optional(name: str) -> Tensor | None:  # present in every part, or in none
            xs = [getattr(p, name) for p in parts]
            return None if any(x is None for x in xs) else torch.cat([pad_t(x) for x in xs])

        return cls(torch.cat([pad_t(p.images) for p in parts]), torch.cat([pad_t(p.proprio) for p in parts]),
                   torch.cat([F.pad(p.instruction_ids, (0, l_max - p.instruction_ids.shape[1])) for p in parts]),
                   torch.cat([pad_t(p.actions) for p in parts]), torch.cat([pad_t(p.mask) for p in parts]),
                   parts[0].temperature, optional("chunk_rewards"), optional("timesteps"), optional("context_seeds"),
                   optional("intervened"))


class VLAPolicy(Policy):
    def __init__(self, cfg: VLAConfig):
        super().__init__()
        if cfg.chunk < 1 or cfg.action_dims < 1:
            raise ValueError(f"chunk and action_dims must be >= 1, got {cfg.chunk}, {cfg.action_dims}")
        if cfg.squash not in ("none", "tanh") or (cfg.squash == "tanh" and cfg.action_head != "gaussian"):
            raise ValueError(f"policy.args.squash must be 'none' or 'tanh' (tanh with action_head: gaussian only), "
                             f"got squash {cfg.squash!r} with action_head {cfg.action_head!r}")
        levels = cfg.consistency_levels
        if not (0 < levels.sigma_min < levels.sigma_max and levels.sigma_data > 0 and levels.levels >= 2
                and cfg.consistency_steps >= 1):
            raise ValueError(f"policy.args.consistency_levels needs 0 < sigma_min < sigma_max, sigma_data > 0, "
                             f"levels >= 2 and consistency_steps >= 1; got {levels}, steps {cfg.consistency_steps}")
        if cfg.flow_steps < 1 or cfg.flow_width < 1:
            raise ValueError(f"policy.args.flow_steps and flow_width must be >= 1, got {cfg.flow_steps}, "
                             f"{cfg.flow_width}")
        self.cfg = cfg
        self.action_selector: ActionSelector | None = None
        """When set (by an off-policy learner: EXPO-FT's Q-guided selection), rollouts choose each decision with
        it instead of sampling the action head; None: the head's own samples (every on-policy recipe)."""
        self.takeover: TakeoverPlan | None = None
        """When set (by an off-policy learner: EXPO-FT's scripted interventions), the episodes it names are taken
        over by the env's scripted expert from the decision it gives; the payload stores the expert's decisions
        there and flags them (``VLAPayload.intervened``). None: the policy acts throughout."""
        self.bc_draws = 0  # consistency / flow / CSP BC draws so far: seeds their noise (no global RNG)
        layers, width = [], 3
        for i, out in enumerate(cfg.channels):
            k, s = (5, 2) if i == 0 else (3, 2 if i == 1 else 1)
            layers += [nn.Conv2d(width, out, k, stride=s, padding=k // 2), nn.GELU()]
            width = out
        self.encoder = nn.Sequential(*layers)
        self.keypoints = SpatialSoftArgmax()
        self.words = nn.Embedding(cfg.vocab_buckets, cfg.hidden, padding_idx=0)
        self.proprio = nn.Linear(cfg.proprio_dims, cfg.hidden)
        self.trunk = nn.Sequential(nn.Linear(2 * width + 2 * cfg.hidden, cfg.hidden), nn.GELU(),
                                   nn.Linear(cfg.hidden, cfg.hidden), nn.GELU())
        outputs = cfg.chunk * cfg.action_dims
        if cfg.action_head == "tokens":
            self.action_logits = nn.Linear(cfg.hidden, outputs * cfg.bins)
        elif cfg.action_head == "consistency":
            self.consistency = ConsistencyHead(cfg.hidden, outputs, cfg.consistency_width, cfg.consistency_levels)
        elif cfg.action_head == "flow":
            self.flow = FlowHead(cfg.hidden, outputs, cfg.flow_width)
        else:
            self.action_mean = nn.Linear(cfg.hidden, outputs)
            self.action_log_std = nn.Linear(cfg.hidden, outputs)  # the σ-network
            nn.init.zeros_(self.action_log_std.weight)
            lo, hi = cfg.log_std_range
            nn.init.constant_(self.action_log_std.bias, math.atanh((2 * cfg.log_std_init - lo - hi) / (hi - lo)))
        self.value = None
        if cfg.value_head:
            self.value = nn.Sequential(nn.Linear(cfg.hidden, 128), nn.GELU(), nn.Linear(128, 1))
            nn.init.normal_(self.value[2].weight, std=0.02)
            nn.init.zeros_(self.value[2].bias)
        if cfg.context_smoothing is not None:  # created last: the other weights keep their seeded initialisation
            levels = cfg.context_smoothing.levels
            self.timestep_embedding = nn.Embedding(levels, cfg.hidden)
            nn.init.zeros_(self.timestep_embedding.weight)  # t starts as a no-op on the trunk
            self.register_buffer("alpha_bars", alpha_bars(levels, cfg.context_smoothing.schedule), persistent=False)
            if cfg.timestep_policy == "learned":
                self.timestep_logits = nn.Linear(cfg.hidden, levels)  # π(t | x), uniform at the start
                nn.init.zeros_(self.timestep_logits.weight)
                nn.init.zeros_(self.timestep_logits.bias)
        self.runner = GymRunner(cfg.num_envs, cfg.vector_mode, {**cfg.env_kwargs, "image_size": cfg.image_size})
        self.register_buffer("_device_probe", torch.zeros(0), persistent=False)

    # -- construction / saving -------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg: VLAConfig) -> VLAPolicy:
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
        (out / CONFIG_FILE).write_text(json.dumps({"architecture": "mmrl.VLAPolicy", **asdict(self.cfg)}, indent=1))

    def load_weights(self, path: str) -> None:
        file = Path(path) / WEIGHTS_FILE
        if not file.is_file():
            raise FileNotFoundError(f"{file} not found: point policy.args.pretrained at a folder written by "
                                    f"save_pretrained (e.g. `mmrl bc <recipe> --out DIR`)")
        state = load_file(file)
        missing, unexpected = self.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"{file} does not fit this VLA config (missing {missing}, unexpected {unexpected}); "
                             f"compare with {Path(path) / CONFIG_FILE}")

    # -- network ---------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self._device_probe.device

    def features(self, images: Tensor, proprio: Tensor, instruction: Tensor, timesteps: Tensor | None = None,
                 noise_seeds: Tensor | None = None) -> Tensor:
        """Pre-action features h [B, hidden] from images [B,H,W,3] uint8, proprio [B,P], word ids [B,L].

        With ``context_smoothing``: the context level ``timesteps`` [B] long (None: 0, the exact context) is
        embedded into the trunk, and rows with t > 0 see their inputs noised to x_t with the noise regenerated
        from ``noise_seeds`` [B] (:func:`mmrl.policies.context_smoothing.context_noise`)."""
        if images.shape[1:] != (self.cfg.image_size, self.cfg.image_size, 3):
            raise ValueError(f"images must be [B, {self.cfg.image_size}, {self.cfg.image_size}, 3], got "
                             f"{tuple(images.shape)}: set policy.args.image_size to the env's image size")
        x = images.to(self.device).float() / 255.0 - 0.5  # [B, H, W, 3]
        p = proprio.to(self.device)
        smoothing = self.cfg.context_smoothing
        if smoothing is not None:
            t = (torch.zeros(len(x), dtype=torch.long, device=self.device) if timesteps is None
                 else timesteps.to(self.device))
            if noise_seeds is not None:
                x, p = self.smooth_context(x, p.float(), t, noise_seeds)
        keypoints = self.keypoints(self.encoder(x.permute(0, 3, 1, 2)))
        ids = instruction.to(self.device)
        mask = (ids > 0).float()
        words = (self.words(ids) * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        state = self.proprio(p)
        if smoothing is not None:
            state = state + self.timestep_embedding(t)
        return self.trunk(torch.cat([keypoints, words, state], dim=-1))

    def smooth_context(self, x: Tensor, p: Tensor, t: Tensor, seeds: Tensor) -> tuple[Tensor, Tensor]:
        """CSP's forward-diffusion step on the rows with t > 0 of images x [B,H,W,3] (as image/255 − 0.5) and
        proprio p [B,P]: x_t = √ᾱ_t x + √(1 − ᾱ_t) ε on the inputs ``context_smoothing.inputs`` names. One seed a
        row draws ε for both inputs (image first), whichever are noised."""
        rows = (t > 0).nonzero(as_tuple=True)[0]
        if len(rows) == 0:
            return x, p
        pixels, dims = x[0].numel(), p.shape[1]
        eps = context_noise(seeds[rows.cpu()], (pixels + dims,), x.device)
        alpha_bar = self.alpha_bars[t[rows]]
        inputs = self.cfg.context_smoothing.inputs
        x, p = x.clone(), p.clone()
        if "image" in inputs:  # the encoder's input is half the diffusion's [−1, 1] data: noise scaled by ½
            x[rows] = noise_context(x[rows], alpha_bar, eps[:, :pixels].view_as(x[rows]), scale=0.5)
        if "proprio" in inputs:
            p[rows] = noise_context(p[rows], alpha_bar, eps[:, pixels:])
        return x, p

    # -- TMRL: the context level as a decision ---------------------------------------------------------
    def sample_timesteps(self, h0: Tensor, temperature: float, generator: torch.Generator) -> Tensor:
        """Each decision's context level t [B] long from the clean features ``h0`` [B, hidden]: 0 without
        ``timestep_policy`` and when greedy (τ = 0); uniform (``fixed``); π(t | x) at temperature τ (``learned``)."""
        b = h0.shape[0]
        if not self.cfg.modulates_timestep or temperature == 0:
            return torch.zeros(b, dtype=torch.long, device=h0.device)
        if self.cfg.timestep_policy == "fixed":
            return torch.randint(self.cfg.context_smoothing.levels, (b,), generator=generator).to(h0.device)
        probs = F.softmax(self.timestep_logits(h0).float() / temperature, -1)
        return torch.multinomial(probs.cpu(), 1, generator=generator).view(b).to(h0.device)

    def timestep_logprob(self, h0: Tensor, t: Tensor, temperature: float,
                         with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        """log π(t | x) [B] and its entropy [B] (zeros where t is not a decision: no ``timestep_policy``, τ = 0);
        ``fixed``: −log K and log K; ``learned``: log softmax(logits(h0)/τ)[t] and the categorical's entropy."""
        zeros = h0.float().sum(-1) * 0.0  # [B], in the graph
        if not self.cfg.modulates_timestep or temperature == 0:
            return zeros, zeros if with_entropy else None
        if self.cfg.timestep_policy == "fixed":
            log_k = math.log(self.cfg.context_smoothing.levels)
            return zeros - log_k, zeros + log_k if with_entropy else None
        logp_all = F.log_softmax(self.timestep_logits(h0).float() / temperature, -1)  # [B, K]
        logp = logp_all.gather(-1, t.to(logp_all.device).long().unsqueeze(-1)).squeeze(-1)
        return logp, -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None

    def log_std(self, h: Tensor) -> Tensor:
        lo, hi = self.cfg.log_std_range
        return lo + (hi - lo) * (torch.tanh(self.action_log_std(h)) + 1) / 2

    def action_logprob(self, h: Tensor, actions: Tensor, temperature: float,
                       with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        """log π(actions | h) summed over the decision's tokens / dims ([B, chunk·A] → [B]); entropy [B].

        τ = 0 (greedy) scores under τ = 1, as for text policies. Gaussian head with ``squash: tanh``:
        ``actions`` are the pre-squash samples u (what the payload stores) and log π is the density of the
        executed tanh(u); the entropy is :func:`squashed_entropy_estimate` at u.
        """
        if self.cfg.decisions_without_logprob() is not None:
            raise ValueError(f"{self.cfg.decisions_without_logprob()}: log π cannot be scored (use an off-policy "
                             f"learner without one, algo.offpolicy: conrft, expo_ft or dsrl)")
        tau = temperature if temperature > 0 else 1.0
        if self.cfg.action_head == "tokens":
            logits = self.action_logits(h).view(h.shape[0], -1, self.cfg.bins).float() / tau
            logp_all = F.log_softmax(logits, -1)  # [B, chunk·A, bins]
            logp = logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1).sum(-1)
            entropy = -(logp_all.exp() * logp_all).sum(-1).sum(-1) if with_entropy else None
            return logp, entropy
        mean, log_std = self.action_mean(h).float(), self.log_std(h).float() + math.log(tau)
        z = (actions - mean) / log_std.exp()
        logp = (-0.5 * z ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        entropy = (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1) if with_entropy else None
        if self.cfg.squash == "tanh":
            logp = logp - tanh_log_abs_det(actions).sum(-1)
            entropy = None if entropy is None else squashed_entropy_estimate(entropy, actions)
        return logp, entropy

    def sample_actions(self, h: Tensor, temperature: float, generator: torch.Generator) -> Tensor:
        """Decision samples [B, chunk·A] (token ids or raw Gaussian samples, before any squashing); τ = 0 is
        greedy (the mean, executed as tanh(μ) when squashed)."""
        if self.cfg.action_head == "tokens":
            logits = self.action_logits(h).view(h.shape[0], -1, self.cfg.bins).float()
            if temperature == 0:
                return logits.argmax(-1)
            probs = F.softmax(logits / temperature, -1)
            return torch.multinomial(probs.view(-1, self.cfg.bins).cpu(), 1, generator=generator).view(probs.shape[:2])
        if self.cfg.action_head == "consistency":  # τ scales the noise; τ = 0 starts from its mode
            return self.consistency.sample(h, self.cfg.consistency_steps, generator, temperature)
        if self.cfg.action_head == "flow":  # z ~ N(0, τ² I); τ = 0: z = 0
            noise = torch.randn((h.shape[0], self.decision_size), generator=generator) * temperature
            return self.flow.sample(h, noise, self.cfg.flow_steps)
        mean = self.action_mean(h).float()
        if temperature == 0:
            return mean
        noise = torch.randn(mean.shape, generator=generator).to(mean.device)
        return mean + temperature * self.log_std(h).float().exp() * noise

    def rsample_actions(self, h: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor | None]:
        """Reparameterised decisions ã = μ(h) + σ(h)·ε, ε ~ N(0, I) from ``generator``, and log π(ã | h)
        (τ = 1): [B, chunk·A] and [B], both differentiable in the policy's parameters (SAC's actor update,
        Haarnoja et al. 2018, eq. 11). With ``squash: tanh`` the decision is the executed tanh(ã) and log π
        its density (eq. 21 of the same paper). The consistency head: its one- or few-step sample
        f_θ(σ_max z, σ_max, h) (differentiable in θ) and None: a deterministic actor of (h, z) without a density;
        the flow head likewise: g_θ(h, z), z ~ N(0, I), and None. Token actions have no reparameterisation."""
        if self.cfg.action_head == "consistency":
            return self.consistency.sample(h, self.cfg.consistency_steps, generator), None
        if self.cfg.action_head == "flow":
            noise = torch.randn((h.shape[0], self.decision_size), generator=generator)
            return self.flow.sample(h, noise, self.cfg.flow_steps), None
        if self.cfg.action_head != "gaussian":
            raise ValueError(f"off-policy actor updates need policy.args.action_head: gaussian, consistency or flow (got "
                             f"{self.cfg.action_head!r}: discrete action tokens cannot be reparameterised)")
        mean, log_std = self.action_mean(h).float(), self.log_std(h).float()
        noise = torch.randn(mean.shape, generator=generator).to(mean.device)
        actions = mean + log_std.exp() * noise
        logp = (-0.5 * noise ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        if self.cfg.squash == "tanh":
            return torch.tanh(actions), logp - tanh_log_abs_det(actions).sum(-1)
        return actions, logp

    def flow_actions(self, h: Tensor, noise: Tensor) -> Tensor:
        """The flow head's decisions g_θ(h, z) [B, chunk·A] from features ``h`` [B, F] and the noise z [B, chunk·A]
        it integrates from (what DSRL's latent actor chooses); deterministic, differentiable in θ, h and z."""
        if self.cfg.action_head != "flow":
            raise ValueError(f"the action noise can be chosen for a flow head only: set policy.args.action_head: "
                             f"flow (got {self.cfg.action_head!r})")
        return self.flow.sample(h, noise, self.cfg.flow_steps)

    @property
    def feature_size(self) -> int:
        """Width of :meth:`features` (the trunk's ``hidden``)."""
        return self.cfg.hidden

    @property
    def decision_size(self) -> int:
        """Numbers in one decision: ``chunk`` · ``action_dims``."""
        return self.cfg.chunk * self.cfg.action_dims

    def encode_instructions(self, texts: Sequence[str]) -> Tensor:
        """Hashed word ids [B, L] of instructions, as :meth:`features` reads them (0 = padding)."""
        return instruction_ids(texts, self.cfg.vocab_buckets)[0]

    def env_actions(self, decision: Tensor) -> np.ndarray:
        """What the env executes [B, chunk, A] from decision samples [B, chunk·A]."""
        return self.executed_decisions(decision).view(-1, self.cfg.chunk, self.cfg.action_dims).cpu().numpy()

    def executed_decisions(self, decision: Tensor) -> Tensor:
        """Decision samples [..., chunk·A] (as the payload stores them) → the actions the env executes, in
        [−1, 1]: bin centres (tokens), tanh (squashed Gaussian) or the sample clipped (Gaussian)."""
        if self.cfg.action_head == "tokens":
            decision = detokenize_actions(decision, self.cfg.bins)
        elif self.cfg.squash == "tanh":
            decision = torch.tanh(decision)
        return decision.clamp(-1, 1)

    def stored_decisions(self, executed: Tensor) -> Tensor:
        """Executed actions [..., chunk·A] in [−1, 1] → decisions as the payload stores them (the inverse of
        :meth:`executed_decisions` on its range): bins (tokens), atanh of the action clipped to ±(1 − 1e-6)
        (squashed Gaussian: tanh of it executes the action to float32 precision), the action itself otherwise."""
        executed = executed.clamp(-1, 1)
        if self.cfg.action_head == "tokens":
            return tokenize_actions(executed, self.cfg.bins)
        if self.cfg.squash == "tanh":
            return torch.atanh(executed.clamp(-1 + 1e-6, 1 - 1e-6))
        return executed

    # -- sampling --------------------------------------------------------------------------------
    @torch.no_grad()
    def rollout(self, examples: Sequence[Any], group_size: int, sampling: SamplingParams, seed: int,
                record_frames: bool = False) -> Rollout:
        generator = torch.Generator().manual_seed(seed)

        def decide(images: np.ndarray, proprio: np.ndarray, instructions: list[str]):
            ids, _ = instruction_ids(instructions, self.cfg.vocab_buckets)
            obs = torch.from_numpy(images), torch.from_numpy(proprio), ids
            h = h0 = self.features(*obs)  # the clean context: the value and π(t | x) read it
            record = {}
            if self.cfg.modulates_timestep:  # TMRL: choose t, then act on the context noised to level t
                t = self.sample_timesteps(h0, sampling.temperature, generator)
                seeds = torch.randint(0, 2 ** 62, (len(t),), generator=generator)
                if (t > 0).any():
                    h = self.features(*obs, t, seeds)
                record = {"timestep": t.cpu().numpy(), "context_seed": seeds.numpy()}
            if self.action_selector is None:
                decision = self.sample_actions(h, sampling.temperature, generator)
            else:
                decision = self.action_selector(*obs, h, sampling.temperature, generator)
            logp = (torch.zeros(len(decision)) if self.cfg.decisions_without_logprob()  # no density: recorded 0
                    else self.action_logprob(h, decision, sampling.temperature)[0])
            if self.cfg.modulates_timestep:
                logp = logp + self.timestep_logprob(h0, t, sampling.temperature)[0]
            record |= {"decision": decision.cpu().numpy(), "logp": logp.cpu().numpy()}
            if self.value is not None:
                record["value"] = self.value(h0).squeeze(-1).float().cpu().numpy()
            return self.env_actions(decision), record

        takeover = (None if self.takeover is None
                    else self.takeover(len(examples) * group_size, sampling.temperature, seed))
        batch = run_episode_groups(self, examples, group_size, decide, record_frames, takeover)
        return self.to_rollout(batch, len(examples), group_size, sampling.temperature)

    def to_rollout(self, batch: EpisodeBatch, num_examples: int, group_size: int, temperature: float) -> Rollout:
        actions = torch.from_numpy(batch.records["decision"])
        ids, _ = instruction_ids(batch.instructions, self.cfg.vocab_buckets)
        mask = torch.from_numpy(batch.mask)
        timesteps = seeds = None
        stats = {}
        if self.cfg.modulates_timestep:
            timesteps = torch.from_numpy(batch.records["timestep"]).long() * mask.long()
            seeds = torch.from_numpy(batch.records["context_seed"]).long()
            stats["rollout/timestep_mean"] = float((timesteps * mask).sum() / mask.sum().clamp(min=1))
        actions = actions.long() if self.cfg.action_head == "tokens" else actions.float()
        intervened = None
        if batch.intervened is not None:  # the expert's decisions replace the policy's discarded ones
            intervened = torch.from_numpy(batch.intervened).float()
            if batch.expert_actions is not None and intervened.any():
                expert = self.stored_decisions(torch.from_numpy(batch.expert_actions).flatten(2))
                actions = torch.where(intervened[..., None] > 0, expert.to(actions.dtype), actions)
        payload = VLAPayload(torch.from_numpy(batch.images), torch.from_numpy(batch.proprio), ids, actions,
                             mask, temperature,
                             None if batch.chunk_rewards is None else torch.from_numpy(batch.chunk_rewards),
                             timesteps, seeds, intervened)
        self.last_frames = batch.frames  # videos (scripts/train_vla.py); None unless asked for
        rollout = episode_rollout(batch, num_examples, group_size, payload, self.version, self.value is not None)
        return replace(rollout, stats=stats) if stats else rollout

    # -- re-scoring ------------------------------------------------------------------------------
    def forward(self, rollout: Rollout, with_entropy: bool = False) -> PolicyOutput:
        p: VLAPayload = rollout.payload
        rows, steps = p.mask.nonzero(as_tuple=True)  # the real decisions, [B] each
        n, t = p.mask.shape
        obs = p.images[rows, steps], p.proprio[rows, steps], p.instruction_ids[rows]
        h = h0 = self.features(*obs)  # the clean context (value, π(t | x))
        if self.cfg.modulates_timestep:
            chosen = p.timesteps[rows, steps]
            h = self.features(*obs, chosen, p.context_seeds[rows, steps])
        if self.cfg.decisions_without_logprob() is not None:
            logp_flat, entropy_flat = unscored_logprob(h), None
        else:
            logp_flat, entropy_flat = self.action_logprob(h, p.actions[rows, steps].to(self.device), p.temperature,
                                                          with_entropy)
        if self.cfg.modulates_timestep:  # log π(decision) = log π(a | x_t, t) + log π(t | x)
            logp_t, entropy_t = self.timestep_logprob(h0, chosen, p.temperature, with_entropy)
            logp_flat = logp_flat + logp_t
            entropy_flat = None if entropy_flat is None else entropy_flat + entropy_t

        def scatter(flat: Tensor) -> Tensor:  # [B] → [N, T], zeros at padding
            out = torch.zeros(n, t, device=flat.device, dtype=flat.dtype)
            return out.index_put((rows.to(flat.device), steps.to(flat.device)), flat)

        values = scatter(self.value(h0).squeeze(-1).float()) if self.value is not None else None
        return PolicyOutput(logp=scatter(logp_flat), entropy=None if entropy_flat is None else scatter(entropy_flat),
                            values=values)

    def sft_loss(self, examples: Sequence[Any], targets: Sequence[Any], timestep: int | None = None) -> Tensor:
        """Behaviour cloning: mean NLL per action dimension of the expert's action chunks (a squashed head:
        of their pre-squash values, see :data:`BC_TANH_MARGIN`).

        With ``context_smoothing`` (CSP) each sample sees its context noised at a level t ~ U{0..K−1} (or at
        ``timestep`` for all, e.g. 0 to measure precise imitation), seeded by ``init_seed`` and the number of
        earlier draws (no global RNG).

        ``targets[i]`` is a demonstration with ``images [T,H,W,3]``, ``proprio [T,P]``,
        ``instruction`` and ``actions [T,A]``; the decision at step t predicts actions
        t .. t+chunk−1 (the last action repeats past the end of the episode).
        """
        images, proprio, ids, chunks = [], [], [], []
        for demo in targets:
            actions = np.asarray(demo.actions, dtype=np.float32)
            if actions.ndim != 2 or actions.shape[1] != self.cfg.action_dims:
                raise ValueError(f"demonstration actions must be [T, {self.cfg.action_dims}], got {actions.shape}: "
                                 f"policy.args.action_dims must match the env")
            steps = len(actions)
            index = np.minimum(np.arange(steps)[:, None] + np.arange(self.cfg.chunk)[None], steps - 1)
            chunks.append(torch.from_numpy(actions[index].reshape(steps, -1)))
            images.append(torch.from_numpy(np.asarray(demo.images)[:steps]))
            proprio.append(torch.from_numpy(np.asarray(demo.proprio, dtype=np.float32)[:steps]))
            ids.append(instruction_ids([demo.instruction], self.cfg.vocab_buckets)[0].expand(steps, -1))
        width = max(x.shape[1] for x in ids)
        ids = torch.cat([F.pad(x, (0, width - x.shape[1])) for x in ids])
        h = self.features(torch.cat(images), torch.cat(proprio), ids, *self.bc_context_levels(len(ids), timestep))
        return self.imitation_loss(h, torch.cat(chunks).to(self.device))

    def imitation_loss(self, h: Tensor, actions: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Behaviour cloning of action chunks ``actions`` [B, chunk·A] (as executed, in [−1, 1]) under features
        ``h`` [B, hidden]: the mean NLL per action dimension (tokens: of their bins; a squashed head: of their
        pre-squash values, see :data:`BC_TANH_MARGIN`), or the consistency / flow-matching BC loss (its noise from
        ``generator``, else seeded as :meth:`consistency_bc_loss` does). What :meth:`sft_loss`, ConRFT's BC term and
        EXPO-FT's base BC minimise."""
        if self.cfg.action_head == "consistency":
            return self.consistency_bc_loss(h, actions.clamp(-1, 1), generator)
        if self.cfg.action_head == "flow":
            return self.flow_bc_loss(h, actions.clamp(-1, 1), generator)
        target = actions
        if self.cfg.action_head == "tokens":
            target = tokenize_actions(target, self.cfg.bins)
        elif self.cfg.squash == "tanh":  # the pre-squash sample that executes the expert's action
            target = torch.atanh(target.clamp(-1 + BC_TANH_MARGIN, 1 - BC_TANH_MARGIN))
        logp, _ = self.action_logprob(h, target, 1.0)
        return -logp.mean() / target.shape[1]

    def bc_context_levels(self, rows: int, timestep: int | None) -> tuple[Tensor | None, Tensor | None]:
        """CSP's context levels [rows] and noise seeds [rows] for a behaviour-cloning batch (Nones without
        ``context_smoothing``): t ~ U{0..K−1}, or ``timestep`` for every row."""
        smoothing = self.cfg.context_smoothing
        if smoothing is None:
            return None, None
        if timestep is not None and not 0 <= timestep < smoothing.levels:
            raise ValueError(f"timestep must be in [0, {smoothing.levels}), got {timestep}")
        generator = torch.Generator().manual_seed(derive_seed(self.cfg.init_seed, 98, self.bc_draws))
        self.bc_draws += 1
        t = (torch.randint(smoothing.levels, (rows,), generator=generator) if timestep is None
             else torch.full((rows,), timestep, dtype=torch.long))
        return t, torch.randint(0, 2 ** 62, (rows,), generator=generator)

    def consistency_bc_loss(self, h: Tensor, actions: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """The consistency head's BC loss (:meth:`ConsistencyHead.bc_loss`) of ``actions`` [B, chunk·A] under
        features ``h``, averaged over rows. Without a ``generator`` the noise is seeded by ``init_seed`` and the
        number of earlier such draws (behaviour cloning's ``sft_loss``; no global RNG)."""
        if generator is None:
            generator = torch.Generator().manual_seed(derive_seed(self.cfg.init_seed, 90, self.bc_draws))
            self.bc_draws += 1
        return self.consistency.bc_loss(h, actions, generator)[0].mean()

    def flow_bc_loss(self, h: Tensor, actions: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """The flow head's BC loss (:meth:`FlowHead.bc_loss`, the flow-matching loss) of ``actions`` [B, chunk·A]
        under features ``h``, averaged over rows; without a ``generator`` seeded as :meth:`consistency_bc_loss`."""
        if generator is None:
            generator = torch.Generator().manual_seed(derive_seed(self.cfg.init_seed, FLOW_BC_STREAM, self.bc_draws))
            self.bc_draws += 1
        return self.flow.bc_loss(h, actions, generator)[0].mean()
