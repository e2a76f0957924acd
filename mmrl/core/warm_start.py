"""Initial policies: build the configured policy, then (optionally) a supervised warm start on the
task's reference outputs, cached so later runs with the same recipe reuse it.

Cache: ``$MMRL_CACHE`` (default ``~/.cache/mmrl``) ``/warm_start/<fingerprint>/`` in the
policy's own format; the fingerprint covers the task, policy and warm-start configs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
import os
import shutil
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from tqdm.auto import tqdm

from mmrl.core.config import TrainConfig, to_dict
from mmrl.core.contracts import DEMONSTRATION_STEPS_FILE, HintedTask, Policy, SimulatorTask, ToolTask
from mmrl.core.paths import cache_root
from mmrl.core.registry import make_policy, make_task


# Warm-start fields added after caches existed: left out of the key while off, so every recipe
# that does not use them keeps its cache key (and its cached warm start).
KEY_FIELDS_WHEN_ON = {"vision_steps": ("vision_steps", "vision_lr"), "init_from": ("init_from",),
                      "hint_fraction": ("hint_fraction",)}


# Component arguments added after caches existed: left out of the key while at their defaults.
POLICY_ARGS_ADDED_LATER = ("video", "share_prompts_under_checkpointing", "squash", "consistency_levels",
                           "consistency_steps", "consistency_width", "context_smoothing", "timestep_policy", "flow_steps",
                           "flow_width")
# Policy args that only act in RL (the warm start never reads them): never part of the cache key, so
# changing them reuses the same warm start.
POLICY_ARGS_RL_ONLY = ("value_stop_gradient",)
TASK_ARGS_ADDED_LATER = {"driving/rift-v0": ("reward", "rlftsim"),
                         "data/rows-v0": ("tools", "tool_result_template", "tool_reference", "answer_prefix_fraction")}


def _without_later_defaults(component: Any, names: tuple[str, ...]) -> dict:
    """``to_dict(component)`` without the ``names`` of its args that are at their dataclass defaults."""
    data = to_dict(component)
    if dataclasses.is_dataclass(component.args):
        fields = {f.name: f for f in dataclasses.fields(component.args)}
        for name in names:
            f = fields.get(name)
            if f is not None and getattr(component.args, name) == (
                    f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default):
                del data["args"][name]
    return data


def warm_start_key(cfg: TrainConfig) -> str:
    ws = to_dict(cfg.warm_start)
    for switch, names in KEY_FIELDS_WHEN_ON.items():
        if not ws[switch]:
            for name in names:
                del ws[name]
    task = _without_later_defaults(cfg.task, TASK_ARGS_ADDED_LATER.get(cfg.task.name, ()))
    policy = _without_later_defaults(cfg.policy, POLICY_ARGS_ADDED_LATER)
    for name in POLICY_ARGS_RL_ONLY:
        policy.get("args", {}).pop(name, None)
    return json.dumps({"task": task, "policy": policy, "warm_start": ws}, sort_keys=True)


def warm_start_path(cfg: TrainConfig) -> Path:
    return cache_root() / "warm_start" / hashlib.sha256(warm_start_key(cfg).encode()).hexdigest()[:16]


@runtime_checkable
class VisionLabels(Protocol):
    """A task whose images (or videos: one per example) carry a class label for vision pretraining
    (``warm_start.vision_steps``)."""

    vision_classes: int

    def vision_label(self, example: Any) -> int:
        """The example's image (or video) class in ``[0, vision_classes)``."""
        ...


def build_initial_policy(cfg: TrainConfig, device: torch.device | str = "cpu", is_main: bool = True,
                         wait=lambda: None) -> Policy:
    """The policy RL starts from, on ``device``. With several processes the main one trains the
    warm start and the others load it from the cache after ``wait()``."""
    policy = make_policy(cfg.policy.name, cfg.policy.args).to(device)
    ws = cfg.warm_start
    if ws.init_from is not None:  # validation ensures sft_steps == 0: no warm start on top
        policy.load_weights(ws.init_from)
        return policy
    if ws.sft_steps == 0:
        return policy
    path = warm_start_path(cfg)
    if not (ws.cache and path.is_dir()) and is_main:
        task = make_task(cfg.task.name, cfg.task.args)
        sft(policy, cfg, task=task)
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        policy.save_pretrained(str(tmp))
        if isinstance(task, SimulatorTask):  # the demonstrations' real steps, counted as they ran (no replay later)
            steps = {repr(key): n for key, n in task.demonstrations_run().items()}
            (tmp / DEMONSTRATION_STEPS_FILE).write_text(json.dumps(steps))
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
    from mmrl.core.config import ConfigError, dump_config
    from mmrl.core.engine import set_threads
    from mmrl.core.run_folder import mark_written, prepare_atomic_out

    if cfg.warm_start.sft_steps < 1:
        raise ConfigError("warm_start.sft_steps must be >= 1 to run a supervised warm start")
    set_threads(cfg.trainer.threads)
    out = Path(out)
    prepare_atomic_out(out, overwrite, "mmrl sft")
    policy = make_policy(cfg.policy.name, cfg.policy.args)
    losses = sft(policy, cfg)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    policy.save_pretrained(str(tmp))
    dump_config(cfg, tmp / "config.yaml")
    (tmp / "sft_losses.json").write_text(json.dumps(losses))
    mark_written(tmp, "sft")
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, out)
    return out


Pairs = Callable[[np.random.Generator], tuple[list[Any], list[Any]]]
"""``draw(rng) -> (examples, targets)``: one supervised batch (``targets[i]`` is the output for ``examples[i]``)."""


def sft(policy: Policy, cfg: TrainConfig, steps: int | None = None,
        on_step: Callable[[int, float], None] | None = None, task: Any | None = None) -> list[float]:
    """``warm_start.sft_steps`` (or ``steps``) AdamW steps of supervised fine-tuning on reference outputs (for a
    :class:`~mmrl.core.contracts.ToolTask`, every turn of each example's reference episode: a batch of
    ``batch_size`` examples may then hold more rows).

    ``on_step(step, loss)`` is called once before the first step (step 0, loss NaN: after any vision
    pretraining) and after each step: learning-curve probes evaluate there (scripts/results/sft_probe.py),
    on exactly the steps the warm start takes. ``task``: the recipe's task object to draw from (built here
    when None), e.g. to read what its demonstrations cost afterwards."""
    task = make_task(cfg.task.name, cfg.task.args) if task is None else task
    ws = cfg.warm_start
    check_hints(task, cfg)
    rng, hint_rng = np.random.default_rng(ws.seed), hint_generator(ws.seed)
    if ws.vision_steps > 0:
        pretrain_vision(policy, task, cfg, rng)

    def reference_batch(rng: np.random.Generator) -> tuple[list[Any], list[Any]]:
        examples = with_hints(task, task.sample_batch("train", ws.batch_size, rng), ws.hint_fraction, hint_rng)
        if isinstance(task, ToolTask):  # every turn of each reference episode: a tool call, then the answer, ...
            pairs = [pair for ex in examples for pair in task.reference_turns(ex)]
            return [context for context, _ in pairs], [output for _, output in pairs]
        return examples, [task.reference_output(ex) for ex in examples]

    return fit(policy, reference_batch, rng, ws.sft_steps if steps is None else steps, ws.lr,
               "warm start (SFT)", cfg.log.progress, on_step)


def hint_generator(seed: int) -> np.random.Generator:
    """The generator that picks the hinted rows of the warm start (``warm_start.hint_fraction``): a stream of its
    own, so the rows drawn, and with ``hint_fraction: 0`` the whole warm start, are what they were without it."""
    return np.random.default_rng([seed, 63])  # 63: Guide's seed number, as Guide's own redraws use


def hinted_rows(rows: int, fraction: float, rng: np.random.Generator) -> list[int]:
    """The positions, ascending, of the ``round(fraction · rows)`` rows of a batch that get the hint, drawn
    without replacement from ``rng``. No draw at all when none is hinted."""
    count = round(fraction * rows)
    return sorted(int(i) for i in rng.choice(rows, count, replace=False)) if count else []


def with_hints(task: Any, examples: list[Any], fraction: float, rng: np.random.Generator) -> list[Any]:
    """``examples`` with :func:`hinted_rows` of them replaced by ``task.hinted(example)``: the prompt with the
    task's hint, the same reference answer. ``fraction`` 0 returns ``examples`` itself."""
    chosen = set(hinted_rows(len(examples), fraction, rng))
    if not chosen:
        return examples
    return [task.hinted(ex) if i in chosen else ex for i, ex in enumerate(examples)]


def check_hints(task: Any, cfg: TrainConfig) -> None:
    """With ``warm_start.hint_fraction`` > 0, fail before training unless the task gives hints
    (:class:`~mmrl.core.contracts.HintedTask`) and can hint a training row (e.g. a hint template is set)."""
    from mmrl.core.config import ConfigError

    if cfg.warm_start.hint_fraction == 0:
        return
    if not isinstance(task, HintedTask):
        raise ConfigError(f"warm_start.hint_fraction > 0 trains on hinted prompts, but {cfg.task.name} gives no hints "
                          f"(a hinted(example) method; data/rows-v0 does, with task.args.hint_template)")
    task.hinted(task.sample_batch("train", 1, np.random.default_rng(0))[0])  # no hints configured: fail now


def fit(policy: Policy, draw: Pairs, rng: np.random.Generator, steps: int, lr: float, desc: str,
        progress: bool = True, on_step: Callable[[int, float], None] | None = None) -> list[float]:
    """``steps`` AdamW steps of ``policy.sft_loss`` on batches from ``draw(rng)``; the losses."""
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=lr)
    losses = []
    if on_step is not None:
        on_step(0, float("nan"))
    policy.train()
    bar = tqdm(range(steps), desc=desc, disable=not progress, dynamic_ncols=True)
    for step in bar:
        examples, targets = draw(rng)
        loss = policy.sft_loss(examples, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
        if on_step is not None:
            on_step(step + 1, losses[-1])
            policy.train()
    optimizer.zero_grad(set_to_none=True)  # no stale gradients may reach the RL optimizer
    return losses


def warm_start_examples(task: Any, cfg: TrainConfig) -> list[Any]:
    """The training examples :func:`sft` draws, in order: the same ``task.sample_batch`` calls on the
    same generator (vision pretraining's draws replayed and skipped) and the same hinted rows, without training. A
    regulariser toward the warm start's data (``algo.bc_coef``) reuses exactly these, so it needs no
    new reference outputs (for robot tasks: no new real-simulator demonstrations)."""
    ws = cfg.warm_start
    rng, hint_rng = np.random.default_rng(ws.seed), hint_generator(ws.seed)
    if ws.vision_steps > 0:
        task.sample_batch("train", 1, rng)
        for _ in range(ws.vision_steps):
            task.sample_batch("train", ws.batch_size, rng)
    return [ex for _ in range(ws.sft_steps)
            for ex in with_hints(task, task.sample_batch("train", ws.batch_size, rng), ws.hint_fraction, hint_rng)]


def pretrain_vision(policy: Policy, task: Any, cfg: TrainConfig, rng: np.random.Generator) -> list[float]:
    """``warm_start.vision_steps`` AdamW steps on the vision encoder alone: cross-entropy of a
    linear head on the pooled image (or video) features against the task's ``vision_label``.

    Why: real VLMs start from a pretrained ViT (Qwen2.5-VL, arXiv 2502.13923, §2.2); a randomly
    initialised tiny tower's features can differ between classes by a few per cent of their norm,
    and SFT then locks the language model onto the answer prior before it reads them. The head is
    discarded afterwards; only the encoder's weights change.
    """
    from mmrl.core.config import ConfigError
    from mmrl.policies.vlm import VLMPolicy

    ws = cfg.warm_start
    if not isinstance(task, VisionLabels):
        raise ConfigError(f"warm_start.vision_steps > 0 needs a task with vision_classes and vision_label(); "
                          f"{cfg.task.name} has none (set warm_start.vision_steps=0)")
    if not isinstance(policy, VLMPolicy) or policy.lora:
        raise ConfigError("warm_start.vision_steps > 0 needs the vlm policy with all weights trained (lora_rank 0)")
    encoder = policy.vision_encoder
    features = policy.pooled_image_features(task.sample_batch("train", 1, rng)).shape[1]
    with torch.random.fork_rng(devices=[]):  # the head's init is seeded; the global RNG is left as it was
        torch.manual_seed(ws.seed)
        head = torch.nn.Linear(features, task.vision_classes).to(next(encoder.parameters()).device)
    optimizer = torch.optim.AdamW([*encoder.parameters(), *head.parameters()], lr=ws.vision_lr)
    losses = []
    policy.train()
    bar = tqdm(range(ws.vision_steps), desc="vision pretraining", disable=not cfg.log.progress, dynamic_ncols=True)
    for _ in bar:
        examples = task.sample_batch("train", ws.batch_size, rng)
        labels = torch.tensor([task.vision_label(ex) for ex in examples], device=head.weight.device)
        loss = torch.nn.functional.cross_entropy(head(policy.pooled_image_features(examples)), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    optimizer.zero_grad(set_to_none=True)
    return losses
