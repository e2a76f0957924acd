"""Loss aggregation, its own axis (verl ``agg_loss``): how per-token losses [N, T] become a scalar.

The denominators can be given explicitly so that a minibatch split into micro-batches (gradient
accumulation) or across processes gives exactly the loss of the whole minibatch: pass the token
and sequence counts of the *global* minibatch and sum the micro-batch losses.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from mmrl.core.registry import Registry

AggregationFn = Callable[..., Tensor]
AGGREGATIONS: Registry[AggregationFn] = Registry("loss aggregation")


@AGGREGATIONS.register("token-mean")
def token_mean(loss: Tensor, mask: Tensor, *, num_tokens: float | None = None, num_seqs: float | None = None,
               norm_len: float | None = None) -> Tensor:
    """Σ_{i,t} ℓ_{i,t} / Σ_{i,t} m_{i,t}: every token weighs the same (DAPO §3.3)."""
    denom = mask.sum() if num_tokens is None else num_tokens
    return (loss * mask).sum() / max(float(denom), 1.0)


@AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(loss: Tensor, mask: Tensor, *, num_tokens: float | None = None,
                        num_seqs: float | None = None, norm_len: float | None = None) -> Tensor:
    """(1/N) Σ_i (Σ_t ℓ_{i,t} / |y_i|): GRPO's original per-sequence average (DeepSeekMath eq. 3)."""
    per_seq = (loss * mask).sum(1) / mask.sum(1).clamp(min=1)
    denom = loss.shape[0] if num_seqs is None else num_seqs
    return per_seq.sum() / max(float(denom), 1.0)


@AGGREGATIONS.register("seq-mean-token-sum")
def seq_mean_token_sum(loss: Tensor, mask: Tensor, *, num_tokens: float | None = None,
                       num_seqs: float | None = None, norm_len: float | None = None) -> Tensor:
    """(1/N) Σ_i Σ_t ℓ_{i,t}: sequence sums averaged over sequences."""
    denom = loss.shape[0] if num_seqs is None else num_seqs
    return (loss * mask).sum() / max(float(denom), 1.0)


@AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(loss: Tensor, mask: Tensor, *, num_tokens: float | None = None,
                            num_seqs: float | None = None, norm_len: float | None = None) -> Tensor:
    """(1/(N·L)) Σ_i Σ_t ℓ_{i,t} with a constant L (Dr. GRPO, Liu et al. 2025 eq. 2; TRL
    ``loss_type="dr_grpo"`` uses L = max_completion_length). Default L: padded length T.
    """
    n = loss.shape[0] if num_seqs is None else num_seqs
    length = loss.shape[1] if norm_len is None else norm_len
    return (loss * mask).sum() / max(float(n) * float(length), 1.0)


def aggregate(loss: Tensor, mask: Tensor, mode: str, **denominators: float | None) -> Tensor:
    """Aggregate [N, T] per-token losses with the registered ``mode``."""
    return AGGREGATIONS.get(mode)(loss, mask, **denominators)
