"""Every built-in text verifier on 10,000 generated completions: no exception, a finite score in [0, 1],
within a time budget; and each huge input (100k characters) within a per-call budget.

The completions are seeded: a third random character soup, two thirds built from a grammar of the
things that break parsers (nested / repeated / unclosed tags, ``\\boxed{`` with unbalanced braces, huge
integers, ``nan`` / ``inf``, JSON fragments, hedges, unicode and control characters, whitespace runs).
References are drawn from each verifier's own well-formed values and from malformed ones.
"""

from __future__ import annotations

import math
import random
import time

import pytest

from mmrl.verifiers import VERIFIERS

N_COMPLETIONS = 10_000
FUZZ_BUDGET_S = 30.0
"""CPU seconds (``time.process_time``) for the whole fuzz of one verifier: a guard against a pathological
input (a regex or parser that blows up), not a speed target (those live in ``bench/``). Measured on a 2-core
machine: math 7.1 s quiet and 10.6–10.7 s with three other jobs running (process time grows under load too),
json_f1 2.1 s, the others 0.05–0.8 s."""
CALL_BUDGET_S = 0.5
"""CPU seconds for one call on a 100k-character input. Measured: ≤ 50 ms."""

SOUP = ("abcxyzABCDE0123456789 \n\t.,;:-+*/^_=()[]{}<>$%\\\"'!?" "🙂ß\u202e\u0301\x00\x7f" "αβπ√∞≤红")
PIECES = [
    "<think>", "</think>", "<answer>", "</answer>", "<answer", "</answr>", "\\boxed{", "\\boxed", "{", "}", "$",
    "\\(", "\\)", "\\frac{1}{2}", "\\frac{", "\\sqrt{2}", "^", "x", "=", "(", ")", "[", "]", ",", " ", "\n", "\t",
    "A", "B", "(B)", "C.", "D)", "answer is", "The answer is ", "Answer: ", "option", " or ", " and ", "/",
    '{"name": ', '"Ada"', '"age": ', ': ', '[0, 0, 10, 10]', '{"bbox_2d": ', '[', ']', "null", "true",
    "nan", "NaN", "inf", "-inf", "Infinity", "1e999", "-2e3", "1,200", "3/4", "50%", "12.5 cm", "0", "-1",
    "\u2212", "🙂", "\u202e", "\x00", "\udc80", "ＲＥＤ", "٣", "İ", "红", "\ufeff", "**", "`",
]
HUGE = [
    "a" * 100_000, " " * 100_000, "<answer>" * 12_500, "\\boxed{" * 14_000, "{" * 100_000, "}" * 100_000,
    "9" * 100_000, "[" * 100_000, "answer" + " " * 100_000 + "x", "<think>" + "x" * 100_000 + "</think><answer>1</answer>",
    "(A) " * 25_000, "1, " * 33_000, "[0,0,1,1]," * 10_000, '{"a": ' * 16_000, "is " * 33_000 + "B",
    "$" * 100_000, "\\frac{" * 16_000, "<answer>" + "1/" * 50_000 + "</answer>",
]
REFERENCES = {
    "math": ["3", "\\frac{1}{2}", "0.5", "x = 3", "\\sqrt{2}", "{1, 2}", 7, 2.5],
    "number": [3, -2000, "1,200", "3/4", "50%", 0.75, "12.5 cm"],
    "choice": ["A", "B", "(C)", 1, "Paris"],
    "exact": ["Paris", "new york", ["Rome", "Roma"], 3],
    "iou": [[0, 0, 10, 10], [[0, 0, 10, 10], [5, 5, 20, 20]], "[0, 0, 10, 10]", {"bbox_2d": [1, 1, 4, 4]}],
    "json_f1": [{"name": "Ada", "age": 36}, '{"a": 1, "b": {"c": 2}}', {"k": [1, 2]}],
    "format": [None],
}
MALFORMED = [None, float("nan"), float("inf"), 10 ** 5000, {"a": 10 ** 5000}, "", "9" * 5000, [], {}, [[[]]], {"a": {"b": None}},
             "[nan, 0, 1, 1]", b"bytes", object(), True, -1, ["x"] * 100, "{" * 1000, "\\boxed{" * 100]
CHOICES = [None, ["Rome", "Paris", "Berlin"], {"A": "red", "B": "dark red"}, ["1", "10", "100"], [None, 3], "AB"]
TEXT_VERIFIERS = ["math", "number", "choice", "exact", "iou", "json_f1", "format"]


def grammar_completion(rng: random.Random) -> str:
    pieces = [rng.choice(PIECES) for _ in range(rng.randint(1, 40))]
    if rng.random() < 0.1:  # a long run of one piece (repeated tags, whitespace, braces)
        pieces.append(rng.choice(PIECES) * rng.randint(100, 3000))
    if rng.random() < 0.05:
        pieces.append("9" * rng.randint(300, 6000))
    return "".join(pieces)


def soup_completion(rng: random.Random) -> str:
    return "".join(rng.choice(SOUP) for _ in range(rng.randint(0, 200)))


def completions(seed: int) -> list[object]:
    rng = random.Random(seed)
    out: list[object] = [grammar_completion(rng) if i % 3 else soup_completion(rng) for i in range(N_COMPLETIONS)]
    out[:6] = [None, 3, b"<answer>1</answer>", ["<answer>1</answer>"], {"content": "1"}, ""]
    return out


def shown(value: object) -> str:
    """A short repr that works for anything (``repr`` of a 5,000-digit integer raises)."""
    try:
        return repr(value)[:80]
    except ValueError:
        return f"<{type(value).__name__} too long to show>"


def references(name: str, rng: random.Random) -> object:
    pool = REFERENCES[name] if rng.random() < 0.8 else MALFORMED
    return rng.choice(pool)


@pytest.mark.parametrize("name", TEXT_VERIFIERS)
def test_fuzz_verifier(name):
    verifier = VERIFIERS.get(name)
    rng = random.Random(1)
    rows = completions(seed=TEXT_VERIFIERS.index(name))
    bad, nonzero = [], 0
    start = time.process_time()
    for completion in rows:
        answer = references(name, rng)
        options = {"choices": rng.choice(CHOICES)} if name == "choice" else {}
        try:
            score = verifier.fn(completion, answer, **options)
        except Exception as err:  # noqa: BLE001 — collect every failure, report them together
            bad.append(f"{shown(completion)} / {shown(answer)}: raised {type(err).__name__}: {err}")
            continue
        if not (isinstance(score, float) and math.isfinite(score) and 0.0 <= score <= 1.0):
            bad.append(f"{shown(completion)} / {shown(answer)}: score {score!r}")
        nonzero += score > 0
    elapsed = time.process_time() - start
    assert not bad, f"{len(bad)} failures, first: {bad[:5]}"
    assert elapsed < FUZZ_BUDGET_S, f"{name}: {N_COMPLETIONS} completions took {elapsed:.1f} s"
    print(f"{name}: {elapsed:.2f} s, {nonzero} nonzero")


@pytest.mark.parametrize("name", TEXT_VERIFIERS)
def test_huge_inputs_are_fast(name):
    verifier = VERIFIERS.get(name)
    slowest = (0.0, "")
    for completion in HUGE:
        for answer in REFERENCES[name][:2]:
            start = time.process_time()
            score = verifier.fn(completion, answer)
            elapsed = time.process_time() - start
            assert math.isfinite(score) and 0.0 <= score <= 1.0
            slowest = max(slowest, (elapsed, completion[:30]))
    assert slowest[0] < CALL_BUDGET_S, f"{name}: {slowest[0]:.2f} s on {slowest[1]!r}..."
