"""Measured memory of one real update micro-batch, to check ``mmrl plan`` against (docs/memory_plan.md).

The rows are drawn as the trainer draws them (``policy.rollout`` of whole groups, so a group's rows share their
prompt) and scored as its update scores them (``policy.score`` of the payload, with entropy: the VLM policy runs
each distinct prompt once). Two exact CPU measurements of that forward and its backward:

- **saved for backward**: every tensor autograd keeps for the backward pass, seen through
  ``torch.autograd.graph.saved_tensors_hooks``, counted once per storage, parameters left out;
- **peak**: the high-water mark of the CPU allocations made during forward + backward (the profiler's
  ``[memory]`` events with ``profile_memory=True``, summed in time order), parameter gradients included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from mmrl.core.config import TrainConfig
from mmrl.core.contracts import Policy
from mmrl.core.rollout import Rollout, SamplingParams
from mmrl.policies.causal_lm import CausalLMPolicy
from mmrl.policies.vlm import VLMPayload, VLMPolicy

ScoredPolicy = CausalLMPolicy | VLMPolicy
"""The policies whose update steps are measured (those ``mmrl plan`` plans in full)."""


@dataclass(frozen=True)
class MeasuredStep:
    rows: int
    prompts: int
    """Distinct prompts among the rows (their groups)."""
    prompt_tokens: int
    """Prompt length of the micro-batch (padded)."""
    completion_tokens: int
    """Completion length of the micro-batch (padded): at most ``rollout.max_new_tokens``."""
    patches_per_row: int
    """Image patches of one prompt."""
    saved_bytes: int
    peak_bytes: int
    parameters: int
    trainable: int


def draw_update_rows(policy: Policy, cfg: TrainConfig, rows: int) -> Rollout:
    """``rows`` sampled rows (whole groups of ``rollout.group_size``, cut to ``rows``) of the recipe's task."""
    from mmrl.core.registry import make_task

    task = make_task(cfg.task.name, cfg.task.args)
    group = cfg.rollout.group_size
    examples = task.sample_batch("train", math.ceil(rows / group), np.random.default_rng(cfg.trainer.seed))
    sampling = SamplingParams(cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_new_tokens)
    rollout = policy.rollout(examples, group, sampling, cfg.trainer.seed)
    return rollout.select(torch.arange(rows))


def saved_and_peak(policy: ScoredPolicy, rollout: Rollout) -> tuple[int, int]:
    """Bytes saved for backward by ``policy.score(rollout.payload, with_entropy=True)`` and the allocation peak of
    that forward and the backward of its summed log-probs."""
    from torch.profiler import ProfilerActivity, profile

    params = {p.untyped_storage().data_ptr() for p in policy.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    policy.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            out = policy.score(rollout.payload, with_entropy=True)
        (-(out.logp * rollout.mask).sum()).backward()
        del out
    policy.zero_grad(set_to_none=True)
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return sum(saved.values()), peak


def measure_update_step(cfg: TrainConfig, rows: int) -> MeasuredStep:
    """Build the recipe's policy for real, draw ``rows`` rows, measure one forward + backward on them."""
    from mmrl.core.registry import make_policy

    policy = make_policy(cfg.policy.name, cfg.policy.args)
    policy.train()
    rollout = draw_update_rows(policy, cfg, rows)
    payload = rollout.payload
    prompts = len(rollout.group_id.unique())
    if isinstance(payload, VLMPayload):  # it stores each distinct prompt (and its images) once
        prompt_tokens, pixels = payload.prompts.input_ids.shape[1], payload.prompts.pixel_values
        patches = 0 if pixels is None else pixels.shape[0] // payload.prompts.num_rows
    else:
        prompt_tokens, patches = payload.prompt_ids.shape[1], 0
    saved, peak = saved_and_peak(policy, rollout)
    params = list(policy.parameters())
    return MeasuredStep(rows=rollout.num_rows, prompts=prompts, prompt_tokens=prompt_tokens,
                        completion_tokens=rollout.mask.shape[1], patches_per_row=patches, saved_bytes=saved,
                        peak_bytes=peak, parameters=sum(p.numel() for p in params),
                        trainable=sum(p.numel() for p in params if p.requires_grad))
