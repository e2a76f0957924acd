"""A policy over the tiny next-scale visual autoregressive model (VAR, Tian et al. 2024) of
:mod:`mmrl.models.var`, for GRPO on images (VAR-GRPO, Gallici & Sáez de Ocáriz Borde, arXiv 2505.23331).

An image is K token maps r_1..r_K (sides ``spec.scales``); all tokens of a scale are sampled in
parallel given the coarser scales, so log π(x) = Σ_k Σ_{i∈scale k} log p(r_k[i] | r_<k). ``forward``
re-scores every token of a rollout under the current weights in ONE teacher-forced pass over all
scales (block-causal attention): the property that makes VAR cheap for online RL.

Decisions (``decision``; the paper's aggregation is not published):

- ``token``: each token is a decision (T = Σ_k s_k², e.g. 1+4+16+64 = 85); ``algo.loss_agg: token-mean``
  weights every token equally, so the fine scales dominate;
- ``scale_mean``: each scale is a decision whose log-prob is the mean of its tokens' log-probs
  (T = K; a per-scale geometric-mean ratio, GSPO-like): token-mean over decisions is then the
  per-scale mean averaged over scales, every scale counting equally;
- ``scale_sum``: each scale's decision log-prob is the sum over its tokens (the scale's joint
  probability; its ratio is the product of its token ratios).

``train_scales`` lists the scale indices that are decisions (e.g. (0, 1, 2): only the coarse scales
are trained); the others are sampled but masked. The behaviour log-prob is that of the distribution
actually sampled: CFG-combined logits u + g(c − u), divided by the temperature, truncated to the
top-k and renormalised (:func:`mmrl.models.var.processed_log_probs`); re-scoring uses the same
guidance, temperature and top-k (carried in the payload), so the on-policy ratio is 1.
``SamplingParams.temperature == 0`` (evaluation) takes the most likely token at every position and
returns no decisions. The VQ-VAE is frozen; the transformer is trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from safetensors.torch import load_file
from torch import Tensor

from mmrl.core.contracts import Policy, PolicyOutput
from mmrl.models.var import (MultiScaleVQ, NextScaleTransformer, guided_logits, processed_log_probs,
                             sample_tokens)
from mmrl.core.rollout import Rollout, SamplingParams
from mmrl.models.var_pretrain import TRANSFORMER_FILE, cached_var, load_var, prompt_word_ids, save_var


@dataclass(frozen=True)
class VARConfig:
    pretrained: str | None = None
    """A VAR model folder (``mmrl pretrain-imagegen assets/imagegen/var_tiny.json --out DIR``, or a run's
    checkpoint ``policy/`` folder)."""
    pretrain_config: str | None = None
    """Instead of ``pretrained``: a VAR pretraining config (``assets/imagegen/var_tiny.json``), built once
    and cached in ``$MMRL_CACHE/imagegen``."""
    guidance_scale: float = 1.0
    """Classifier-free guidance g on the logits in sampling and re-scoring (1: no unconditional pass)."""
    top_k: int = 0
    """Sample from the k most likely codes only (0: all); the behaviour log-prob is of the truncated,
    renormalised distribution."""
    decision: Literal["token", "scale_mean", "scale_sum"] = "token"
    """What a decision is: each token, or each scale with the mean / sum of its tokens' log-probs."""
    train_scales: tuple[int, ...] = ()
    """Indices (0 = the 1×1 scale) of the scales that are decisions; empty: every scale."""


@dataclass(frozen=True)
class VARPayload:
    tokens: Tensor  # [N, L] long: code indices of all scales, coarse to fine
    words: Tensor  # [N, W] long: prompt word ids (0 = padding)
    guidance: float
    temperature: float
    top_k: int

    def select(self, index: Tensor) -> VARPayload:
        return VARPayload(self.tokens[index], self.words[index], self.guidance, self.temperature, self.top_k)

    @classmethod
    def concat(cls, parts: Sequence[VARPayload]) -> VARPayload:
        first = parts[0]
        settings = {(p.guidance, p.temperature, p.top_k) for p in parts}
        if len(settings) != 1:
            raise ValueError(f"VAR rollouts sampled with different (guidance, temperature, top_k) {sorted(settings)} "
                             f"cannot be concatenated")
        width = max(p.words.shape[1] for p in parts)
        words = torch.cat([torch.nn.functional.pad(p.words, (0, width - p.words.shape[1])) for p in parts])
        return cls(torch.cat([p.tokens for p in parts]), words, first.guidance, first.temperature, first.top_k)


class VARPolicy(Policy):
    def __init__(self, vq: MultiScaleVQ, model: NextScaleTransformer, cfg: VARConfig, source: Path | None = None):
        super().__init__()
        spec = model.spec
        if vq.spec != spec:
            raise ValueError(f"VQ spec {vq.spec} != transformer spec {spec}")
        bad = [k for k in cfg.train_scales if not 0 <= k < len(spec.scales)]
        if bad or len(set(cfg.train_scales)) != len(cfg.train_scales):
            raise ValueError(f"policy.args.train_scales {cfg.train_scales}: indices must be distinct and in "
                             f"0..{len(spec.scales) - 1} (scales {spec.scales})")
        if cfg.top_k < 0 or cfg.guidance_scale < 0:
            raise ValueError(f"policy.args.top_k ({cfg.top_k}) and guidance_scale ({cfg.guidance_scale}) must be >= 0")
        self.vq = vq.eval().requires_grad_(False)
        self.model = model
        self.cfg, self.source, self.spec = cfg, source, spec
        self.register_buffer("token_scale", spec.scale_of_token(), persistent=False)
        trained = torch.zeros(len(spec.scales))
        trained[list(cfg.train_scales or range(len(spec.scales)))] = 1.0
        self.register_buffer("trained_scales", trained, persistent=False)

    @classmethod
    def from_config(cls, cfg: VARConfig) -> VARPolicy:
        if (cfg.pretrained is None) == (cfg.pretrain_config is None):
            raise ValueError("policy.args needs exactly one of pretrained (a VAR model folder) or pretrain_config "
                             "(assets/imagegen/var_tiny.json, built and cached by mmrl pretrain-imagegen)")
        folder = Path(cfg.pretrained) if cfg.pretrained is not None else cached_var(cfg.pretrain_config)
        vq, model = load_var(folder)
        return cls(vq, model, cfg, source=folder)

    @property
    def device(self) -> torch.device:
        return self.model.head.weight.device

    @property
    def num_decisions(self) -> int:
        return self.spec.num_tokens if self.cfg.decision == "token" else len(self.spec.scales)

    def decisions(self, token_values: Tensor) -> Tensor:
        """Token-level values [N, L] → decision values [N, T] (the identity, or per-scale mean / sum)."""
        if self.cfg.decision == "token":
            return token_values
        index = self.token_scale.expand_as(token_values)
        sums = token_values.new_zeros(token_values.shape[0], len(self.spec.scales)).scatter_add(1, index, token_values)
        if self.cfg.decision == "scale_sum":
            return sums
        sizes = torch.tensor([s * s for s in self.spec.scales], dtype=sums.dtype, device=sums.device)
        return sums / sizes

    def decision_mask(self, n: int) -> Tensor:
        per = self.trained_scales if self.cfg.decision != "token" else self.trained_scales[self.token_scale]
        return per.expand(n, -1).clone().cpu()

    @torch.no_grad()
    def rollout(self, examples: Sequence[Any], group_size: int, sampling: SamplingParams, seed: int) -> Rollout:
        if sampling.top_p != 1.0:
            raise ValueError(f"the VAR policy truncates with policy.args.top_k, not top_p (got top_p {sampling.top_p})")
        if sampling.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {sampling.temperature}")
        prompts = [ex.prompt for ex in examples for _ in range(group_size)]
        words = prompt_word_ids(prompts, self.spec.vocab_size).to(self.device)
        gen = torch.Generator().manual_seed(seed)
        tokens, token_logp = sample_tokens(self.model, self.vq, words, self.cfg.guidance_scale, sampling.temperature,
                                           self.cfg.top_k, gen)
        n = len(prompts)
        greedy = sampling.temperature == 0
        mask = torch.zeros(n, self.num_decisions) if greedy else self.decision_mask(n)
        logp = torch.where(mask > 0, self.decisions(token_logp).cpu(), torch.zeros(()))
        example_index = torch.arange(len(examples)).repeat_interleave(group_size)
        payload = VARPayload(tokens.cpu(), words.cpu(), self.cfg.guidance_scale, sampling.temperature, self.cfg.top_k)
        return Rollout(logp=logp.float(), mask=mask, group_id=example_index.clone(), example_index=example_index,
                       outputs=self.decode(tokens), payload=payload, policy_version=self.version)

    @torch.no_grad()
    def decode(self, tokens: Tensor) -> list[np.ndarray]:
        """Tokens [N, L] → uint8 images [H, W, 3] through the frozen VQ decoder."""
        images = ((self.vq.decode(tokens.to(self.device)).clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
        return list(images.permute(0, 2, 3, 1).cpu().numpy())

    @torch.no_grad()
    def generate(self, prompts: Sequence[str], seed: int, temperature: float = 1.0) -> list[np.ndarray]:
        """Images for ``prompts`` sampled at ``temperature`` (0: greedy) with the policy's guidance / top-k."""
        words = prompt_word_ids(list(prompts), self.spec.vocab_size).to(self.device)
        tokens, _ = sample_tokens(self.model, self.vq, words, self.cfg.guidance_scale, temperature, self.cfg.top_k,
                                  torch.Generator().manual_seed(seed))
        return self.decode(tokens)

    def forward(self, rollout: Rollout, with_entropy: bool = False) -> PolicyOutput:
        """Log-probs [N, T] of the rollout's decisions: every token of every scale re-scored in ONE
        teacher-forced pass (CFG doubles the batch), then grouped into decisions."""
        p: VARPayload = rollout.payload
        if p.temperature == 0:  # greedy rows carry no decision: zeros that still reach the weights
            zero = 0.0 * sum(w.sum() for w in self.model.parameters())
            return PolicyOutput(logp=torch.zeros_like(rollout.mask).to(self.device) + zero)
        tokens, words = p.tokens.to(self.device), p.words.to(self.device)
        cond, uncond = guided_logits(self.model, self.vq, words, tokens, p.guidance)
        lp = processed_log_probs(cond, uncond, p.guidance, p.temperature, p.top_k, keep=tokens)  # [N, L, V]
        token_logp = lp.gather(-1, tokens[..., None])[..., 0]
        entropy = None
        if with_entropy:
            probs = lp.exp()
            token_entropy = -torch.where(probs > 0, probs * lp, torch.zeros_like(lp)).sum(-1)
            entropy = self.decisions(token_entropy)  # scale_sum: the joint entropy of the scale's tokens
        return PolicyOutput(logp=self.decisions(token_logp), entropy=entropy)

    def save_pretrained(self, path: str) -> None:
        """A VAR model folder (spec, VQ, transformer) that ``policy.args.pretrained`` loads."""
        save_var(Path(path), self.vq, self.model)

    def load_weights(self, path: str) -> None:
        file = Path(path) / TRANSFORMER_FILE
        if not file.is_file():
            raise FileNotFoundError(f"{path} has no {TRANSFORMER_FILE} (not a VAR model folder)")
        self.model.load_state_dict(load_file(file))
