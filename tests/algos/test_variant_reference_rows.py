"""ViSurf reference rows (``rollout.reference_rows``): the causal LM scores given outputs exactly as it scores
its own samples, and the trainer's groups hold the task's reference answer next to the sampled ones."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from mmrl.core.config import ConfigError, load_config
from mmrl.core.rollout import SamplingParams
from mmrl.core.trainer import Trainer

OVERRIDES = ["log.progress=false", "log.tensorboard=false", "trainer.steps=1", "eval.every=0", "eval.num_examples=8",
             "rollout.prompts_per_step=8", "rollout.group_size=4", "warm_start.sft_steps=20"]


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    cfg = load_config("sanity/tiny_cpu", [*OVERRIDES, "rollout.reference_rows=1"])
    return Trainer(cfg, tmp_path_factory.mktemp("run") / "run")


def test_given_outputs_are_scored_like_samples(trainer):
    examples = trainer.task.sample_batch("train", 3, __import__("numpy").random.default_rng(0))
    outputs = ["123", "9", "00000"]
    rows = trainer.policy.rollout_from_outputs(examples, outputs, SamplingParams(1.0, 1.0, 8))
    assert rows.outputs == outputs and rows.group_id.tolist() == [0, 1, 2]
    assert rows.mask.sum(1).tolist() == [4.0, 2.0, 6.0]  # the characters + EOS
    with torch.no_grad():
        assert_close(trainer.policy(rows).logp * rows.mask, rows.logp)  # ratio exactly 1 before any update
    assert torch.all(rows.logp[rows.mask > 0] < 0)
    with pytest.raises(ValueError, match="3 examples for 2 outputs"):
        trainer.policy.rollout_from_outputs(examples, outputs[:2], SamplingParams())


def test_each_group_holds_the_reference_answer(trainer):
    trainer.step = 1
    batch = trainer.collect()
    assert torch.bincount(batch.rollout.group_id).tolist() == [4] * 8
    for g, example in enumerate(batch.examples):
        rows = (batch.rollout.group_id == g).nonzero().squeeze(1).tolist()
        references = [i for i in rows if batch.rollout.outputs[i] == example.target]
        assert references and all(batch.outcome[i] == 1.0 for i in references)
    assert batch.stats["rollout/generated"] == 8 * 3  # the reference rows are not sampled
    adv, _, _ = trainer.advantages(batch)
    assert torch.isfinite(adv).all()


def test_reference_rows_must_leave_a_sampled_row(sanity_config):
    with pytest.raises(ConfigError, match="reference_rows must be in 0..group_size"):
        sanity_config("rollout.group_size=2", "rollout.reference_rows=2")
