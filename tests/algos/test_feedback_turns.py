"""Multi-turn feedback (``algo.feedback_turns``): failed rows answered again after the task's feedback, in
context, as rows of their prompt's group whose decisions are only the new answer's tokens."""

from __future__ import annotations

import json

import pytest

from mmrl.core.config import load_config
from mmrl.core.contracts import FollowUp
from mmrl.core.trainer import Trainer
from mmrl.policies.causal_lm import prompt_text

QUIET = ["log.progress=false", "log.tensorboard=false", "eval.every=0", "eval.num_examples=4"]
FEEDBACK = "task.args.feedback_template='\nno, score {score:.1f}, again\nA:'"


def rows_file(tmp_path, n: int = 16):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"problem": f"{a} plus {a}", "answer": str(2 * a)}) + "\n" for a in range(n)))
    return path


def trainer_with(tmp_path, *overrides: str) -> Trainer:
    cfg = load_config("data/text_tiny_cpu", [*QUIET, f"task.args.train_files={rows_file(tmp_path)}",
                                             f"task.args.test_files={rows_file(tmp_path)}", FEEDBACK,
                                             "warm_start.sft_steps=0", "rollout.prompts_per_step=4",
                                             "rollout.group_size=4", "trainer.minibatches=1", "trainer.steps=1",
                                             *overrides])
    return Trainer(cfg, tmp_path / "run")


def test_a_follow_up_renders_its_turns_after_the_prompt():
    class Ex:
        prompt = "Q: 1 plus 1\nA:"

    follow = FollowUp(Ex(), (("assistant", " 3"), ("user", "\nno, again\nA:")))
    assert prompt_text(follow) == "Q: 1 plus 1\nA: 3\nno, again\nA:"
    assert prompt_text(Ex()) == Ex.prompt and follow.images == () and follow.system is None


@pytest.mark.parametrize("turns", [1, 2])
def test_failed_rows_are_answered_again_in_context_and_join_their_group(tmp_path, turns):
    trainer = trainer_with(tmp_path, f"algo.feedback_turns={turns}")
    batch = trainer.collect()  # an untrained policy: every first answer fails
    rollout, tokenizer = batch.rollout, trainer.policy.tokenizer
    follow_ups = rollout.num_rows - 16
    assert follow_ups == batch.stats["rollout/feedback_rows"] >= 16  # every first answer got a second turn
    assert follow_ups <= 16 * turns
    for row in range(16, rollout.num_rows):
        group = int(rollout.group_id[row])
        assert int(rollout.example_index[row]) == group  # scored as (and grouped with) its prompt
        prompt = tokenizer.decode(rollout.payload.prompt_ids[row][rollout.payload.prompt_mask[row] > 0])
        base = batch.examples[group].prompt
        assert prompt.startswith(base) and "again" in prompt[len(base):]  # earlier turns are context ...
        completion = rollout.payload.completion_ids[row][rollout.mask[row] > 0]
        assert "again" not in tokenizer.decode(completion)  # ... and only the new answer is a decision
    trainer.train()  # groups of several sizes train
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["rollout/trained_rows"] > 16 and last["rollout/feedback_rows"] >= 16


def test_feedback_needs_a_task_that_gives_it(tmp_path):
    cfg = load_config("sanity/tiny_cpu", [*QUIET, "algo.feedback_turns=1", "warm_start.sft_steps=0"])
    with pytest.raises(ValueError, match="feedback"):
        Trainer(cfg, tmp_path / "run")
