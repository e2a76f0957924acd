"""The trainer's extension points for the paper variants, end to end on the sanity task: behaviour
entropy reaches the hooks, the per-prompt history is counted and checkpointed (resume is exact),
``rollout/generated`` and ``eval/pass@k`` are logged, and a variant learns."""

from __future__ import annotations

import json

import pytest
import torch

from mmrl.algos import SHAPING_HOOKS
from mmrl.core.config import load_config
from mmrl.core.trainer import Trainer, train

QUIET = ["log.progress=false", "log.tensorboard=false"]
SHORT = ["eval.num_examples=16", "rollout.prompts_per_step=8", "rollout.group_size=4", "warm_start.sft_steps=20",
         "eval.every=0"]
MSSR = ["rollout.group_size=1", "algo.advantage=beta_posterior", "algo.shaping=[entropy_bonus]",
        "algo.extra={beta_posterior: {count_group: false, count_history: true, normalize_std: false}}"]


def rows_of(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


def test_behaviour_entropy_and_history_reach_the_algorithms(tmp_path):
    cfg = load_config("sanity/tiny_cpu", [*QUIET, *SHORT, *MSSR, "trainer.steps=1"])
    trainer = Trainer(cfg, tmp_path / "run")
    assert trainer.needs == {"entropy", "prompt_history"}
    batch = trainer.collect()
    seen = {}
    hook = SHAPING_HOOKS.get("entropy_bonus")

    # the registered hook is a plain function: look at its inputs through the trainer's own call
    def spy(adv, ctx, algo_cfg):
        seen["entropy"] = ctx.entropy
        return hook(adv, ctx, algo_cfg)

    SHAPING_HOOKS._entries["entropy_bonus"] = spy
    try:
        adv, _, _ = trainer.advantages(batch)
    finally:
        SHAPING_HOOKS._entries["entropy_bonus"] = hook
    entropy = seen["entropy"]
    mask = batch.rollout.mask
    assert entropy is not None and entropy.shape == mask.shape
    assert torch.all(entropy[mask > 0] > 0) and torch.all(entropy[mask == 0] == 0)
    # first visit of every prompt: the history baseline is the prior mean 1/2, so A = r − 1/2 (+ bonus ≥ 0)
    assert torch.all(adv[:, 0] >= batch.outcome - 0.5 - 1e-6)
    assert len(dict(trainer.rollout_hooks)["prompt_history"].history) == len(set(e.digits for e in batch.examples))
    total = sum(s + f for s, f in dict(trainer.rollout_hooks)["prompt_history"].history.counts.values())
    assert total == pytest.approx(len(batch.outcome))


def test_history_is_checkpointed_and_resume_is_exact(tmp_path):
    full = strip(train_rows(tmp_path / "full", "trainer.steps=6"))
    out = tmp_path / "resumed"
    train_rows(out, "trainer.steps=3")
    state = json.loads((out / "checkpoints" / "step_3" / "trainer_state.json").read_text())
    assert len(state["hooks"]["prompt_history"]["prompt_history"]) > 0
    cfg = load_config("sanity/tiny_cpu", [*QUIET, *SHORT, *MSSR, "trainer.steps=6", "checkpoint.every=3",
                                          "eval.every=3"])
    Trainer(cfg, out, resume=True).train()
    assert strip(rows_of(out)) == full


def train_rows(out, *overrides):
    train(load_config("sanity/tiny_cpu", [*QUIET, *SHORT, *MSSR, "checkpoint.every=3", "eval.every=3", *overrides]),
          out)
    return rows_of(out)


def test_generated_rollouts_and_pass_at_k_are_logged(tmp_path):
    rows = [r for r in train_rows(tmp_path / "run", "trainer.steps=2", "eval.pass_k=4")]
    assert all(r["rollout/generated"] == 8 for r in rows[1:])  # 8 prompts × 1 rollout
    assert {"eval/pass@4", "eval/mean@4"} <= set(rows[0]) and {"eval/pass@4", "eval/mean@4"} <= set(rows[-1])
    assert 0 <= rows[-1]["eval/mean@4"] <= 1 and 0 <= rows[-1]["eval/pass@4"] <= 1


def test_a_variant_learns(tmp_path):
    """F-GRPO (focal scaling, γ = 1) raises the held-out reward of the warm start within 50 steps."""
    cfg = load_config("sanity/tiny_cpu", [*QUIET, "algo.shaping=[f_grpo]", "trainer.steps=50", "eval.every=0",
                                          "checkpoint.every=0"])
    train(cfg, tmp_path / "run")
    evals = [r["eval/reward_mean"] for r in rows_of(tmp_path / "run") if "eval/reward_mean" in r]
    assert evals[-1] >= evals[0] + 0.05, evals


@pytest.mark.parametrize("arm", ["w_reinforce", "nsr", "psr", "f_grpo", "ace", "rl_zvp", "divergence_weighted",
                                 "aero_beta", "aero", "psn", "visurf", "dph_rl", "mssr", "pacs", "frpo",
                                 "polychromic", "polychromic_vine", "rw_sft", "weighted_grpo", "seele", "ampo", "eapo",
                                 "fest", "ebft", "rorecomp", "rollout_bandit", "erpo_reactivate", "erpo_full"])
def test_every_variant_runs_through_the_trainer_from_a_recipe(tmp_path, arm):
    from mmrl.experiments.sweep import SWEEP_ARMS

    overrides = [*QUIET, "trainer.steps=2", "eval.every=0", "eval.num_examples=8", "warm_start.sft_steps=20",
                 *SWEEP_ARMS.get(arm).overrides]
    train(load_config("sanity/tiny_cpu", overrides), tmp_path / "run")
    rows = rows_of(tmp_path / "run")
    for row in rows[1:]:
        assert row["train/skipped_updates"] == 0 and row["policy/version"] > 0
        assert all(v is None or v == v for v in row.values())  # no NaN metric


# ssb / cipo write texts after the prompt: on the sanity task they must be digits and ">"; direct_opd needs a teacher
VOCABULARY_TEXTS = {"ssb": ["algo.extra.ssb={hint_template: '{correct}>{incorrect}>'}"],
                    "cipo": ["algo.extra.cipo={instruction: '>'}"]}


@pytest.mark.parametrize("arm", ["ssb", "cipo", "direct_opd"])
def test_distillation_arms_run_through_the_trainer(tmp_path, arm):
    from mmrl.experiments.sweep import SWEEP_ARMS

    overrides = [*QUIET, "trainer.steps=2", "eval.every=0", "eval.num_examples=8", "warm_start.sft_steps=20",
                 *SWEEP_ARMS.get(arm).overrides, *VOCABULARY_TEXTS.get(arm, [])]
    if arm == "direct_opd":  # a teacher: another short run of the same recipe
        train(load_config("sanity/tiny_cpu", [*QUIET, "trainer.steps=2", "eval.every=0", "eval.num_examples=8",
                                              "warm_start.sft_steps=20"]), tmp_path / "teacher")
        overrides.append(f"algo.extra.direct_opd={{teacher: {tmp_path / 'teacher/checkpoints/step_2/policy'}}}")
    train(load_config("sanity/tiny_cpu", overrides), tmp_path / "run")
    rows = rows_of(tmp_path / "run")
    for row in rows[1:]:
        assert row["train/skipped_updates"] == 0 and row["policy/version"] > 0
        assert all(v is None or v == v for v in row.values())  # no NaN metric
