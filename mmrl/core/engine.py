"""Devices, processes and precision, through ``accelerate`` (DDP / FSDP / DeepSpeed by its config).

The trainer talks to this thin layer only: it never checks ranks or devices itself.
Run multi-process with ``accelerate launch --config_file configs/accelerate/<name>.yaml``; on CPU
use ``ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2`` (``--cpu
--num_processes 2`` silently runs one process; see docs/architecture.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

import torch
from accelerate import Accelerator
from torch import Tensor

from mmrl.core.config import ConfigError


class _TiedWeightsNotice(logging.Filter):
    """accelerate warns on every checkpoint of a model with tied embeddings (ours: tiny LMs);
    saving them once is what safetensors requires, and reloading restores the tie."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Removed shared tensor" not in record.getMessage()


logging.getLogger("accelerate.utils.other").addFilter(_TiedWeightsNotice())


def set_threads(threads: int | None) -> int:
    """Use ``threads`` CPU math threads in torch (None: keep torch's default, one per core, or
    ``OMP_NUM_THREADS``); returns the count in use. Tiny models on a shared 2-core machine run many
    times faster on one thread than on torch's default, which spins against the other processes."""
    if threads is not None and threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    return torch.get_num_threads()


class LaunchError(ConfigError):
    """The processes were launched in a way that cannot train (reported once, by rank 0)."""


class Engine:
    def __init__(self, mixed_precision: str | None = None):
        """``mixed_precision`` None leaves the choice to the launch config / environment."""
        self.accelerator = Accelerator(mixed_precision=mixed_precision)
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if launched > 1 and self.accelerator.num_processes == 1:
            # e.g. a MULTI_GPU launch config on a machine without GPUs: every process would train
            # alone and write the same run folder.
            raise LaunchError(f"launched with WORLD_SIZE={launched} but accelerate sees one process; on CPU "
                              f"set ACCELERATE_USE_CPU=true (see configs/accelerate/cpu_2proc.yaml)")

    @property
    def rank(self) -> int:
        return self.accelerator.process_index

    @property
    def world_size(self) -> int:
        return self.accelerator.num_processes

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    def prepare(self, *objects):
        return self.accelerator.prepare(*objects)

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return self.accelerator.unwrap_model(model)

    def autocast(self) -> contextlib.AbstractContextManager:
        return self.accelerator.autocast()

    def backward(self, loss: Tensor) -> None:
        self.accelerator.backward(loss)

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module, skip_sync: bool) -> Iterator[None]:
        """Skip the gradient all-reduce for all but the last micro-batch of a minibatch.

        The accumulation state is also what DeepSpeed's engine reads to decide when to step.
        """
        self.accelerator.gradient_state._set_sync_gradients(not skip_sync)
        try:
            if skip_sync and self.world_size > 1:
                with self.accelerator.no_sync(model):
                    yield
            else:
                yield
        finally:
            self.accelerator.gradient_state._set_sync_gradients(True)

    def clip_grad_norm(self, params, max_norm: float) -> float | None:
        """Global gradient norm before clipping; None when the backend clips and checks the
        gradients itself and reports no norm (DeepSpeed)."""
        norm = self.accelerator.clip_grad_norm_(params, max_norm)
        return None if norm is None else float(norm)

    def sum(self, value: float | Tensor) -> float:
        """Sum of a scalar over processes."""
        t = torch.as_tensor(value, dtype=torch.float64, device=self.device).reshape(1)
        return float(self.accelerator.reduce(t, reduction="sum")) if self.world_size > 1 else float(t)

    def mean(self, value: float | Tensor) -> float:
        return self.sum(value) / self.world_size

    def any(self, flag: bool) -> bool:
        return self.sum(float(flag)) > 0

    def gather_objects(self, *lists: list) -> tuple[list, ...]:
        """Each list concatenated over processes in rank order (the same result on every process)."""
        if self.world_size == 1:
            return lists
        from accelerate.utils import gather_object

        return tuple(gather_object(list(items)) for items in lists)

    def wait(self) -> None:
        self.accelerator.wait_for_everyone()

    def end(self) -> None:
        self.accelerator.end_training()
