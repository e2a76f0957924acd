"""Variants that score given outputs (ViSurf's reference rows, CalibRL's expert) run on the VLM policy."""

from __future__ import annotations

import json
import math

import numpy as np

from mmrl.core.config import load_config
from mmrl.core.trainer import Trainer

SMALL = ["trainer.steps=1", "warm_start.sft_steps=5", "warm_start.vision_steps=0", "rollout.prompts_per_step=4",
         "rollout.group_size=4", "trainer.minibatches=1", "eval.num_examples=4", "eval.every=0",
         "log.progress=false", "log.tensorboard=false"]


def test_reference_rows_join_each_group_on_the_vlm(tmp_path):
    cfg = load_config("vlm_sanity/tiny_cpu", [*SMALL, "rollout.reference_rows=1", "algo.loss_terms=[calibrl]"])
    trainer = Trainer(cfg, tmp_path / "run")
    batch = trainer.collect()
    rollout = batch.rollout
    assert rollout.num_rows == 4 * 4
    for g in range(4):
        rows = (rollout.group_id == g).nonzero().squeeze(1).tolist()
        reference = trainer.task.reference_output(batch.examples[g])
        assert len(rows) == 4 and sum(rollout.outputs[i] == reference for i in rows) >= 1
    assert batch.outcome[[i for i, o in enumerate(rollout.outputs)
                          if o == trainer.task.reference_output(batch.examples[int(rollout.example_index[i])])]].min() == 1
    trainer.train()
    last = [line for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][-1]
    assert '"loss/calibrl"' in last and math.isfinite(json.loads(last)["loss/total"])


def test_vlm_distributions_ssb_cipo_and_ebft_features_run_on_the_vlm(tmp_path):
    """SSB's whole next-token distributions agree with the VLM's token log-probs; CIPO's correction groups and
    EBFT's model-free features run through the VLM trainer."""
    import torch

    from mmrl.core.rollout import SamplingParams

    cfg = load_config("vlm_sanity/tiny_cpu", [*SMALL, "algo.cipo=true", "algo.ebft=true",
                                              "algo.extra.ebft={features: char_ngram}"])
    trainer = Trainer(cfg, tmp_path / "run")
    examples = trainer.task.sample_batch("train", 2, np.random.default_rng(0))
    outputs = [trainer.task.reference_output(e) for e in examples]
    policy = trainer.policy
    logp_all, mask = policy.completion_log_distributions(examples, outputs, 1.0)
    rows = policy.rollout_from_outputs(examples, outputs, SamplingParams(1.0))
    picked = logp_all.gather(-1, rows.payload.completion_ids[..., None]).squeeze(-1)
    assert torch.equal(mask, rows.mask)
    assert torch.allclose(torch.where(mask > 0, picked, torch.zeros_like(picked)), rows.logp, atol=1e-5)
    trainer.train()
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["rollout/cipo_prompts"] > 0 and math.isfinite(last["loss/total"]) and "rollout/ebft_reward" in last


def test_vlm_completion_features_ignore_padding_and_drive_ebft(tmp_path):
    """EBFT's default hidden-state features on the VLM: a row's feature does not depend on the rows padded
    beside it (outputs of different lengths), the features of different outputs differ, and EBFT trains with
    them."""
    import torch

    cfg = load_config("vlm_sanity/tiny_cpu", [*SMALL, "algo.ebft=true"])
    trainer = Trainer(cfg, tmp_path / "run")
    examples = trainer.task.sample_batch("train", 2, np.random.default_rng(0))
    outputs = [trainer.task.reference_output(examples[0]), trainer.task.reference_output(examples[1]) + " and more"]
    together = trainer.policy.completion_features(examples, outputs)
    alone = torch.cat([trainer.policy.completion_features([e], [o]) for e, o in zip(examples, outputs)])
    assert together.shape == (2, trainer.policy.model.config.get_text_config().hidden_size)
    assert not together.requires_grad
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-4)
    other = trainer.policy.completion_features(examples[:1], ["blue"])
    assert not torch.allclose(other, together[:1])
    trainer.train()
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert math.isfinite(last["loss/total"]) and "rollout/ebft_reward" in last
