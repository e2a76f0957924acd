"""The one training loop: collect → score → advantages → update → log → eval → checkpoint.

Every domain runs through :meth:`Trainer.train`. What differs between domains lives in the task
(examples, reward) and the policy (sampling, re-scoring); what differs between algorithms lives in
the registered functions of :mod:`mmrl.algos`, chosen by ``cfg.algo``; paper variants that change
how rows are drawn or add loss terms with data of their own are hooks (:mod:`mmrl.algos.hooks`).
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mmrl.algos import (ADVANTAGE_ESTIMATORS, GAUSSIAN_KL_ESTIMATORS, POLICY_LOSSES, SHAPING_HOOKS, AdvantageInputs,
                        ShapingContext, aggregate, kl_penalty, overlong_penalty, truncated_is_weights, value_loss)
from mmrl.algos.hooks import (LOSS_HOOKS, ROLLOUT_HOOKS, HookContext, MicroBatch, Round, UpdateIndex, build_hooks,
                              compose_draw, round_driver)
from mmrl.algos.variants import algo_needs
from mmrl.core import checkpoint as ckpt
from mmrl.core.config import ConfigError, TrainConfig, dump_config
from mmrl.core.contracts import Policy, PolicyOutput
from mmrl.core.engine import Engine
from mmrl.core.evaluate import held_out_metrics, verify
from mmrl.core.logging import RunLogger
from mmrl.core.trackers import open_trackers
from mmrl.core.registry import make_task
from mmrl.core.rescoring import forward_no_grad, gaussian_outputs, select_output
from mmrl.core.rollout import Rollout, SamplingParams, derive_seed
from mmrl.core.run_folder import prepare_out_dir
from mmrl.core.scored import Scored
from mmrl.core.warm_start import build_initial_policy, warm_start_examples


class Trainer:
    def __init__(self, cfg: TrainConfig, out: str | Path, resume: bool = False, overwrite: bool = False):
        self.cfg, self.out = cfg, Path(out)
        self.engine = Engine(cfg.trainer.mixed_precision)
        if self.engine.is_main:
            prepare_out_dir(self.out, resume, overwrite)
        self.engine.wait()
        world, t = self.engine.world_size, cfg.trainer
        if cfg.rollout.prompts_per_step % (world * t.minibatches):
            raise ConfigError(f"rollout.prompts_per_step ({cfg.rollout.prompts_per_step}) must be divisible by "
                              f"processes × trainer.minibatches ({world} × {t.minibatches})")
        self.task = make_task(cfg.task.name, cfg.task.args)
        policy = build_initial_policy(cfg, self.engine.device, self.engine.is_main, self.engine.wait)
        self.ref = copy.deepcopy(policy).eval().requires_grad_(False) if t.ref_model == "copy" else None
        if t.ref_model == "adapter_disabled":
            with policy.adapter_disabled():  # fails now, clearly, for a policy without adapters
                pass
        trainable = [p for p in policy.parameters() if p.requires_grad]  # LoRA: the adapters only
        optimizer = torch.optim.AdamW(trainable, lr=t.lr, weight_decay=t.weight_decay)
        updates = t.steps * t.ppo_epochs * t.minibatches
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: lr_factor(i, t.warmup_steps, updates,
                                                                                       t.lr_schedule))
        policy.zero_grad(set_to_none=True)
        self.model, self.optimizer = self.engine.prepare(policy, optimizer)
        # The scheduler is not passed through accelerate (its wrapper steps once per process);
        # it is checkpointed with the rest of the state instead.
        self.scheduler = scheduler
        self.engine.accelerator.register_for_checkpointing(scheduler)
        self.policy: Policy = self.engine.unwrap(self.model)
        self.data_rng = np.random.default_rng(t.seed)
        self.eval_sets = [(split, self.task.sample_batch(split, cfg.eval.num_examples, np.random.default_rng(cfg.eval.seed)))
                          for split in (cfg.eval.split, *cfg.eval.extra_splits)]
        self.step, self.skipped_updates = 0, 0
        self.needs = algo_needs(cfg.algo)  # what the estimator / shaping hooks need beyond the core inputs
        ctx = HookContext(cfg, self.policy, self.model, self.task, self.engine, self.score,
                          lambda: warm_start_examples(self.task, cfg))
        self.rollout_hooks = build_hooks(ROLLOUT_HOOKS, ctx)
        self.loss_hooks = build_hooks(LOSS_HOOKS, ctx)
        self.draw = compose_draw([hook for _, hook in self.rollout_hooks], self.sample)
        self.drawn, self.sampler_stats = 0, {}
        if resume:
            self.load_checkpoint()
        elif self.engine.is_main:
            dump_config(cfg, self.out / "config.yaml")
        self.logger = RunLogger(self.out, self.engine.is_main, t.steps, self.step, cfg.log.tensorboard,
                                cfg.log.progress, open_trackers(cfg, self.out) if self.engine.is_main else ())

    def train(self) -> None:
        cfg = self.cfg
        if self.step == 0:
            self.logger.log({"step": 0, **self.evaluate()})
        while self.step < cfg.trainer.steps:
            self.step += 1
            start = time.perf_counter()
            batch = self.collect()
            rollout_s = time.perf_counter() - start
            row = {"step": self.step, **batch.stats}
            if self.engine.any(not torch.isfinite(batch.outcome).all()):
                row["train/skipped_nonfinite_reward"] = 1  # a NaN reward: skip the step, keep going
            else:
                advantages, returns, reference = self.advantages(batch)
                for _, hook in self.loss_hooks:
                    hook.prepare(batch)
                row |= self.update(batch.rollout, advantages, returns, reference)
            row |= {"perf/rollout_s": rollout_s, "perf/step_s": time.perf_counter() - start,
                    "perf/decisions_per_s": self.engine.sum(batch.rollout.mask.sum()) / max(rollout_s, 1e-9)}
            if self.step == cfg.trainer.steps or (cfg.eval.every and self.step % cfg.eval.every == 0):
                row |= self.evaluate()
            self.logger.log(row)
            if self.step == cfg.trainer.steps or (cfg.checkpoint.every and self.step % cfg.checkpoint.every == 0):
                self.save_checkpoint()
        self.logger.close()
        self.engine.end()

    # -- collect: this process's share of the step's prompts, drawn through the rollout hooks, scored --------
    def collect(self) -> Scored:
        eng, hooks = self.engine, [hook for _, hook in self.rollout_hooks]
        self.drawn, self.sampler_stats = 0, {}
        batch = round_driver(self.rollout_hooks).rounds(self.collect_round)
        for hook in hooks:
            batch = hook.finish(batch)
        batch.stats = self.reward_stats(batch)
        for hook in hooks:
            batch.stats |= hook.metrics()
        batch.stats |= {key: eng.mean(value) for key, value in self.sampler_stats.items()}
        batch.stats |= {"rollout/len_mean": eng.mean(batch.rollout.lengths.float().mean()),
                        "rollout/generated": eng.sum(self.drawn), "rollout/trained_rows": eng.sum(batch.rollout.num_rows)}
        return batch

    def collect_round(self, index: int) -> Scored:
        cfg, eng = self.cfg, self.engine
        examples = self.task.sample_batch("train", cfg.rollout.prompts_per_step, self.data_rng)[eng.rank::eng.world_size]
        sampling = SamplingParams(cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_new_tokens)
        round_ = Round(index, sampling, derive_seed(cfg.trainer.seed, self.step, index, eng.rank), self.draw)
        for _, hook in self.rollout_hooks:
            hook.begin_round(examples)
        part = self.score(self.draw(examples, cfg.rollout.samples_per_group, sampling, round_.seed), examples)
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
        outcome = torch.tensor([r.score for r in results], dtype=torch.float32)
        rewards, a = outcome.clone(), self.cfg.algo
        if a.overlong_max_len is not None:
            rewards = rewards + overlong_penalty(rollout.lengths, a.overlong_max_len, a.overlong_buffer,
                                                 a.overlong_factor)
        return Scored(rollout, examples, results, outcome, rewards)

    def reward_stats(self, batch: Scored) -> dict[str, float]:
        eng, n = self.engine, len(batch.results)
        total = eng.sum(n)
        mean = eng.sum(batch.outcome.sum()) / total
        stats = {"reward/mean": mean,
                 "reward/std": math.sqrt(max(eng.sum(((batch.outcome - mean) ** 2).sum()) / total, 0.0))}
        for name in sorted(batch.results[0].components) if batch.results else []:
            stats[f"reward/{name}"] = eng.sum(sum(r.components.get(name, 0.0) for r in batch.results)) / total
        if self.cfg.algo.overlong_max_len is not None:
            stats["reward/shaped_mean"] = eng.sum(batch.rewards.sum()) / total
        return stats

    # -- advantages: estimator, then shaping hooks; the reference policy's outputs when one is kept -----------
    def advantages(self, batch: Scored) -> tuple[Tensor, Tensor | None, PolicyOutput | None]:
        a, rollout = self.cfg.algo, batch.rollout
        reference = self.reference_outputs(rollout)
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

    def reference_outputs(self, rollout: Rollout) -> PolicyOutput | None:
        """The reference policy on the whole rollout, once per step: log-probs [N, T] (and Gaussian means /
        stds for closed-form KL estimators), on the CPU, sliced per micro-batch by :meth:`update`."""
        mode, estimator = self.cfg.trainer.ref_model, self.cfg.algo.kl_estimator
        if mode == "none":
            return None
        model = self.ref if mode == "copy" else self.policy
        with self.policy.adapter_disabled() if mode == "adapter_disabled" else contextlib.nullcontext():
            if estimator in GAUSSIAN_KL_ESTIMATORS:
                return gaussian_outputs(model, rollout, self.cfg.trainer.micro_batch_size, self.engine.autocast,
                                        estimator)
            return PolicyOutput(logp=self.no_grad_forward(model, rollout))

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
                        loss, terms = self.micro_loss(index, rollout.select(idx), idx, logp_old[idx], advantages[idx],
                                                      None if returns is None else returns[idx],
                                                      select_output(reference, idx), denominators)
                        eng.backward(loss * eng.world_size)  # DDP averages gradients over processes; the loss is a global sum
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
        return metrics | extra | {"train/lr": self.scheduler.get_last_lr()[0],
                                  "train/skipped_updates": self.skipped_updates, "policy/version": self.policy.version}

    def micro_loss(self, index: UpdateIndex, rows: Rollout, idx: Tensor, logp_old: Tensor, adv: Tensor,
                   returns: Tensor | None, reference: PolicyOutput | None,
                   denominators: dict) -> tuple[Tensor, dict[str, float]]:
        """The loss of one micro-batch: objective, KL to the reference, loss hooks' terms, entropy, value."""
        a, device = self.cfg.algo, self.engine.device
        mask, logp_old, adv = rows.mask.to(device), logp_old.to(device), adv.to(device)
        with self.engine.autocast():
            out = self.model(rows, with_entropy=True)
        logp = out.logp.float()
        pg, metrics = POLICY_LOSSES.get(a.policy_loss)(logp, logp_old, adv, mask, a)
        if a.tis_cap is not None:
            pg = pg * truncated_is_weights(logp_old, rows.logp.to(device), a.tis_cap)
        total = loss_pg = aggregate(pg, mask, a.loss_agg, **denominators)
        terms: dict[str, float] = {"loss/policy": loss_pg.item()}
        kl_ref = None
        if reference is not None:
            if a.kl_estimator in GAUSSIAN_KL_ESTIMATORS:  # closed form from the decisions' means (Flow-GRPO)
                ref = PolicyOutput(logp=reference.logp.to(device), mean=reference.mean.to(device),
                                   std=reference.std.to(device))
                kl = GAUSSIAN_KL_ESTIMATORS.get(a.kl_estimator)(out, ref)
            else:
                kl = kl_penalty(logp, reference.logp.to(device), a.kl_estimator)
            loss_kl = aggregate(kl, mask, a.loss_agg, **denominators)
            total = total + a.kl_coef * loss_kl
            kl_ref = float((kl.detach() * mask).sum() / mask.sum().clamp(min=1))
            terms |= {"loss/kl": loss_kl.item(), "policy/kl_ref": kl_ref}
        micro = MicroBatch(index, idx, logp, logp_old, adv, mask, denominators, kl_ref)
        for _, hook in self.loss_hooks:
            term, hook_terms = hook.micro_term(micro)
            if term is not None:
                total = total + term
            terms |= hook_terms
        if out.entropy is not None:
            loss_ent = aggregate(out.entropy.float(), mask, a.loss_agg, **denominators)
            if a.entropy_coef:
                total = total - a.entropy_coef * loss_ent
            terms |= {"loss/entropy": loss_ent.item(),
                      "policy/entropy": float((out.entropy.detach() * mask).sum() / mask.sum().clamp(min=1))}
        if out.values is not None and returns is not None and rows.values is not None:
            vl, v_metrics = value_loss(out.values.float(), rows.values.to(device), returns.to(device), mask,
                                       a.value_clip, a.value_huber_delta)
            loss_v = aggregate(vl, mask, a.loss_agg, **denominators)
            total = total + a.value_coef * loss_v
            terms |= {"loss/value": loss_v.item(), **{k: float(v) for k, v in v_metrics.items()}}
        terms |= {k: float(v) for k, v in metrics.items()}
        terms["loss/total"] = total.item()
        return total, terms

    def optimizer_step(self) -> float:
        """Clip, then step, unless the gradient is not finite: then skip and count it."""
        norm = self.engine.clip_grad_norm(self.model.parameters(), self.cfg.trainer.grad_clip)
        if norm is None or math.isfinite(norm):  # None: the backend guards the step itself
            self.optimizer.step()
            self.scheduler.step()
            self.policy.version += 1
        else:
            self.skipped_updates += 1
        self.optimizer.zero_grad(set_to_none=True)
        return norm if norm is not None and math.isfinite(norm) else float("nan")

    # -- evaluation and checkpoints ------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Greedy held-out metrics: ``eval/<metric>`` on ``eval.split``, ``eval/<split>/<metric>`` on each of
        ``eval.extra_splits``; the first outputs of each go to ``samples.jsonl`` and the trackers."""
        metrics, samples = {}, []
        for index, (split, examples) in enumerate(self.eval_sets):
            prefix = "eval/" if index == 0 else f"eval/{split}/"
            values, shown = held_out_metrics(self.policy, self.task, self.cfg, self.engine, examples, self.step, index)
            metrics |= {prefix + key: value for key, value in values.items()}
            samples += [(split, sample) for sample in shown]
        self.logger.log_samples(self.step, samples)
        return metrics

    def save_checkpoint(self) -> None:
        state = {"step": self.step, "policy_version": self.policy.version, "skipped_updates": self.skipped_updates,
                 "data_rng": self.data_rng.bit_generator.state, "config_fingerprint": ckpt.config_fingerprint(self.cfg),
                 "hooks": {name: hook.state_dict() for name, hook in self.rollout_hooks}}
        ckpt.save(self.engine, self.policy, self.out, self.step, state, self.cfg.checkpoint.keep_last)

    def load_checkpoint(self) -> None:
        state = ckpt.load(self.engine, self.out, self.cfg)
        self.step, self.skipped_updates = state["step"], state["skipped_updates"]
        self.policy.version = state["policy_version"]
        self.data_rng.bit_generator.state = state["data_rng"]
        for name, hook in self.rollout_hooks:
            hook.load_state_dict(state["hooks"][name])


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


def train(cfg: TrainConfig, out: str | Path, resume: bool = False, overwrite: bool = False) -> Path:
    """Run (or resume) training; returns the run folder."""
    trainer = Trainer(cfg, out, resume=resume, overwrite=overwrite)
    trainer.train()
    return trainer.out
