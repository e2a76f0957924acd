"""Extra per-token loss terms added to the policy objective (``algo.loss_terms``).

A term is a pure function ``(inputs: LossTermInputs, cfg) -> (loss [n, T] or [n], metrics)`` registered
in :data:`LOSS_TERMS`; the trainer aggregates a per-token loss [n, T] with ``algo.loss_agg`` and the
global minibatch denominators (as the PPO term), and a per-sequence loss [n] as a mean over the global
minibatch's sequences (Σ_i ℓ_i / num_seqs: objectives defined per response, e.g. PACS's BCE), adds it
to the total, and logs it as ``loss/<name>``. The returned loss already carries the term's coefficient. What a term reads
beyond the current / old log-probs and advantages comes from :class:`LossTermRows` (per rollout
row: the verifiable outcome, the row's group and its size in the step's batch, and, for terms that
declare the ``"expert_rows"`` need, the π_old
log-probs of the task's reference output for the row's prompt, scored by
``Policy.rollout_from_outputs``, the mechanism of ViSurf's ``rollout.reference_rows``).

``calibrl`` — CalibRL ("Controllable Exploration in Hybrid-Policy RLVR for Multi-Modal Reasoning",
arXiv 2602.20197; code zhh6425/CalibRL ``src/core_algos.py::compute_mix_policy_loss``): the
expert's response is kept out of the group (it enters neither the advantage baseline nor the PPO
term) and calibrates every on-policy token:

    g_{i,t}      = −(2·pass_i − 1) · (log π_θ(y_{i,t}) − log π_old(e)_t)     pass_i = 1[r_i > τ]
    guided_{i,t} = LeakyReLU(g_{i,t}, slope) · |A_{i,t}|                      slope 0.5
    loss         = PPO-clip (dual clip c = 3) + coef · guided                 coef 0.1, token-mean

The expert log-probs are subtracted position-wise, as in the published code (token t of the sample
against token t of the expert). Positions past the end of the expert's response carry no term
(INFERRED: the published code's padding there could not be read).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from mmrl.algos.config import AlgoConfig
from mmrl.algos.masked import masked_mean
from mmrl.algos.variants.params import declare_variant, variant_params
from mmrl.core.registry import Registry


@dataclass(frozen=True)
class LossTermRows:
    """Per-row inputs of the extra loss terms, aligned with the rollout's rows (N of them)."""

    outcome: Tensor  # [N] verifiable score of each row
    expert_logp: Tensor | None  # [N, T_e] π_old log-probs of the row's prompt's expert output (0 on padding)
    expert_mask: Tensor | None  # [N, T_e] float {0,1}: the expert's real tokens
    group_id: Tensor | None = None  # [N] long: the row's group (rows answering the same prompt)
    group_count: Tensor | None = None  # [N] long: rows of the row's group in the step's batch

    def select(self, index: Tensor) -> LossTermRows:
        """Rows ``index`` ([k] long)."""

        def rows(x: Tensor | None) -> Tensor | None:
            return None if x is None else x[index]

        return LossTermRows(self.outcome[index], rows(self.expert_logp), rows(self.expert_mask), rows(self.group_id),
                            rows(self.group_count))


def group_counts(group_id: Tensor) -> Tensor:
    """[N] long: how many rows share each row's group."""
    _, inverse, counts = torch.unique(group_id, return_inverse=True, return_counts=True)
    return counts[inverse]


def whole_groups(rows: LossTermRows, term: str) -> tuple[Tensor, Tensor]:
    """(group index [n] long in 0..g−1, group count g) of the rows, checked to hold every row of each of
    their groups: terms that compare a row with its whole group (PACS, FRPO) need micro-batches of whole
    groups (``trainer.micro_batch_size`` a multiple of ``rollout.group_size``)."""
    if rows.group_id is None or rows.group_count is None:
        raise ValueError(f"the {term} loss term needs the rows' groups (LossTermRows.group_id / group_count)")
    uniq, inverse = torch.unique(rows.group_id, return_inverse=True)
    present = torch.zeros(len(uniq), dtype=torch.long).index_add_(0, inverse.cpu(), torch.ones_like(inverse.cpu()))
    if not torch.equal(present[inverse.cpu()], rows.group_count.cpu().long()):
        raise ValueError(f"the {term} loss term compares each row with its whole group, but a micro-batch holds "
                         f"part of a group: make trainer.micro_batch_size a multiple of rollout.group_size (and do "
                         f"not mix it with hooks that add rows to groups, e.g. rollout.reference_rows)")
    return inverse, len(uniq)


@dataclass(frozen=True)
class LossTermInputs:
    """What a loss term sees for n rows of T decisions."""

    logp: Tensor  # [n, T] log π_θ, with gradient
    logp_old: Tensor  # [n, T] log π_old
    advantages: Tensor  # [n, T]
    mask: Tensor  # [n, T] float {0,1}
    rows: LossTermRows  # n rows


LossTermFn = Callable[[LossTermInputs, AlgoConfig], tuple[Tensor, dict[str, Tensor]]]
LOSS_TERMS: Registry[LossTermFn] = Registry("loss term")


def align_positions(values: Tensor, mask: Tensor, length: int) -> tuple[Tensor, Tensor]:
    """Right-pad (zeros) or cut ``values`` / ``mask`` [n, T_e] to ``length`` positions → two [n, length]."""
    t = values.shape[1]
    if t >= length:
        return values[:, :length], mask[:, :length]
    return F.pad(values, (0, length - t)), F.pad(mask, (0, length - t))


def calibration_term(logp: Tensor, expert_logp_old: Tensor, expert_mask: Tensor, mask: Tensor, passed: Tensor,
                     abs_advantage: Tensor, slope: float) -> Tensor:
    """CalibRL's expert-guided calibration per token (arXiv 2602.20197; ``compute_mix_policy_loss``).

    logp [n, T] (gradient), expert_logp_old / expert_mask [n, T_e] (aligned position-wise, cut or
    padded to T), mask [n, T], passed [n] bool, abs_advantage [n, T] → [n, T]:
    LeakyReLU(−(2·pass − 1)·(log π_θ(y_t) − log π_old(e)_t), slope)·|A|, zero where either row has no token.
    """
    expert, expert_valid = align_positions(expert_logp_old.to(logp), expert_mask.to(logp), logp.shape[1])
    sign = 2.0 * passed.to(logp)[:, None] - 1.0  # [n, 1]: +1 passed, −1 failed
    g = -sign * (logp - expert.detach())
    return F.leaky_relu(g, negative_slope=slope) * abs_advantage.detach() * mask * expert_valid


@dataclass(frozen=True)
class CalibRLParams:
    coef: float = 0.1
    """Weight of the guided term in the loss (CalibRL code: 0.1)."""
    slope: float = 0.5
    """LeakyReLU negative slope (CalibRL code: 0.5)."""
    pass_threshold: float = 0.1
    """A row passes when its outcome is > this (CalibRL code: 0.1)."""


declare_variant("calibrl", CalibRLParams, needs=("expert_rows",))


@LOSS_TERMS.register("calibrl")
def calibrl_loss_term(inputs: LossTermInputs, cfg: AlgoConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """``coef`` × :func:`calibration_term` on the rows (their expert rows come from the trainer)."""
    p = variant_params(cfg, "calibrl")
    rows = inputs.rows
    if rows.expert_logp is None or rows.expert_mask is None:
        raise ValueError("the calibrl loss term needs the expert rows' log-probs (the trainer provides them "
                         "when the variant's 'expert_rows' need is declared)")
    passed = rows.outcome > p.pass_threshold
    term = calibration_term(inputs.logp, rows.expert_logp, rows.expert_mask, inputs.mask, passed,
                            inputs.advantages.abs(), p.slope)
    metrics = {"policy/calibrl_pass_rate": passed.float().mean(),
               "policy/calibrl_guided": masked_mean(term.detach(), inputs.mask)}
    return p.coef * term, metrics
