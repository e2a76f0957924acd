"""The one training loop: rollout → reward → advantage → shaping → PPO epochs → log → eval → checkpoint.

Every domain runs through :meth:`Trainer.train`. What differs between domains lives in the task
(examples, reward) and the policy (sampling, re-scoring); what differs between algorithms lives in
the registered functions of :mod:`mmrl.algos`, chosen by ``cfg.algo``.
"""

from __future__ import annotations

import copy
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
from mmrl.algos import (ADVANTAGE_ESTIMATORS, POLICY_LOSSES, SHAPING_HOOKS, AdvantageInputs, ShapingContext,
                        aggregate, groups_with_signal, kl_penalty, overlong_penalty, truncated_is_weights,
                        value_loss)
from mmrl.config import ConfigError, TrainConfig, dump_config
from mmrl.contracts import Policy, RewardResult
from mmrl.engine import Engine
from mmrl.logging import RunLogger, truncate_metrics
from mmrl.registry import make_task
from mmrl.rollout import Rollout, SamplingParams
from mmrl.warm_start import build_initial_policy


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


def prepare_out_dir(out: Path, resume: bool, overwrite: bool) -> None:
    """Refuse to clobber a previous run: ``--resume`` continues it, ``--overwrite`` replaces it."""
    if resume:
        if not (out / "config.yaml").is_file():
            raise FileNotFoundError(f"--resume {out}: no run there (config.yaml missing)")
        return
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out} already holds files; pass --resume to continue that run or "
                                  f"--overwrite to replace it")
        if not (out / "config.yaml").is_file():
            raise FileExistsError(f"refusing to --overwrite {out}: it holds files but is not an mmrl run "
                                  f"folder (no config.yaml)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


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
        self.eval_examples = self.task.sample_batch(cfg.eval.split, cfg.eval.num_examples,
                                                    np.random.default_rng(cfg.eval.seed))
        self.step, self.skipped_updates = 0, 0
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
                advantages, returns, ref_logp = self.advantages(batch)
                row |= self.update(batch.rollout, advantages, returns, ref_logp)
            row |= {"perf/rollout_s": rollout_s, "perf/step_s": time.perf_counter() - start,
                    "perf/decisions_per_s": self.engine.sum(batch.rollout.mask.sum()) / max(rollout_s, 1e-9)}
            if self.step == cfg.trainer.steps or (cfg.eval.every and self.step % cfg.eval.every == 0):
                row |= self.evaluate()
            self.logger.log(row)
            if self.step == cfg.trainer.steps or (cfg.checkpoint.every and self.step % cfg.checkpoint.every == 0):
                self.save_checkpoint()
        self.logger.close()
        self.engine.end()

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
        rounds = n_dropped = 0
        while True:
            examples = self.task.sample_batch("train", cfg.rollout.prompts_per_step, self.data_rng)
            examples = examples[eng.rank::eng.world_size]
            seed = derive_seed(cfg.trainer.seed, self.step, rounds, eng.rank)
            rollout = self.policy.rollout(examples, cfg.rollout.group_size, sampling, seed)
            part = self.score(rollout, examples)
            rounds += 1
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
        batch.stats = (self.reward_stats(batch) | sampling_stats
                       | {"rollout/len_mean": eng.mean(batch.rollout.lengths.float().mean())})
        return batch

    def verify(self, rollout: Rollout, examples: list[Any]) -> list[RewardResult]:
        results = []
        for i, output in zip(rollout.example_index.tolist(), rollout.outputs):
            try:
                results.append(self.task.reward(examples[i], output))
            except Exception as err:  # a reward must be total; say which task and output broke it
                raise RuntimeError(f"{self.cfg.task.name}.reward raised on output {output!r}: {err}") from err
        return results

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
    def advantages(self, batch: Batch) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Estimator then shaping hooks; also the reference log-probs (for KL) when kept."""
        a, rollout = self.cfg.algo, batch.rollout
        ref_logp = self.reference_logp(rollout)
        kl = (rollout.logp - ref_logp) * rollout.mask if ref_logp is not None else None
        inputs = AdvantageInputs(rewards=batch.rewards, mask=rollout.mask, group_id=rollout.group_id,
                                 step_rewards=rollout.step_rewards, values=rollout.values, dones=rollout.dones, kl=kl)
        advantages, returns = ADVANTAGE_ESTIMATORS.get(a.advantage)(inputs, a)
        ctx = ShapingContext(outcome=batch.outcome, rewards=batch.rewards, group_id=rollout.group_id,
                             mask=rollout.mask, logp_old=rollout.logp, ref_logp=ref_logp, entropy=None)
        for hook in a.shaping:
            advantages = SHAPING_HOOKS.get(hook)(advantages, ctx, a)
        return advantages, returns, ref_logp

    def reference_logp(self, rollout: Rollout) -> Tensor | None:
        mode = self.cfg.trainer.ref_model
        if mode == "copy":
            return self.forward_no_grad(self.ref, rollout)
        if mode == "adapter_disabled":
            with self.policy.adapter_disabled():
                return self.forward_no_grad(self.policy, rollout)
        return None

    @torch.no_grad()
    def forward_no_grad(self, model: Policy, rollout: Rollout) -> Tensor:
        size = self.cfg.trainer.micro_batch_size
        parts = []
        for start in range(0, rollout.num_rows, size):
            rows = rollout.select(torch.arange(start, min(start + size, rollout.num_rows)))
            with self.engine.autocast():
                parts.append(model(rows).logp.float().cpu())
        t_max = rollout.mask.shape[1]
        return torch.cat([torch.nn.functional.pad(p, (0, t_max - p.shape[1])) for p in parts]) * rollout.mask

    def update(self, rollout: Rollout, advantages: Tensor, returns: Tensor | None,
               ref_logp: Tensor | None) -> dict[str, float]:
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
                micro = rows.split(cfg.trainer.micro_batch_size)
                for i, idx in enumerate(micro):
                    with eng.no_sync(self.model, skip_sync=i < len(micro) - 1):
                        terms = self.loss_terms(rollout.select(idx), logp_old[idx], advantages[idx],
                                                None if returns is None else returns[idx],
                                                None if ref_logp is None else ref_logp[idx], denominators)
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
        if ref_logp is None:
            metrics["policy/kl_ref"] = None
        return metrics | extra | {"train/lr": self.scheduler.get_last_lr()[0],
                                  "train/skipped_updates": self.skipped_updates, "policy/version": self.policy.version}

    def loss_terms(self, rows: Rollout, logp_old: Tensor, adv: Tensor, returns: Tensor | None,
                   ref_logp: Tensor | None, denominators: dict) -> dict[str, Any]:
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
        if ref_logp is not None:
            kl = kl_penalty(logp, ref_logp.to(device), a.kl_estimator)
            loss_kl = aggregate(kl, mask, a.loss_agg, **denominators)
            total = total + a.kl_coef * loss_kl
            terms |= {"loss/kl": loss_kl.item(), "policy/kl_ref": float((kl.detach() * mask).sum() / mask.sum().clamp(min=1))}
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
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean verifiable reward (``eval/reward_mean``) and the task's metrics on held-out data."""
        cfg, eng = self.cfg, self.engine
        examples = self.eval_examples[eng.rank::eng.world_size]
        sampling = SamplingParams(cfg.eval.temperature, 1.0, cfg.rollout.max_new_tokens)
        rollout = self.policy.rollout(examples, 1, sampling, derive_seed(cfg.eval.seed, self.step, eng.rank))
        results = self.verify(rollout, examples)
        n, total = len(results), eng.sum(len(results))
        metrics = {"reward_mean": float(np.mean([r.score for r in results]))}
        metrics |= self.task.metrics([examples[i] for i in rollout.example_index.tolist()], rollout.outputs, results)
        return {f"eval/{k}": eng.sum(v * n) / total for k, v in metrics.items()}

    # ------------------------------------------------------------------------------------------
    def save_checkpoint(self) -> None:
        final = ckpt.checkpoint_dir(self.out, self.step)
        tmp = final.with_name(f".{final.name}.tmp")
        if self.engine.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        self.engine.wait()
        self.engine.accelerator.save_state(str(tmp))
        if self.engine.is_main:
            self.policy.save_pretrained(str(tmp / "policy"))
            state = {"step": self.step, "policy_version": self.policy.version,
                     "skipped_updates": self.skipped_updates, "data_rng": self.data_rng.bit_generator.state,
                     "config_fingerprint": ckpt.config_fingerprint(self.cfg)}
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
