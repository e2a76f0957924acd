"""The one training loop: collect → score → advantages → update → log → eval → checkpoint.

Every domain runs through :meth:`Trainer.train`. What differs between domains lives in the task
(examples, reward) and the policy (sampling, re-scoring); what differs between algorithms lives in
the registered functions of :mod:`mmrl.algos`, chosen by ``cfg.algo``; paper variants that change
how rows are drawn or add loss terms with data of their own are hooks (:mod:`mmrl.algos.hooks`).
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mmrl.algos import (ADVANTAGE_ESTIMATORS, GAUSSIAN_KL_ESTIMATORS, SHAPING_HOOKS, AdvantageInputs,
                        ShapingContext, overlong_penalty)
from mmrl.algos.masked import count_nonfinite
from mmrl.algos.hooks import (LOSS_HOOKS, ROLLOUT_HOOKS, HookContext, Round, UpdateIndex, build_hooks,
                              compose_draw, prompt_selector, round_driver)
from mmrl.algos.variants import algo_needs
from mmrl.core import checkpoint as ckpt
from mmrl.core import interrupt
from mmrl.core.config import ConfigError, TrainConfig, dump_config
from mmrl.core.contracts import Policy, PolicyOutput
from mmrl.core.engine import Engine, set_threads
from mmrl.core.evaluate import evaluate_sets, held_out_sets, verify
from mmrl.core.guards import NonFiniteGuard
from mmrl.core.logging import RunLogger
from mmrl.core.objective import MicroInputs, micro_loss
from mmrl.core.trackers import open_trackers
from mmrl.core.registry import make_task
from mmrl.core.rescoring import forward_no_grad, reference_outputs, select_output
from mmrl.core.rollout import Rollout, SamplingParams, derive_seed, draw_per_example
from mmrl.core.run_folder import prepare_out_dir, release_lock
from mmrl.core.optim import build_optimizer
from mmrl.core.scored import Scored, finite_outcomes, reward_stats
from mmrl.core.warm_start import build_initial_policy, warm_start_examples, warm_start_path


class Trainer:
    def __init__(self, cfg: TrainConfig, out: str | Path, resume: bool = False, overwrite: bool = False):
        self.cfg, self.out = cfg, Path(out)
        self.engine = Engine(cfg.trainer.mixed_precision)
        self.threads = set_threads(cfg.trainer.threads)  # before any torch work; logged as perf/threads
        if self.engine.is_main:
            prepare_out_dir(self.out, resume, overwrite)
        self.engine.wait()
        world, t = self.engine.world_size, cfg.trainer
        if cfg.rollout.prompts_per_step % (world * t.minibatches):
            raise ConfigError(f"rollout.prompts_per_step ({cfg.rollout.prompts_per_step}) must be divisible by "
                              f"processes × trainer.minibatches ({world} × {t.minibatches})")
        self.task = make_task(cfg.task.name, cfg.task.args)
        check_rollout_split(self.task, cfg)
        check_best_metric_split(self.task, cfg)
        policy = build_initial_policy(cfg, self.engine.device, self.engine.is_main, self.engine.wait)
        self.ref = copy.deepcopy(policy).eval().requires_grad_(False) if t.ref_model == "copy" else None
        if t.ref_model == "adapter_disabled":
            with policy.adapter_disabled():  # fails now, clearly, for a policy without adapters
                pass
        optimizer, self.scheduler = build_optimizer(policy, t)  # LoRA: the adapters only
        policy.zero_grad(set_to_none=True)
        self.model, self.optimizer = self.engine.prepare(policy, optimizer)
        self.engine.accelerator.register_for_checkpointing(self.scheduler)  # stepped by us, saved with the state
        self.policy: Policy = self.engine.unwrap(self.model)
        self.data_rng = np.random.default_rng(t.seed)
        self.eval_sets = held_out_sets(self.task, cfg)
        self.step, self.guard = 0, NonFiniteGuard(self.engine, t.max_skipped_frac)
        self.needs = algo_needs(cfg.algo)  # what the estimator / shaping hooks need beyond the core inputs
        ctx = HookContext(cfg, self.policy, self.model, self.task, self.engine, self.score,
                          lambda: warm_start_examples(self.task, cfg), self.out, warm_start_path(cfg))
        self.rollout_hooks = build_hooks(ROLLOUT_HOOKS, ctx)
        self.loss_hooks = build_hooks(LOSS_HOOKS, ctx)
        self.draw = compose_draw([hook for _, hook in self.rollout_hooks], self.sample)
        self.selector = prompt_selector(self.rollout_hooks)
        self.drawn, self.sampler_stats = 0, {}
        self.best: dict[str, Any] | None = None  # checkpoint.best_metric: {"step", "metric", "value"} so far
        if resume:
            self.load_checkpoint()
        elif self.engine.is_main:
            dump_config(cfg, self.out / "config.yaml")
        self.logger = RunLogger(self.out, self.engine.is_main, t.steps, self.step, cfg.log.tensorboard,
                                cfg.log.progress, open_trackers(cfg, self.out) if self.engine.is_main else ())

    def train(self, end: bool = True) -> None:
        """Train to ``trainer.steps``. ``end=False`` keeps the process group for more work in this process
        (the next stage of a multi-stage recipe)."""
        cfg = self.cfg
        if self.step == 0:
            metrics = self.evaluate()
            self.keep_best(metrics)
            self.logger.log({"step": 0, "perf/threads": self.threads, **metrics})
        while self.step < cfg.trainer.steps:
            self.step += 1
            start = time.perf_counter()
            with self.engine.full_parameters(self.model):  # sampling: whole weights on every process (FSDP)
                batch = self.collect()
            rollout_s = time.perf_counter() - start
            row = {"step": self.step, **batch.stats}
            advantages, returns, reference = self.advantages(batch)
            for _, hook in self.loss_hooks:
                hook.prepare(batch)
            row |= self.update(batch.rollout, advantages, returns, reference) | self.guard.step_metrics(self.step)
            row |= {"perf/rollout_s": rollout_s, "perf/step_s": time.perf_counter() - start,
                    "perf/decisions_per_s": self.engine.sum(batch.rollout.mask.sum()) / max(rollout_s, 1e-9)}
            if self.step == cfg.trainer.steps or (cfg.eval.every and self.step % cfg.eval.every == 0):
                metrics = self.evaluate()
                self.keep_best(metrics)
                row |= metrics
            self.logger.log(row)
            self.guard.check(self.step, self.step * cfg.trainer.ppo_epochs * cfg.trainer.minibatches,
                             self.out / "metrics.jsonl")
            stop = self.engine.any(interrupt.requested())  # SIGINT / SIGTERM: checkpoint, then stop
            every = cfg.checkpoint.every
            if stop or self.step == cfg.trainer.steps or (every and self.step % every == 0):
                self.save_checkpoint()
            if stop and self.step < cfg.trainer.steps:
                self.logger.close()
                raise interrupt.TrainingInterrupted(self.step)
        self.logger.close()
        if end:
            self.engine.end()
        release_lock(self.out)

    # -- collect: this process's share of the step's prompts, drawn through the rollout hooks, scored --------
    def collect(self) -> Scored:
        eng, hooks = self.engine, [hook for _, hook in self.rollout_hooks]
        self.drawn, self.sampler_stats = 0, {}
        self.guard.new_step()
        batch = round_driver(self.rollout_hooks).rounds(self.collect_round)
        for hook in hooks:
            batch = hook.finish(batch)
        batch.stats = reward_stats(batch, eng, self.cfg.algo.overlong_max_len is not None)
        for hook in hooks:
            batch.stats |= hook.metrics()
        batch.stats |= {key: eng.mean(value) for key, value in self.sampler_stats.items()}
        batch.stats |= {"rollout/len_mean": eng.mean(batch.rollout.lengths.float().mean()),
                        "rollout/generated": eng.sum(self.drawn),
                        "rollout/trained_rows": eng.sum(batch.rollout.num_rows)}
        return batch

    def collect_round(self, index: int) -> Scored:
        cfg, eng = self.cfg, self.engine
        n, selector = cfg.rollout.prompts_per_step, self.selector
        candidates = n * (selector.candidates_per_prompt if selector else 1)
        examples = self.task.sample_batch(cfg.rollout.split, candidates, self.data_rng)
        examples = selector.select_prompts(examples, n) if selector else examples
        examples = examples[eng.rank::eng.world_size]
        sampling = SamplingParams(cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_new_tokens)
        round_ = Round(index, sampling, derive_seed(cfg.trainer.seed, self.step, index, eng.rank), self.draw)
        for _, hook in self.rollout_hooks:
            hook.begin_round(examples)
        if cfg.rollout.seed_per_example:  # seeds from global positions: the same rows for any process count
            seeds = [derive_seed(cfg.trainer.seed, self.step, index, 1 << 20, eng.rank + k * eng.world_size)
                     for k in range(len(examples))]
            rollout = draw_per_example(self.draw, examples, cfg.rollout.samples_per_group, sampling, seeds)
        else:
            rollout = self.draw(examples, cfg.rollout.samples_per_group, sampling, round_.seed)
        part = self.score(rollout, examples)
        for _, hook in self.rollout_hooks:
            part = hook.refine(part, round_)
        return part

    def sample(self, examples: list[Any], group_size: int, sampling: SamplingParams, seed: int) -> Rollout:
        """The policy's sampler, innermost of the hooks' draws; counts every row drawn and the sampler's stats."""
        rollout = self.policy.rollout(examples, group_size, sampling, seed)
        self.drawn += rollout.num_rows
        for key, value in rollout.stats.items():  # sampler measurements (perf/weight_sync_s, ...)
            self.sampler_stats[key] = self.sampler_stats.get(key, 0.0) + value
        return rollout

    def score(self, rollout: Rollout, examples: list[Any]) -> Scored:
        results = verify(self.task, self.cfg.task.name, rollout, examples)
        outcome, bad = finite_outcomes(torch.tensor([r.score for r in results], dtype=torch.float32),
                                       rollout.group_id)
        self.guard.add("train/nonfinite_rewards", bad)
        rewards, a = outcome.clone(), self.cfg.algo
        if a.overlong_max_len is not None:
            rewards = rewards + overlong_penalty(rollout.lengths, a.overlong_max_len, a.overlong_buffer,
                                                 a.overlong_factor)
        return Scored(rollout, examples, results, outcome, rewards)

    # -- advantages: estimator, then shaping hooks; the reference policy's outputs when one is kept -----------
    def advantages(self, batch: Scored) -> tuple[Tensor, Tensor | None, PolicyOutput | None]:
        a, rollout = self.cfg.algo, batch.rollout
        t, estimator = self.cfg.trainer, a.kl_estimator  # the reference on the whole rollout, once per step
        reference = reference_outputs(t.ref_model, self.policy, self.ref, rollout, t.micro_batch_size,
                                      self.engine.autocast, estimator, estimator in GAUSSIAN_KL_ESTIMATORS)
        ref_logp = None if reference is None else reference.logp
        kl = (rollout.logp - ref_logp) * rollout.mask if ref_logp is not None else None
        inputs = AdvantageInputs(rewards=batch.rewards, mask=rollout.mask, group_id=rollout.group_id,
                                 step_rewards=rollout.step_rewards, values=rollout.values, dones=rollout.dones, kl=kl,
                                 **batch.row_inputs)
        advantages, returns = ADVANTAGE_ESTIMATORS.get(a.advantage)(inputs, a)
        entropy = self.no_grad_forward(self.policy, rollout, entropy=True) if "entropy" in self.needs else None
        ctx = ShapingContext(outcome=batch.outcome, rewards=batch.rewards, group_id=rollout.group_id,
                             mask=rollout.mask, logp_old=rollout.logp, ref_logp=ref_logp, entropy=entropy)
        for hook in a.shaping:
            advantages = SHAPING_HOOKS.get(hook)(advantages, ctx, a)
        return advantages, returns, reference

    def no_grad_forward(self, model: Policy, rollout: Rollout, entropy: bool = False) -> Tensor:
        return forward_no_grad(model, rollout, self.cfg.trainer.micro_batch_size, self.engine.autocast, entropy)

    # -- update: ppo_epochs passes of minibatches optimizer steps over this process's rows ---------------
    def update(self, rollout: Rollout, advantages: Tensor, returns: Tensor | None,
               reference: PolicyOutput | None) -> dict[str, float]:
        """Each minibatch holds whole groups; its loss uses the token / sequence counts of the *global*
        minibatch (all processes, all micro-batches), so the update does not depend on the micro-batch size,
        nor (for one minibatch per pass) on the number of processes. With several minibatches each process
        shuffles its own groups, so which groups share a minibatch depends on the number of processes."""
        cfg, eng, a = self.cfg, self.engine, self.cfg.algo
        logp_old, extra = rollout.logp, {}
        if cfg.trainer.recompute_logp_old:
            logp_old = self.no_grad_forward(self.policy, rollout)
            extra["rollout/logp_diff"] = eng.sum(((logp_old - rollout.logp).abs() * rollout.mask).sum()) \
                / max(eng.sum(rollout.mask.sum()), 1.0)
        num_groups = int(rollout.group_id.max()) + 1
        per_minibatch = num_groups // cfg.trainer.minibatches
        sums: dict[str, float] = {}
        tokens_seen = 0.0
        for epoch in range(cfg.trainer.ppo_epochs):
            gen = torch.Generator().manual_seed(derive_seed(cfg.trainer.seed, self.step, epoch, 7))
            order = torch.randperm(num_groups, generator=gen)  # the same on every process
            for mb in range(cfg.trainer.minibatches):
                index = UpdateIndex(self.step, epoch, mb)
                groups = order[mb * per_minibatch:(mb + 1) * per_minibatch]
                rows = torch.isin(rollout.group_id, groups).nonzero().squeeze(1)
                denominators = {"num_tokens": eng.sum(rollout.mask[rows].sum()), "num_seqs": eng.sum(len(rows)),
                                # Dr. GRPO's constant: the max completion length, the same on every process.
                                "norm_len": a.loss_agg_norm_len or cfg.rollout.max_new_tokens}
                for _, hook in self.loss_hooks:  # terms of their own data, the same rows on every process
                    with eng.no_sync(self.model, skip_sync=True):
                        term = hook.update_term(index)
                        if term is not None:
                            eng.backward(term[0])
                    for key, value in (term[1] if term is not None else {}).items():
                        sums[key] = sums.get(key, 0.0) + value / eng.world_size
                micro = rows.split(cfg.trainer.micro_batch_size)
                for i, idx in enumerate(micro):
                    with eng.no_sync(self.model, skip_sync=i < len(micro) - 1):
                        loss, terms = self.micro_loss(MicroInputs(
                            index, rollout.select(idx), idx, logp_old[idx], advantages[idx],
                            None if returns is None else returns[idx], select_output(reference, idx), denominators))
                        eng.backward(loss * eng.world_size)  # DDP averages over processes; the loss is a global sum
                    tokens = float(rollout.mask[idx].sum())
                    tokens_seen += tokens
                    for key, value in terms.items():
                        sums[key] = sums.get(key, 0.0) + value * (1.0 if key.startswith("loss/") else tokens)
                sums["policy/grad_norm"] = sums.get("policy/grad_norm", 0.0) + self.optimizer_step()
        updates = cfg.trainer.ppo_epochs * cfg.trainer.minibatches
        total_tokens = max(eng.sum(tokens_seen), 1.0)
        metrics = {key: (eng.sum(v) / updates if key.startswith("loss/") else
                         v / updates if key == "policy/grad_norm" else eng.sum(v) / total_tokens)
                   for key, v in sums.items()}
        if reference is None:
            metrics["policy/kl_ref"] = None
        for _, hook in self.loss_hooks:
            metrics |= hook.metrics()
        return metrics | extra | {"train/lr": self.scheduler.get_last_lr()[0], "policy/version": self.policy.version}

    def micro_loss(self, m: MicroInputs) -> tuple[Tensor, dict[str, float]]:
        """The policy's forward pass on one micro-batch, then its loss (:func:`mmrl.core.objective.micro_loss`)."""
        with self.engine.autocast():
            out = self.model(m.rows, with_entropy=True)
        loss, terms = micro_loss(out, m, self.cfg.algo, [hook for _, hook in self.loss_hooks], self.engine.device)
        self.guard.check_loss(count_nonfinite(out.logp.detach().float(), m.rows.mask), terms["loss/total"])
        return loss, terms

    def optimizer_step(self) -> float:
        t = self.cfg.trainer
        norm, stepped = self.guard.optimizer_step(self.model, self.optimizer, self.scheduler, t.grad_clip)
        self.policy.version += stepped
        return norm

    # -- evaluation and checkpoints ------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Held-out metrics (:func:`mmrl.core.evaluate.evaluate_sets`) and the rollout hooks' ``eval_metrics``;
        sample outputs to the logger."""
        with self.engine.full_parameters(self.model):
            metrics, samples = evaluate_sets(self.policy, self.task, self.cfg, self.engine, self.eval_sets, self.step)
        self.logger.log_samples(self.step, samples)
        for _, hook in self.rollout_hooks:  # counters read with the evaluation (real env steps so far, ...)
            metrics |= hook.eval_metrics()
        return metrics

    def keep_best(self, metrics: dict[str, float]) -> None:
        """``checkpoint.best_metric``: write ``checkpoints/best/`` when this evaluation beats every earlier one."""
        name, mode = self.cfg.checkpoint.best_metric, self.cfg.checkpoint.best_mode
        if name is None:
            return
        if name not in metrics:
            raise ConfigError(f"checkpoint.best_metric: the evaluation logs no {name!r}; it logs "
                              f"{', '.join(sorted(k for k in metrics if k.startswith('eval/')))} "
                              f"(a split's metrics need the split in eval.split or eval.extra_splits)")
        value = float(metrics[name])
        if math.isfinite(value) and ckpt.is_better(value, None if self.best is None else self.best["value"], mode):
            self.best = {"step": self.step, "metric": name, "value": value}
            ckpt.save_best(self.engine, self.policy, self.out, self.cfg, self.best)

    def save_checkpoint(self) -> None:
        state = {"step": self.step, "best": self.best, "policy_version": self.policy.version,
                 "skipped_updates": self.guard.skipped_updates,
                 "data_rng": self.data_rng.bit_generator.state, "config_fingerprint": ckpt.config_fingerprint(self.cfg),
                 "hooks": {name: hook.state_dict() for name, hook in self.rollout_hooks},
                 "loss_hooks": {name: hook.state_dict() for name, hook in self.loss_hooks}}
        ckpt.save(self.engine, self.policy, self.out, self.step, state, self.cfg.checkpoint.keep_last)

    def load_checkpoint(self) -> None:
        state = ckpt.load(self.engine, self.out, self.cfg)
        self.step, self.guard.skipped_updates = state["step"], state["skipped_updates"]
        self.policy.version = state["policy_version"]
        self.data_rng.bit_generator.state = state["data_rng"]
        best = state.get("best")  # checkpoints from before best_metric existed hold none
        self.best = best if best and best["metric"] == self.cfg.checkpoint.best_metric else None  # metric changed: anew
        if self.engine.is_main:
            ckpt.drop_best_after(self.out, self.step)
        for name, hook in self.rollout_hooks:  # a hook added after the checkpoint was written: {}
            hook.load_state_dict(state["hooks"].get(name, {}))
        for name, hook in self.loss_hooks:  # checkpoints from before loss hooks kept state hold none
            hook.load_state_dict(state.get("loss_hooks", {}).get(name, {}))


def check_rollout_split(task: Any, cfg: TrainConfig) -> None:
    """A ``rollout.split`` other than ``train`` must be one the task draws examples from: one draw now, so a
    misspelt split fails before the warm start and the first rollout (a ``ConfigError`` naming the key)."""
    split = cfg.rollout.split
    if split == "train":
        return
    error = split_error(task, split)
    if error is not None:
        raise ConfigError(f"rollout.split: {cfg.task.name} cannot draw training examples from split {split!r} "
                          f"({error})") from error


def split_error(task: Any, split: str) -> Exception | None:
    """Why ``task`` cannot draw examples from ``split`` (one draw), or None when it can."""
    try:
        task.sample_batch(split, 1, np.random.default_rng(0))
    except (ValueError, KeyError) as error:
        return error
    return None


def check_best_metric_split(task: Any, cfg: TrainConfig) -> None:
    """A ``checkpoint.best_metric`` of a task split the run does not evaluate (``eval/val/success_rate`` without
    ``val`` in ``eval.extra_splits``) fails now, before the warm start, not at the first evaluation."""
    name = cfg.checkpoint.best_metric
    parts = name.split("/") if name else []
    if len(parts) < 3 or parts[1] in (cfg.eval.split, *cfg.eval.extra_splits):
        return
    if split_error(task, parts[1]) is not None:
        return  # not a split: a metric of the main split with a "/" in its name (eval/success_rate/<task>)
    raise ConfigError(f"checkpoint.best_metric {name!r} reads split {parts[1]!r}, which the run does not evaluate: "
                      f"add it to eval.extra_splits (now {list(cfg.eval.extra_splits)})")


def train(cfg: TrainConfig, out: str | Path, resume: bool = False, overwrite: bool = False) -> Path:
    """Run (or resume) training; returns the run folder."""
    trainer = Trainer(cfg, out, resume=resume, overwrite=overwrite)
    trainer.train()
    return trainer.out
