"""Shared guards for rewards that read model text: a length cap, linear-time tag blocks, bounded integers.

Every text reward checks :func:`text_problem` before any regex runs, so its parsing work is bounded by
:data:`MAX_OUTPUT_CHARS`; tag blocks are found with :func:`tag_blocks` (linear) rather than a lazy
``<tag>(.*?)</tag>`` regex, which rescans the rest of the text from every unclosed opening tag
(quadratic: 7.8 s on ``"<answer>"`` repeated to 64k characters).
"""

from __future__ import annotations

import re

MAX_OUTPUT_CHARS = 32_768
"""Longest text output a reward parses; longer ones score the task's floor with "output too long". 8
characters per token at the largest ``max_new_tokens`` of the recipes (4096): no answer needs more."""
MAX_INT_DIGITS = 18
"""Integers with more digits are clamped by :func:`parse_int` (Python refuses to convert > 4,300 digits)."""


def text_problem(output: object, limit: int = MAX_OUTPUT_CHARS) -> str:
    """Why ``output`` is not a text a reward should parse ("" when it is).

    >>> text_problem("<answer>1</answer>"), text_problem(None), text_problem(" "), text_problem("ab", limit=1)
    ('', 'empty or non-text output', 'empty or non-text output', 'output too long (2 > 1 characters)')
    """
    if not isinstance(output, str) or not output.strip():
        return "empty or non-text output"
    if len(output) > limit:
        return f"output too long ({len(output)} > {limit} characters)"
    return ""


def tag_blocks(text: str, tag: str, ignore_case: bool = False) -> list[str]:
    """Contents of the non-overlapping ``<tag>…</tag>`` blocks, left to right, in linear time: the list
    ``re.findall(r"<tag>(.*?)</tag>", text, re.DOTALL)`` returns (with ``re.IGNORECASE`` on the tags when
    ``ignore_case``).

    >>> tag_blocks("<a>1</a> <a>2</a><a>3", "a"), tag_blocks("<A> x </a>", "a", ignore_case=True)
    (['1', '2'], [' x '])
    """
    flags = re.IGNORECASE if ignore_case else 0
    opening, closing = re.compile(re.escape(f"<{tag}>"), flags), re.compile(re.escape(f"</{tag}>"), flags)
    blocks, position = [], 0
    while (start := opening.search(text, position)) is not None:
        end = closing.search(text, start.end())
        if end is None:  # no later closing tag: no later opening tag can be closed either
            break
        blocks.append(text[start.end():end.start()])
        position = end.end()
    return blocks


def parse_int(digits: str) -> int:
    """The integer of an optionally signed decimal digit string; magnitudes beyond ``10**MAX_INT_DIGITS``
    are clamped to ±10**18 (Python's ``int`` raises on more than 4,300 digits; no count, index or id a
    reward compares against comes near either bound, so the verdicts are unchanged).

    >>> parse_int("-007"), parse_int("9" * 5000) == 10 ** 18
    (-7, True)
    """
    sign = -1 if digits.startswith("-") else 1
    body = digits.lstrip("+-").lstrip("0") or "0"
    return sign * (int(body) if len(body) <= MAX_INT_DIGITS else 10 ** MAX_INT_DIGITS)
