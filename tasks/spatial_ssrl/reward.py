"""Spatial-SSRL reward (seed_tasks.md §1.2, ``img_score`` in the paper's math.py):
``0.9·accuracy + 0.1·format``.

- The response is tag-normalised as ``re.sub(r"\\s*(<|>|/)\\s*", r"\\1", response)`` does (whitespace
  around ``<``, ``>`` and ``/`` removed; computed in linear time by :func:`normalise_tags`);
  format = 1 iff it fullmatches ``<think>.*</think>.*\\boxed\\{.*\\}.*`` (DOTALL).
- Outputs longer than :data:`~mmrl.tasks.parsing.MAX_OUTPUT_CHARS` score 0 unread.
- The answer is the content of the LAST ``\\boxed{…}`` (braces balanced). If several ``\\boxed{}``
  hold different normalised answers, accuracy is 0 (repeating \\boxed cannot hedge).
- Answers are normalised to a tuple of lower-case tokens: brackets, parentheses, commas, semicolons,
  colons and full stops are separators. So "2,0,1,3", "[2, 0, 1, 3]", "2 0 1 3", "(2,0,1,3)" are one
  answer, and "A", "(A)", "A.", "a" are one answer; "A, B, C, D" and "ABCD" are not "A".
"""

from __future__ import annotations

import re

from mmrl.core.contracts import RewardResult
from mmrl.tasks.parsing import text_problem

SEPARATORS = re.compile(r"[\[\](),;:.]")
TAG_CHARS = re.compile(r"([<>/])")


def normalise_tags(text: str) -> str:
    """The paper's ``re.sub(r"\\s*(<|>|/)\\s*", r"\\1", text)`` in linear time (that regex rescans a
    whitespace run from each of its characters: 5 s on 32k spaces between two letters).

    >>> normalise_tags("< think > a b </ think >")
    '<think>a b</think>'
    """
    parts = TAG_CHARS.split(text)  # even indices: text between tag characters; odd: the characters
    for i in range(0, len(parts), 2):
        if i > 0:
            parts[i] = parts[i].lstrip()
        if i < len(parts) - 1:
            parts[i] = parts[i].rstrip()
    return "".join(parts)


def has_format(text: str) -> bool:
    """Whether ``text`` fullmatches ``<think>.*</think>.*\\boxed\\{.*\\}.*`` (DOTALL), in linear time
    (the regex backtracks over every ``</think>``: quadratic). The earliest occurrences decide it.

    >>> has_format("<think>a</think>so \\\\boxed{1}."), has_format("<think>a</think>\\\\boxed{")
    (True, False)
    """
    if not text.startswith("<think>"):
        return False
    end_think = text.find("</think>", len("<think>"))
    boxed = text.find("\\boxed{", end_think + len("</think>")) if end_think >= 0 else -1
    return boxed >= 0 and text.find("}", boxed + len("\\boxed{")) >= 0


def boxed_contents(text: str) -> list[str]:
    """Contents of every ``\\boxed{…}`` with balanced braces, in order.

    >>> boxed_contents(r"a \\boxed{1} b \\boxed{\\{2\\}} \\boxed{x")
    ['1', '\\\\{2\\\\}']
    """
    found, start = [], 0
    while (i := text.find("\\boxed{", start)) >= 0:
        depth, j = 1, i + 7
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        if depth:
            break
        found.append(text[i + 7:j - 1])
        start = j
    return found


def normalise_answer(text: str) -> tuple[str, ...]:
    """Lower-case tokens; brackets and punctuation are separators.

    >>> normalise_answer("[2, 0, 1, 3]") == normalise_answer("2 0 1 3") == ("2", "0", "1", "3")
    True
    """
    return tuple(SEPARATORS.sub(" ", text.lower()).split())


def ssrl_reward(output: object, answer: str, format_weight: float = 0.1) -> RewardResult:
    """(1 − w)·accuracy + w·format with w = 0.1 (paper); total for any input.

    >>> ssrl_reward("<think>t</think> \\\\boxed{2,0,1,3}", "2 0 1 3").score
    1.0
    >>> ssrl_reward("\\\\boxed{A}", "A").score
    0.9
    """
    if problem := text_problem(output):
        return RewardResult(0.0, {"accuracy": 0.0, "format": 0.0}, problem)
    response = normalise_tags(output)
    fmt = float(has_format(response))
    boxed = boxed_contents(response)
    answers = {normalise_answer(b) for b in boxed}
    if not boxed:
        correct, info = 0.0, "no \\boxed{} in the output"
    elif len(answers) > 1:
        correct, info = 0.0, f"{len(answers)} different \\boxed{{}} answers"
    else:
        correct = float(normalise_answer(boxed[-1]) == normalise_answer(answer))
        info = "" if correct else f"wrong answer {boxed[-1][:40]!r} (expected {answer!r})"
    if correct and not fmt:
        info = "right answer, but not <think>…</think> … \\boxed{}"
    return RewardResult((1 - format_weight) * correct + format_weight * fmt, {"accuracy": correct, "format": fmt}, info)
