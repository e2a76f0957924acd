"""ERPO (arXiv 2511.04800) on the temperature-schedule axis (mmrl/algos/variants/prompt_temperature.py): golden
numbers of the residual-prompt schedule, the per-prompt table, and the trainer wiring: a prompt whose whole
group was correct is re-sampled hotter next time (rows of one batch at different temperatures, on-policy ratio
still exactly 1), the table is checkpointed and resume is exact."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from mmrl.algos import AlgoConfig
from mmrl.algos.variants import TEMPERATURE_SCHEDULES, PromptTemperatures, prompt_key
from mmrl.algos.variants.prompt_temperature import all_correct_groups
from mmrl.core.config import ConfigError, load_config
from mmrl.core.rollout import SamplingParams
from mmrl.core.trainer import Trainer, train

# example 0 all-correct [1, 1], 1 mixed [1, 0], 2 all-wrong [0, 0], 3 all-correct but already at T_max
OUTCOME = torch.tensor([1.0, 1, 1, 0, 0, 0, 1, 1])
INDEX = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])


def erpo(temperature, base=1.0, **params):
    cfg = AlgoConfig(temperature_schedule="erpo", extra={"erpo": params})
    return TEMPERATURE_SCHEDULES.get("erpo")(torch.tensor(temperature, dtype=torch.float64), OUTCOME, INDEX, base, cfg)


def test_all_correct_groups():
    assert all_correct_groups(OUTCOME, INDEX, 5, 1.0).tolist() == [True, False, False, True, False]  # 4: no rows
    soft = torch.tensor([0.5, 0.75, 0.25, 1.0])
    assert all_correct_groups(soft, torch.tensor([0, 0, 1, 1]), 2, 0.5).tolist() == [True, False]


def test_erpo_schedule_golden():
    # all-correct: + ΔT (capped at T_max); otherwise reset to T_0 (decay 0)
    assert_close(erpo([1.0, 1.3, 1.2, 1.45], delta=0.1, max_temperature=1.5),
                 torch.tensor([1.1, 1.0, 1.0, 1.5], dtype=torch.float64))
    # decay 0.5 keeps half of T_x − T_0 after a group that is not all-correct
    assert_close(erpo([1.2, 1.4, 1.2, 1.5], base=0.8, delta=0.25, max_temperature=1.5, decay=0.5),
                 torch.tensor([1.45, 1.1, 1.0, 1.5], dtype=torch.float64))
    fixed = TEMPERATURE_SCHEDULES.get("fixed")(torch.tensor([1.3, 0.7]), OUTCOME[:2], INDEX[:2], 0.9, AlgoConfig())
    assert fixed.tolist() == pytest.approx([0.9, 0.9])


def test_bad_schedule_parameters_are_refused():
    with pytest.raises(ValueError, match="delta > 0"):
        erpo([1.0] * 4, delta=0.0)
    with pytest.raises(ValueError, match="max_temperature"):
        erpo([1.0] * 4, base=2.0)


def test_table_keeps_only_prompts_away_from_t0():
    table = PromptTemperatures()
    table.update(["a", "b"], [1.2, 1.0], 1.0)
    assert table.state_dict() == {"a": 1.2} and table.lookup(["a", "b", "c"], 1.0).tolist() == [1.2, 1.0, 1.0]
    table.update(["a"], [1.0], 1.0)
    assert len(table) == 0
    restored = PromptTemperatures()
    restored.load_state_dict(json.loads(json.dumps({"x": 1.3000000000000003})))
    assert restored.lookup(["x"], 1.0).item() == 1.3000000000000003
    with pytest.raises(ValueError, match="2 keys for 1"):
        table.update(["a", "b"], [1.1], 1.0)


def test_recipe_selects_it_with_typed_parameters(sanity_config):
    cfg = sanity_config("algo.temperature_schedule=erpo", "algo.extra={erpo: {delta: 0.2}}")
    assert cfg.algo.temperature_schedule == "erpo"
    with pytest.raises(ConfigError, match="delta"):
        sanity_config("algo.temperature_schedule=erpo", "algo.extra={erpo: {detla: 0.2}}")
    with pytest.raises(ConfigError, match="erpo"):
        sanity_config("algo.temperature_schedule=erpx")


QUIET = ["log.progress=false", "log.tensorboard=false"]
SHORT = ["eval.num_examples=8", "rollout.prompts_per_step=8", "rollout.group_size=4", "warm_start.sft_steps=20"]


def erpo_overrides():
    from mmrl.experiments.sweep import SWEEP_ARMS

    return list(SWEEP_ARMS.get("erpo").overrides)


def test_a_prompt_solved_by_its_whole_group_is_resampled_hotter(tmp_path):
    cfg = load_config("sanity/tiny_cpu", [*QUIET, *SHORT, *erpo_overrides(), "trainer.steps=1", "eval.every=0",
                                          "algo.extra={erpo: {delta: 0.25, max_temperature: 1.5}}"])
    trainer = Trainer(cfg, tmp_path / "run")
    hook = dict(trainer.rollout_hooks)["prompt_temperature"]

    def temperatures_of(batch):
        hook.begin_round(batch)
        return torch.tensor([hook.current[prompt_key(e)] for e in batch], dtype=torch.float64)

    examples = trainer.task.sample_batch("train", 3, np.random.default_rng(0))
    assert temperatures_of(examples).tolist() == [1.0, 1.0, 1.0]
    # a scored group per example: 0 answered right twice (all-correct), 1 right and wrong (mixed), 2 wrong twice
    answers = [trainer.task.reference_output(examples[0])] * 2 + [trainer.task.reference_output(examples[1]), "0",
                                                                   "0", "0"]
    index = torch.tensor([0, 0, 1, 1, 2, 2])
    rows = trainer.policy.rollout_from_outputs([examples[i] for i in index.tolist()], answers, SamplingParams())
    part = trainer.score(rows.replace(example_index=index, group_id=index.clone()), examples)
    hook.refine(part, None)
    temperatures = temperatures_of(examples)
    assert temperatures.tolist() == [1.25, 1.0, 1.0]
    assert hook.table.state_dict() == {prompt_key(examples[0]): 1.25}
    # next time: example 0's group is drawn at 1.25, the others at T_0; rows in example order, ratio exactly 1
    rollout = trainer.draw(examples, 4, SamplingParams(1.0, 1.0, 8), 5)
    assert rollout.example_index.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert rollout.payload.temperature.tolist() == [1.25] * 4 + [1.0] * 8
    with torch.no_grad():
        assert_close(trainer.policy(rollout).logp * rollout.mask, rollout.logp, rtol=0, atol=1e-6)
    # the hot rows' log-probs are those of the tempered distribution, not of T_0
    cold = rollout.select(torch.arange(4))
    cold = cold.replace(payload=dataclasses.replace(cold.payload, temperature=torch.ones(4)))
    with torch.no_grad():
        assert not torch.allclose(trainer.policy(cold).logp * cold.mask, rollout.logp[:4])
    # a mixed group resets the prompt: its next group is at T_0 again
    again = trainer.policy.rollout_from_outputs([examples[0]] * 2, [answers[0], "0"], SamplingParams())
    zero = torch.zeros(2, dtype=torch.long)
    hook.begin_round(examples[:1])
    hook.refine(trainer.score(again.replace(example_index=zero, group_id=zero.clone()), examples[:1]), None)
    assert temperatures_of(examples).tolist() == [1.0, 1.0, 1.0] and len(hook.table) == 0


def test_rollouts_at_different_temperatures_concatenate_and_select():
    from mmrl.policies.tokens import TokenPayload

    def payload(n, t, temperature):
        return TokenPayload(torch.zeros(n, 2, dtype=torch.long), torch.ones(n, 2, dtype=torch.long),
                            torch.zeros(n, t, dtype=torch.long), torch.ones(n, t, dtype=torch.long),
                            torch.full((n,), temperature, dtype=torch.float32), 0)

    both = TokenPayload.concat([payload(2, 3, 1.0), payload(1, 5, 1.25)])
    assert both.temperature.tolist() == [1.0, 1.0, 1.25] and both.completion_ids.shape == (3, 5)
    assert both.select(torch.tensor([2, 0])).temperature.tolist() == [1.25, 1.0]


def rows_of(out):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_table_is_checkpointed_and_resume_is_exact(tmp_path):
    # 100 two-digit prompts (a longer warm start solves most of them), so solved prompts recur within a few steps
    base = [*QUIET, *SHORT, *erpo_overrides(), "task.args={min_len: 2, max_len: 2}", "warm_start.sft_steps=60",
            "checkpoint.every=3", "eval.every=3"]
    train(load_config("sanity/tiny_cpu", [*base, "trainer.steps=6"]), tmp_path / "full")
    train(load_config("sanity/tiny_cpu", [*base, "trainer.steps=3"]), tmp_path / "resumed")
    state = json.loads((tmp_path / "resumed" / "checkpoints" / "step_3" / "trainer_state.json").read_text())
    assert len(state["hooks"]["prompt_temperature"]["prompt_temperatures"]) > 0 and all(t > 1.0 for t in state["hooks"]["prompt_temperature"]["prompt_temperatures"].values())
    Trainer(load_config("sanity/tiny_cpu", [*base, "trainer.steps=6"]), tmp_path / "resumed", resume=True).train()
    full = rows_of(tmp_path / "full")
    assert rows_of(tmp_path / "resumed") == full
    assert any(r["rollout/temperature_mean"] > 1.0 for r in full[1:])  # hot prompts were drawn again
    assert all(math.isfinite(r["loss/total"]) for r in full[1:])
