"""Tool calls through the multi-turn contract (``algo.tool_turns``): every call answered by the task's tool as the
next turn, every turn a row of its prompt's group carrying the episode's score, whose decisions are only that
turn's tokens; the call limit; held-out evaluation over whole episodes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mmrl.core.config import ConfigError, load_config
from mmrl.core.contracts import FollowUp, turns_of
from mmrl.core.episodes import episode_results, run_tool_episodes, tool_metrics
from mmrl.core.evaluate import verify
from mmrl.core.registry import make_policy, make_task
from mmrl.core.rollout import SamplingParams
from mmrl.core.trainer import Trainer
from mmrl.policies.causal_lm import prompt_text

QUIET = ["log.progress=false", "log.tensorboard=false", "eval.every=0", "eval.num_examples=16"]
SMALL = ["rollout.prompts_per_step=4", "rollout.group_size=4", "trainer.minibatches=1", "trainer.steps=1"]
WARM = ["warm_start.sft_steps=60", "warm_start.batch_size=32"]  # enough to write calls (~10 s on a busy core)
SAMPLING = SamplingParams(1.0, 1.0, 24)


def tool_config(*overrides: str):
    return load_config("data/tool_tiny_cpu", [*QUIET, *overrides])


def scripted_draw(policy, script):
    """A draw whose outputs are ``script(context)``, scored by the policy (its log-probs of those outputs)."""
    def draw(examples, group_size, sampling, seed):
        contexts = [ex for ex in examples for _ in range(group_size)]
        rollout = policy.rollout_from_outputs(contexts, [script(c) for c in contexts], sampling)
        index = torch.arange(len(examples)).repeat_interleave(group_size)
        return rollout.replace(example_index=index, group_id=index.clone())
    return draw


def test_episodes_answer_calls_in_context_up_to_the_limit():
    cfg = tool_config("warm_start.sft_steps=0")
    task, policy = make_task(cfg.task.name, cfg.task.args), make_policy(cfg.policy.name, cfg.policy.args)
    examples = task.sample_batch("train", 3, np.random.default_rng(0))
    first_outputs = {0: "<tool>calc({})</tool>", 1: "<tool>calc 1</tool>", 2: "{answer}"}

    def script(context):  # example 0: a call, then the answer; 1: malformed calls forever; 2: answers at once
        base = context.base if isinstance(context, FollowUp) else context
        k = examples.index(base)
        if k == 1:
            return first_outputs[1]
        if not turns_of(context):
            return first_outputs[k].format(base.columns["expression"], answer=base.answer)
        return base.answer

    draw = scripted_draw(policy, script)
    first = draw(examples, 2, SAMPLING, 0)
    episodes = run_tool_episodes(first, examples, task, draw, SAMPLING, 0, max_calls=2)
    rollout, tokenizer = episodes.rollout, policy.tokenizer
    # episodes 0, 1: example 0 (one call); 2, 3: example 1 (two malformed calls, then a third: overrun); 4, 5: example 2
    assert episodes.calls.tolist() == [1, 1, 2, 2, 0, 0]
    assert episodes.overran.tolist() == [False, False, True, True, False, False]
    assert rollout.num_rows == 6 + 2 + 4
    assert rollout.example_index.tolist() == [0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 1, 1]
    assert torch.equal(rollout.group_id, rollout.example_index)
    assert episodes.episode.tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 2, 3]
    assert episodes.final.tolist() == [6, 7, 10, 11, 4, 5]
    for row in range(rollout.num_rows):
        prompt = tokenizer.decode(rollout.payload.prompt_ids[row][rollout.payload.prompt_mask[row] > 0])
        completion = tokenizer.decode(rollout.payload.completion_ids[row][rollout.mask[row] > 0],
                                      skip_special_tokens=True)
        assert completion == rollout.outputs[row]  # the decisions are this turn's output, nothing else
        base = examples[int(rollout.example_index[row])]
        assert prompt.startswith(base.prompt)
    expression = examples[0].columns["expression"]
    row6 = tokenizer.decode(rollout.payload.prompt_ids[6][rollout.payload.prompt_mask[6] > 0])
    assert row6 == f"{examples[0].prompt}<tool>calc({expression})</tool>\n={examples[0].answer}\nA:"
    row10 = tokenizer.decode(rollout.payload.prompt_ids[10][rollout.payload.prompt_mask[10] > 0])
    error = "\n=error: malformed call, write <tool>name(arguments)</tool>\nA:"
    assert row10 == examples[1].prompt + ("<tool>calc 1</tool>" + error) * 2  # both earlier turns, in order
    finals = rollout.select(episodes.final)
    verdicts = episode_results(episodes, verify(task, cfg.task.name, finals, examples), 0.0)
    assert [v.score for v in verdicts] == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    assert "more than the 2 tool calls" in verdicts[2].info
    assert tool_metrics(episodes) == pytest.approx({"tool_use_rate": 4 / 6, "tool_calls_mean": 1.0,
                                                    "tool_overrun_rate": 2 / 6})


@pytest.fixture(scope="module")
def warm_trainer_factory(tmp_path_factory):
    """Trainers of the tool recipe after a short warm start (built once, then read from the warm-start cache)."""
    def make(*overrides: str) -> Trainer:
        return Trainer(tool_config(*WARM, *SMALL, *overrides), tmp_path_factory.mktemp("run"))
    return make


def test_every_turn_is_a_row_with_the_episode_score_and_log_prob_parity(warm_trainer_factory):
    trainer = warm_trainer_factory("algo.tool_turns=2")
    batch = trainer.collect()
    rollout, task = batch.rollout, trainer.task
    assert batch.stats["rollout/tool_use_rate"] > 0.5  # the warm start calls the calculator
    assert rollout.num_rows > 16 and batch.stats["rollout/trained_rows"] == rollout.num_rows
    # each later turn's row continues an earlier one: the same group, and its context holds the call and result
    tokenizer = trainer.policy.tokenizer
    for row in range(16, rollout.num_rows):
        example = batch.examples[int(rollout.example_index[row])]
        prompt = tokenizer.decode(rollout.payload.prompt_ids[row][rollout.payload.prompt_mask[row] > 0])
        assert prompt.startswith(example.prompt + "<tool>") and prompt.endswith("\nA:")
        assert "=" not in tokenizer.decode(rollout.payload.completion_ids[row][rollout.mask[row] > 0])
    # every row of an episode carries the verdict of its final answer (a call alone would score 0)
    calls = [i for i in range(16) if task.call(batch.examples[int(rollout.example_index[i])], rollout.outputs[i])]
    assert calls and any(batch.outcome[i] == 1.0 for i in calls)
    # on-policy, re-scoring gives the sampled log-probs: PPO's ratio is 1 on every turn's decisions
    logp = trainer.no_grad_forward(trainer.policy, rollout)
    assert torch.allclose(logp * rollout.mask, rollout.logp, atol=1e-5)
    advantages, _, _ = trainer.advantages(batch)
    trainer.update(rollout, advantages, None, None)  # groups of several sizes train


def test_held_out_evaluation_runs_whole_episodes(warm_trainer_factory):
    on, off = warm_trainer_factory("algo.tool_turns=2").evaluate(), warm_trainer_factory("algo.tool_turns=0").evaluate()
    assert on["eval/tool_use_rate"] > 0.5 and on["eval/accuracy"] > off["eval/accuracy"]
    assert "eval/tool_use_rate" not in off  # without tool turns a call is the answer, and scores 0


def test_a_run_resumes_exactly(tmp_path):
    """The hook keeps no state across steps; a resumed run equals an uninterrupted one."""
    args = [*WARM, "rollout.prompts_per_step=4", "rollout.group_size=4", "trainer.minibatches=1",
            "checkpoint.every=1"]
    Trainer(tool_config(*args, "trainer.steps=2"), tmp_path / "full").train()
    Trainer(tool_config(*args, "trainer.steps=1"), tmp_path / "part").train()
    Trainer(tool_config(*args, "trainer.steps=2"), tmp_path / "part", resume=True).train()

    def last(run):
        row = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
        return {k: v for k, v in row.items() if not k.startswith("perf/")}
    assert last(tmp_path / "full") == last(tmp_path / "part")


def test_tool_turns_need_a_tool_task_and_exclude_feedback_turns(tmp_path):
    with pytest.raises(ValueError, match="tool_turns needs a task whose answers may call tools"):
        Trainer(load_config("sanity/tiny_cpu", [*QUIET, "algo.tool_turns=1", "warm_start.sft_steps=0"]),
                tmp_path / "run")
    with pytest.raises(ValueError, match="tool_turns needs a task whose answers may call tools"):  # tools not configured
        Trainer(load_config("data/text_tiny_cpu", [*QUIET, "algo.tool_turns=1", "warm_start.sft_steps=0"]),
                tmp_path / "run2")
    with pytest.raises(ConfigError, match="tool_turns and algo.feedback_turns"):
        tool_config("algo.feedback_turns=1", "task.args.feedback_template=again")
