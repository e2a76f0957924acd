"""The one training loop: rollout → reward → advantage → shaping → PPO epochs → log → eval → checkpoint.

Every domain runs through :meth:`Trainer.train`. What differs between domains lives in the task
(examples, reward) and the policy (sampling, re-scoring); what differs between algorithms lives in
the registered functions of :mod:`mmrl.algos`, chosen by ``cfg.algo``.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mmrl import checkpoint as ckpt
from mmrl import interrupt
from mmrl.algos import (ADVANTAGE_ESTIMATORS, GAUSSIAN_KL_ESTIMATORS, POLICY_LOSSES, SHAPING_HOOKS, AdvantageInputs,
                        ShapingContext, aggregate, drift_gate, groups_with_signal, kl_penalty, overlong_penalty,
                        truncated_is_weights, value_loss)
from mmrl.algos.variants import (LOSS_TERMS, REHEARSAL_DIVERGENCES, ROLLOUT_STRATEGIES, TEMPERATURE_SCHEDULES,
                                 LossTermInputs, LossTermRows, PromptHistory, PromptTemperatures, algo_needs,
                                 perturbed_parameters, prompt_key, variant_params)
from mmrl.config import ConfigError, TrainConfig, dump_config
from mmrl.contracts import Policy, PolicyOutput, RewardResult
from mmrl.engine import Engine
from mmrl.evaluate import pass_at_k, rollout_metrics, verify
from mmrl.logging import RunLogger, truncate_metrics
from mmrl.registry import make_task
from mmrl.run_folder import prepare_out_dir, release_lock
from mmrl.rollout import Rollout, SamplingParams
from mmrl.warm_start import build_initial_policy, warm_start_examples


@dataclass
class Batch:
    """One step's scored rollouts on this process."""

    rollout: Rollout
    examples: list[Any]
    results: list[RewardResult]
    outcome: Tensor  # [N] verifiable scores
    rewards: Tensor  # [N] scores after reward shaping (overlong penalty)
    stats: dict[str, float]


def derive_seed(*parts: int) -> int:
    return int(np.random.SeedSequence([p & 0xFFFFFFFF for p in parts]).generate_state(1)[0])


def select_output(reference: PolicyOutput | Tensor | None, idx: Tensor) -> PolicyOutput | None:
    """Rows ``idx`` of the reference policy's outputs (a bare [N, T] tensor is its log-probs)."""
    if reference is None:
        return None
    if isinstance(reference, Tensor):
        return PolicyOutput(logp=reference[idx])
    return PolicyOutput(logp=reference.logp[idx],
                        mean=None if reference.mean is None else reference.mean[idx],
                        std=None if reference.std is None else reference.std[idx])


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
        if cfg.algo.bc_coef > 0 and t.ref_model == "none":
            raise ConfigError("algo.bc_coef > 0 gates the BC regulariser by the KL to a reference: set "
                              "trainer.ref_model: copy (or adapter_disabled); algo.kl_coef may stay 0")
        if cfg.algo.bc_coef > 0 and cfg.warm_start.sft_steps <= 0:
            raise ConfigError("algo.bc_coef > 0 regularises toward the warm start's own examples (VLA-RFT reuses "
                              "the SFT data): it needs warm_start.sft_steps > 0")
        self.bc_pool = warm_start_examples(self.task, cfg) if cfg.algo.bc_coef > 0 else []
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
        self.eval_examples = self.task.sample_batch(cfg.eval.split, cfg.eval.num_examples,
                                                    np.random.default_rng(cfg.eval.seed))
        self.extra_eval_examples = {split: self.task.sample_batch(split, cfg.eval.num_examples,
                                                                  np.random.default_rng(cfg.eval.seed))
                                    for split in cfg.eval.extra_splits}
        self.step, self.skipped_updates = 0, 0
        # What the selected paper variants need beyond the core inputs (mmrl.algos.variants.params):
        # behaviour entropy, per-prompt history (checkpointed), reference log-probs.
        self.needs = algo_needs(cfg.algo)
        self.history = PromptHistory()
        self.prompt_temperatures = PromptTemperatures()  # algo.temperature_schedule (ERPO), checkpointed
        self.rehearsal = self.build_rehearsal_set()
        if resume:
            self.load_checkpoint()
        elif self.engine.is_main:
            dump_config(cfg, self.out / "config.yaml")
        self.logger = RunLogger(self.out, self.engine.is_main, t.steps, self.step, cfg.log.tensorboard,
                                cfg.log.progress)

    # ------------------------------------------------------------------------------------------
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
                row |= self.update(batch.rollout, advantages, returns, reference, self.loss_term_rows(batch))
            row |= {"perf/rollout_s": rollout_s, "perf/step_s": time.perf_counter() - start,
                    "perf/decisions_per_s": self.engine.sum(batch.rollout.mask.sum()) / max(rollout_s, 1e-9)}
            if self.step == cfg.trainer.steps or (cfg.eval.every and self.step % cfg.eval.every == 0):
                row |= self.evaluate()
            self.logger.log(row)
            stop = self.engine.any(interrupt.requested())  # SIGINT / SIGTERM: checkpoint, then stop
            if stop or self.step == cfg.trainer.steps or (cfg.checkpoint.every
                                                          and self.step % cfg.checkpoint.every == 0):
                self.save_checkpoint()
            if stop and self.step < cfg.trainer.steps:
                self.logger.close()
                raise interrupt.TrainingInterrupted(self.step)
        self.logger.close()
        self.engine.end()
        release_lock(self.out)

    # ------------------------------------------------------------------------------------------
    def collect(self) -> Batch:
        """Sample this process's share of the step's prompts, score them, and (DAPO dynamic
        sampling) replace groups whose verifiable outcome does not vary, for at most
        ``max_gen_rounds`` rounds. All processes run the same number of rounds."""
        cfg, eng = self.cfg, self.engine
        per_rank = cfg.rollout.prompts_per_step // eng.world_size
        sampling = SamplingParams(cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_new_tokens)
        kept: list[Batch] = []
        dropped: list[Batch] = []
        sampler_stats: dict[str, float] = {}
        rounds = n_dropped = generated = 0
        temperature_sum = 0.0
        while True:
            examples = self.task.sample_batch("train", cfg.rollout.prompts_per_step, self.data_rng)
            examples = examples[eng.rank::eng.world_size]
            seed = derive_seed(cfg.trainer.seed, self.step, rounds, eng.rank)
            temperatures = self.sampling_temperatures(examples)  # [E] (ERPO), None with the fixed schedule
            rollout = self.sample(examples, cfg.rollout.group_size - cfg.rollout.reference_rows, sampling, seed,
                                  temperatures)
            generated += rollout.num_rows
            if cfg.rollout.reference_rows:
                rollout = self.with_reference_rows(rollout, examples, sampling)
            part = self.score(rollout, examples)
            for key, value in rollout.stats.items():  # sampler measurements (perf/weight_sync_s, ...)
                sampler_stats[key] = sampler_stats.get(key, 0.0) + value
            rounds += 1
            if temperatures is not None:
                temperature_sum += float(temperatures.mean())
                self.update_prompt_temperatures(part, temperatures)
            part, more = self.apply_rollout_strategy(part, examples, sampling, seed, temperatures)
            generated += more
            if not cfg.algo.dynamic_sampling:
                kept.append(part)
                break
            signal = groups_with_signal(part.outcome, rollout.group_id)
            kept.append(self.select_rows(part, signal))
            dropped.append(self.select_rows(part, ~signal))
            n_dropped += int((~signal).sum()) // cfg.rollout.group_size
            have = sum(len(b.examples) for b in kept)
            if not eng.any(have < per_rank) or rounds >= cfg.algo.max_gen_rounds:
                break
        if cfg.algo.dynamic_sampling:
            batch = self.merge(kept + dropped, per_rank)
            sampling_stats = {"rollout/gen_rounds": rounds, "rollout/dropped_groups": eng.sum(n_dropped)}
        else:
            batch, sampling_stats = kept[0], {}
        if cfg.algo.temperature_schedule != "fixed":
            sampling_stats |= {"rollout/temperature_mean": eng.mean(temperature_sum / rounds),
                               "rollout/hot_prompts": len(self.prompt_temperatures)}
        batch.stats = (self.reward_stats(batch) | sampling_stats | {k: eng.mean(v) for k, v in sampler_stats.items()}
                       | {"rollout/len_mean": eng.mean(batch.rollout.lengths.float().mean()),
                          "rollout/generated": eng.sum(generated),
                          "rollout/trained_rows": eng.sum(batch.rollout.num_rows)})
        return batch

    def sample(self, examples: list[Any], group_size: int, sampling: SamplingParams, seed: int,
               temperatures: Tensor | None = None) -> Rollout:
        """Training rollouts; with ``rollout.param_noise_std`` > 0 drawn from perturbed weights (PSN-RLVR).
        With per-example ``temperatures`` ([E], ERPO) one sampling call per distinct temperature; the
        rows come back in example order, as from one call."""
        with perturbed_parameters(self.policy, self.cfg.rollout.param_noise_std, derive_seed(seed, 13)):
            if temperatures is None or bool((temperatures == sampling.temperature).all()):
                return self.policy.rollout(examples, group_size, sampling, seed)
            parts = []
            for value in sorted(set(temperatures.tolist())):
                chosen = (temperatures == value).nonzero().squeeze(1)
                part = self.policy.rollout([examples[i] for i in chosen.tolist()], group_size,
                                           dataclasses.replace(sampling, temperature=value),
                                           derive_seed(seed, round(value * 1e6), 23))
                index = chosen[part.example_index]  # back to indices into ``examples``
                parts.append(part.replace(example_index=index, group_id=index.clone()))
            rollout = Rollout.concat(parts)
            return rollout.select(torch.argsort(rollout.example_index, stable=True))

    def sampling_temperatures(self, examples: list[Any]) -> Tensor | None:
        """Each example's sampling temperature under ``algo.temperature_schedule`` ([E] float64; None: fixed)."""
        if self.cfg.algo.temperature_schedule == "fixed":
            return None
        return self.prompt_temperatures.lookup([prompt_key(e) for e in examples], self.cfg.rollout.temperature)

    def update_prompt_temperatures(self, part: Batch, temperatures: Tensor) -> None:
        """The schedule's next temperature for each example of ``part`` from its group's outcomes (all processes
        hold the same table)."""
        a, base = self.cfg.algo, self.cfg.rollout.temperature
        following = TEMPERATURE_SCHEDULES.get(a.temperature_schedule)(temperatures, part.outcome,
                                                                      part.rollout.example_index, base, a)
        keys = [prompt_key(e) for e in part.examples]
        self.prompt_temperatures.update(*self.engine.gather_objects(keys, following.tolist()), base)

    def with_reference_rows(self, rollout: Rollout, examples: list[Any], sampling: SamplingParams) -> Rollout:
        """Append ``rollout.reference_rows`` rows per example holding the task's reference output (ViSurf):
        scored by the current policy, so π_old is the policy's own probability of the reference."""
        copies = self.cfg.rollout.reference_rows
        index = torch.arange(len(examples)).repeat_interleave(copies)
        references = self.policy.rollout_from_outputs([examples[i] for i in index.tolist()],
                                                      [self.task.reference_output(examples[i]) for i in index.tolist()],
                                                      sampling)
        return Rollout.concat([rollout, references.replace(example_index=index, group_id=index.clone())])

    def apply_rollout_strategy(self, part: Batch, examples: list[Any], sampling: SamplingParams,
                               seed: int, temperatures: Tensor | None = None) -> tuple[Batch, int]:
        """``algo.rollout_strategy`` (mmrl/algos/variants/adaptive_sampling.py): draw the extra samples
        it asks for, per example, until it asks for none; then keep the rows it selects. Returns the
        batch and how many extra samples were drawn (``plain``: none, every row kept)."""
        a = self.cfg.algo
        strategy = ROLLOUT_STRATEGIES.get(a.rollout_strategy)
        extra = 0
        for round_ in itertools.count(1):  # the strategy bounds the rounds (AERO: its per-prompt budget)
            more = strategy.more(part.outcome, part.rollout.example_index, len(examples), a)  # [E]
            if not torch.any(more > 0):
                break
            for count in sorted(set(more[more > 0].tolist())):  # one sampling call per requested count
                asked = (more == count).nonzero().squeeze(1)
                rollout = self.sample([examples[i] for i in asked.tolist()], count, sampling,
                                      derive_seed(seed, round_, count, 11),
                                      None if temperatures is None else temperatures[asked])
                index = asked[rollout.example_index]  # back to indices into ``examples``
                new = self.score(rollout.replace(example_index=index, group_id=index.clone()), examples)
                part = Batch(Rollout.concat([part.rollout, new.rollout]), examples, part.results + new.results,
                             torch.cat([part.outcome, new.outcome]), torch.cat([part.rewards, new.rewards]), {})
                extra += rollout.num_rows
        generator = torch.Generator().manual_seed(derive_seed(seed, 12))
        keep = strategy.keep(part.outcome, part.rollout.example_index, a, generator)
        return (part if bool(keep.all()) else self.select_rows(part, keep)), extra

    def verify(self, rollout: Rollout, examples: list[Any]) -> list[RewardResult]:
        return verify(self.task, self.cfg.task.name, rollout, examples)

    def score(self, rollout: Rollout, examples: list[Any]) -> Batch:
        results = self.verify(rollout, examples)
        outcome = torch.tensor([r.score for r in results], dtype=torch.float32)
        rewards = outcome.clone()
        a = self.cfg.algo
        if a.overlong_max_len is not None:
            rewards = rewards + overlong_penalty(rollout.lengths, a.overlong_max_len, a.overlong_buffer,
                                                 a.overlong_factor)
        return Batch(rollout, examples, results, outcome, rewards, {})

    @staticmethod
    def select_rows(batch: Batch, rows: Tensor) -> Batch:
        """Rows ``rows`` (bool [N]) with their examples, whole groups only."""
        index = rows.nonzero().squeeze(1)
        rollout = batch.rollout.select(index)
        used = sorted(set(rollout.example_index.tolist()))
        remap = {old: new for new, old in enumerate(used)}
        example_index = torch.tensor([remap[i] for i in rollout.example_index.tolist()], dtype=torch.long)
        rollout = rollout.replace(example_index=example_index, group_id=example_index.clone())
        return Batch(rollout, [batch.examples[i] for i in used], [batch.results[i] for i in index.tolist()],
                     batch.outcome[index], batch.rewards[index], {})

    def merge(self, parts: list[Batch], num_groups: int) -> Batch:
        """Concatenate parts (informative groups first) and keep the first ``num_groups`` groups."""
        parts = [p for p in parts if p.examples]
        offsets = np.cumsum([0] + [len(p.examples) for p in parts])
        rollout = Rollout.concat([p.rollout.replace(example_index=p.rollout.example_index + int(o),
                                                    group_id=p.rollout.group_id + int(o))
                                  for p, o in zip(parts, offsets)])
        merged = Batch(rollout, [e for p in parts for e in p.examples], [r for p in parts for r in p.results],
                       torch.cat([p.outcome for p in parts]), torch.cat([p.rewards for p in parts]), {})
        return self.select_rows(merged, rollout.example_index < num_groups)

    def reward_stats(self, batch: Batch) -> dict[str, float]:
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

    # ------------------------------------------------------------------------------------------
    def advantages(self, batch: Batch) -> tuple[Tensor, Tensor | None, PolicyOutput | None]:
        """Estimator then shaping hooks; also the reference policy's outputs on the rollout (its
        log-probs, and for Gaussian KL estimators its means) when a reference is kept."""
        a, rollout = self.cfg.algo, batch.rollout
        reference = self.reference_outputs(rollout)
        ref_logp = None if reference is None else reference.logp
        kl = (rollout.logp - ref_logp) * rollout.mask if ref_logp is not None else None
        inputs = AdvantageInputs(rewards=batch.rewards, mask=rollout.mask, group_id=rollout.group_id,
                                 step_rewards=rollout.step_rewards, values=rollout.values, dones=rollout.dones, kl=kl)
        if "prompt_history" in self.needs:  # counts from earlier steps only; this step's are added after
            keys = [prompt_key(batch.examples[i]) for i in rollout.example_index.tolist()]
            successes, failures = self.history.lookup(keys)
            inputs = dataclasses.replace(inputs, prompt_successes=successes, prompt_failures=failures)
            self.history.update(*self.engine.gather_objects(keys, batch.outcome.tolist()))
        advantages, returns = ADVANTAGE_ESTIMATORS.get(a.advantage)(inputs, a)
        entropy = self.forward_no_grad(self.policy, rollout, entropy=True) if "entropy" in self.needs else None
        ctx = ShapingContext(outcome=batch.outcome, rewards=batch.rewards, group_id=rollout.group_id,
                             mask=rollout.mask, logp_old=rollout.logp, ref_logp=ref_logp, entropy=entropy)
        for hook in a.shaping:
            advantages = SHAPING_HOOKS.get(hook)(advantages, ctx, a)
        return advantages, returns, reference

    def loss_term_rows(self, batch: Batch) -> LossTermRows | None:
        """Per-row inputs of ``algo.loss_terms`` (None without any): the rows' outcomes and, with the
        ``expert_rows`` need (CalibRL), π_old's log-probs of the task's reference output for each row's
        prompt, scored by the current policy before the update (``Policy.rollout_from_outputs``)."""
        cfg = self.cfg
        if not cfg.algo.loss_terms:
            return None
        if "expert_rows" not in self.needs:
            return LossTermRows(batch.outcome, None, None)
        sampling = SamplingParams(cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_new_tokens)
        references = [self.task.reference_output(e) for e in batch.examples]
        expert = self.policy.rollout_from_outputs(batch.examples, references, sampling)
        index = batch.rollout.example_index
        return LossTermRows(batch.outcome, expert.logp[index], expert.mask[index])

    @torch.no_grad()
    def reference_outputs(self, rollout: Rollout) -> PolicyOutput | None:
        """The reference policy on the whole rollout, in micro-batches, once per step: log-probs
        [N, T], plus the Gaussian means / stds when ``algo.kl_estimator`` needs them (Flow-GRPO's
        KL on the mean), kept on the CPU and sliced per micro-batch by :meth:`update`."""
        mode = self.cfg.trainer.ref_model
        if mode not in ("copy", "adapter_disabled"):
            return None
        if self.cfg.algo.kl_estimator not in GAUSSIAN_KL_ESTIMATORS:
            if mode == "copy":
                return PolicyOutput(logp=self.forward_no_grad(self.ref, rollout))
            with self.policy.adapter_disabled():
                return PolicyOutput(logp=self.forward_no_grad(self.policy, rollout))
        size, parts = self.cfg.trainer.micro_batch_size, []
        for start in range(0, rollout.num_rows, size):
            rows = rollout.select(torch.arange(start, min(start + size, rollout.num_rows)))
            with self.engine.autocast():
                if mode == "copy":
                    out = self.ref(rows)
                else:
                    with self.policy.adapter_disabled():
                        out = self.policy(rows)
            if out.mean is None or out.std is None:
                raise ValueError(f"algo.kl_estimator {self.cfg.algo.kl_estimator} needs a policy whose decisions "
                                 f"are Gaussian and that returns PolicyOutput.mean / std (the diffusion policy); "
                                 f"{type(self.policy).__name__} does not: use k1 / k3 / low_var_kl")
            parts.append(out)
        return PolicyOutput(logp=torch.cat([o.logp.float().cpu() for o in parts]) * rollout.mask,
                            mean=torch.cat([o.mean.float().cpu() for o in parts]),
                            std=torch.cat([o.std.float().cpu() for o in parts]))

    @torch.no_grad()
    def forward_no_grad(self, model: Policy, rollout: Rollout, entropy: bool = False) -> Tensor:
        """Log-probs of the rollout's decisions ([N, T]), or with ``entropy`` the per-decision entropy."""
        size = self.cfg.trainer.micro_batch_size
        parts = []
        for start in range(0, rollout.num_rows, size):
            rows = rollout.select(torch.arange(start, min(start + size, rollout.num_rows)))
            with self.engine.autocast():
                out = model(rows, with_entropy=entropy)
            parts.append((out.entropy if entropy else out.logp).float().cpu())
        t_max = rollout.mask.shape[1]
        return torch.cat([torch.nn.functional.pad(p, (0, t_max - p.shape[1])) for p in parts]) * rollout.mask

    def update(self, rollout: Rollout, advantages: Tensor, returns: Tensor | None,
               reference: PolicyOutput | Tensor | None, term_rows: LossTermRows | None = None) -> dict[str, float]:
        """``ppo_epochs`` passes of ``minibatches`` optimizer steps over this process's rows.

        Each minibatch holds whole groups; its loss uses the token / sequence counts of the
        *global* minibatch (all processes, all micro-batches), so the update does not depend on
        the micro-batch size, nor (for one minibatch per pass) on the number of processes. With
        several minibatches each process shuffles its own groups, so which groups share a
        minibatch depends on the number of processes, as with any data-parallel sharding.
        """
        cfg, eng, a = self.cfg, self.engine, self.cfg.algo
        logp_old, extra = rollout.logp, {}
        if cfg.trainer.recompute_logp_old:
            logp_old = self.forward_no_grad(self.policy, rollout)
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
                groups = order[mb * per_minibatch:(mb + 1) * per_minibatch]
                rows = torch.isin(rollout.group_id, groups).nonzero().squeeze(1)
                denominators = {"num_tokens": eng.sum(rollout.mask[rows].sum()), "num_seqs": eng.sum(len(rows)),
                                # Dr. GRPO's constant: the max completion length, the same on every process.
                                "norm_len": a.loss_agg_norm_len or cfg.rollout.max_new_tokens}
                if self.rehearsal is not None and self.rehearsal.num_rows:  # DPH-RL: + coef · divergence to π_0
                    seed = derive_seed(cfg.trainer.seed, self.step, epoch, mb, 19)
                    with eng.no_sync(self.model, skip_sync=True):  # the same rows on every process: no reduction
                        value = self.rehearsal_divergence(seed)
                        eng.backward(value * variant_params(a, "dph_rl").coef)
                    sums["loss/rehearsal"] = sums.get("loss/rehearsal", 0.0) + value.item() / eng.world_size
                micro = rows.split(cfg.trainer.micro_batch_size)
                for i, idx in enumerate(micro):
                    with eng.no_sync(self.model, skip_sync=i < len(micro) - 1):
                        terms = self.loss_terms(rollout.select(idx), logp_old[idx], advantages[idx],
                                                None if returns is None else returns[idx],
                                                select_output(reference, idx), denominators,
                                                None if term_rows is None else term_rows.select(idx))
                        # DDP averages gradients over processes; the loss is a global sum.
                        eng.backward(terms.pop("loss/total_tensor") * eng.world_size)
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
        if self.rehearsal is not None:
            metrics["rollout/rehearsal_rows"] = self.rehearsal.num_rows
        return metrics | extra | {"train/lr": self.scheduler.get_last_lr()[0],
                                  "train/skipped_updates": self.skipped_updates, "policy/version": self.policy.version}

    def rehearsal_divergence(self, seed: int) -> Tensor:
        """Token-mean of ``algo.rehearsal_divergence`` between π_θ and π_0 on ``rows_per_update`` rows of the
        rehearsal set drawn with ``seed`` (DPH-RL, mmrl/algos/variants/divergences.py)."""
        a = self.cfg.algo
        params = variant_params(a, "dph_rl")
        pick = torch.randperm(self.rehearsal.num_rows, generator=torch.Generator().manual_seed(seed))
        rows = self.rehearsal.select(pick[:params.rows_per_update])
        mask = rows.mask.to(self.engine.device)
        with self.engine.autocast():
            logp = self.model(rows).logp.float()
        term = REHEARSAL_DIVERGENCES.get(a.rehearsal_divergence)(logp, rows.logp.to(self.engine.device), params)
        return aggregate(term * mask, mask, "token-mean")

    def build_rehearsal_set(self) -> Rollout | None:
        """DPH-RL's rehearsal set: π_0's samples of the training prompts it always solves, with π_0's
        log-probs. Built from the initial weights at start-up (also on ``--resume``: before the checkpoint
        is loaded), from seeds of the config, so it is the same every time and need not be stored."""
        cfg = self.cfg
        if cfg.algo.rehearsal_divergence is None:
            return None
        params = variant_params(cfg.algo, "dph_rl")
        examples = self.task.sample_batch("train", params.rehearsal_prompts,
                                          np.random.default_rng(derive_seed(cfg.trainer.seed, 17)))
        sampling = SamplingParams(cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_new_tokens)
        rollout = self.policy.rollout(examples, params.samples_per_prompt, sampling, derive_seed(cfg.trainer.seed, 18))
        success = torch.tensor([r.score >= params.success_threshold for r in self.verify(rollout, examples)])
        failures = torch.zeros(len(examples)).index_add_(0, rollout.example_index, (~success).float())
        always_solved = (failures == 0)[rollout.example_index]
        return rollout.select(always_solved.nonzero().squeeze(1))

    def loss_terms(self, rows: Rollout, logp_old: Tensor, adv: Tensor, returns: Tensor | None,
                   reference: PolicyOutput | None, denominators: dict,
                   term_rows: LossTermRows | None = None) -> dict[str, Any]:
        a, device = self.cfg.algo, self.engine.device
        mask, logp_old, adv = rows.mask.to(device), logp_old.to(device), adv.to(device)
        with self.engine.autocast():
            out = self.model(rows, with_entropy=True)
        logp = out.logp.float()
        pg, metrics = POLICY_LOSSES.get(a.policy_loss)(logp, logp_old, adv, mask, a)
        if a.tis_cap is not None:
            pg = pg * truncated_is_weights(logp_old, rows.logp.to(device), a.tis_cap)
        loss_pg = aggregate(pg, mask, a.loss_agg, **denominators)
        total = loss_pg
        terms: dict[str, Any] = {"loss/policy": loss_pg.item()}
        for name in a.loss_terms:  # extra per-token terms (CalibRL), aggregated like the policy loss
            if term_rows is None:
                raise ValueError(f"algo.loss_terms {list(a.loss_terms)}: the update was given no LossTermRows")
            per_token, term_metrics = LOSS_TERMS.get(name)(LossTermInputs(logp, logp_old, adv, mask, term_rows), a)
            value = aggregate(per_token, mask, a.loss_agg, **denominators)
            total = total + value
            terms |= {f"loss/{name}": value.item(), **{k: float(v) for k, v in term_metrics.items()}}
        if reference is not None:
            if a.kl_estimator in GAUSSIAN_KL_ESTIMATORS:  # closed form from the decisions' means (Flow-GRPO)
                ref = PolicyOutput(logp=reference.logp.to(device), mean=reference.mean.to(device),
                                   std=reference.std.to(device))
                kl = GAUSSIAN_KL_ESTIMATORS.get(a.kl_estimator)(out, ref)
            else:
                kl = kl_penalty(logp, reference.logp.to(device), a.kl_estimator)
            loss_kl = aggregate(kl, mask, a.loss_agg, **denominators)
            total = total + a.kl_coef * loss_kl
            terms |= {"loss/kl": loss_kl.item(), "policy/kl_ref": float((kl.detach() * mask).sum() / mask.sum().clamp(min=1))}
            if a.bc_coef > 0:  # VLA-RFT's drift-gated BC term, weighted so a minibatch adds it once
                gate = drift_gate(terms["policy/kl_ref"], a.bc_kl_threshold)
                terms["policy/bc_gate"] = gate
                if gate > 0:
                    loss_bc = self.bc_loss()
                    total = total + a.bc_coef * gate * loss_bc * (rows.num_rows / denominators["num_seqs"])
                    terms["loss/bc"] = loss_bc.item()
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
        terms["loss/total_tensor"] = total
        return terms

    def bc_loss(self) -> Tensor:
        """The policy's supervised loss on ``algo.bc_batch_size`` of the warm start's own examples and
        reference outputs (no new data: for robot tasks no new real-simulator step), drawn with a seed of
        the step and the policy version (the same after ``--resume``)."""
        rng = np.random.default_rng(derive_seed(self.cfg.trainer.seed, self.step, self.policy.version, 23))
        examples = [self.bc_pool[i] for i in rng.choice(len(self.bc_pool), self.cfg.algo.bc_batch_size)]
        with self.engine.autocast():
            return self.policy.sft_loss(examples, [self.task.reference_output(e) for e in examples]).float()

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

    # ------------------------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Mean verifiable reward (``eval/reward_mean``) and the task's metrics on held-out data;
        the same for each of ``eval.extra_splits``, logged as ``eval/<split>/<metric>``."""
        metrics = self.evaluate_split(self.eval_examples, 0)
        for i, (split, examples) in enumerate(self.extra_eval_examples.items()):
            metrics |= {f"eval/{split}/{key.removeprefix('eval/')}": value
                        for key, value in self.evaluate_split(examples, i + 1).items()}
        return metrics

    @torch.no_grad()
    def evaluate_split(self, all_examples: list[Any], index: int) -> dict[str, float]:
        """Greedy (``eval.temperature``) metrics on one split; ``index`` 0 is ``eval.split``."""
        cfg, eng = self.cfg, self.engine
        examples = all_examples[eng.rank::eng.world_size]
        sampling = SamplingParams(cfg.eval.temperature, 1.0, cfg.rollout.max_new_tokens)
        seed = derive_seed(cfg.eval.seed, self.step, eng.rank) if index == 0 else \
            derive_seed(cfg.eval.seed, self.step, eng.rank, 100 + index)
        rollout = self.policy.rollout(examples, 1, sampling, seed)
        results = self.verify(rollout, examples)
        n, total = len(results), eng.sum(len(results))
        metrics = rollout_metrics(self.task, examples, rollout, results)
        if cfg.eval.pass_k and index == 0:
            metrics |= self.pass_at_k(examples)
        return {f"eval/{k}": eng.sum(v * n) / total for k, v in metrics.items()}

    def pass_at_k(self, examples: list[Any]) -> dict[str, float]:
        """``pass@k``: share of examples with a sample scoring ≥ ``eval.pass_threshold`` among k drawn at
        ``eval.pass_temperature`` (Chen et al. 2021, with n = k samples); ``mean@k``: their mean score."""
        e = self.cfg.eval
        sampling = SamplingParams(e.pass_temperature, 1.0, self.cfg.rollout.max_new_tokens)
        rollout = self.policy.rollout(examples, e.pass_k, sampling, derive_seed(e.seed, self.step, self.engine.rank, 1))
        scores = torch.tensor([r.score for r in self.verify(rollout, examples)], dtype=torch.float64)
        return {f"pass@{e.pass_k}": pass_at_k(scores, rollout.example_index, len(examples), e.pass_threshold),
                f"mean@{e.pass_k}": float(scores.mean())}

    # ------------------------------------------------------------------------------------------
    def save_checkpoint(self) -> None:
        final = ckpt.checkpoint_dir(self.out, self.step)
        tmp = final.with_name(f".{final.name}.tmp")
        if self.engine.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        self.engine.wait()
        self.engine.accelerator.save_state(str(tmp))
        self.engine.wait()  # every process has written its RNG state into tmp before it is renamed
        if self.engine.is_main:
            self.policy.save_pretrained(str(tmp / "policy"))
            state = {"step": self.step, "policy_version": self.policy.version,
                     "skipped_updates": self.skipped_updates, "data_rng": self.data_rng.bit_generator.state,
                     "config_fingerprint": ckpt.config_fingerprint(self.cfg),
                     "prompt_history": self.history.state_dict(),
                     "prompt_temperatures": self.prompt_temperatures.state_dict()}
            ckpt.finalize(tmp, final, state, self.cfg.checkpoint.keep_last)
        self.engine.wait()

    def load_checkpoint(self) -> None:
        path = ckpt.latest_checkpoint(self.out)
        if path is None:
            raise FileNotFoundError(f"--resume {self.out}: no checkpoint in {self.out / 'checkpoints'}")
        state = ckpt.read_state(path)
        if state["config_fingerprint"] != ckpt.config_fingerprint(self.cfg):
            raise ConfigError(f"{path} was written with a different config (only "
                              f"{sorted('.'.join(k) for k in ckpt.resumable_changes(self.cfg))} may change on resume); "
                              f"compare with {self.out / 'config.yaml'}")
        self.engine.accelerator.load_state(str(path))
        self.step, self.skipped_updates = state["step"], state["skipped_updates"]
        self.policy.version = state["policy_version"]
        self.data_rng.bit_generator.state = state["data_rng"]
        self.history.load_state_dict(state["prompt_history"])
        # checkpoints written before per-prompt temperatures existed hold none: every prompt at T_0
        self.prompt_temperatures.load_state_dict(state.get("prompt_temperatures", {}))
        if self.engine.is_main:
            truncate_metrics(self.out, self.step)
            dump_config(self.cfg, self.out / "config.yaml")


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
