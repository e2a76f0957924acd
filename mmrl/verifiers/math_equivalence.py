"""``math``: mathematical equivalence of the completion's answer and the reference, through ``math_verify``.

The answer is the last ``<answer>`` block, else the last balanced ``\\boxed{}``, else the last line of
the text (:func:`mmrl.verifiers.text.answer_region`); a marked answer without math delimiters is put
between ``$``; ``math_verify.parse`` reads it and ``math_verify.verify``
compares it with the parsed reference (numbers, fractions, LaTeX expressions, sets, intervals, equations).
``math_verify`` can be slow or raise on adversarial input: each call runs under its own timeout
(:data:`TIMEOUT_S`; signal based, so only in the main thread; elsewhere the length caps alone bound it)
and any exception scores 0.
"""

from __future__ import annotations

import logging
import threading
from functools import lru_cache

from math_verify import parse, verify
from math_verify.errors import TimeoutException

from mmrl.verifiers.base import register_verifier
from mmrl.verifiers.text import answer_region, final_line, scalar_text

TIMEOUT_S = 3
"""Wall-clock seconds allowed to each ``math_verify`` parse / verify call (its signal timeout takes whole
seconds). 1 s was too tight on a loaded CPU: with six busy processes on 2 cores a correct interval answer's first
parse (sympy's lazy imports, 0.2 s at load 4) ran out of it and scored 0; 3 s still stops the pathological
inputs (the slowest measured below is 0.3 s)."""
MAX_PARSED_CHARS = 200
"""Characters of the answer handed to ``math_verify`` (the last ones of its last line when longer). Its
LaTeX grammar and sympy's simplification grow fast with length: at 200 characters 10,000 adversarial
completions take ~6 s and the slowest call 0.3 s; at 300, 10 s and a 1 s timeout. Final answers are
shorter (a 2×2 ``pmatrix`` is 50 characters)."""
DELIMITERS = ("$", "\\(", "\\[", "\\boxed")

logging.getLogger("math_verify").setLevel(logging.ERROR)  # its timeouts are expected on adversarial input


def _timeout() -> int | None:
    """``math_verify``'s signal timeout works only in the main thread; elsewhere it must be off."""
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def as_latex(answer: str) -> str:
    r"""An answer without math delimiters, put between ``$`` so that ``math_verify`` reads it as LaTeX
    ("$x+1$" parses where "x+1" does not; "$Answer: 3$" still parses as 3, "\boxed{Answer: 3}" does not).

    >>> as_latex("\\frac{1}{2}"), as_latex("\\boxed{1}")
    ('$\\frac{1}{2}$', '\\boxed{1}')
    """
    return answer if any(d in answer for d in DELIMITERS) else f"${answer}$"


def shortened(text: str) -> str:
    """``text``, or when longer than :data:`MAX_PARSED_CHARS` the end of its last line."""
    return text if len(text) <= MAX_PARSED_CHARS else final_line(text)[-MAX_PARSED_CHARS:]


@lru_cache(maxsize=8192)
def parse_reference(reference: str) -> tuple:
    """The parsed reference (cached: a dataset repeats each reference group-size times)."""
    try:
        return tuple(parse(reference, parsing_timeout=_timeout()))
    except (Exception, TimeoutException):  # noqa: BLE001 — math_verify raises on adversarial input
        return ()


def reference_latex(answer: object) -> str | None:
    r"""The reference as ``math_verify`` input: a string or a real number; a full solution is reduced to its
    last ``\boxed{}`` (or ``<answer>`` block) like a completion; None for anything else.

    >>> reference_latex(3), reference_latex("x = 3"), reference_latex([3])
    ('$3$', '$x = 3$', None)
    >>> reference_latex("so $y=2$, hence \\boxed{4}.")
    '$4$'
    """
    text = scalar_text(answer)
    region = answer_region(text) if text is not None else None
    if region is None or not region.text.strip():
        return None
    return as_latex(shortened(region.text.strip()))


@register_verifier("math")
def math_equivalence(completion: object, answer: object) -> float:
    """1.0 when the completion's answer is mathematically equal to the reference, else 0.0.

    >>> math_equivalence("so the answer is \\\\boxed{\\\\frac{2}{4}}", "0.5")
    1.0
    >>> math_equivalence("<answer>$\\\\sqrt{4}$</answer>", 2), math_equivalence("\\\\boxed{3}", "2")
    (1.0, 0.0)
    """
    reference = reference_latex(answer)
    region = answer_region(completion)
    if reference is None or region is None:
        return 0.0
    if region.explicit:
        text = as_latex(shortened(region.text))
    else:
        text = shortened(final_line(region.text))
    gold = parse_reference(reference)
    if not gold or not text.strip():
        return 0.0
    try:
        predicted = parse(text, parsing_timeout=_timeout())
        return 1.0 if predicted and verify(list(gold), predicted, timeout_seconds=_timeout()) else 0.0
    except (Exception, TimeoutException):  # noqa: BLE001
        return 0.0
