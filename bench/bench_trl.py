"""mmrl's GRPO step against TRL's ``GRPOTrainer``, side by side, on the Spatial-SSRL tiny recipe (CPU).

Both frameworks train the embedded tiny Qwen2.5-VL after the recipe's SFT warm start
(``configs/spatial_ssrl/tiny_cpu.yaml``) from the *same* Hugging Face folder, on the same prompts and
images in the same order, with the same reward (the task's own ``reward``), in fp32 on one thread,
sampling with HF ``generate`` on both sides. One framework runs per process, the processes alternate
in ABBA order, and every run does warm-up steps before its timed ones; the report gives medians over
all timed steps and the ratios TRL / mmrl.

    python bench/bench_trl.py                       # both settings, 4 / 8 / 16 prompts × 8, one thread
    python bench/bench_trl.py --quick               # a smoke test: 1 warm-up + 2 timed steps, 1 ABBA pair
    python bench/bench_trl.py --setting recipe --prompts 16 --threads 2 --json out.json
    python bench/bench_trl.py --setting recipe --prompts 16 --trl-gradient-checkpointing   # TRL's default

Settings (group size 8, ≤ ``rollout.max_new_tokens`` = 40 new tokens, temperature 1):

- ``one_step``: one optimizer step per generation batch (``ppo_epochs 1 × minibatches 1``);
- ``recipe``: the recipe's ``ppo_epochs 2 × minibatches 2`` (four optimizer steps per generation batch).

A *step* is one generation batch and every update made from it: mmrl's ``collect`` + ``advantages``
+ ``update``; in TRL the ``num_iterations × steps_per_generation / gradient_accumulation_steps``
optimizer steps that reuse one ``_generate_and_score_completions`` batch. Reported per step:
``step`` (wall time), ``rollout`` (prompts to advantages: mmrl's ``collect`` + ``advantages``, TRL's
``_generate_and_score_completions``), ``generate`` (TRL: the ``model.generate`` calls alone; mmrl: its
sampler call, i.e. one prefill per prompt and ``generate`` over the group's rows), ``update``
(step − rollout), completion tokens/s (completion tokens of the step / step time), the mean completion
length, and the process's peak resident memory (RSS, sampled every 5 ms by a thread).

How mmrl's recipe maps onto ``GRPOConfig`` (TRL 1.16; read from ``trl/trainer/grpo_trainer.py``)
--------------------------------------------------------------------------------------------------
Generation batch
    mmrl draws ``prompts_per_step`` prompts × ``group_size`` rows and samples them in one ``generate``
    call. TRL: ``num_generations = group_size``; ``per_device_train_batch_size`` = mmrl's micro-batch
    (``min(trainer.micro_batch_size, rows per minibatch)``); ``steps_per_generation = rows /
    per_device_train_batch_size``, so ``generation_batch_size`` = all rows of the step, sampled in one
    ``generate`` call too (TRL's ``RepeatSampler`` repeats each prompt ``num_generations`` times in a row,
    the same row order as mmrl's ``repeat_interleave``).
Iterations and minibatches
    ``num_iterations = trainer.ppo_epochs``; ``gradient_accumulation_steps`` = micro-batches per mmrl
    minibatch, so each TRL optimizer step sees as many rows as one mmrl minibatch (``max_steps`` =
    steps × ppo_epochs × minibatches). Two differences remain: mmrl's minibatches hold whole groups,
    TRL shuffles rows before splitting the batch; and when ``num_iterations × steps_per_generation``
    exceeds ``gradient_accumulation_steps`` (the ``recipe`` setting) TRL recomputes the old log-probs
    with an extra no-grad forward over the whole batch (inside its rollout time), where mmrl keeps the
    sampler's log-probs (same weights, so the same numbers up to rounding).
Loss type and aggregation
    mmrl ``policy_loss: ppo_clip``, ``loss_agg: token-mean`` (divided by the minibatch's valid tokens)
    ↔ TRL ``loss_type="dapo"`` (divided by the generation batch's valid tokens × accumulation steps /
    ``steps_per_generation``: the average tokens per optimizer step, the same number with one minibatch).
Advantages
    mmrl ``advantage: grpo`` (group mean, unbiased group std, ε 1e-6) ↔ TRL ``scale_rewards="group"``
    (same, ε 1e-4).
KL
    mmrl ``kl_coef: 0``, ``ref_model: none`` ↔ TRL ``beta=0`` (no reference model is loaded).
Clipping
    mmrl ``clip_low 0.2`` / ``clip_high 0.28`` ↔ TRL ``epsilon=0.2`` / ``epsilon_high=0.28``.
Sampling
    ``temperature``, ``top_p`` as the recipe; ``top_k=0`` (mmrl passes ``top_k=0`` to ``generate``);
    ``max_completion_length = rollout.max_new_tokens``; ``use_vllm=False`` (HF ``generate`` both sides);
    ``repetition_penalty=1``. Both stop at the same EOS ids (checked: mmrl's tokenizer EOS and
    ``<|im_end|>``, TRL's ``generation_config.json`` ids and tokenizer EOS).
Blocked special tokens
    mmrl never samples the tokenizer's special tokens (vision ones included) other than EOS, nor
    embedding rows past the tokenizer, and leaves them out of its scored distribution. TRL blocks only
    ``image_token_id`` by default; ``generation_kwargs={"suppress_tokens": <mmrl's list>}`` makes it
    block the same ids while sampling (TRL still scores over the full vocabulary: the sampled tokens'
    log-probs then differ slightly, not the amount of work).
Precision, memory, optimizer
    fp32 both (``bf16=False``, ``fp16=False``: TRL's default is bf16); ``gradient_checkpointing=False``
    (TRL's default is True; ``--trl-gradient-checkpointing`` measures it); AdamW at the recipe's
    ``trainer.lr``, weight decay, constant schedule without warm-up, ``max_grad_norm = trainer.grad_clip``
    (``optim="adamw_torch"``).
Data
    The recipe's seeded ``task.sample_batch`` draws, in the order the mmrl trainer draws them, as a
    ``datasets.Dataset`` with a conversational ``prompt`` (image and text blocks where mmrl's chat
    messages put them) and an ``images`` column (``shuffle_dataset=False``). The token ids, token types,
    ``pixel_values`` and ``image_grid_thw`` that each side samples from in its first batch are saved and
    checked equal (prompt rows compared without their padding): TRL's ``generate`` inputs, and mmrl's
    sampler inputs repeated to one row per sample (mmrl reads each prompt and its images once). TRL runs
    its processor a second time for the training forward (``processing_class(images=..., text=...)``);
    mmrl keeps the encoded prompts in the rollout. Each framework's extra work is part of its time.
Logging
    TRL logs every optimizer step (``logging_steps=1``: the losses are read from ``log_history``) without
    printing; mmrl's ``update`` returns its metrics every step. Neither evaluates nor saves checkpoints.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import psutil
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor, PrinterCallback, TrainerCallback
from transformers.utils import logging as hf_logging

from mmrl.core.config import TrainConfig, load_config
from mmrl.core.contracts import IMAGE_PLACEHOLDER, VideoPrompt, answer_prefix_of, turns_of
from mmrl.core.engine import set_threads
from mmrl.core.registry import make_task
from mmrl.core.trainer import Trainer
from mmrl.core.warm_start import build_initial_policy

RECIPE = "spatial_ssrl/tiny_cpu"
QUIET = ["log.progress=false", "log.tensorboard=false", "eval.num_examples=1"]
Framework = Literal["mmrl", "trl"]
FRAMEWORKS: tuple[Framework, Framework] = ("mmrl", "trl")
SETTINGS = {"one_step": (1, 1), "recipe": (2, 2)}
"""Setting name → (ppo_epochs, minibatches); ``recipe`` is the recipe's own."""
LENGTH_TOLERANCE = 0.15
"""Largest relative gap between the two sides' mean completion lengths still called 'the same'."""


# -- the shared starting point -------------------------------------------------------------------------------
@dataclass(frozen=True)
class PolicyFolder:
    """The warm-started policy as a HF folder, with the ids mmrl never samples (passed to TRL)."""

    path: str
    suppressed: list[int]
    eos_ids: list[int]


def prepare_policy(folder: str | Path, overrides: Sequence[str] = ()) -> PolicyFolder:
    """Build the recipe's initial policy once (the SFT warm start, cached under ``$MMRL_CACHE``) and save
    it to ``folder`` with its processor, so both frameworks load exactly these weights."""
    cfg = load_config(RECIPE, [*QUIET, *overrides])
    set_threads(cfg.trainer.threads)
    policy = build_initial_policy(cfg)
    policy.save_pretrained(str(folder))
    return PolicyFolder(str(folder), policy.suppressed.tolist(), list(policy.eos_ids))


@dataclass(frozen=True)
class RunSpec:
    """One measurement run: one framework, one setting, one batch size."""

    framework: Framework
    setting: str
    prompts: int
    policy: PolicyFolder
    steps: int
    warmup: int
    threads: int
    inputs_path: str
    """Where the first ``generate`` call's inputs are saved (for the identical-inputs check)."""
    overrides: tuple[str, ...] = ()
    """Extra recipe overrides applied to both sides (tests shorten the rollout with these)."""
    trl_gradient_checkpointing: bool = False

    @property
    def cycles(self) -> int:
        return self.warmup + self.steps


def run_config(spec: RunSpec) -> TrainConfig:
    """The recipe with the setting's epochs and minibatches, starting from the saved folder."""
    epochs, minibatches = SETTINGS[spec.setting]
    return load_config(RECIPE, [
        *QUIET, f"policy.args.pretrained={spec.policy.path}", "policy.args.model_spec=null",
        "warm_start.sft_steps=0", f"rollout.prompts_per_step={spec.prompts}", f"trainer.steps={spec.cycles}",
        f"trainer.ppo_epochs={epochs}", f"trainer.minibatches={minibatches}", f"trainer.threads={spec.threads}",
        *spec.overrides])


def draw_examples(cfg: TrainConfig, cycles: int) -> list[list[Any]]:
    """The prompts the mmrl trainer draws in its first ``cycles`` steps (its ``data_rng`` is seeded the same)."""
    task = make_task(cfg.task.name, cfg.task.args)
    rng = np.random.default_rng(cfg.trainer.seed)
    return [task.sample_batch("train", cfg.rollout.prompts_per_step, rng) for _ in range(cycles)]


def same_example(a: Any, b: Any) -> bool:
    """Same prompt, system text and image pixels."""
    return (a.prompt == b.prompt and a.system == b.system and len(a.images) == len(b.images)
            and all(x.size == y.size and x.tobytes() == y.tobytes() for x, y in zip(a.images, b.images)))


# -- measurement helpers -------------------------------------------------------------------------------------
class RSSWatch:
    """Peak resident memory of this process, sampled every 5 ms by a thread; ``take()`` returns the peak
    since the previous ``take()`` (in MiB) and starts a new window."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.peak = self.process.memory_info().rss
        self.running = True
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while self.running:
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.005)

    def take(self) -> float:
        now = self.process.memory_info().rss
        peak, self.peak = max(self.peak, now), now
        return peak / 2**20

    def stop(self) -> None:
        self.running = False
        self.thread.join()


class GenerateRecorder:
    """Wraps one model's ``generate`` (on the instance, so both frameworks' calls pass through it): sums its
    wall time and saves the first call's model inputs to ``path``."""

    KEYS = ("input_ids", "attention_mask", "mm_token_type_ids", "pixel_values", "image_grid_thw")

    def __init__(self, model: torch.nn.Module, path: str | Path) -> None:
        self.model, self.path, self.seconds, self.saved = model, Path(path), 0.0, False
        self.original = model.generate
        model.generate = self  # instance attribute: shadows the class's method for this model only

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.saved:
            save_inputs(kwargs, self.path)
            self.saved = True
        start = time.perf_counter()
        try:
            return self.original(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


class SamplerRecorder(GenerateRecorder):
    """mmrl's side: wraps the policy's sampler call (one prefill per prompt, then ``generate`` over the group's
    rows, :mod:`mmrl.policies.shared_prefix`), so its time includes the prefill; the saved inputs are the
    sampled prompts repeated to one per row, the rows TRL's ``generate`` reads."""

    def __init__(self, sampler: Any, path: str | Path) -> None:
        self.path, self.seconds, self.saved = Path(path), 0.0, False
        self.original = sampler.sample
        sampler.sample = self

    def __call__(self, model: Any, prompts: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.saved:
            rows = prompts.select(torch.arange(prompts.num_rows).repeat_interleave(kwargs.get("group_size", 1)))
            save_inputs({"input_ids": rows.input_ids, "attention_mask": rows.attention_mask,
                         "mm_token_type_ids": rows.mm_token_type_ids, **rows.vision_inputs()}, self.path)
            self.saved = True
        start = time.perf_counter()
        try:
            return self.original(model, prompts, *args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


def save_inputs(inputs: dict[str, Any], path: Path) -> None:
    """The identical-inputs check's tensors of one ``generate`` call."""
    torch.save({k: inputs[k].detach().cpu() for k in GenerateRecorder.KEYS if inputs.get(k) is not None}, path)


def parameters_snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the trained weights."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def largest_change(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> float:
    """Largest absolute change of any trained weight since ``before``."""
    return max(float((p.detach() - before[name]).abs().max()) for name, p in model.named_parameters()
               if name in before)


@dataclass
class RunResult:
    """Per-step measurements of one run (warm-up steps dropped) and its training checks."""

    framework: str
    setting: str
    prompts: int
    rows: int
    step_s: list[float] = field(default_factory=list)
    rollout_s: list[float] = field(default_factory=list)
    generate_s: list[float] = field(default_factory=list)
    update_s: list[float] = field(default_factory=list)
    tokens: list[float] = field(default_factory=list)
    peak_rss_mib: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    weight_change: float = 0.0
    threads: int = 1

    def add(self, timed: bool, step: float, rollout: float, generate: float, tokens: float, rss: float) -> None:
        if timed:
            self.step_s.append(step)
            self.rollout_s.append(rollout)
            self.generate_s.append(generate)
            self.update_s.append(step - rollout)
            self.tokens.append(tokens)
            self.peak_rss_mib.append(rss)


def check_trained(result: RunResult) -> None:
    """Both must train: every logged loss finite, and the weights moved."""
    if not result.losses or not all(np.isfinite(result.losses)):
        raise AssertionError(f"{result.framework}: non-finite or missing losses {result.losses}")
    if not result.weight_change > 0:
        raise AssertionError(f"{result.framework}: the weights did not move")


# -- mmrl ----------------------------------------------------------------------------------------------------
def run_mmrl(spec: RunSpec) -> RunResult:
    """``spec.cycles`` mmrl steps (collect → advantages → update), the first ``spec.warmup`` untimed."""
    cfg = run_config(spec)
    expected = draw_examples(cfg, spec.cycles)
    result = RunResult("mmrl", spec.setting, spec.prompts, spec.prompts * cfg.rollout.group_size,
                       threads=spec.threads)
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(cfg, out)
        recorder = SamplerRecorder(trainer.policy.sampler, spec.inputs_path)
        before = parameters_snapshot(trainer.policy.model)
        watch = RSSWatch()
        for cycle in range(spec.cycles):
            trainer.step += 1
            watch.take()
            recorder.take()
            start = time.perf_counter()
            batch = trainer.collect()
            advantages, returns, reference = trainer.advantages(batch)
            rollout = time.perf_counter() - start
            metrics = trainer.update(batch.rollout, advantages, returns, reference)
            step = time.perf_counter() - start
            if not all(same_example(a, b) for a, b in zip(batch.examples, expected[cycle], strict=True)):
                raise AssertionError(f"mmrl step {cycle + 1} drew other prompts than the TRL dataset holds")
            result.losses.append(metrics["loss/total"])
            result.add(cycle >= spec.warmup, step, rollout, recorder.take(), float(batch.rollout.mask.sum()),
                       watch.take())
        watch.stop()
        result.weight_change = largest_change(trainer.policy.model, before)
    return result


# -- TRL -----------------------------------------------------------------------------------------------------
def trl_prompt(example: Any) -> list[dict]:
    """The example as a conversational TRL prompt: image placeholders and text blocks in the order of its
    ``<image>`` markers (where mmrl's chat messages put them); a system text as a text block."""
    if answer_prefix_of(example) or turns_of(example) or isinstance(example, VideoPrompt):
        raise ValueError("the TRL comparison takes single-turn image prompts without an answer prefix or videos")
    content = [{"type": "image", "text": None} if piece == IMAGE_PLACEHOLDER else {"type": "text", "text": piece}
               for piece in re.split(f"({re.escape(IMAGE_PLACEHOLDER)})", example.prompt) if piece]
    system = [] if example.system is None else [
        {"role": "system", "content": [{"type": "text", "text": example.system}]}]
    return [*system, {"role": "user", "content": content}]


def trl_dataset(batches: list[list[Any]]):
    """All steps' prompts in order, as the ``datasets.Dataset`` GRPOTrainer reads (``example_index``
    points back at the example for the reward)."""
    from datasets import Dataset

    flat = [ex for batch in batches for ex in batch]
    return Dataset.from_dict({"prompt": [trl_prompt(ex) for ex in flat], "images": [list(ex.images) for ex in flat],
                              "example_index": list(range(len(flat)))})


def task_reward(task: Any, examples: list[Any]) -> Callable[..., list[float]]:
    """A TRL reward function that asks the mmrl task's own ``reward`` about each completion."""

    def spatial_ssrl_reward(completions: list, example_index: list[int], **_: Any) -> list[float]:
        return [task.reward(examples[i], completion[-1]["content"]).score
                for completion, i in zip(completions, example_index, strict=True)]

    return spatial_ssrl_reward


def trl_config(cfg: TrainConfig, spec: RunSpec, out: str) -> Any:
    """The recipe (one setting) as a ``GRPOConfig``; fails on recipe fields TRL cannot express the same way."""
    from trl import GRPOConfig  # the bench extra: imported only where TRL runs

    a, t, r = cfg.algo, cfg.trainer, cfg.rollout
    same = {"advantage": (a.advantage, "grpo"), "policy_loss": (a.policy_loss, "ppo_clip"),
            "loss_agg": (a.loss_agg, "token-mean"), "shaping": (tuple(a.shaping), ()),
            "ref_model": (t.ref_model, "none"), "lr_schedule": (t.lr_schedule, "constant"),
            "warmup_steps": (t.warmup_steps, 0), "norm_adv_by_std": (a.norm_adv_by_std, True)}
    for name, (value, wanted) in same.items():
        if value != wanted:
            raise ValueError(f"the TRL comparison needs {name} = {wanted!r}, the recipe has {value!r}")
    rows = r.prompts_per_step * r.group_size
    minibatch_rows = rows // t.minibatches
    micro = min(t.micro_batch_size, minibatch_rows)
    if minibatch_rows % micro:
        raise ValueError(f"rows per minibatch ({minibatch_rows}) must be a multiple of the micro-batch ({micro})")
    return GRPOConfig(
        output_dir=out, seed=t.seed, use_cpu=True, bf16=False, fp16=False,
        activation_checkpointing=spec.trl_gradient_checkpointing,  # TRL defaults to True (its gradient_checkpointing)
        per_device_train_batch_size=micro, gradient_accumulation_steps=minibatch_rows // micro,
        steps_per_generation=rows // micro, num_generations=r.group_size, num_iterations=t.ppo_epochs,
        max_steps=spec.cycles * t.ppo_epochs * t.minibatches,
        beta=a.kl_coef, epsilon=a.clip_low, epsilon_high=a.clip_high, loss_type="dapo", scale_rewards="group",
        max_completion_length=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, top_k=0,
        repetition_penalty=1.0, use_vllm=False, generation_kwargs={"suppress_tokens": spec.policy.suppressed},
        learning_rate=t.lr, weight_decay=t.weight_decay, lr_scheduler_type="constant", warmup_steps=0,
        max_grad_norm=t.grad_clip, optim="adamw_torch",
        shuffle_dataset=False, remove_unused_columns=False, dataloader_num_workers=0,
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True)


def run_trl(spec: RunSpec) -> RunResult:
    """``spec.cycles`` generation batches through ``GRPOTrainer.train``, the first ``spec.warmup`` untimed."""
    from trl import GRPOTrainer  # the bench extra: imported only where TRL runs

    cfg = run_config(spec)
    torch.set_num_threads(spec.threads)
    batches = draw_examples(cfg, spec.cycles)
    task = make_task(cfg.task.name, cfg.task.args)
    model = AutoModelForImageTextToText.from_pretrained(spec.policy.path, dtype=getattr(torch, cfg.policy.args.dtype),
                                                        attn_implementation=cfg.policy.args.attn_implementation)
    processor = AutoProcessor.from_pretrained(spec.policy.path, padding_side="left")
    result = RunResult("trl", spec.setting, spec.prompts, spec.prompts * cfg.rollout.group_size,
                       threads=spec.threads)
    updates_per_cycle = cfg.trainer.ppo_epochs * cfg.trainer.minibatches
    with tempfile.TemporaryDirectory() as out:
        trainer = GRPOTrainer(model=model, reward_funcs=task_reward(task, [ex for b in batches for ex in b]),
                              args=trl_config(cfg, spec, out), train_dataset=trl_dataset(batches),
                              processing_class=processor)
        if trainer.eos_token_ids != spec.policy.eos_ids:
            raise AssertionError(f"TRL stops at {trainer.eos_token_ids}, mmrl at {spec.policy.eos_ids}")
        trainer.remove_callback(PrinterCallback)  # no per-step printing (mmrl's run prints none either)
        recorder = GenerateRecorder(trainer.model, spec.inputs_path)
        before = parameters_snapshot(trainer.model)
        clock = TRLStepClock(trainer, recorder, result, updates_per_cycle, spec.warmup)
        trainer.add_callback(clock)
        trainer.train()
        clock.watch.stop()
        result.losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
        result.weight_change = largest_change(trainer.model, before)
    if len(result.step_s) != spec.steps:
        raise AssertionError(f"TRL ran {len(result.step_s)} timed steps, expected {spec.steps}")
    return result


class TRLStepClock(TrainerCallback):
    """Closes a step after every ``updates_per_cycle`` optimizer steps; times ``_generate_and_score_completions``
    (wrapped on the trainer instance) as the step's rollout and counts its completion tokens."""

    def __init__(self, trainer: Any, recorder: GenerateRecorder, result: RunResult, updates_per_cycle: int,
                 warmup: int) -> None:
        self.recorder, self.result, self.updates, self.warmup = recorder, result, updates_per_cycle, warmup
        self.rollout, self.tokens, self.start, self.cycle = 0.0, 0.0, 0.0, 0
        self.watch = RSSWatch()
        self.generate_and_score = trainer._generate_and_score_completions
        trainer._generate_and_score_completions = self.timed_generate_and_score

    def timed_generate_and_score(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        start = time.perf_counter()
        out = self.generate_and_score(*args, **kwargs)
        self.rollout += time.perf_counter() - start
        self.tokens += float(out["completion_mask"].sum())
        return out

    def on_train_begin(self, args, state, control, **kwargs) -> None:
        self.watch.take()
        self.recorder.take()
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs) -> None:
        if state.global_step % self.updates:
            return
        step = time.perf_counter() - self.start
        self.result.add(self.cycle >= self.warmup, step, self.rollout, self.recorder.take(), self.tokens,
                        self.watch.take())
        self.cycle += 1
        self.rollout, self.tokens = 0.0, 0.0
        self.start = time.perf_counter()


# -- the parent: identical inputs, ABBA runs, medians ---------------------------------------------------------
def unpadded_rows(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    """Each row of ``ids`` [N, P] where ``mask`` is 1 (the left padding dropped)."""
    return [row[m.bool()].tolist() for row, m in zip(ids, mask)]


def check_identical_inputs(mmrl_path: str | Path, trl_path: str | Path) -> dict[str, Any]:
    """Assert that both sides' first ``generate`` call got the same prompt tokens, token types (each row
    without its left padding), ``pixel_values`` and ``image_grid_thw``; returns what was compared."""
    a, b = torch.load(mmrl_path), torch.load(trl_path)
    for name in ("input_ids", "mm_token_type_ids"):
        rows_a, rows_b = unpadded_rows(a[name], a["attention_mask"]), unpadded_rows(b[name], b["attention_mask"])
        if rows_a != rows_b:
            bad = next(i for i, (x, y) in enumerate(zip(rows_a, rows_b)) if x != y) if len(rows_a) == len(rows_b) \
                else f"{len(rows_a)} vs {len(rows_b)} rows"
            raise AssertionError(f"prompt {name} differ between mmrl and TRL (first differing row: {bad})")
    for name in ("pixel_values", "image_grid_thw"):
        if (name in a) != (name in b) or (name in a and not torch.equal(a[name], b[name])):
            raise AssertionError(f"{name} differ between mmrl and TRL")
    return {"rows": int(a["input_ids"].shape[0]), "prompt_tokens": int(a["attention_mask"].sum()),
            "pixel_values": list(a["pixel_values"].shape) if "pixel_values" in a else None}


def run_in_subprocess(spec: RunSpec, workdir: Path) -> RunResult:
    """One run in a fresh Python process (one framework per process), with ``OMP_NUM_THREADS`` = threads."""
    name = f"{spec.framework}_{spec.setting}_{spec.prompts}_{Path(spec.inputs_path).stem}"
    spec_path, result_path = workdir / f"{name}.spec.json", workdir / f"{name}.result.json"
    spec_path.write_text(json.dumps(asdict(spec)))
    env = {**os.environ, "OMP_NUM_THREADS": str(spec.threads), "MKL_NUM_THREADS": str(spec.threads)}
    subprocess.run([sys.executable, __file__, "--run-spec", str(spec_path), "--run-out", str(result_path)],
                   check=True, env=env)
    return RunResult(**json.loads(result_path.read_text()))


def run_spec_file(spec_path: str, out_path: str) -> None:
    """The child's side of :func:`run_in_subprocess`: run the spec, check it trained, write the result."""
    data = json.loads(Path(spec_path).read_text())
    spec = RunSpec(**{**data, "policy": PolicyFolder(**data["policy"]), "overrides": tuple(data["overrides"])})
    result = run_mmrl(spec) if spec.framework == "mmrl" else run_trl(spec)
    check_trained(result)
    Path(out_path).write_text(json.dumps(asdict(result)))


def abba(pairs: int) -> list[Framework]:
    """mmrl, TRL, TRL, mmrl, mmrl, TRL, ...: each framework first in half of the pairs."""
    return [fw for k in range(pairs) for fw in (FRAMEWORKS if k % 2 == 0 else FRAMEWORKS[::-1])]


def median_of(runs: list[RunResult], name: str) -> float:
    """Median of the per-step list ``name`` over all timed steps of ``runs``."""
    return statistics.median(v for r in runs for v in getattr(r, name))


def summarize(runs: dict[Framework, list[RunResult]], inputs: dict[str, Any]) -> dict[str, Any]:
    """Medians per framework over every timed step of every run, and the ratios TRL / mmrl."""
    row: dict[str, Any] = {"setting": runs["mmrl"][0].setting, "prompts": runs["mmrl"][0].prompts,
                           "rows": runs["mmrl"][0].rows, "identical_inputs": inputs}
    for fw, rs in runs.items():
        tokens = [t for r in rs for t in r.tokens]
        row[fw] = {name: median_of(rs, name) for name in ("step_s", "rollout_s", "generate_s", "update_s")}
        row[fw] |= {"tokens_per_s": statistics.median(t / s for r in rs for t, s in zip(r.tokens, r.step_s)),
                    "len_mean": sum(tokens) / (len(tokens) * rs[0].rows),
                    "peak_rss_mib": max(v for r in rs for v in r.peak_rss_mib),
                    "timed_steps": sum(len(r.step_s) for r in rs),
                    "losses_finite": all(np.isfinite(r.losses).all() for r in rs),
                    "weight_change": min(r.weight_change for r in rs)}
    m, t = row["mmrl"], row["trl"]
    row["trl_over_mmrl"] = {name: t[name] / m[name] for name in
                            ("step_s", "rollout_s", "generate_s", "update_s", "tokens_per_s", "len_mean", "peak_rss_mib")}
    row["same_length"] = abs(t["len_mean"] / m["len_mean"] - 1) <= LENGTH_TOLERANCE
    return row


def print_table(rows: list[dict[str, Any]], threads: int, trl_checkpointing: bool) -> None:
    print(f"\nmedians per step (one generation batch and its updates), {threads} thread(s), TRL gradient "
          f"checkpointing {'on' if trl_checkpointing else 'off'}; ratios are TRL / mmrl")
    head = (f"{'setting':>9} {'prompts':>7} {'rows':>5} {'side':>5} {'step s':>8} {'rollout s':>9} {'generate s':>10} "
            f"{'update s':>8} {'tok/s':>7} {'len':>6} {'peak RSS MiB':>12}")
    print(head)
    for row in rows:
        for fw in (*FRAMEWORKS, "trl_over_mmrl"):
            r, ratio = row[fw], fw == "trl_over_mmrl"
            print(f"{row['setting']:>9} {row['prompts']:>7} {row['rows']:>5} {'ratio' if ratio else fw:>5} "
                  f"{r['step_s']:>8.3f} {r['rollout_s']:>9.3f} {r['generate_s']:>10.3f} {r['update_s']:>8.3f} "
                  f"{r['tokens_per_s']:>7.{2 if ratio else 0}f} {r['len_mean']:>6.2f} "
                  f"{r['peak_rss_mib']:>12.{2 if ratio else 0}f}")
        if not row["same_length"]:
            print(f"  ! mean completion lengths differ by more than {LENGTH_TOLERANCE:.0%}: "
                  f"mmrl {row['mmrl']['len_mean']:.2f}, TRL {row['trl']['len_mean']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", default="4,8,16", help="prompts per step (× group 8), comma-separated")
    parser.add_argument("--setting", choices=[*SETTINGS, "both"], default="both")
    parser.add_argument("--steps", type=int, default=16, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps at the start of each run")
    parser.add_argument("--repeats", type=int, default=2,
                        help="ABBA pairs of runs per setting and batch size (medians over steps × repeats per side)")
    parser.add_argument("--threads", type=int, default=1, help="torch / OpenMP threads of every run")
    parser.add_argument("--quick", action="store_true", help="smoke test: 1 warm-up + 2 timed steps, 1 pair")
    parser.add_argument("--trl-gradient-checkpointing", action="store_true",
                        help="TRL with its default gradient checkpointing (mmrl's recipe has none)")
    parser.add_argument("--json", help="write every run's measurements and the summary here")
    parser.add_argument("--workdir", help="folder for the saved policy and the runs' files (default: a temporary one)")
    parser.add_argument("--run-spec", help=argparse.SUPPRESS)  # internal: one measurement run in this process
    parser.add_argument("--run-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    hf_logging.disable_progress_bar()  # no weight-loading bars between the runs' lines
    if args.run_spec:
        run_spec_file(args.run_spec, args.run_out)
        return
    if args.quick:
        args.steps, args.warmup, args.repeats = 2, 1, 1
    prompts = [int(p) for p in args.prompts.split(",")]
    settings = list(SETTINGS) if args.setting == "both" else [args.setting]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        policy = prepare_policy(workdir / "policy", [f"trainer.threads={args.threads}"])
        rows, raw = [], []
        for setting in settings:
            for n in prompts:
                runs: dict[Framework, list[RunResult]] = {"mmrl": [], "trl": []}
                for k, fw in enumerate(abba(args.repeats)):
                    spec = RunSpec(fw, setting, n, policy, args.steps, args.warmup, args.threads,
                                   str(workdir / f"inputs_{fw}_{setting}_{n}_{k}.pt"),
                                   trl_gradient_checkpointing=args.trl_gradient_checkpointing)
                    result = run_in_subprocess(spec, workdir)
                    print(f"{setting} {n}x8 run {k + 1} {fw}: median step {statistics.median(result.step_s):.3f} s",
                          flush=True)
                    runs[fw].append(result)
                    raw.append(asdict(result))
                inputs = check_identical_inputs(workdir / f"inputs_mmrl_{setting}_{n}_0.pt",
                                                workdir / f"inputs_trl_{setting}_{n}_1.pt")
                rows.append(summarize(runs, inputs))
        print_table(rows, args.threads, args.trl_gradient_checkpointing)
        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), "summary": rows, "runs": raw}, indent=1))


if __name__ == "__main__":
    main()
