"""Variants that score given outputs (ViSurf's reference rows, CalibRL's expert) run on the VLM policy."""

from __future__ import annotations

import json
import math

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
