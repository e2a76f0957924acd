"""A vision-language-action policy on a Qwen-VL backbone (``policy: vla_vlm``), the way OpenVLA builds on a VLM.

    frame [H,W,3] ─┐
    instruction ───┼─ chat prompt ─ Qwen-VL (the vlm policy's) ─┬─ h: last hidden state before the actions
    proprio (text) ┘                                            ├─ value head ─ V(s)
                                                                └─ chunk·A action tokens

Prompt (OpenVLA's, Kim et al. 2024, §3.2, in the backbone's chat template): one user turn
``<image>What action should the robot take to {instruction}?`` followed, when ``proprio_in_prompt``,
by ``State: +0.12 -0.40 ...`` (the proprioception as text, two decimals). The answer is
``chunk × action_dims`` action tokens, step-major (step 0's dimensions, then step 1's, ...).

Action tokens (OpenVLA §3.2): each action dimension is one of ``bins`` = 256 uniform bins over
[−1, 1] (the bin centre is executed: :func:`~mmrl.policies.vla.tokenize_actions`), and bin ``k`` is
the vocabulary id ``action_ids[k]``, where ``action_ids`` are the last ``bins`` ids of the tokenizer's
ordinary vocabulary in ascending order (:func:`action_token_ids`): special and added tokens
(``<|im_end|>``, vision tokens, ...) and the embedding rows past the tokenizer are never used. A
byte-level BPE assigns its last ids to its last merges, the least frequent pieces, so these are the
least-used tokens, as OpenVLA's last 256 Llama ids are. (OpenVLA counts down from the end, bin 1 →
the last id; here bin 0 → the lowest of the 256. Both are a fixed bijection; the order is a convention.)

Decoding is constrained: the logits of a step are restricted to the ``bins`` action ids (every other
id has probability 0, as a −inf logits mask gives), tempered by τ, and sampled; exactly
``chunk × action_dims`` tokens are drawn, with no EOS. The behaviour log-prob of a decision is the
sum over its tokens of log softmax(logits[action_ids] / τ), and :meth:`VLAVLMPolicy.forward` re-scores
the same tokens with one teacher-forced forward through the same function, so on-policy ratios are 1.

Value head (RL4VLA, Liu et al. 2025, shared actor-critic): an MLP on the backbone's last hidden state
at the last prompt position, the one that predicts the first action token; its gradients reach the
backbone (or its LoRA adapters) like the policy's.

Decisions are env steps (one decision = one action chunk, executed open loop), recorded by the gym
runner (:mod:`mmrl.samplers.gym_runner`) like the tiny ``vla`` policy's, so PPO with GAE and GRPO with
same-seed groups run through the shared trainer unchanged. Behaviour cloning (``mmrl bc``,
:meth:`VLAVLMPolicy.sft_loss`) takes the same demonstrations as ``vla``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from torch.nn import functional as F
from transformers import DynamicCache

from mmrl.core.config import ConfigError
from mmrl.core.contracts import IMAGE_PLACEHOLDER, Policy, PolicyOutput
from mmrl.core.rollout import Rollout, SamplingParams
from mmrl.policies.shared_prefix import cache_keyword, next_positions, plain_model, prompt_positions
from mmrl.policies.tokens import token_logprobs
from mmrl.policies.vla import detokenize_actions, episode_rollout, run_episode_groups, tokenize_actions
from mmrl.policies.vlm import VLMConfig, VLMPolicy
from mmrl.samplers.gym_runner import EpisodeBatch, GymRunner
from mmrl.samplers.tokens import VisionPrompts

VALUE_HEAD_FILE = "value_head.safetensors"
ACTION_CONFIG_FILE = "vla_vlm.json"
TINY_SPEC = "vlm/qwen2_5_vl_tiny.json"


def tiny_backbone() -> VLMConfig:
    """The embedded ~1 M-parameter Qwen2.5-VL (as the VLM recipes build it), sized for action prompts."""
    return VLMConfig(model_spec=TINY_SPEC, max_prompt_tokens=256)


@dataclass(frozen=True)
class VLAVLMConfig:
    backbone: VLMConfig = field(default_factory=tiny_backbone)
    """The Qwen-VL model, as ``policy: vlm`` takes it: ``model_spec`` (the embedded tiny one, CPU) or
    ``pretrained`` (a local Qwen2.5-VL folder, GPU); dtype, pixel budget, LoRA, gradient checkpointing."""
    action_dims: int = 4
    """Action dimensions of the env (Meta-World: dx, dy, dz, gripper; table-top reach/push: 2)."""
    bins: int = 256
    """Bins per action dimension = action tokens taken from the end of the vocabulary (OpenVLA: 256)."""
    chunk: int = 1
    """Actions per decision (action chunking); one decision = ``chunk`` env steps, ``chunk·action_dims`` tokens."""
    image_size: int = 64
    """Side of the env's square RGB frame (passed to the env; demonstrations must match)."""
    proprio_dims: int = 4
    """Proprioception values per observation (checked against the env's)."""
    proprio_in_prompt: bool = True
    """Write the proprioception into the prompt as text (``State: +0.12 ...``)."""
    instruction_template: str = "What action should the robot take to {instruction}?"
    """The prompt's question (OpenVLA's); ``{instruction}`` is the env's instruction."""
    value_head: bool = True
    """Critic on the last hidden state before the action tokens (PPO with GAE)."""
    value_hidden: int = 256
    """Width of the value head's hidden layer (hidden → value_hidden → GELU → 1)."""
    value_stop_gradient: bool = False
    """The value loss trains the value head only: the head reads the backbone's hidden state through a
    stop-gradient, so the backbone learns from the policy loss alone (a separate critic on shared features).
    False: RL4VLA's shared actor-critic, where the critic's loss also moves the backbone."""
    max_decisions: int = 50
    """Decisions per episode at most (the env's time limit usually ends it first)."""
    num_envs: int = 16
    """Episodes stepped together in one vector env (one batched backbone call per decision)."""
    vector_mode: Literal["sync", "async"] = "sync"
    """gymnasium ``SyncVectorEnv`` (one process) or ``AsyncVectorEnv`` (a subprocess per env)."""
    env_kwargs: dict = field(default_factory=dict)
    """Extra ``gymnasium.make`` arguments (e.g. Meta-World's ``camera``); ``image_size`` is always passed."""


def action_token_ids(tokenizer: Any, bins: int) -> Tensor:
    """The ``bins`` vocabulary ids that stand for action bins 0 … bins−1 (ascending): the last ids of the
    tokenizer's ordinary vocabulary, i.e. without special and added tokens (see the module docstring).

    The embedded tiny tokenizer (682 ids, its 14 special ones first): ids 426 … 681. Qwen2.5-VL's (151,643
    ordinary ids, then 22 added ones) would give 151,387 … 151,642."""
    excluded = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    ordinary = [i for i in range(len(tokenizer)) if i not in excluded]
    if len(ordinary) < bins:
        raise ConfigError(f"policy.args.bins ({bins}) exceeds the {len(ordinary)} ordinary tokens of the vocabulary")
    return torch.tensor(ordinary[-bins:], dtype=torch.long)


@dataclass(frozen=True)
class ActionPrompt:
    """One observation as a :class:`~mmrl.core.contracts.VisualPrompt` for the backbone."""

    prompt: str
    images: tuple[Any, ...]
    system: str | None = None


@dataclass(frozen=True)
class VLAVLMPayload:
    """What re-scoring needs: the observations of every decision and its action bins. Satisfies
    :class:`mmrl.core.rollout.Payload`."""

    images: Tensor  # [N, T, H, W, 3] uint8
    proprio: Tensor  # [N, T, P] float32
    instructions: tuple[str, ...]  # [N]: each episode's instruction
    actions: Tensor  # [N, T, chunk·A] long: action bins (not vocabulary ids)
    mask: Tensor  # [N, T] float
    temperature: float

    def select(self, index: Tensor) -> VLAVLMPayload:
        index = index.long()
        return VLAVLMPayload(self.images[index], self.proprio[index],
                             tuple(self.instructions[i] for i in index.tolist()), self.actions[index],
                             self.mask[index], self.temperature)

    @classmethod
    def concat(cls, parts: Sequence[VLAVLMPayload]) -> VLAVLMPayload:
        if len({p.temperature for p in parts}) != 1:
            raise ValueError("cannot mix rollouts sampled at different temperatures")
        t_max = max(p.mask.shape[1] for p in parts)

        def pad_t(x: Tensor) -> Tensor:
            return F.pad(x, [0, 0] * (x.dim() - 2) + [0, t_max - x.shape[1]])

        return cls(torch.cat([pad_t(p.images) for p in parts]), torch.cat([pad_t(p.proprio) for p in parts]),
                   tuple(s for p in parts for s in p.instructions), torch.cat([pad_t(p.actions) for p in parts]),
                   torch.cat([pad_t(p.mask) for p in parts]), parts[0].temperature)


@dataclass(frozen=True)
class ScoredDecisions:
    """One teacher-forced forward over decisions: per-token log-probs [B, K], entropies [B, K] (when asked)
    and the hidden state before the first action token [B, D]."""

    logp: Tensor
    entropy: Tensor | None
    hidden: Tensor


class VLAVLMPolicy(Policy):
    def __init__(self, backbone: VLMPolicy, cfg: VLAVLMConfig):
        super().__init__()
        if cfg.chunk < 1 or cfg.action_dims < 1 or cfg.proprio_dims < 0 or cfg.bins < 2:
            raise ConfigError(f"policy.args: need chunk >= 1, action_dims >= 1, proprio_dims >= 0 and bins >= 2, got "
                              f"{cfg.chunk}, {cfg.action_dims}, {cfg.proprio_dims}, {cfg.bins}")
        if cfg.backbone.sampler != "hf":
            raise ConfigError("policy.args.backbone.sampler must be hf: vla_vlm decodes its action tokens itself")
        if "{instruction}" not in cfg.instruction_template:
            raise ConfigError(f"policy.args.instruction_template must contain {{instruction}}, got "
                              f"{cfg.instruction_template!r}")
        self.cfg, self.backbone = cfg, backbone
        self.register_buffer("action_ids", action_token_ids(backbone.processor.tokenizer, cfg.bins), persistent=False)
        self.value = None
        if cfg.value_head:
            hidden = backbone.base_model.config.get_text_config().hidden_size
            self.value = nn.Sequential(nn.Linear(hidden, cfg.value_hidden), nn.GELU(), nn.Linear(cfg.value_hidden, 1))
            nn.init.normal_(self.value[2].weight, std=0.02)
            nn.init.zeros_(self.value[2].bias)
        self.runner = GymRunner(cfg.num_envs, cfg.vector_mode, {**cfg.env_kwargs, "image_size": cfg.image_size})

    # -- construction / saving -------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg: VLAVLMConfig) -> VLAVLMPolicy:
        backbone = VLMPolicy.from_config(cfg.backbone)
        with torch.random.fork_rng(devices=[]):  # the value head's init is seeded; the global RNG is left alone
            torch.manual_seed(cfg.backbone.init_seed)
            return cls(backbone, cfg)

    @property
    def device(self) -> torch.device:
        return self.action_ids.device

    @property
    def decision_size(self) -> int:
        """Action tokens in one decision: ``chunk`` · ``action_dims``."""
        return self.cfg.chunk * self.cfg.action_dims

    def adapter_disabled(self):
        return self.backbone.adapter_disabled()

    def save_pretrained(self, path: str) -> None:
        """The backbone as the ``vlm`` policy saves it (a HF folder, or the LoRA adapter + base), the value
        head (``value_head.safetensors``) and the action-token mapping (``vla_vlm.json``)."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(path)
        if self.value is not None:
            save_file({k: v.detach().contiguous().cpu() for k, v in self.value.state_dict().items()},
                      out / VALUE_HEAD_FILE)
        (out / ACTION_CONFIG_FILE).write_text(json.dumps(
            {"architecture": "mmrl.VLAVLMPolicy", "action_token_ids": self.action_ids.tolist(), **asdict(self.cfg)},
            indent=1))

    def load_weights(self, path: str) -> None:
        folder = Path(path)
        mapping = folder / ACTION_CONFIG_FILE
        if not mapping.is_file():
            raise FileNotFoundError(f"{mapping} not found: point warm_start.init_from at a folder written by a "
                                    f"vla_vlm policy's save_pretrained (e.g. `mmrl bc <recipe> --out DIR`)")
        saved_ids = json.loads(mapping.read_text())["action_token_ids"]
        if saved_ids != self.action_ids.tolist():
            raise ValueError(f"{path} maps action bins to other vocabulary ids than this policy (a different "
                             f"tokenizer or bins); compare {mapping}")
        self.backbone.load_weights(path)
        if self.value is not None:
            head = folder / VALUE_HEAD_FILE
            if not head.is_file():
                raise FileNotFoundError(f"{head} not found: the folder was saved without a value head "
                                        f"(policy.args.value_head: false)")
            self.value.load_state_dict(load_file(head))

    # -- prompts ---------------------------------------------------------------------------------
    def prompt_text(self, instruction: str, proprio: np.ndarray) -> str:
        """The user text of one observation (its image placeholder first)."""
        text = IMAGE_PLACEHOLDER + self.cfg.instruction_template.format(instruction=instruction)
        if self.cfg.proprio_in_prompt:
            text += " State: " + " ".join(f"{float(x):+.2f}" for x in proprio)
        return text

    def encode(self, images: np.ndarray, proprio: np.ndarray, instructions: Sequence[str]) -> VisionPrompts:
        """Observations (frames [B,H,W,3] uint8, proprio [B,P], B instructions) → backbone prompt rows."""
        if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
            raise ValueError(f"frames must be uint8 [B, H, W, 3], got {images.dtype} {list(images.shape)}")
        if proprio.shape != (len(images), self.cfg.proprio_dims):
            raise ValueError(f"proprio must be [B, {self.cfg.proprio_dims}], got {list(proprio.shape)}: set "
                             f"policy.args.proprio_dims to the env's")
        if not np.isfinite(proprio).all():
            raise ValueError("proprio holds NaN or inf values")
        examples = [ActionPrompt(self.prompt_text(text, state), (Image.fromarray(frame),))
                    for frame, state, text in zip(images, proprio, instructions, strict=True)]
        return self.backbone.encode(examples).to(self.device)

    # -- the action distribution -----------------------------------------------------------------
    def action_logprobs(self, logits: Tensor, bins: Tensor, temperature: float,
                        with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        """log π(bin) per token ([B, K, V] logits, [B, K] bins → [B, K]) under softmax over the action ids of
        logits / τ (τ = 0 scores under τ = 1): the distribution sampling draws from; entropies [B, K]."""
        restricted = logits.index_select(-1, self.action_ids)  # every other id: probability 0 (a −inf mask)
        return token_logprobs(restricted, bins.to(logits.device), temperature, None, torch.ones_like(bins),
                              with_entropy)

    @torch.no_grad()
    def decode(self, prompts: VisionPrompts, temperature: float, generator: torch.Generator
               ) -> tuple[Tensor, Tensor, Tensor]:
        """Constrained decoding of ``chunk·A`` action tokens per prompt row: bins [B, K], their summed
        log-prob [B] and the hidden state before the first action token [B, D].

        The prompt runs once (its cache kept); each further token continues from one past the prompt's
        largest (m)RoPE position, as :func:`mmrl.policies.shared_prefix.score_logits` places completions."""
        model = self.backbone.model
        prompts = _with_positions(model, prompts)
        cache, keyword = DynamicCache(config=plain_model(model).config), cache_keyword(model)
        out = model(input_ids=prompts.input_ids, attention_mask=prompts.attention_mask,
                    position_ids=prompts.position_ids, mm_token_type_ids=prompts.mm_token_type_ids, use_cache=True,
                    logits_to_keep=1, output_hidden_states=True, **{keyword: cache}, **prompts.vision_inputs())
        hidden = out.hidden_states[-1][:, -1]
        start, attention = next_positions(prompts), prompts.attention_mask
        bins, logps = [], []
        logits = out.logits[:, -1:]
        for k in range(self.decision_size):
            token = self.sample_bins(logits, temperature, generator)  # [B, 1]
            logps.append(self.action_logprobs(logits, token, temperature)[0])
            bins.append(token)
            if k + 1 == self.decision_size:
                break
            attention = torch.cat([attention, torch.ones_like(attention[:, :1])], 1)
            positions = (start + k)[None, :, None].expand(3, -1, 1)
            logits = model(input_ids=self.action_ids[token], attention_mask=attention, position_ids=positions,
                           use_cache=True, **{keyword: cache}).logits[:, -1:]
        return torch.cat(bins, 1), torch.cat(logps, 1).sum(1), hidden

    def sample_bins(self, logits: Tensor, temperature: float, generator: torch.Generator) -> Tensor:
        """One action bin per row ([B, 1, V] logits → [B, 1] long) from the restricted, tempered softmax;
        τ = 0 is greedy. Draws on the CPU from ``generator`` (the same samples on any device)."""
        restricted = logits[:, -1].index_select(-1, self.action_ids).float()
        if temperature == 0:
            return restricted.argmax(-1, keepdim=True)
        probs = F.softmax(restricted / temperature, -1).cpu()
        return torch.multinomial(probs, 1, generator=generator).to(logits.device)

    def score(self, prompts: VisionPrompts, bins: Tensor, temperature: float,
              with_entropy: bool = False) -> ScoredDecisions:
        """Teacher-forced log-probs of action ``bins`` [B, K] after ``prompts`` (B rows), with gradients: one
        plain forward over prompt + action tokens, its (m)RoPE positions from the token types."""
        bins = bins.to(self.device)
        tokens = self.action_ids[bins]
        k = tokens.shape[1]
        input_ids = torch.cat([prompts.input_ids, tokens], 1)
        attention = torch.cat([prompts.attention_mask, torch.ones_like(tokens)], 1)
        out = self.backbone.model(input_ids=input_ids, attention_mask=attention,
                                  mm_token_type_ids=F.pad(prompts.mm_token_type_ids, (0, k)), use_cache=False,
                                  logits_to_keep=k + 1, output_hidden_states=True, **prompts.vision_inputs())
        logp, entropy = self.action_logprobs(out.logits[:, :-1], bins, temperature, with_entropy)
        return ScoredDecisions(logp, entropy, out.hidden_states[-1][:, prompts.input_ids.shape[1] - 1])

    def state_value(self, hidden: Tensor) -> Tensor:
        """V(s) [B] from the hidden state before the first action token [B, D]."""
        if self.cfg.value_stop_gradient:
            hidden = hidden.detach()
        return self.value(hidden.float()).squeeze(-1).float()

    def env_actions(self, bins: Tensor) -> np.ndarray:
        """What the env executes [B, chunk, A] (bin centres) from a decision's bins [B, chunk·A]."""
        return detokenize_actions(bins, self.cfg.bins).view(-1, self.cfg.chunk, self.cfg.action_dims).cpu().numpy()

    # -- sampling --------------------------------------------------------------------------------
    @torch.no_grad()
    def rollout(self, examples: Sequence[Any], group_size: int, sampling: SamplingParams, seed: int,
                record_frames: bool = False) -> Rollout:
        generator = torch.Generator().manual_seed(seed)

        def decide(images: np.ndarray, proprio: np.ndarray, instructions: list[str]):
            bins, logp, hidden = self.decode(self.encode(images, proprio, instructions), sampling.temperature,
                                             generator)
            record = {"decision": bins.cpu().numpy(), "logp": logp.float().cpu().numpy()}
            if self.value is not None:
                record["value"] = self.state_value(hidden).cpu().numpy()
            return self.env_actions(bins), record

        batch = run_episode_groups(self, examples, group_size, decide, record_frames)
        return self.to_rollout(batch, len(examples), group_size, sampling.temperature)

    def to_rollout(self, batch: EpisodeBatch, num_examples: int, group_size: int, temperature: float) -> Rollout:
        payload = VLAVLMPayload(torch.from_numpy(batch.images), torch.from_numpy(batch.proprio),
                                tuple(batch.instructions), torch.from_numpy(batch.records["decision"]).long(),
                                torch.from_numpy(batch.mask), temperature)
        self.last_frames = batch.frames  # videos; None unless asked for
        return episode_rollout(batch, num_examples, group_size, payload, self.version, self.value is not None)

    # -- re-scoring ------------------------------------------------------------------------------
    def forward(self, rollout: Rollout, with_entropy: bool = False) -> PolicyOutput:
        p: VLAVLMPayload = rollout.payload
        rows, steps = p.mask.nonzero(as_tuple=True)  # the real decisions, [B] each
        n, t = p.mask.shape
        prompts = self.encode(p.images[rows, steps].numpy(), p.proprio[rows, steps].numpy(),
                              [p.instructions[r] for r in rows.tolist()])
        scored = self.score(prompts, p.actions[rows, steps], p.temperature, with_entropy)

        def scatter(flat: Tensor) -> Tensor:  # [B] → [N, T], zeros at padding
            out = torch.zeros(n, t, device=flat.device, dtype=flat.dtype)
            return out.index_put((rows.to(flat.device), steps.to(flat.device)), flat)

        values = scatter(self.state_value(scored.hidden)) if self.value is not None else None
        entropy = None if scored.entropy is None else scatter(scored.entropy.sum(1))
        return PolicyOutput(logp=scatter(scored.logp.sum(1)), entropy=entropy, values=values)

    def sft_loss(self, examples: Sequence[Any], targets: Sequence[Any]) -> Tensor:
        """Behaviour cloning: mean NLL per action token of the expert's action chunks.

        ``targets[i]`` is a demonstration (``images [T,H,W,3]``, ``proprio [T,P]``, ``instruction``,
        ``actions [T,A]``) as the robot tasks' ``reference_output`` gives it; the decision at step t
        predicts actions t … t+chunk−1 (the last action repeats past the end of the episode)."""
        images, proprio, instructions, chunks = [], [], [], []
        for i, demo in enumerate(targets):
            actions = np.asarray(demo.actions, dtype=np.float32)
            if actions.ndim != 2 or actions.shape[1] != self.cfg.action_dims:
                raise ValueError(f"demonstration {i}: actions must be [T, {self.cfg.action_dims}], got "
                                 f"{list(actions.shape)}: policy.args.action_dims must match the env")
            if not np.isfinite(actions).all():
                raise ValueError(f"demonstration {i}: actions hold NaN or inf values")
            frames = np.asarray(demo.images)
            if frames.shape[1:] != (self.cfg.image_size, self.cfg.image_size, 3):
                raise ValueError(f"demonstration {i}: frames are {list(frames.shape[1:])}, expected "
                                 f"[{self.cfg.image_size}, {self.cfg.image_size}, 3]: set policy.args.image_size to "
                                 f"the task's image_size")
            steps = len(actions)
            index = np.minimum(np.arange(steps)[:, None] + np.arange(self.cfg.chunk)[None], steps - 1)
            chunks.append(torch.from_numpy(actions[index].reshape(steps, -1)))
            images.append(frames[:steps])
            proprio.append(np.asarray(demo.proprio, dtype=np.float32)[:steps])
            instructions += [demo.instruction] * steps
        prompts = self.encode(np.concatenate(images), np.concatenate(proprio), instructions)
        target = tokenize_actions(torch.cat(chunks), self.cfg.bins)
        return -self.score(prompts, target, 1.0).logp.mean()


def _with_positions(model: nn.Module, prompts: VisionPrompts) -> VisionPrompts:
    """``prompts`` with their (m)RoPE positions computed (once per prompt)."""
    if prompts.position_ids is not None:
        return prompts
    return replace(prompts, position_ids=prompt_positions(model, prompts))
