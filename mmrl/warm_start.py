"""Initial policies: build the configured policy, then (optionally) a supervised warm start on the
task's reference outputs, cached so later runs with the same recipe reuse it.

Cache: ``$MMRL_CACHE`` (default ``~/.cache/mmrl``) ``/warm_start/<fingerprint>/`` in the
policy's own format; the fingerprint covers the task, policy and warm-start configs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from mmrl.config import TrainConfig, to_dict
from mmrl.contracts import Policy
from mmrl.registry import make_policy, make_task


def cache_root() -> Path:
    return Path(os.environ.get("MMRL_CACHE", Path.home() / ".cache" / "mmrl"))


def warm_start_path(cfg: TrainConfig) -> Path:
    key = json.dumps({"task": to_dict(cfg.task), "policy": to_dict(cfg.policy),
                      "warm_start": to_dict(cfg.warm_start)}, sort_keys=True)
    return cache_root() / "warm_start" / hashlib.sha256(key.encode()).hexdigest()[:16]


def build_initial_policy(cfg: TrainConfig, device: torch.device | str = "cpu", is_main: bool = True,
                         wait=lambda: None) -> Policy:
    """The policy RL starts from, on ``device``. With several processes the main one trains the
    warm start and the others load it from the cache after ``wait()``."""
    policy = make_policy(cfg.policy.name, cfg.policy.args).to(device)
    ws = cfg.warm_start
    if ws.sft_steps == 0:
        return policy
    path = warm_start_path(cfg)
    if not (ws.cache and path.is_dir()) and is_main:
        sft(policy, cfg)
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        policy.save_pretrained(str(tmp))
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
    wait()
    policy.load_weights(str(path))  # also on the main process: the same weights every way
    return policy


def sft(policy: Policy, cfg: TrainConfig) -> list[float]:
    """``warm_start.sft_steps`` AdamW steps of supervised fine-tuning on reference outputs."""
    task = make_task(cfg.task.name, cfg.task.args)
    ws = cfg.warm_start
    rng = np.random.default_rng(ws.seed)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=ws.lr)
    losses = []
    policy.train()
    bar = tqdm(range(ws.sft_steps), desc="warm start (SFT)", disable=not cfg.log.progress, dynamic_ncols=True)
    for _ in bar:
        examples = task.sample_batch("train", ws.batch_size, rng)
        loss = policy.sft_loss(examples, [task.reference_output(ex) for ex in examples])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    optimizer.zero_grad(set_to_none=True)  # no stale gradients may reach the RL optimizer
    return losses
