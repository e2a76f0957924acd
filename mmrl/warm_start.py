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


def export_warm_start(cfg: TrainConfig, out: str | Path, overwrite: bool = False) -> Path:
    """``mmrl sft`` / ``mmrl bc``: run the recipe's warm start and save the policy to ``out`` in its
    own format (``save_pretrained``), with ``config.yaml`` and the loss curve ``sft_losses.json``.

    The folder can then seed RL with ``policy.args.pretrained=<out>`` (policies that load one).
    """
    from mmrl.config import ConfigError, dump_config

    if cfg.warm_start.sft_steps < 1:
        raise ConfigError("warm_start.sft_steps must be >= 1 to run a supervised warm start")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out} already holds files; pass --overwrite to replace it")
        if not (out / "config.yaml").is_file():
            raise FileExistsError(f"refusing to --overwrite {out}: it holds files but was not written by mmrl "
                                  f"(no config.yaml)")
        shutil.rmtree(out)
    policy = make_policy(cfg.policy.name, cfg.policy.args)
    losses = sft(policy, cfg)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    policy.save_pretrained(str(tmp))
    dump_config(cfg, tmp / "config.yaml")
    (tmp / "sft_losses.json").write_text(json.dumps(losses))
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, out)
    return out


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
