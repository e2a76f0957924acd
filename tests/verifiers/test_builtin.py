"""Golden cases of every built-in text verifier: right, wrong, hedged, malformed and edge formats."""

from __future__ import annotations

import pytest

from mmrl.verifiers import VERIFIERS
from mmrl.verifiers.text import answer_region, last_boxed, normalise


def score(name: str, completion: object, answer: object, **options) -> float:
    return VERIFIERS.get(name).fn(completion, answer, **options)


# ------------------------------------------------------------------------------------------------
# extraction


@pytest.mark.parametrize("completion, text, explicit", [
    ("<think>2</think><answer>4</answer>", "4", True),
    ("<answer>1</answer> then <answer>2</answer>", "2", True),  # the last block
    ("<answer>x</answer><answer>unclosed", "x", True),
    (r"so \boxed{3} no \boxed{5}", "5", True),  # the last box
    (r"<answer>\boxed{7}</answer> \boxed{8}", "7", True),  # the box inside the last block
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}", True),  # balanced braces
    (r"\boxed{3} \boxed{4", "3", True),  # an unbalanced box is skipped
    ("just text", "just text", False),
])
def test_answer_region(completion, text, explicit):
    region = answer_region(completion)
    assert (region.text, region.explicit) == (text, explicit)


def test_extraction_reads_the_tail_of_long_text():
    assert answer_region("x" * 50_000 + "<answer>9</answer>").text == "9"
    assert last_boxed("\\boxed{" * 4000) is None
    assert answer_region(None) is None and answer_region(["<answer>1</answer>"]) is None


def test_normalise():
    assert normalise("  ¡Hola,  MUNDO! ") == "hola, mundo"
    assert normalise("...") == "" and normalise("ＡＢＣ") == "abc"


# ------------------------------------------------------------------------------------------------
# math


@pytest.mark.parametrize("completion, answer, expected", [
    (r"The answer is \boxed{\frac{1}{2}}.", "0.5", 1.0),
    (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
    ("<answer>x = 3</answer>", "3", 1.0),
    ("<answer>3 apples</answer>", 3, 1.0),
    ("<answer>1+x</answer>", "x+1", 1.0),
    (r"<answer>$\sqrt{8}$</answer>", r"2\sqrt{2}", 1.0),
    ("<answer>(1, 2)</answer>", "(1,2)", 1.0),
    ("Adding them gives 7.\nSo the result is 7", 7, 1.0),  # no marked answer: the last line
    (r"\boxed{3}", r"hence $x$ is \boxed{3}.", 1.0),  # a full solution as the reference
    (r"\boxed{4}", "3", 0.0),
    (r"\boxed{3} or maybe \boxed{4}", "3", 0.0),  # the last box counts
    ("<answer>(1, 2)</answer>", "[1,2]", 0.0),  # open vs closed interval
    ("no answer here", "3", 0.0),
    (r"\boxed{3}", None, 0.0),
    (r"\boxed{3}", ["3"], 0.0),
    (r"\boxed{3}", float("nan"), 0.0),
    (r"\boxed{" + "9" * 5000 + "}", "9", 0.0),
    ("", "3", 0.0),
    (None, "3", 0.0),
])
def test_math(completion, answer, expected):
    assert score("math", completion, answer) == expected


def test_math_in_a_thread():
    """``math_verify``'s signal timeout only works in the main thread; elsewhere it runs without it."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(score, "math", r"\boxed{\frac{2}{4}}", "0.5").result() == 1.0


# ------------------------------------------------------------------------------------------------
# choice


@pytest.mark.parametrize("completion, answer, choices, expected", [
    ("B", "B", None, 1.0),
    ("(B)", "B", None, 1.0),
    ("B.", "(B)", None, 1.0),
    ("b", "B", None, 1.0),
    ("The answer is B", "B", None, 1.0),
    ("**Answer: B**", "B", None, 1.0),
    ("It is B.", "B", None, 1.0),
    ("B) Paris", "B", None, 1.0),
    ("<think>not (A)</think><answer>C</answer>", "C", None, 1.0),
    ("Reasoning about (A) and (C).\nThe answer is (B).", "B", None, 1.0),  # unmarked: the last line
    ("The answer is B", 1, None, 1.0),  # 0-based index
    ("Paris", "B", ["Rome", "Paris", "Berlin"], 1.0),
    ("<answer>paris.</answer>", "Paris", ["Rome", "Paris"], 1.0),  # text reference, text answer
    ("<answer>B</answer>", "Paris", ["Rome", "Paris"], 1.0),  # text reference, letter answer
    ("It is dark red", "B", {"A": "red", "B": "dark red"}, 1.0),  # "red" inside "dark red" is no hedge
    ("C", "B", None, 0.0),
    ("A or B", "B", None, 0.0),  # hedges
    ("A, B", "B", None, 0.0),
    ("(A) (B)", "B", None, 0.0),
    ("<answer>B/C</answer>", "B", None, 0.0),
    ("Paris or Rome", "B", ["Rome", "Paris"], 0.0),
    ("A dog", "A", None, 0.0),  # an article is not an answer
    ("E", "E", ["x", "y", "z"], 0.0),  # a letter beyond the options
    ("B", None, None, 0.0),
    ("B", 7, ["x", "y"], 0.0),
    ("B", {"a": 1}, None, 0.0),
    ("B", "B", "not a list", 1.0),  # unreadable options are ignored
    (None, "B", None, 0.0),
])
def test_choice(completion, answer, choices, expected):
    assert score("choice", completion, answer, choices=choices) == expected


# ------------------------------------------------------------------------------------------------
# number


@pytest.mark.parametrize("completion, answer, options, expected", [
    ("<answer>12.5 cm</answer>", 12.5, {}, 1.0),
    ("<answer>1,200</answer>", "1200", {}, 1.0),
    ("<answer>3/4</answer>", 0.75, {}, 1.0),
    (r"\boxed{\frac{3}{4}}", "0.75", {}, 1.0),
    ("<answer>-2e3</answer>", -2000, {}, 1.0),
    ("<answer>−4</answer>", -4, {}, 1.0),  # Unicode minus
    ("<answer>50%</answer>", 50, {}, 1.0),  # % is a unit: 50% is 50
    ("<answer>50%</answer>", 0.5, {}, 0.0),
    ("<answer>x = 3, so 3</answer>", 3, {}, 1.0),  # the same number repeated
    ("Step: 2 + 5 = 7\nTotal: 7 apples", 7, {}, 1.0),  # unmarked: the last line
    ("<answer>3.14</answer>", "3.14159", {"rel_tol": 0.01}, 1.0),
    ("<answer>3.14</answer>", "3.14159", {}, 0.0),
    ("<answer>0.001</answer>", 0, {"abs_tol": 0.01}, 1.0),
    ("<answer>12 or 13</answer>", 12, {}, 0.0),  # hedges
    ("<answer>between 3 and 5</answer>", 3, {}, 0.0),
    ("<answer>3-5</answer>", 3, {}, 0.0),
    ("<answer>1,2</answer>", 1.2, {}, 0.0),  # not a decimal comma
    ("<answer>nan</answer>", 1, {}, 0.0),
    ("<answer>1e999</answer>", 1e308, {}, 0.0),
    ("<answer>1/0</answer>", 1, {}, 0.0),
    ("<answer>" + "9" * 5000 + "</answer>", 1e308, {}, 0.0),
    ("<answer>seven</answer>", 7, {}, 0.0),
    ("<answer>7</answer>", None, {}, 0.0),
    ("<answer>7</answer>", True, {}, 0.0),
    ("<answer>7</answer>", "7 or 8", {}, 0.0),  # an unreadable reference
    ("<answer>7</answer>", 10 ** 400, {}, 0.0),
])
def test_number(completion, answer, options, expected):
    assert score("number", completion, answer, **options) == expected


# ------------------------------------------------------------------------------------------------
# exact


@pytest.mark.parametrize("completion, answer, expected", [
    ("<answer>Paris</answer>", "paris", 1.0),
    ("<answer>  New   York. </answer>", "new york", 1.0),
    (r"\boxed{Blue}", "blue", 1.0),
    ("Rome", ["Roma", "Rome"], 1.0),
    ("<answer>42</answer>", 42, 1.0),
    ("<answer>Paris, France</answer>", "Paris", 0.0),
    ("<answer>paris</answer> extra text", "paris", 1.0),  # the block is the answer
    ("paris extra text", "paris", 0.0),  # unmarked: the whole text
    ("<answer></answer>", "", 0.0),  # an empty reference matches nothing
    ("<answer>x</answer>", None, 0.0),
    ("<answer>x</answer>", {"x": 1}, 0.0),
])
def test_exact(completion, answer, expected):
    assert score("exact", completion, answer) == expected


# ------------------------------------------------------------------------------------------------
# iou


@pytest.mark.parametrize("completion, answer, options, expected", [
    ("<answer>[0, 0, 10, 10]</answer>", [0, 0, 10, 10], {}, 1.0),
    ("<answer>[0, 0, 10, 10]</answer>", [0, 0, 10, 20], {}, 0.5),
    ("<answer>[0, 0, 10, 10]</answer>", "[0, 0, 10, 20]", {}, 0.5),  # a JSON string reference
    ('<answer>[{"bbox_2d": [0, 0, 10, 10], "label": "cat 2"}]</answer>', [0, 0, 10, 10], {}, 1.0),
    ("<answer>(0, 0), (10, 10)</answer>", [0, 0, 10, 10], {}, 1.0),  # plain numbers
    ("<answer>[0,0,10,10] [20,20,30,30]</answer>", [[20, 20, 30, 30], [0, 0, 10, 10]], {}, 1.0),  # any order
    ("<answer>[0,0,10,10]</answer>", [[0, 0, 10, 10], [20, 20, 30, 30]], {}, 0.5),  # a missed box
    ("<answer>[0,0,10,10], [50,50,60,60]</answer>", [0, 0, 10, 10], {}, 0.5),  # an extra box
    ("<answer>[0,0,10,10]</answer>", {"bbox": [0, 0, 10, 10]}, {}, 1.0),
    ("<answer>[0, 0, 10, 10]</answer>", [0, 0, 10, 20], {"threshold": 0.5}, 1.0),
    ("<answer>[0, 0, 10, 10]</answer>", [0, 0, 10, 30], {"threshold": 0.5}, 0.0),
    ("<answer>[10, 10, 0, 0]</answer>", [0, 0, 10, 10], {}, 0.0),  # swapped corners are degenerate
    ("<answer>[0, 0, 0, 10]</answer>", [0, 0, 10, 10], {}, 0.0),  # zero width
    ("<answer>[NaN, 0, 10, 10]</answer>", [0, 0, 10, 10], {}, 0.0),
    ("<answer>[0, 0, 1e300, 1e300]</answer>", [0, 0, 10, 10], {}, 0.0),  # huge
    ("<answer>[0, 0, 10]</answer>", [0, 0, 10, 10], {}, 0.0),  # three numbers
    ("<answer>[" + "9" * 5000 + ", 0, 10, 10]</answer>", [0, 0, 10, 10], {}, 0.0),
    ("no box", [0, 0, 10, 10], {}, 0.0),
    ("<answer>[0, 0, 10, 10]</answer>", [10, 10, 0, 0], {}, 0.0),  # a degenerate reference
    ("<answer>[0, 0, 10, 10]</answer>", None, {}, 0.0),
    ("<answer>[0, 0, 10, 10]</answer>", [[0, 0, 10, 10]] * 100, {}, 0.0),  # too many boxes
])
def test_iou(completion, answer, options, expected):
    assert score("iou", completion, answer, **options) == pytest.approx(expected)


# ------------------------------------------------------------------------------------------------
# json_f1


@pytest.mark.parametrize("completion, answer, options, expected", [
    ('<answer>{"name": "Ada", "age": 36}</answer>', {"name": "ada", "age": "36"}, {}, 1.0),
    ('<answer>{"name": "Ada"}</answer>', {"name": "Ada", "age": 36}, {}, 2 / 3),  # P=1, R=1/2
    ('<answer>{"name": "Ada", "x": 1}</answer>', {"name": "Ada", "age": 36}, {}, 0.5),
    ('<answer>{"name": "Ada"}</answer>', {"name": "Ada", "age": 36}, {"beta": 2.0}, 5 / 9),  # recall weighs more
    ('<answer>{"a": {"b": 1}}</answer>', {"a": {"b": 1}}, {}, 1.0),  # nested keys flatten
    ('<answer>{"a": 1}</answer>', '{"a": 1}', {}, 1.0),  # a JSON string reference
    ('<answer>{"k": "red", "k": "blue"}</answer>', {"k": "red"}, {}, 0.0),  # one value per key
    ("<answer>name: Ada</answer>", {"name": "Ada"}, {}, 0.0),  # no JSON object
    ('<answer>{"a": 1}</answer>', "not json", {}, 0.0),
    ('<answer>{"a": 1}</answer>', [1], {}, 0.0),
    ('<answer>{"a": 1}</answer>', {"a": 10 ** 5000}, {}, 0.0),
])
def test_json_f1(completion, answer, options, expected):
    assert score("json_f1", completion, answer, **options) == pytest.approx(expected)


# ------------------------------------------------------------------------------------------------
# format


@pytest.mark.parametrize("completion, options, expected", [
    ("<think>2+2</think><answer>4</answer>", {}, 1.0),
    ("\n<think>\nlong\n</think>\n\n<answer> 4 </answer>\n", {}, 1.0),
    ("<answer>4</answer>", {}, 0.0),  # no think block
    ("<think>a</think>", {}, 0.0),
    ("<think>a</think>text<answer>4</answer>", {}, 0.0),  # text between the blocks
    ("<think>a</think><answer>4</answer> trailing", {}, 0.0),
    ("preamble <think>a</think><answer>4</answer>", {}, 0.0),
    ("<think>a</think><answer> </answer>", {}, 0.0),  # a blank answer
    ("<answer>4</answer><think>a</think>", {}, 0.0),  # wrong order
    ("<think>a</think><answer>4</answer><answer>5</answer>", {}, 0.0),  # repeated blocks
    ("<think><think>a</think></think><answer>4</answer>", {}, 0.0),  # nested
    ("<reason>a</reason><final>4</final>", {"think_tag": "reason", "answer_tag": "final"}, 1.0),
    ("<think>a</think><answer>4</answer>", {"think_tag": "reason", "answer_tag": "final"}, 0.0),
    (None, {}, 0.0),
])
def test_format(completion, options, expected):
    assert score("format", completion, None, **options) == expected
