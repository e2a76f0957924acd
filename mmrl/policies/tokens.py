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


def positions_from_mask(attention_mask: Tensor) -> Tensor:
    """Position ids that skip left padding (as ``generate`` computes them)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
