"""The trainer on the sanity task: it learns (GRPO and PPO), logs the documented metrics, is
reproducible, and survives bad rewards and bad gradients without corrupting the weights."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from mmrl.core.checkpoint import drop_best_after, is_better
from mmrl.core.config import ConfigError, load_config
from mmrl.experiments.plotting import plot_run
from mmrl.core.registry import TASKS, register_task
from mmrl.tasks.sanity import ReverseConfig, ReverseTask
from mmrl.core.guards import TrainingDiverged
from mmrl.core.scored import finite_outcomes
from mmrl.core.trainer import Trainer, train

QUIET = ["log.progress=false", "log.tensorboard=false"]

REQUIRED = ["step", "reward/mean", "loss/policy", "policy/kl_ref", "policy/clip_frac", "policy/entropy", "perf/step_s"]
SHORT = ["trainer.steps=3", "eval.num_examples=16", "rollout.prompts_per_step=8", "rollout.group_size=4",
         "warm_start.sft_steps=20"]


def run(out, *overrides, recipe="sanity/tiny_cpu"):
    train(load_config(recipe, [*QUIET, *overrides]), out)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def held_out_gain(rows):
    evals = [r["eval/reward_mean"] for r in rows if "eval/reward_mean" in r]
    return evals[0], evals[-1]


# -- learning ------------------------------------------------------------------------------------
@pytest.mark.parametrize("recipe", ["sanity/tiny_cpu", "sanity/ppo_tiny_cpu"])
def test_short_learning_check(tmp_path, recipe):
    """GRPO and PPO each raise the held-out reward of the warm start within ~60 steps."""
    rows = run(tmp_path / "run", "trainer.steps=60", "eval.every=0", "checkpoint.every=0", recipe=recipe)
    before, after = held_out_gain(rows)
    assert after >= before + 0.05, (before, after)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["sanity/tiny_cpu", "sanity/ppo_tiny_cpu"])
def test_full_recipe_learns(tmp_path, recipe):
    rows = run(tmp_path / "run", recipe=recipe)
    before, after = held_out_gain(rows)
    assert after >= before + 0.10, (before, after)
    train_rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
    assert np.mean(train_rewards[-10:]) > np.mean(train_rewards[:10]) + 0.05


# -- outputs -------------------------------------------------------------------------------------
def test_run_outputs_and_metric_contract(tmp_path):
    out = tmp_path / "run"
    rows = run(out, *SHORT, "eval.every=2", "checkpoint.every=2")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert set(rows[0]) == {"step", "perf/threads", "eval/reward_mean", "eval/exact_match", "eval/position_acc"}
    for row in rows[1:]:
        missing = [k for k in REQUIRED if k not in row]
        assert not missing, missing
        assert row["perf/step_s"] > 0 and 0 <= row["policy/clip_frac"] <= 1
    assert "eval/reward_mean" in rows[2] and "eval/reward_mean" in rows[3] and "eval/reward_mean" not in rows[1]
    assert (out / "config.yaml").is_file() and load_config(str(out / "config.yaml")) == load_config(
        "sanity/tiny_cpu", [*QUIET, *SHORT, "eval.every=2", "checkpoint.every=2"])
    assert sorted(p.name for p in (out / "checkpoints").glob("step_*")) == ["step_2", "step_3"]
    png = plot_run(out)
    assert png == out / "curves.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_extra_eval_splits_are_logged_under_their_names(tmp_path):
    """eval.extra_splits: each split evaluated at the same times as eval.split, as eval/<split>/<metric>;
    evaluating the main split again as an extra one gives the same examples and numbers."""
    rows = run(tmp_path / "run", *SHORT, "eval.extra_splits=[train, test]")
    assert set(rows[0]) == {"step", "perf/threads", "eval/reward_mean", "eval/exact_match", "eval/position_acc",
                            "eval/train/reward_mean", "eval/train/exact_match", "eval/train/position_acc",
                            "eval/test/reward_mean", "eval/test/exact_match", "eval/test/position_acc"}
    for row in (rows[0], rows[-1]):
        assert row["eval/test/reward_mean"] == row["eval/reward_mean"]  # greedy: same examples, same outputs
    assert "eval/train/reward_mean" not in rows[1]


def test_seeded_runs_are_identical(tmp_path):
    a = run(tmp_path / "a", *SHORT)
    b = run(tmp_path / "b", *SHORT)
    strip = [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in a]
    assert strip == [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in b]
    c = run(tmp_path / "c", *SHORT, "trainer.seed=1")
    assert c[1]["reward/mean"] != a[1]["reward/mean"]



# -- the best checkpoint (checkpoint.best_metric) --------------------------------------------------
BEST = [*SHORT, "trainer.steps=4", "eval.every=1", "checkpoint.every=1", "checkpoint.keep_last=0"]


def best_record(out):
    return json.loads((out / "checkpoints" / "best" / "best.json").read_text())


@pytest.mark.parametrize("mode", ["max", "min"])
def test_best_checkpoint_is_the_first_best_evaluation(tmp_path, mode):
    """checkpoints/best holds the policy of the first evaluation with the best value (the warm start's at step 0
    included), byte for byte that step's checkpointed policy, with the run's config and best.json."""
    out = tmp_path / "run"
    rows = run(out, *BEST, "checkpoint.best_metric=eval/reward_mean", f"checkpoint.best_mode={mode}")
    values = [(r["eval/reward_mean"], r["step"]) for r in rows if "eval/reward_mean" in r]
    assert len(values) == 5 and len({v for v, _ in values}) > 1  # the choice is not trivial
    pick = max if mode == "max" else min
    best = pick(v for v, _ in values)
    step = min(s for v, s in values if v == best)
    assert best_record(out) == {"step": step, "metric": "eval/reward_mean", "value": best}
    folder = out / "checkpoints" / "best"
    assert load_config(str(folder / "config.yaml")) == load_config(str(out / "config.yaml"))
    if step > 0:
        saved = out / "checkpoints" / f"step_{step}" / "policy"
        names = sorted(p.name for p in saved.iterdir())
        assert names and sorted(p.name for p in folder.iterdir()) == sorted([*names, "config.yaml", "best.json"])
        assert all((saved / n).read_bytes() == (folder / n).read_bytes() for n in names)
    if mode == "max":
        assert step > 0  # the sanity task learns within 4 steps: RL beat its warm start here


def test_best_checkpoint_survives_resume(tmp_path):
    """A run stopped at step 2 and resumed to step 4 keeps the same best as one run straight to 4 (the best so
    far travels in the checkpoint; a best written after the checkpoint resumed from is dropped and replayed)."""
    straight = tmp_path / "straight"
    run(straight, *BEST, "checkpoint.best_metric=eval/reward_mean")
    parted = tmp_path / "parted"
    run(parted, *BEST, "trainer.steps=2", "checkpoint.best_metric=eval/reward_mean")
    cfg = load_config("sanity/tiny_cpu", [*QUIET, *BEST, "checkpoint.best_metric=eval/reward_mean"])
    Trainer(cfg, parted, resume=True).train()
    assert best_record(parted) == best_record(straight)
    switched = tmp_path / "switched"  # a resume may change the metric: the best starts anew from the next evaluation
    run(switched, *BEST, "trainer.steps=2", "checkpoint.best_metric=eval/reward_mean")
    Trainer(load_config("sanity/tiny_cpu", [*QUIET, *BEST, "checkpoint.best_metric=eval/exact_match",
                                            "checkpoint.best_mode=min"]), switched, resume=True).train()
    assert best_record(switched)["metric"] == "eval/exact_match" and best_record(switched)["step"] == 3


def test_a_later_best_is_dropped_on_resume_from_an_earlier_step(tmp_path):
    folder = tmp_path / "checkpoints" / "best"
    folder.mkdir(parents=True)
    (folder / "best.json").write_text(json.dumps({"step": 6, "metric": "eval/x", "value": 1.0}))
    drop_best_after(tmp_path, 6)
    assert folder.is_dir()  # written at the step resumed from: kept
    drop_best_after(tmp_path, 4)
    assert not folder.exists()
    assert is_better(0.5, None, "max") and is_better(0.6, 0.5, "max") and not is_better(0.5, 0.5, "max")
    assert is_better(0.4, 0.5, "min") and not is_better(0.5, 0.5, "min")


def test_best_metric_the_evaluation_does_not_log_fails_early(tmp_path):
    """A split the run does not evaluate fails before the warm start; any other unlogged metric at step 0,
    naming the metrics logged."""
    with pytest.raises(ConfigError, match=r"reads split 'train', which the run does not evaluate: add it to "
                                          r"eval.extra_splits"):
        Trainer(load_config("sanity/tiny_cpu", [*QUIET, *SHORT, "checkpoint.best_metric=eval/train/reward_mean"]),
                tmp_path / "early")
    assert not (tmp_path / "early" / "config.yaml").exists()  # stopped before the warm start and the config dump
    with pytest.raises(ConfigError, match="eval.extra_splits") as err:
        run(tmp_path / "run", *SHORT, "checkpoint.best_metric=eval/val/reward_mean")  # no split "val" here
    assert "eval/reward_mean" in str(err.value)
    with pytest.raises(ConfigError, match="checkpoint.best_metric must be an evaluation metric"):
        load_config("sanity/tiny_cpu", ["checkpoint.best_metric=reward/mean"])

# -- robustness ----------------------------------------------------------------------------------
class NanOnSomeOutputs(ReverseTask):
    """A broken verifier: NaN for outputs that do not start with an odd digit."""

    def reward(self, example, output):
        result = super().reward(example, output)
        return result if output[:1] in tuple("13579") else type(result)(float("nan"), result.components)


class HugeRewards(ReverseTask):
    """Rewards near the float32 maximum: the loss's gradient overflows to inf."""

    def reward(self, example, output):
        result = super().reward(example, output)
        return type(result)(3e38 * result.score, result.components)


for task_id, cls in (("testing/nan_reverse-v0", NanOnSomeOutputs), ("testing/huge_reverse-v0", HugeRewards)):
    if task_id not in TASKS:
        register_task(task_id, cls, ReverseConfig)


def test_nan_rewards_are_replaced_counted_and_said_once(tmp_path, capsys):
    """A verifier that returns NaN for some outputs does not stop learning: those rows get their group's
    finite mean (no signal), the rest of the step trains, the count is logged and said once."""
    rows = run(tmp_path / "run", *SHORT, "task.name=testing/nan_reverse-v0")
    steps = rows[1:]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert all(math.isfinite(r["loss/policy"]) and math.isfinite(r["reward/mean"]) for r in steps)
    assert sum(r["train/nonfinite_rewards"] for r in steps) > 0 and all(r["policy/version"] > 0 for r in steps)
    assert capsys.readouterr().err.count("non-finite rewards") == 1
    assert rows[-1]["eval/reward_mean"] is None  # the held-out mean is NaN too: logged as null


def test_finite_outcomes_replace_by_the_group_mean():
    outcome = torch.tensor([1.0, float("nan"), 0.0, float("inf"), float("nan"), float("nan")])
    fixed, bad = finite_outcomes(outcome, torch.tensor([0, 0, 0, 1, 1, 2]))
    assert bad == 4 and torch.equal(fixed, torch.tensor([1.0, 0.5, 0.0, 0.0, 0.0, 0.0]))


def test_nonfinite_gradient_skips_the_update(tmp_path):
    cfg = load_config("sanity/tiny_cpu", [*QUIET, *SHORT, "task.name=testing/huge_reverse-v0", "algo.advantage=returns",
                                          "algo.whiten_advantages=false", "trainer.ppo_epochs=1", "trainer.minibatches=1",
                                          "trainer.grad_clip=1e30", "trainer.max_skipped_frac=1"])
    trainer = Trainer(cfg, tmp_path / "run")
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    trainer.train()
    assert trainer.guard.skipped_updates == 3 and trainer.policy.version == 0
    assert all(torch.equal(before[k], v) for k, v in trainer.policy.state_dict().items())


def test_a_run_that_skips_most_updates_stops_with_an_error(tmp_path):
    cfg = load_config("sanity/tiny_cpu", [*QUIET, *SHORT, "task.name=testing/huge_reverse-v0", "algo.advantage=returns",
                                          "algo.whiten_advantages=false", "trainer.ppo_epochs=1", "trainer.minibatches=1",
                                          "trainer.grad_clip=1e30", "trainer.steps=10"])
    with pytest.raises(TrainingDiverged, match="4 of 4 updates were skipped"):
        train(cfg, tmp_path / "run")
    assert [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][-1] == 4


def test_nonfinite_logprobs_are_counted_and_their_update_skipped(tmp_path, monkeypatch, capsys):
    """A forward pass that diverges (NaN log-probs for one row) is counted, said once, and its update skipped."""
    cfg = load_config("sanity/tiny_cpu", [*QUIET, *SHORT, "trainer.ppo_epochs=1", "trainer.minibatches=1",
                                          "trainer.max_skipped_frac=1"])
    trainer = Trainer(cfg, tmp_path / "run")
    forward = type(trainer.policy).forward

    def diverged(self, rows, **kwargs):
        out = forward(self, rows, **kwargs)
        if torch.is_grad_enabled():  # the update's forward, not sampling or re-scoring
            out.logp[0, 0] = float("nan")
        return out

    monkeypatch.setattr(type(trainer.policy), "forward", diverged)
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][1:]
    assert all(r["train/nonfinite_logp"] == 1 for r in rows)
    assert trainer.guard.skipped_updates == 3 and trainer.policy.version == 0
    assert capsys.readouterr().err.count("non-finite token log-probs") == 1


# -- update invariances --------------------------------------------------------------------------
def one_update(out, *overrides):
    cfg = load_config("sanity/tiny_cpu", [*QUIET, *SHORT, "trainer.steps=1", "eval.num_examples=4",
                                          "trainer.ppo_epochs=1", "trainer.minibatches=2", *overrides])
    trainer = Trainer(cfg, out)
    trainer.train()
    return trainer.policy.state_dict()


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_update_does_not_depend_on_micro_batch_size(tmp_path, agg):
    whole = one_update(tmp_path / "a", f"algo.loss_agg={agg}", "trainer.micro_batch_size=64")
    split = one_update(tmp_path / "b", f"algo.loss_agg={agg}", "trainer.micro_batch_size=3")
    for key in whole:
        torch.testing.assert_close(split[key], whole[key], atol=2e-6, rtol=1e-5)


def test_dynamic_sampling_keeps_informative_groups(tmp_path):
    overrides = [*QUIET, *SHORT, "rollout.temperature=0.3", "rollout.prompts_per_step=16"]
    plain = Trainer(load_config("sanity/tiny_cpu", overrides), tmp_path / "a")
    plain.step = 1
    base = plain.collect()
    dynamic = Trainer(load_config("sanity/tiny_cpu", [*overrides, "algo.dynamic_sampling=true",
                                                      "algo.max_gen_rounds=4"]), tmp_path / "b")
    dynamic.step = 1
    batch = dynamic.collect()

    def informative(b):
        from mmrl.algos import groups_with_signal

        return int(groups_with_signal(b.outcome, b.rollout.group_id).sum()) // 4

    assert len(batch.examples) == 16 and batch.rollout.num_rows == 64  # the batch is refilled to size
    assert informative(base) < 16  # at τ = 0.3 some groups agree on everything
    assert informative(batch) > informative(base)
    assert batch.stats["rollout/gen_rounds"] > 1 and batch.stats["rollout/dropped_groups"] >= 16 - informative(base)
    assert math.isclose(batch.stats["reward/mean"], float(batch.outcome.mean()), rel_tol=1e-6)


def test_lora_with_the_adapter_free_base_as_reference(tmp_path):
    rows = run(tmp_path / "run", *SHORT, "warm_start.sft_steps=0", "policy.args.lora_rank=4",
               "trainer.ref_model=adapter_disabled", "algo.kl_coef=0.05", "trainer.lr=1e-2")
    kl = [r["policy/kl_ref"] for r in rows[1:]]
    assert all(k is not None and k >= 0 for k in kl) and kl[-1] > 0  # the adapters moved away from the base


def test_adapter_reference_without_adapters_fails_early(tmp_path):
    cfg = load_config("sanity/tiny_cpu", [*QUIET, *SHORT, "warm_start.sft_steps=0", "trainer.ref_model=adapter_disabled"])
    with pytest.raises(TypeError, match="has no adapters"):
        Trainer(cfg, tmp_path / "run")


def test_recomputed_old_logprobs_and_truncated_is(tmp_path):
    rows = run(tmp_path / "run", *SHORT, "trainer.recompute_logp_old=true", "algo.tis_cap=2.0")
    # HF sampling and the trainer's forward share weights: the behaviour/old mismatch is rounding only.
    assert all(r["rollout/logp_diff"] < 1e-5 for r in rows[1:])


def test_overlong_shaping_is_logged_apart_from_the_verifiable_reward(tmp_path):
    rows = run(tmp_path / "run", *SHORT, "algo.overlong_max_len=4", "algo.overlong_buffer=2")
    for r in rows[1:]:
        assert r["reward/shaped_mean"] < r["reward/mean"]  # answers of 4-5 tokens (+EOS) are penalised


@pytest.mark.parametrize("overrides", [
    ["algo.advantage=rloo", "algo.policy_loss=gspo", "algo.clip_low=3e-4", "algo.clip_high=4e-4",
     "algo.loss_agg=seq-mean-token-mean"],
    ["algo.advantage=reinforce_pp", "algo.kl_in_reward_coef=0.01", "algo.policy_loss=gspo_token"],
    ["algo.advantage=grpo", "algo.norm_adv_by_std=false", "algo.loss_agg=seq-mean-token-sum-norm",
     "algo.kl_coef=0.05", "algo.kl_estimator=k2"],
    ["algo.advantage=returns", "algo.policy_loss=reinforce", "trainer.ppo_epochs=1", "algo.kl_coef=0.05",
     "algo.kl_estimator=k1", "algo.entropy_coef=0.01", "algo.shaping=[adv_clip]", "algo.adv_clip=1.0"],
    ["algo.dual_clip_c=3", "algo.loss_agg=seq-mean-token-sum", "algo.kl_coef=0.05", "algo.kl_estimator=k3",
     "trainer.lr_schedule=cosine", "trainer.warmup_steps=2"],
], ids=["rloo-gspo", "reinforcepp-gspotoken", "drgrpo", "reinforce", "dualclip-cosine"])
def test_every_registered_axis_runs_through_the_trainer(tmp_path, overrides):
    rows = run(tmp_path / "run", *SHORT, *overrides)
    for row in rows[1:]:
        assert math.isfinite(row["loss/policy"]) and math.isfinite(row["policy/grad_norm"])
        assert row["train/skipped_updates"] == 0
    assert rows[-1]["policy/version"] > 0


def test_tensorboard_events_are_written(tmp_path):
    out = tmp_path / "run"
    train(load_config("sanity/tiny_cpu", ["log.progress=false", *SHORT]), out)
    assert list((out / "tb").glob("events.out.tfevents.*"))
