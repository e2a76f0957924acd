"""Token-sequence machinery shared by every text-emitting policy (causal LMs, VLMs).

One place owns the layout: prompts left-padded, completions right-padded, positions from the
attention mask, log-probs of the tempered distribution with the same suppressed ids in sampling
and in scoring (so on-policy ratios are exactly 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F
from transformers import LogitsProcessor, TopPLogitsWarper


@dataclass(frozen=True)
class TokenPayload:
    """Rows of (prompt, completion) token ids. Satisfies :class:`mmrl.core.rollout.Payload`."""

    prompt_ids: Tensor  # [N, P] long, left-padded
    prompt_mask: Tensor  # [N, P] long {0,1}
    completion_ids: Tensor  # [N, T] long, right-padded (pad after the first EOS)
    completion_mask: Tensor  # [N, T] long {0,1}: generated tokens up to and including EOS
    temperature: Tensor  # [N] float32: each row's sampling temperature, whose distribution log-probs refer to
    # (per row, so rollouts drawn at different temperatures concatenate: ERPO's per-prompt temperatures)
    pad_id: int

    def select(self, index: Tensor) -> TokenPayload:
        return TokenPayload(self.prompt_ids[index], self.prompt_mask[index], self.completion_ids[index],
                            self.completion_mask[index], self.temperature[index], self.pad_id)

    @classmethod
    def concat(cls, parts: Sequence[TokenPayload]) -> TokenPayload:
        p_max = max(p.prompt_ids.shape[1] for p in parts)
        t_max = max(p.completion_ids.shape[1] for p in parts)
        pad = parts[0].pad_id

        def left(x: Tensor, value: int) -> Tensor:
            return F.pad(x, (p_max - x.shape[1], 0), value=value)

        def right(x: Tensor, value: int) -> Tensor:
            return F.pad(x, (0, t_max - x.shape[1]), value=value)

        return cls(
            prompt_ids=torch.cat([left(p.prompt_ids, pad) for p in parts]),
            prompt_mask=torch.cat([left(p.prompt_mask, 0) for p in parts]),
            completion_ids=torch.cat([right(p.completion_ids, pad) for p in parts]),
            completion_mask=torch.cat([right(p.completion_mask, 0) for p in parts]),
            temperature=torch.cat([p.temperature for p in parts]), pad_id=pad,
        )


def completion_mask_from_eos(completion_ids: Tensor, eos_ids: Sequence[int]) -> Tensor:
    """1 for tokens up to and including the first EOS of each row, 0 after ([N, T] long)."""
    is_eos = torch.isin(completion_ids, torch.tensor(list(eos_ids), device=completion_ids.device))
    # eos_before[t] = number of EOS strictly before t
    eos_before = is_eos.long().cumsum(1) - is_eos.long()
    return (eos_before == 0).long()


def token_logprobs(logits: Tensor, tokens: Tensor, temperature: float | Tensor, suppressed: Tensor | None,
                   mask: Tensor, with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """log π(token) under softmax(logits / τ) with ``suppressed`` ids removed ([N,T,V] → [N,T]).

    ``temperature`` is one τ or one per row ([N]). τ = 0 (greedy) scores under τ = 1. The same
    function serves sampling and re-scoring, so both see one distribution.

    ``mask`` [N, T] marks the real tokens. Outside it the log-prob is 0 (padding may hold a
    suppressed id, whose log-prob is −inf). Inside it a non-finite log-prob (NaN / inf logits from
    a diverged forward pass, or a suppressed id in a scored text) is returned as it is, never
    replaced: the loss then shows it, and ``mmrl.algos.masked.count_nonfinite(logp, mask)`` counts it.
    """
    logits = logits.float()
    if isinstance(temperature, Tensor):
        tau = temperature.to(device=logits.device, dtype=logits.dtype)
        logits = logits / torch.where(tau > 0, tau, torch.ones_like(tau))[:, None, None]
    elif temperature > 0:
        logits = logits / temperature
    if suppressed is not None and suppressed.numel():
        logits = logits.index_fill(-1, suppressed, float("-inf"))
    logp_all = F.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    # 0 on padding only (a suppressed pad id gives −inf, and −inf · 0 would be NaN downstream).
    logp = torch.where(mask.to(logp.device) > 0, logp, torch.zeros_like(logp))
    entropy = None
    if with_entropy:
        p = logp_all.exp()
        entropy = -(p * torch.where(p > 0, logp_all, torch.zeros_like(logp_all))).sum(-1)
    return logp, entropy


def tempered_log_softmax(logits: Tensor, temperature: float, suppressed: Tensor | None) -> Tensor:
    """log softmax(logits / τ) over the vocabulary with ``suppressed`` ids at −inf ([..., V] → [..., V], float32):
    the whole distribution :func:`token_logprobs` reads one entry of. τ = 0 counts as τ = 1."""
    logits = logits.float() / (temperature if temperature > 0 else 1.0)
    if suppressed is not None and suppressed.numel():
        logits = logits.index_fill(-1, suppressed.to(logits.device), float("-inf"))
    return F.log_softmax(logits, dim=-1)


def positions_from_mask(attention_mask: Tensor) -> Tensor:
    """Position ids that skip left padding (as ``generate`` computes them)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


class BehaviourLogprobs(LogitsProcessor):
    """The only logits processor of a ``generate`` call: raw logits → the sampling distribution
    (÷ τ, suppressed ids at −inf, then top-p), recording the log-prob of each sampled token under the
    tempered distribution with the suppressed ids removed (no top-p cut: the distribution re-scoring
    uses). τ = 0 (greedy) scores under τ = 1, as :func:`token_logprobs` does. Keeping one step of logits
    instead of every step's (``output_logits``) bounds generation memory by rows × vocabulary.

    Step t's call sees the token sampled at step t − 1 (the last column of ``input_ids``) and scores it
    against the logits of step t − 1, kept until then; :meth:`finish` scores the last step's token."""

    def __init__(self, temperature: float, top_p: float, suppressed: torch.Tensor):
        self.tau = temperature if temperature > 0 else 1.0
        self.top_p = TopPLogitsWarper(top_p) if 0 < temperature and top_p < 1.0 else None
        self.suppressed = suppressed
        self.logps: list[torch.Tensor] = []
        self.previous: torch.Tensor | None = None  # the last step's tempered logits, suppressed ids at −inf

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.previous is not None:
            self.record(input_ids[:, -1])
        x = scores.float() / self.tau
        if self.suppressed.numel():
            x.index_fill_(-1, self.suppressed.to(x.device), float("-inf"))
        self.previous = x
        return x if self.top_p is None else self.top_p(input_ids, x.clone())

    def record(self, tokens: torch.Tensor) -> None:
        # log_softmax of the one step: the same floats token_logprobs gives the whole [N, T, V] stack
        self.logps.append(F.log_softmax(self.previous, dim=-1).gather(-1, tokens[:, None]).squeeze(-1))

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """[n, T] log-probs of every step's token (pad after a row's end: the caller masks it)."""
        self.record(last_tokens)
        self.previous = None
        return torch.stack(self.logps, dim=1)
