"""Devices, processes and precision, through ``accelerate`` (DDP / FSDP / DeepSpeed by its config).

The trainer talks to this thin layer only: it never checks ranks or devices itself.
Run multi-process with ``accelerate launch --config_file configs/accelerate/<name>.yaml``; on CPU
use ``ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2`` (``--cpu
--num_processes 2`` silently runs one process; see docs/architecture.md), and for FSDP2 on CPU
``ACCELERATE_USE_CPU=true accelerate launch --config_file configs/accelerate/fsdp_cpu_2proc.yaml``
(docs/scaling.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

import torch
from accelerate import Accelerator
from accelerate.state import PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
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


def fsdp_requested() -> bool:
    """Whether ``accelerate launch`` was given an FSDP config (it exports ``ACCELERATE_USE_FSDP``)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def enable_fsdp_on_cpu(accelerator: Accelerator) -> None:
    """Turn a CPU (gloo) multi-process run launched with an FSDP config into the FSDP run it asked for.

    accelerate 1.16 enables FSDP only for accelerator devices (``AcceleratorState.__init__`` switches
    to FSDP from MULTI_GPU / MULTI_XPU / ..., never from MULTI_CPU): on CPU it silently wraps the model
    in DDP instead. torch's FSDP2 (``fully_shard``) itself runs on CPU with gloo, and so do accelerate's
    FSDP2 preparation and its sharded (DCP) checkpoints, so this sets the two fields that
    ``AcceleratorState.__init__`` sets on a GPU: the distributed type (in the shared state that every
    later ``AcceleratorState()`` copies) and the plugin (read from the same environment variables).
    """
    plugin = FullyShardedDataParallelPlugin()
    if accelerator.mixed_precision != "no":
        plugin.set_mixed_precision(accelerator.mixed_precision)
    accelerator.state.fsdp_plugin = plugin
    accelerator.state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP


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
        if fsdp_requested() and self.accelerator.distributed_type == DistributedType.MULTI_CPU:
            enable_fsdp_on_cpu(self.accelerator)
        if self.accelerator.distributed_type == DistributedType.FSDP and not self.accelerator.is_fsdp2:
            raise LaunchError("FSDP1 (fsdp_version: 1) is not supported: sampling needs FSDP2's per-module "
                              "unshard (Engine.full_parameters); set fsdp_version: 2 (configs/accelerate/fsdp.yaml)")

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

    @property
    def sharded(self) -> bool:
        """Parameters are sharded over processes (FSDP2): sampling and saving need :meth:`full_parameters`."""
        return self.accelerator.is_fsdp2

    def prepare(self, *objects):
        prepared = self.accelerator.prepare(*objects)
        if self.sharded:
            # FSDP2 takes as its root the first sharded module to run forward; sampling calls the
            # inner model (generate) and so the decoder layers' forward first, which would make a
            # layer the root and fail the first update ("requires running forward through the root
            # module first"). There is no public call for this: the root is settled here, once.
            model = next(obj for obj in (prepared if isinstance(prepared, (tuple, list)) else (prepared,))
                         if isinstance(obj, torch.nn.Module))
            model._get_fsdp_state()._lazy_init()
        return prepared

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return self.accelerator.unwrap_model(model)

    @contextlib.contextmanager
    def full_parameters(self, model: torch.nn.Module) -> Iterator[None]:
        """Every process holds all of ``model``'s parameters, whole, for the duration (all processes enter).

        Sampling needs it under FSDP2: ``generate`` calls the model once per new token until every row
        stopped, so processes run different numbers of forward calls, and the per-layer all-gathers of
        FSDP's forward would pair up across processes wrongly (a hang or wrong weights). Inside this
        context each sharded module is all-gathered once and kept whole through any number of forward
        calls; on leaving it is re-sharded (modifications to the whole parameters are discarded). Without
        sharding it does nothing.
        """
        if not self.sharded:
            yield
            return
        from torch.distributed.fsdp import FSDPModule

        units = [module for module in model.modules() if isinstance(module, FSDPModule)]
        reshard_after_forward = self.accelerator.state.fsdp_plugin.reshard_after_forward
        for unit in units:
            unit.set_reshard_after_forward(False, recurse=False)
            unit.unshard()
        try:
            yield
        finally:
            for unit in units:
                unit.set_reshard_after_forward(reshard_after_forward, recurse=False)
                unit.reshard()

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
