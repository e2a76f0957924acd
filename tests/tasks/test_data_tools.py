"""The calculator tool of ``data/rows-v0`` (``task.args.tools: [calc]``): golden values, refusals as error strings
(never exceptions), call parsing, the task's ``call`` / ``reward`` / ``reference_turns`` on the tool recipe's rows."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mmrl.core.config import load_config
from mmrl.core.contracts import FollowUp, ToolTask
from mmrl.core.paths import assets_dir
from mmrl.core.registry import make_task
from mmrl.core.typed import ConfigError
from mmrl.policies.causal_lm import prompt_text
from mmrl.tasks.data.tools import calc, find_call, run_tool

TOOL_ARGS = {"train_files": "assets/data/arith_tool_train.jsonl", "test_files": "assets/data/arith_tool_test.jsonl",
             "template": "Q: {prompt}\nA:", "reward": "number", "answer_template": "{answer}", "tools": ["calc"],
             "tool_reference": "<tool>calc({expression})</tool>"}


@pytest.mark.parametrize("expression, value", [
    ("7+3", "10"), ("9-9", "0"), ("3 - 8", "-5"), ("6*7", "42"), ("8/2", "4"), ("7/2", "3.5"), ("1/3", "0.333333"),
    ("2/3", "0.666667"), ("-(4+2)*3", "-18"), ("+5", "5"), ("((1+2))*(3+4)", "21"), ("1/3*3", "1"),
    ("999999*1000000", "999999000000"), ("-1/3", "-0.333333"), ("-1/3000000000", "0"),
])
def test_calculator_golden_values(expression, value):
    assert calc(expression) == value


@pytest.mark.parametrize("expression, error", [
    ("x+1", "unknown name x"), ("__import__('os')", "only + - * / on integers (found Call)"),
    ("(1).real", "attribute access is not allowed"), ("().__class__", "attribute access is not allowed"),
    ("2**100", "found Pow"), ("9**9**9", "found Pow"), ("7/0", "division by zero"), ("1/(2-2)", "division by zero"),
    ("1.5+1", "found Constant"), ("True+1", "found Constant"), ("'a'*3", "found Constant"), ("7%2", "found Mod"),
    ("7//2", "found FloorDiv"), ("[1]", "found List"), ("1 if 1 else 2", "found IfExp"), ("", "not an arithmetic"),
    ("7+", "not an arithmetic"), ("lambda: 1", "found Lambda"), ("9" * 13, "number beyond"),
    ("999999*999999*999999", "number beyond"), ("1" + "+1" * 40, "longer than 64"), ("(" * 200 + "1" + ")" * 200,
                                                                                 "longer than 64"),
])
def test_calculator_refuses_with_an_error_string(expression, error):
    result = calc(expression)
    assert result.startswith("error: ") and error in result, result


@pytest.mark.parametrize("output, result", [
    ("<tool>calc(7+3)</tool>", "10"), ("I will compute <tool> calc(2*(3+4)) </tool> now", "14"),
    ("<tool>calc(7+3)", "error: malformed call"), ("<tool>calc 7+3</tool>", "error: malformed call"),
    ("<tool>sh(ls)</tool>", "error: unknown tool sh (tools: calc)"), ("<tool>calc(a.b)</tool>", "error: attribute access"),
])
def test_calls_are_parsed_and_answered(output, result):
    assert run_tool(output, ("calc",)).startswith(result)


def test_error_strings_use_only_characters_the_tool_recipe_can_read():
    chars = set(load_config("data/tool_tiny_cpu", []).policy.args.tokenizer_chars)
    calls = ["<tool>calc(x+1)</tool>", "<tool>calc 1</tool>", "<tool>sh(ls)</tool>", "<tool>calc(a.b)</tool>",
             "<tool>calc(2**9)</tool>", "<tool>calc(7/0)</tool>", "<tool>calc(" + "9" * 13 + ")</tool>",
             "<tool>calc(" + "1+" * 40 + "1)</tool>", "<tool>calc(1.5)</tool>", "<tool>calc()</tool>"]
    for call in calls:
        assert set(run_tool(call, ("calc",))) <= chars, run_tool(call, ("calc",))


def test_find_call_reads_the_first_call():
    assert find_call("<tool>calc(1+1)</tool><tool>calc(2+2)</tool>") == ("calc", "1+1")


def test_the_tool_rows_are_the_text_rows_with_an_expression_that_computes_the_answer():
    for split in ("train", "test"):
        plain = (assets_dir() / "data" / f"arith_{split}.jsonl").read_text().splitlines()
        tool = [json.loads(line) for line in (assets_dir() / "data" / f"arith_tool_{split}.jsonl").read_text().splitlines()]
        assert [json.loads(line) for line in plain] == [{k: v for k, v in row.items() if k != "expression"}
                                                        for row in tool]
        assert all(calc(row["expression"]) == row["answer"] for row in tool)


def test_the_task_answers_calls_and_scores_them_the_floor():
    task = make_task("data/rows-v0", TOOL_ARGS)
    assert isinstance(task, ToolTask)
    example = task.sample_batch("train", 1, np.random.default_rng(0))[0]
    assert task.call(example, "<tool>calc(7+3)</tool>") == "\n=10\nA:"
    assert task.call(example, "<tool>calc(7/0)</tool>") == "\n=error: division by zero\nA:"
    assert task.call(example, example.answer) is None and task.call(example, None) is None
    call = task.reward(example, f"<tool>calc({example.columns['expression']})</tool>")
    assert call.score == 0.0 and "tool call" in call.info
    assert task.reward(example, example.answer).score == 1.0


def test_without_tools_nothing_is_a_call():
    task = make_task("data/rows-v0", {**TOOL_ARGS, "tools": [], "tool_reference": None})
    example = task.sample_batch("train", 1, np.random.default_rng(0))[0]
    assert task.call(example, "<tool>calc(7+3)</tool>") is None
    assert task.reference_turns(example) == ((example, example.answer),)


def test_reference_turns_call_then_answer_after_the_real_result():
    task = make_task("data/rows-v0", TOOL_ARGS)
    example = task.sample_batch("train", 1, np.random.default_rng(0))[0]
    (first, call), (later, answer) = task.reference_turns(example)
    assert first is example and call == f"<tool>calc({example.columns['expression']})</tool>"
    assert isinstance(later, FollowUp) and later.base is example and answer == example.answer
    assert prompt_text(later) == f"{example.prompt}{call}\n={example.answer}\nA:"


def test_an_unknown_tool_is_a_config_error():
    with pytest.raises(ConfigError, match="task.args.tools: unknown tool 'calculator'. Did you mean 'calc'"):
        make_task("data/rows-v0", {**TOOL_ARGS, "tools": ["calculator"]})


def test_a_reference_that_calls_no_tool_is_a_config_error():
    task = make_task("data/rows-v0", {**TOOL_ARGS, "tool_reference": "calc({expression})"})
    with pytest.raises(ConfigError, match="tool_reference"):
        task.reference_turns(task.sample_batch("train", 1, np.random.default_rng(0))[0])


def test_the_tool_recipe_loads():
    cfg = load_config("data/tool_tiny_cpu", [])
    assert cfg.algo.tool_turns == 2 and tuple(cfg.task.args.tools) == ("calc",)
