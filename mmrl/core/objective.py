"""The loss of one micro-batch, from the policy's outputs on it: the policy-gradient objective, the KL
to the reference, the loss hooks' terms, the entropy bonus and the value loss.

Every term is aggregated with the *global* minibatch's denominators (``MicroInputs.denominators``),
so the sum of the micro-batch losses is the minibatch loss whatever the micro-batch size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from mmrl.algos import (GAUSSIAN_KL_ESTIMATORS, POLICY_LOSSES, aggregate, kl_penalty, truncated_is_weights,
                        value_loss)
from mmrl.algos.config import AlgoConfig
from mmrl.algos.hooks import MicroBatch, UpdateIndex
from mmrl.core.contracts import PolicyOutput
from mmrl.core.rollout import Rollout


@dataclass(frozen=True)
class MicroInputs:
    """One micro-batch of an update: its rows and the step's per-row inputs sliced to them."""

    index: UpdateIndex
    rows: Rollout
    idx: Tensor  # [n] long: positions of the rows in the step's batch
    logp_old: Tensor  # [n, T]
    advantages: Tensor  # [n, T]
    returns: Tensor | None  # [n, T] value targets (critic-based estimators)
    reference: PolicyOutput | None  # the reference policy on these rows
    denominators: dict[str, float]  # num_tokens, num_seqs, norm_len of the global minibatch


def micro_loss(out: PolicyOutput, m: MicroInputs, a: AlgoConfig, hooks: Sequence[Any],
               device: Any) -> tuple[Tensor, dict[str, float]]:
    """The micro-batch's loss (a scalar with gradient) and its metrics (``loss/*``, ``policy/*``)."""
    mask, logp_old, adv, den = m.rows.mask.to(device), m.logp_old.to(device), m.advantages.to(device), m.denominators
    logp = out.logp.float()
    pg, metrics = POLICY_LOSSES.get(a.policy_loss)(logp, logp_old, adv, mask, a)
    if a.tis_cap is not None:
        pg = pg * truncated_is_weights(logp_old, m.rows.logp.to(device), a.tis_cap)
    total = loss_pg = aggregate(pg, mask, a.loss_agg, **den)
    terms: dict[str, float] = {"loss/policy": loss_pg.item()}
    kl_ref = None
    if m.reference is not None:
        reference = m.reference
        if a.kl_estimator in GAUSSIAN_KL_ESTIMATORS:  # closed form from the decisions' means (Flow-GRPO)
            ref = PolicyOutput(logp=reference.logp.to(device), mean=reference.mean.to(device),
                               std=reference.std.to(device))
            kl = GAUSSIAN_KL_ESTIMATORS.get(a.kl_estimator)(out, ref)
        else:
            kl = kl_penalty(logp, reference.logp.to(device), a.kl_estimator)
        loss_kl = aggregate(kl, mask, a.loss_agg, **den)
        total = total + a.kl_coef * loss_kl
        kl_ref = float((kl.detach() * mask).sum() / mask.sum().clamp(min=1))
        terms |= {"loss/kl": loss_kl.item(), "policy/kl_ref": kl_ref}
    micro = MicroBatch(m.index, m.idx, logp, logp_old, adv, mask, den, kl_ref)
    for hook in hooks:
        term, hook_terms = hook.micro_term(micro)
        if term is not None:
            total = total + term
        terms |= hook_terms
    if out.entropy is not None:
        loss_ent = aggregate(out.entropy.float(), mask, a.loss_agg, **den)
        if a.entropy_coef:
            total = total - a.entropy_coef * loss_ent
        terms |= {"loss/entropy": loss_ent.item(),
                  "policy/entropy": float((out.entropy.detach() * mask).sum() / mask.sum().clamp(min=1))}
    if out.values is not None and m.returns is not None and m.rows.values is not None:
        vl, v_metrics = value_loss(out.values.float(), m.rows.values.to(device), m.returns.to(device), mask,
                                   a.value_clip, a.value_huber_delta)
        loss_v = aggregate(vl, mask, a.loss_agg, **den)
        total = total + a.value_coef * loss_v
        terms |= {"loss/value": loss_v.item(), **{k: float(v) for k, v in v_metrics.items()}}
    terms |= {k: float(v) for k, v in metrics.items()}
    terms["loss/total"] = total.item()
    return total, terms
