"""The optimizer and learning-rate schedule of a training run, and the step that guards them.

AdamW over the trainable parameters (the adapters only under LoRA); the learning rate is
``trainer.lr × lr_factor(update)``, counted in optimizer steps (``steps × ppo_epochs × minibatches``).
The scheduler is not passed through accelerate (its wrapper would step once per process): the trainer
checkpoints it with the rest of the state.
"""

from __future__ import annotations

import math

import torch

from mmrl.core.config import TrainerConfig


def lr_factor(update: int, warmup: int, total: int, schedule: str) -> float:
    """Multiplier of the base learning rate at optimizer step ``update``."""
    if update < warmup:
        return (update + 1) / warmup
    progress = (update - warmup) / max(total - warmup, 1)
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return 1.0


def build_optimizer(model: torch.nn.Module, t: TrainerConfig
                    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``model``'s trainable parameters and its warmup + decay schedule."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=t.lr, weight_decay=t.weight_decay)
    updates = t.steps * t.ppo_epochs * t.minibatches
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: lr_factor(i, t.warmup_steps, updates, t.lr_schedule))
    return optimizer, scheduler
