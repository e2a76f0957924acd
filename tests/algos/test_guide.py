"""Guide (``algo.guide``): all-failed groups are drawn again with a hint and trained as answers to the
hint-free prompt with π_old(y | x, hint) as π_old."""

from __future__ import annotations

import json

import pytest
import torch

from mmrl.core.config import ConfigError, load_config
from mmrl.core.rollout import SamplingParams
from mmrl.core.trainer import Trainer

QUIET = ["log.progress=false", "log.tensorboard=false", "eval.every=0", "eval.num_examples=4"]


def rows_file(tmp_path, n: int = 16):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"problem": f"{a} plus {a}", "answer": str(2 * a), "hint": f"it is {2 * a}"})
                            + "\n" for a in range(n)))
    return path


def guided_trainer(tmp_path, *overrides: str) -> Trainer:
    cfg = load_config("data/text_tiny_cpu", [*QUIET, f"task.args.train_files={rows_file(tmp_path)}",
                                             f"task.args.test_files={rows_file(tmp_path)}", "algo.guide=true",
                                             "task.args.hint_template='{hint}. {prompt}'", "warm_start.sft_steps=0",
                                             "rollout.prompts_per_step=4", "rollout.group_size=4",
                                             "trainer.minibatches=1", "trainer.steps=1", *overrides])
    return Trainer(cfg, tmp_path / "run")


def test_failed_groups_are_redrawn_with_hints_and_trained_without_them(tmp_path):
    trainer = guided_trainer(tmp_path)
    batch = trainer.collect()  # an untrained policy: every group fails, every group is guided
    assert batch.stats["rollout/guided_groups"] == 4
    rollout, policy, task = batch.rollout, trainer.policy, trainer.task
    assert rollout.num_rows == 16 and sorted(rollout.group_id.tolist()) == sorted(list(range(4)) * 4)
    examples = [batch.examples[i] for i in rollout.example_index.tolist()]
    sampling = SamplingParams(trainer.cfg.rollout.temperature)
    plain = policy.rollout_from_outputs(examples, rollout.outputs, sampling)
    hinted = policy.rollout_from_outputs([task.hinted(e) for e in examples], rollout.outputs, sampling)
    # trained on the hint-free prompt ...
    assert torch.equal(rollout.payload.prompt_ids, plain.payload.prompt_ids)
    # ... with the behaviour policy's log-probs, which saw the hint: the ratio is π_θ(y|x) / π_old(y|x, hint)
    assert torch.allclose(rollout.logp, hinted.logp) and not torch.allclose(rollout.logp, plain.logp)
    assert torch.allclose(policy(rollout).logp * rollout.mask, plain.logp, atol=1e-6)


def test_groups_with_a_success_are_left_alone(tmp_path):
    trainer = guided_trainer(tmp_path, "algo.extra.guide.fail_threshold=-1.0")  # no group scores ≤ −1
    batch = trainer.collect()
    assert batch.stats["rollout/guided_groups"] == 0


def test_guide_needs_hints_and_keeps_its_behaviour_logprobs(tmp_path):
    with pytest.raises(ConfigError, match="hint_template"):
        cfg = load_config("data/text_tiny_cpu", [*QUIET, "algo.guide=true", "warm_start.sft_steps=0"])
        Trainer(cfg, tmp_path / "run")
    with pytest.raises(ConfigError, match="recompute_logp_old"):
        load_config("data/text_tiny_cpu", [*QUIET, "algo.guide=true", "trainer.recompute_logp_old=true"])


def test_guide_arm_on_the_hint_trained_recipe(tmp_path):
    """configs/data/guide_tiny_cpu.yaml with the sweep's ``guide`` arm: the warm start trains on hinted rows,
    and Guide redraws the failed groups with the same hints (a short warm start: most groups fail)."""
    from mmrl.core.logging import read_metrics
    from mmrl.core.trainer import train
    from mmrl.experiments.sweep import SWEEP_ARMS

    cfg = load_config("data/guide_tiny_cpu", [*QUIET, "warm_start.sft_steps=10",
                                              "trainer.steps=2", "checkpoint.every=0",
                                              *SWEEP_ARMS.get("guide").overrides])
    assert cfg.algo.guide and cfg.warm_start.hint_fraction == 0.5
    train(cfg, tmp_path / "run")
    rows = [r for r in read_metrics(tmp_path / "run") if r["step"] > 0]
    assert len(rows) == 2 and sum(r["rollout/guided_groups"] for r in rows) > 0
    assert all(r["train/skipped_updates"] == 0 for r in rows)
