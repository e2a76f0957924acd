"""build_reward: specs, weights and ranges, spec errors, user functions (both forms) and their failures."""

from __future__ import annotations

import logging
import math
import textwrap
from pathlib import Path

import pytest

from mmrl.verifiers import VERIFIERS, RewardBatch, RewardError, RewardSpecError, build_reward, register_verifier

REPO = Path(__file__).resolve().parents[2]
PROMPTS = ["q1", "q2", "q3"]


def write(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


# ------------------------------------------------------------------------------------------------
# Built-in verifiers combined


def test_single_name_and_weighted_mapping():
    completions = ["<think>t</think><answer>4</answer>", "<answer>4</answer>", "<think>t</think><answer>5</answer>"]
    columns = {"answer": ["4", "4", "4"], "unused": [1, 2, 3]}
    reward = build_reward({"math": 0.9, "format": 0.1})
    batch = reward(PROMPTS, completions, columns)
    assert isinstance(batch, RewardBatch)
    assert reward.names == ("math", "format") and reward.weights == (0.9, 0.1)
    assert reward.reward_range == (0.0, 1.0) and reward.required_columns == ("answer",)
    assert batch.components == {"math": [1.0, 1.0, 0.0], "format": [1.0, 0.0, 1.0]}
    assert batch.scores == pytest.approx([1.0, 0.9, 0.1]) and batch.errors == [None, None, None]
    assert build_reward("math")(PROMPTS, completions, columns).scores == [1.0, 1.0, 0.0]


def test_options_column_name_and_negative_weight():
    reward = build_reward({"number": {"weight": 2.0, "rel_tol": 0.01, "column": "target"},
                           "format": {"weight": -0.5, "name": "no_format"}})
    assert reward.names == ("number", "no_format") and reward.reward_range == (-0.5, 2.0)
    batch = reward(["q"], ["<answer>3.14</answer>"], {"target": [3.14159]})
    assert batch.scores == [2.0] and batch.components["no_format"] == [0.0]


def test_choices_come_from_the_row_unless_the_recipe_sets_them():
    columns = {"answer": ["B", "A"], "choices": [["Rome", "Paris"], ["red", "blue"]]}
    assert build_reward("choice")(["q", "q"], ["Paris", "red"], columns).scores == [1.0, 1.0]
    fixed = build_reward({"choice": {"choices": ["x", "Paris"]}})
    assert fixed(["q", "q"], ["Paris", "red"], columns).scores == [1.0, 0.0]


def test_missing_column_is_a_clear_error():
    reward = build_reward({"exact": {"column": "label"}})
    with pytest.raises(RewardSpecError, match="'exact' needs dataset column 'label'; columns are: answer"):
        reward(["q"], ["x"], {"answer": ["x"]})
    reward.check_columns({"label"})  # nothing missing
    with pytest.raises(ValueError, match="column 'answer' has 2 entries for 1 completions"):
        reward(["q"], ["x"], {"answer": ["x", "y"], "label": ["x"]})


@pytest.mark.parametrize("spec, message", [
    ("maths", r"unknown verifier 'maths'\. Did you mean 'math'.*Registered: .*choice.*json_f1"),
    ({"math": "heavy"}, r"reward 'math': the weight must be a finite number"),
    ({"math": float("inf")}, r"the weight must be a finite number"),
    ({"math": True}, r"the weight must be a finite number"),
    ({}, r"reward mapping is empty"),
    (["math", "format"], r"reward must be a verifier name, .* or a mapping .*got list"),
    ({"number": {"rel_tl": 0.1}}, r"unknown key 'rel_tl' in reward\.number \(did you mean 'rel_tol'\?\)"),
    ({"number": {"rel_tol": "loose"}}, r"reward\.number\.rel_tol expects a number, got 'loose'"),
    ({"number": {"rel_tol": -1}}, r"reward\.number: rel_tol must be a finite number >= 0"),
    ({"format": {"think_tag": "<think>"}}, r"reward\.format: a tag name is letters"),
    ({"format": {"column": "x"}}, r"reads no reference answer, so it takes no 'column'"),
    ({"math": {"range": [0, 2]}}, r"a built-in verifier's range is fixed"),
    ({"iou": {"threshold": 2.0}}, r"threshold must be in \(0, 1\]"),
    ({"json_f1": {"beta": 0}}, r"beta must be a finite number > 0"),
    ({"math": {"name": ""}}, r"name must be a non-empty string"),
    ({"classifier": {}}, r"missing required key 'reward\.classifier\.model'"),
    ({"judge": {"model": "/nonexistent/judge"}}, r"reward\.judge: model '/nonexistent/judge' is not a local model folder"),
])
def test_spec_errors(spec, message):
    with pytest.raises(RewardSpecError, match=message):
        build_reward(spec)


def test_spec_error_is_a_value_error_on_one_line():
    with pytest.raises(ValueError) as info:
        build_reward("nope")
    assert "\n" not in str(info.value)


def test_registering_a_verifier():
    @register_verifier("test_length_at_most", reward_range=(0.0, 1.0), uses_answer=False)
    def length_at_most(completion: object, answer: object = None, *, limit: int = 10) -> float:
        return float(isinstance(completion, str) and len(completion) <= limit)

    try:
        reward = build_reward({"test_length_at_most": {"limit": 3}})
        assert reward(["q", "q"], ["abc", "abcd"], {}).scores == [1.0, 0.0]
    finally:
        VERIFIERS._entries.pop("test_length_at_most")


# ------------------------------------------------------------------------------------------------
# User functions: loading


def test_trl_function_from_a_file_relative_to_base_dir(tmp_path, monkeypatch):
    write(tmp_path, "my_rewards.py", """
        def score(prompts, completions, answer, **kwargs):
            assert set(kwargs) == {"difficulty"}
            return [float(c.strip() == a) for c, a in zip(completions, answer)]
    """)
    monkeypatch.chdir(REPO)  # not next to the file: base_dir finds it
    reward = build_reward({"my_rewards.py:score": 0.5, "format": 0.5}, base_dir=tmp_path)
    assert reward.names == ("score", "format") and reward.required_columns == ("answer",)
    batch = reward(["q", "q"], ["4", "5"], {"answer": ["4", "4"], "difficulty": [1, 2]})
    assert batch.components["score"] == [1.0, 0.0] and batch.scores == [0.5, 0.0]


def test_file_in_the_working_directory_and_named_parameters(tmp_path, monkeypatch):
    write(tmp_path, "rewards.py", """
        def shorter(completions, limit):  # no **kwargs: only the named column is passed
            return [float(len(c) <= n) for c, n in zip(completions, limit)]
    """)
    monkeypatch.chdir(tmp_path)
    reward = build_reward("rewards.py:shorter")
    assert reward.required_columns == ("limit",)
    assert reward(["q", "q"], ["ab", "abcd"], {"limit": [3, 3], "answer": ["x", "y"]}).scores == [1.0, 0.0]


def test_module_function(tmp_path, monkeypatch):
    (tmp_path / "team_rewards").mkdir()
    write(tmp_path / "team_rewards", "__init__.py", "")
    write(tmp_path / "team_rewards", "text.py", """
        def nonempty(prompts, completions, **kwargs):
            return [float(bool(c.strip())) for c in completions]
    """)
    monkeypatch.syspath_prepend(str(tmp_path))
    reward = build_reward("team_rewards.text:nonempty")
    assert reward.names == ("nonempty",) and reward(["q", "q"], [" ", "x"], {}).scores == [0.0, 1.0]


def test_two_files_with_the_same_name_do_not_collide(tmp_path):
    for folder, value in (("a", 1.0), ("b", 0.5)):
        (tmp_path / folder).mkdir()
        write(tmp_path / folder, "rewards.py", f"def score(completions, **kw):\n    return [{value}] * len(completions)\n")
    reward = build_reward({"a/rewards.py:score": {"name": "a"}, "b/rewards.py:score": {"name": "b"}}, base_dir=tmp_path)
    assert reward(["q"], ["x"], {}).components == {"a": [1.0], "b": [0.5]}


@pytest.mark.parametrize("source, spec, message", [
    (None, "missing.py:score", r"reward file 'missing.py' not found \(looked at .*missing.py"),
    ("def score(completions, **kw):\n    return []\n", "r.py:scroe", r"file 'r.py' has no 'scroe'\. Did you mean 'score'\?"),
    ("score = 3\n", "r.py:score", r"'score' in file 'r.py' is a int, not a function"),
    ("def score(completions:\n", "r.py:score", r"importing .*r.py raised SyntaxError \(line 1\)"),
    ("raise RuntimeError('no GPU')\n", "r.py:score", r"importing .*r.py raised RuntimeError: no GPU"),
    ("def score(prompts, answer):\n    return []\n", "r.py:score", r"a batched reward function takes `completions`"),
    ("def score(completions, /):\n    return []\n", "r.py:score", r"remove the positional-only"),
    ("def score(completions, **kw):\n    return []\n", {"r.py:score": {"range": [1, 0]}}, r"range must be \[low, high\]"),
    ("def score(completions, **kw):\n    return []\n", {"r.py:score": {"conversational": "yes"}}, r"conversational must be true or false"),
    ("def score(completions, **kw):\n    return []\n", {"r.py:score": {"rel_tol": 1}}, r"unknown option 'rel_tol'"),
    ("def score(completions, **kw):\n    return []\n", {"r.py:score": 1, "exact": {"name": "score"}}, r"both named 'score'"),
    (None, "no_such_module_xyz:score", r"cannot import module 'no_such_module_xyz'"),
    (None, "mmrl.verifiers.answers:nothing", r"module 'mmrl.verifiers.answers' has no 'nothing'"),
    (None, "r.py:", r"write 'path/to/file.py:function'"),
])
def test_user_function_spec_errors(tmp_path, source, spec, message):
    if source is not None:
        write(tmp_path, "r.py", source)
    with pytest.raises(RewardSpecError, match=message):
        build_reward(spec, base_dir=tmp_path)


# ------------------------------------------------------------------------------------------------
# User functions: calling


def test_none_means_not_applicable(tmp_path):
    write(tmp_path, "r.py", """
        def score(completions, answer, **kw):
            return [None if a is None else 1.0 for a in answer]
    """)
    batch = build_reward("r.py:score", base_dir=tmp_path)(["q", "q"], ["x", "y"], {"answer": [None, "y"]})
    assert batch.scores == [0.0, 1.0] and batch.errors == [None, None]


def test_values_are_clipped_to_the_declared_range(tmp_path):
    write(tmp_path, "r.py", "def score(completions, **kw):\n    return [-5, 0.5, 7, True]\n")
    reward = build_reward({"r.py:score": {"range": [-1, 2], "weight": 2}}, base_dir=tmp_path)
    assert reward.reward_range == (-2.0, 4.0)
    batch = reward(["q"] * 4, ["a"] * 4, {})
    assert batch.components["score"] == [-1.0, 0.5, 2.0, 1.0] and batch.errors == [None] * 4


def test_numpy_results_are_accepted(tmp_path):
    write(tmp_path, "r.py", "import numpy as np\ndef score(completions, **kw):\n    return np.array([0.25, 1.0])\n")
    assert build_reward("r.py:score", base_dir=tmp_path)(["q", "q"], ["a", "b"], {}).scores == [0.25, 1.0]


FAILING = {
    "raises": ("def score(completions, **kw):\n    raise KeyError('answer')\n", [0, 1], "raised KeyError: 'answer'"),
    "nan": ("def score(completions, **kw):\n    return [1.0, float('nan')]\n", [1], "returned nan, not a finite number"),
    "inf": ("def score(completions, **kw):\n    return [float('inf'), 1.0]\n", [0], "returned inf, not a finite number"),
    "text": ("def score(completions, **kw):\n    return ['1.0', 1.0]\n", [0], "returned '1.0', expected a number or None"),
    "length": ("def score(completions, **kw):\n    return [1.0]\n", [0, 1], "returned 1 values for 2 completions"),
    "not a list": ("def score(completions, **kw):\n    return 1.0\n", [0, 1], "returned float, expected a list of 2"),
}


@pytest.mark.parametrize("case", FAILING)
def test_failures_score_zero_with_a_reason(tmp_path, caplog, case):
    source, failed_rows, reason = FAILING[case]
    write(tmp_path, "r.py", source)
    reward = build_reward({"r.py:score": 1.0, "format": 1.0}, base_dir=tmp_path)
    completions = ["<think>a</think><answer>1</answer>"] * 2
    with caplog.at_level(logging.WARNING, logger="mmrl.verifiers"):
        batch = reward(["q", "q"], completions, {})
        reward(["q", "q"], completions, {})  # a second failing batch warns no more
    for row in range(2):
        if row in failed_rows:
            assert batch.errors[row] == f"score: {reason}" or batch.errors[row].startswith(f"score: {reason}")
            assert batch.components["score"][row] == 0.0 and batch.scores[row] == 1.0  # format still counts
        else:
            assert batch.errors[row] is None
    assert all(math.isfinite(s) for s in batch.scores)
    warnings = [r for r in caplog.records if r.name == "mmrl.verifiers"]
    assert len(warnings) == 1 and f"'score' failed on row {failed_rows[0]}" in warnings[0].getMessage()
    if case == "raises":
        assert warnings[0].exc_info is not None  # the traceback is printed once


@pytest.mark.parametrize("case", FAILING)
def test_strict_raises_naming_component_and_row(tmp_path, case):
    source, failed_rows, reason = FAILING[case]
    write(tmp_path, "r.py", source)
    reward = build_reward("r.py:score", base_dir=tmp_path, strict=True)
    with pytest.raises(RewardError, match=rf"reward component 'score' failed on row {failed_rows[0]}: "):
        reward(["q", "q"], ["a", "b"], {})


def test_per_example_form(tmp_path):
    write(tmp_path, "r.py", """
        def graded(example, output):
            right = output.strip() == example["answer"]
            if example["prompt"] == "skip":
                return None
            if example["prompt"] == "boom":
                raise ValueError("bad row")
            return {"accuracy": float(right), "brevity": 0.5 * (len(output) < 5)}

        def flagged(ex, out):
            return float(out == ex["answer"])
        flagged.per_example = True
    """)
    reward = build_reward({"r.py:graded": 1.0, "r.py:flagged": 1.0}, base_dir=tmp_path)
    assert reward.required_columns == ()
    batch = reward(["q", "q", "skip", "boom"], ["4", "wrong answer", "4", "4"], {"answer": ["4", "4", "4", "4"]})
    assert batch.components["graded"] == [1.0, 0.0, 0.0, 0.0]  # the sum 1.5, clipped to the range [0, 1]
    assert batch.components["graded/accuracy"] == [1.0, 0.0, 0.0, 0.0]
    assert batch.components["graded/brevity"] == [0.5, 0.0, 0.0, 0.0]
    assert batch.components["flagged"] == [1.0, 0.0, 1.0, 1.0]
    assert batch.errors[:3] == [None, None, None] and batch.errors[3] == "graded: raised ValueError: bad row"
    assert reward.reward_range == (0.0, 2.0)  # [0, 1] each by default
    assert batch.scores == [2.0, 0.0, 1.0, 1.0]


def test_per_example_bad_mapping(tmp_path):
    write(tmp_path, "r.py", "def f(example, output):\n    return {'a': 1.0, 'b': 'high'}\n")
    batch = build_reward("r.py:f", base_dir=tmp_path)(["q"], ["x"], {})
    assert batch.scores == [0.0] and "entry 'b' is 'high', not a finite number" in batch.errors[0]


def test_conversational_functions_get_messages(tmp_path):
    write(tmp_path, "r.py", """
        def score(prompts, completions, **kwargs):
            assert prompts[0] == [{"role": "user", "content": "q"}]
            return [float(c[0]["role"] == "assistant" and c[0]["content"] == "hi") for c in completions]
    """)
    reward = build_reward({"r.py:score": {"conversational": True}}, base_dir=tmp_path)
    assert reward(["q", "q"], ["hi", "bye"], {}).scores == [1.0, 0.0]


def test_example_trl_reward_file(monkeypatch):
    monkeypatch.chdir(REPO)
    reward = build_reward({"examples/trl_reward.py:accuracy": 1.0, "examples/trl_reward.py:format_bonus": 0.2})
    assert reward.names == ("accuracy", "format_bonus") and reward.reward_range == (0.0, 1.2)
    completions = ["Let me think.\nAnswer: Paris", "paris", "Answer: Rome", "Answer: x"]
    batch = reward(["q"] * 4, completions, {"answer": ["Paris", "Paris", "Paris", None]})
    assert batch.components == {"accuracy": [1.0, 1.0, 0.0, 0.0], "format_bonus": [1.0, 0.0, 1.0, 1.0]}
    assert batch.scores == pytest.approx([1.2, 1.0, 0.2, 0.2]) and batch.errors == [None] * 4
