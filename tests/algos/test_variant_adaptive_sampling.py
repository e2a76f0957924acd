"""Rollout strategies (mmrl/algos/variants/adaptive_sampling.py): AERO's rescue and selective rejection on
hand-built groups, and the trainer drawing / counting / training on what the strategy asks for."""

from __future__ import annotations

import json

import pytest
import torch

from mmrl.algos import AlgoConfig
from mmrl.algos.variants import ROLLOUT_STRATEGIES
from mmrl.algos.variants.adaptive_sampling import aero_rescue, aero_selective_rejection
from mmrl.core.config import ConfigError, load_config
from mmrl.core.trainer import Trainer

# example 0: all correct (4); 1: all wrong (4); 2: one success in 4; 3: one wrong sample; 4: 2 of 4
OUTCOME = torch.tensor([1.0, 1, 1, 1, 0, 0, 0.5, 0, 1, 0, 0, 0, 0.9, 1, 0, 1, 0])
INDEX = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 4, 4, 4, 4])


def cfg(**aero) -> AlgoConfig:
    return AlgoConfig(rollout_strategy="aero", extra={"aero": aero})


def test_rescue_asks_more_only_for_prompts_without_success_within_budget():
    more = aero_rescue(OUTCOME, INDEX, 5, cfg(rescue_rollouts=2, max_rollouts_per_prompt=5))
    # a partial score (0.5, 0.9) is not a success at threshold 1.0; example 1 has room for 1 more (4 → 5)
    assert more.tolist() == [0, 1, 0, 2, 0]
    assert aero_rescue(OUTCOME, INDEX, 5, cfg(success_threshold=0.5)).tolist() == [0, 0, 0, 0, 0]
    assert aero_rescue(OUTCOME, INDEX, 5, cfg(max_rollouts_per_prompt=4)).tolist() == [0, 0, 0, 2, 0]


def test_selective_rejection_keeps_all_successes_and_k_times_as_many_failures():
    generator = torch.Generator().manual_seed(0)
    keep = aero_selective_rejection(OUTCOME, INDEX, cfg(rejection_ratio=1.0), generator)
    # only example 2 (1 success of 4 < 0.5·4) is low-success: its success and m = 1 of its 3 failures stay
    assert keep[INDEX != 2].all()
    rows = (INDEX == 2).nonzero().squeeze(1)
    assert keep[rows].sum() == 2 and keep[rows[0]]
    keep = aero_selective_rejection(OUTCOME, INDEX, cfg(rejection_ratio=2.0), torch.Generator().manual_seed(0))
    assert keep[rows].sum() == 3
    # k = 0 still keeps one failure, so the group has a contrast
    keep = aero_selective_rejection(OUTCOME, INDEX, cfg(rejection_ratio=0.0), torch.Generator().manual_seed(0))
    assert keep[rows].sum() == 2


def test_plain_strategy_asks_nothing_and_keeps_everything():
    plain = ROLLOUT_STRATEGIES.get("plain")
    assert plain.more(OUTCOME, INDEX, 5, AlgoConfig()).tolist() == [0] * 5
    assert plain.keep(OUTCOME, INDEX, AlgoConfig(), torch.Generator()).all()


def test_aero_excludes_dynamic_sampling(sanity_config):
    with pytest.raises(ConfigError, match="use one of them"):
        sanity_config("algo.rollout_strategy=aero", "algo.dynamic_sampling=true")
    with pytest.raises(ConfigError, match="rollout strategy 'aerro'"):
        sanity_config("algo.rollout_strategy=aerro")


def test_trainer_draws_counts_and_trains_on_what_aero_selects(tmp_path):
    overrides = ["log.progress=false", "log.tensorboard=false", "trainer.steps=2", "eval.every=0",
                 "eval.num_examples=8", "rollout.prompts_per_step=8", "rollout.group_size=4",
                 "warm_start.sft_steps=20", "algo.rollout_strategy=aero",
                 "algo.extra={aero: {rescue_rollouts: 2, max_rollouts_per_prompt: 8}}"]
    trainer = Trainer(load_config("sanity/tiny_cpu", overrides), tmp_path / "run")
    trainer.step = 1
    batch = trainer.collect()
    counts = torch.bincount(batch.rollout.group_id)
    success = batch.outcome >= 1.0
    solved = torch.zeros(len(counts), dtype=torch.bool).index_fill_(0, batch.rollout.group_id[success], True)
    # unsolved prompts were rescued to the budget (8); every kept group still has ≥ 2 rows
    assert torch.all(counts[~solved] == 8) and torch.all(counts >= 2)
    assert batch.stats["rollout/generated"] >= batch.stats["rollout/trained_rows"] == batch.rollout.num_rows
    assert batch.stats["rollout/generated"] >= 8 * 4 + 4 * int((~solved).sum())
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(32 <= r["rollout/generated"] <= 64 for r in rows[1:])
