"""DyME (``algo.dyme``): groups whose rollouts all failed are trained by SFT on their reference, once a step."""

from __future__ import annotations

import pytest
import torch

from mmrl.algos.hooks import UpdateIndex
from mmrl.core.trainer import Trainer


def test_all_failed_groups_switch_to_memorisation(sanity_config, tmp_path):
    cfg = sanity_config("algo.dyme=true", "algo.extra.dyme.fail_threshold=0.99", "algo.extra.dyme.coef=0.5",
                        "warm_start.sft_steps=15", "rollout.prompts_per_step=8", "trainer.minibatches=2",
                        "trainer.steps=1", "eval.every=0", "eval.num_examples=8")
    trainer = Trainer(cfg, tmp_path / "run")
    (name, dyme), = [(n, h) for n, h in trainer.loss_hooks if n == "dyme"]
    batch = trainer.collect()
    dyme.prepare(batch)
    best = [max(float(batch.outcome[i]) for i in range(batch.rollout.num_rows) if batch.rollout.example_index[i] == g)
            for g in range(len(batch.examples))]
    failed = [batch.examples[g] for g, b in enumerate(best) if b <= 0.99]
    assert 0 < len(failed) < len(batch.examples)  # a mix: some groups explore, some memorise
    assert dyme.examples == failed
    loss, metrics = dyme.update_term(UpdateIndex(1, 0, 0))
    expected = trainer.policy.sft_loss(failed, [trainer.task.reference_output(e) for e in failed])
    assert torch.allclose(loss, 0.5 * expected) and metrics["loss/dyme_sft"] == pytest.approx(expected.item())
    assert dyme.update_term(UpdateIndex(1, 0, 1)) is None and dyme.update_term(UpdateIndex(1, 1, 0)) is None
    assert dyme.metrics()["rollout/dyme_memorised_frac"] == pytest.approx(len(failed) / len(batch.examples))
