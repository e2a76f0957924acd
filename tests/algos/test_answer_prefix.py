"""TFPI's ThinkFree input (``algo.answer_prefix``): samples start with the prefix as context; the task scores
prefix + continuation; held-out evaluation is unchanged."""

from __future__ import annotations

import torch

from mmrl.core.contracts import Prefixed, answer_prefix_of
from mmrl.core.trainer import Trainer
from mmrl.policies.causal_lm import prompt_text


def test_prefix_is_context_and_part_of_the_scored_answer(sanity_config, tmp_path):
    cfg = sanity_config("algo.answer_prefix='4'", "warm_start.sft_steps=15", "rollout.prompts_per_step=4",
                        "rollout.group_size=4", "trainer.minibatches=1", "trainer.steps=1", "eval.every=0",
                        "eval.num_examples=8")
    trainer = Trainer(cfg, tmp_path / "run")
    batch = trainer.collect()
    rollout, tokenizer = batch.rollout, trainer.policy.tokenizer
    assert all(o.startswith("4") for o in rollout.outputs)
    for row in range(rollout.num_rows):
        example = batch.examples[int(rollout.example_index[row])]
        prompt = tokenizer.decode(rollout.payload.prompt_ids[row][rollout.payload.prompt_mask[row] > 0])
        assert prompt == example.prompt + "4"  # the prefix is in the context ...
        completion = tokenizer.decode(rollout.payload.completion_ids[row][rollout.mask[row] > 0])
        assert "4" + completion.replace(tokenizer.eos_token or "", "") == rollout.outputs[row]  # ... not a decision
        assert batch.results[row].score == trainer.task.reward(example, rollout.outputs[row]).score
    assert torch.allclose(trainer.policy(rollout).logp * rollout.mask, rollout.logp, atol=1e-6)


def test_a_prefixed_example_is_its_base_with_a_prefix():
    class Base:
        prompt, images, system = "1234>", (), None

    example = Prefixed(Base(), "<think></think>")
    assert example.prompt == "1234>" and example.images == () and answer_prefix_of(example) == "<think></think>"
    assert prompt_text(example) == "1234><think></think>" and answer_prefix_of(Base()) == ""
