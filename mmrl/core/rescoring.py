"""No-gradient forwards over a whole rollout, in micro-batches: the behaviour policy's per-decision entropy,
a fresh π_old, and the reference policy's outputs for the KL term."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from torch import Tensor

from mmrl.core.contracts import Policy, PolicyOutput
from mmrl.core.rollout import Rollout


def micro_batches(rollout: Rollout, size: int) -> list[Rollout]:
    return [rollout.select(torch.arange(start, min(start + size, rollout.num_rows)))
            for start in range(0, rollout.num_rows, size)]


@torch.no_grad()
def forward_no_grad(model: Policy, rollout: Rollout, size: int, autocast: Callable[[], AbstractContextManager],
                    entropy: bool = False) -> Tensor:
    """Log-probs of the rollout's decisions ([N, T] on the CPU), or with ``entropy`` the per-decision entropy."""
    parts = []
    for rows in micro_batches(rollout, size):
        with autocast():
            out = model(rows, with_entropy=entropy)
        parts.append((out.entropy if entropy else out.logp).float().cpu())
    t_max = rollout.mask.shape[1]
    return torch.cat([torch.nn.functional.pad(p, (0, t_max - p.shape[1])) for p in parts]) * rollout.mask


@torch.no_grad()
def gaussian_outputs(model: Policy, rollout: Rollout, size: int, autocast: Callable[[], AbstractContextManager],
                     estimator: str) -> PolicyOutput:
    """Log-probs [N, T] with the Gaussian means / stds of each decision (closed-form KL estimators such as
    Flow-GRPO's), kept on the CPU."""
    parts = []
    for rows in micro_batches(rollout, size):
        with autocast():
            out = model(rows)
        if out.mean is None or out.std is None:
            raise ValueError(f"algo.kl_estimator {estimator} needs a policy whose decisions are Gaussian and that "
                             f"returns PolicyOutput.mean / std (the diffusion policy); {type(model).__name__} does "
                             f"not: use k1 / k3 / low_var_kl")
        parts.append(out)
    return PolicyOutput(logp=torch.cat([o.logp.float().cpu() for o in parts]) * rollout.mask,
                        mean=torch.cat([o.mean.float().cpu() for o in parts]),
                        std=torch.cat([o.std.float().cpu() for o in parts]))


def select_output(reference: PolicyOutput | None, idx: Tensor) -> PolicyOutput | None:
    """Rows ``idx`` of the reference policy's outputs."""
    if reference is None:
        return None
    return PolicyOutput(logp=reference.logp[idx],
                        mean=None if reference.mean is None else reference.mean[idx],
                        std=None if reference.std is None else reference.std[idx])


def reference_outputs(mode: str, policy: Policy, ref: Policy | None, rollout: Rollout, size: int,
                      autocast: Callable[[], AbstractContextManager], estimator: str, gaussian: bool
                      ) -> PolicyOutput | None:
    """The reference policy on the whole rollout (``trainer.ref_model``: the frozen ``ref`` copy, the
    ``policy`` with its adapters disabled, or none): log-probs [N, T], with the Gaussian means / stds of
    each decision when ``gaussian`` (closed-form KL estimators), on the CPU."""
    if mode == "none":
        return None
    model = ref if mode == "copy" else policy
    with policy.adapter_disabled() if mode == "adapter_disabled" else contextlib.nullcontext():
        if gaussian:
            return gaussian_outputs(model, rollout, size, autocast, estimator)
        return PolicyOutput(logp=forward_no_grad(model, rollout, size, autocast))
