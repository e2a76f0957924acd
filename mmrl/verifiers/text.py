"""Reading a completion's answer: a length cap, the last ``<answer>`` block, the last balanced ``\\boxed{}``.

Every text verifier reads completions through :func:`answer_region`, so its parsing work is bounded by
:data:`MAX_CHARS` and every step here is linear in the text (``str.rfind`` and one pass over the braces;
no regex that can backtrack over the whole text).
"""

from __future__ import annotations

import numbers
import re
import unicodedata
from dataclasses import dataclass

MAX_CHARS = 16_384
"""Characters of a completion a text verifier reads: the *last* ``MAX_CHARS`` (the answer comes last, so
a long reasoning trace is judged on its tail). 16k characters is about 4k tokens of answer-bearing tail."""
ANSWER_TAG = "answer"
BOXED = re.compile(r"\\boxed\s*\{")
BRACE = re.compile(r"[{}]")


@dataclass(frozen=True)
class Region:
    """Where a completion's answer is: ``text`` and whether it was marked (an answer block or a box)."""

    text: str
    explicit: bool


def tail(completion: object) -> str | None:
    """The last :data:`MAX_CHARS` characters of a text completion; None for anything that is not a string.

    >>> tail("abc"), tail(None), len(tail("x" * 100_000))
    ('abc', None, 16384)
    """
    if not isinstance(completion, str):
        return None
    return completion[-MAX_CHARS:]


def last_tag_block(text: str, tag: str) -> str | None:
    """Content of the last complete ``<tag>…</tag>`` block (the innermost when nested), or None.

    >>> last_tag_block("<a>1</a> <a>2</a> <a>3", "a"), last_tag_block("<a>x", "a")
    ('2', None)
    """
    end = text.rfind(f"</{tag}>")
    if end < 0:
        return None
    opening = f"<{tag}>"
    start = text.rfind(opening, 0, end)
    return None if start < 0 else text[start + len(opening):end]


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}`` whose braces balance (the innermost when nested), or None.

    One pass pairs every brace with its partner, so unbalanced input ("\\boxed{" × 4000) stays linear.

    >>> last_boxed(r"so \\boxed{\\frac{1}{2}} or \\boxed{3"), last_boxed(r"\\boxed{\\boxed{7}}"), last_boxed("7")
    ('\\\\frac{1}{2}', '7', None)
    """
    if "\\boxed" not in text:
        return None
    partner: dict[int, int] = {}
    open_positions: list[int] = []
    for brace in BRACE.finditer(text):
        if brace.group() == "{":
            open_positions.append(brace.start())
        elif open_positions:
            partner[open_positions.pop()] = brace.start()
    best = None
    for box in BOXED.finditer(text):
        brace_at = box.end() - 1
        if brace_at in partner:
            best = text[box.end():partner[brace_at]]
    return best


def answer_region(completion: object, tag: str = ANSWER_TAG) -> Region | None:
    """The answer of a completion: the last ``<tag>`` block if there is one, else the whole (tail) text;
    inside it, the last balanced ``\\boxed{}`` if there is one. None for a non-string completion.

    >>> answer_region("work <answer>\\\\boxed{4}</answer>"), answer_region("so 3")
    (Region(text='4', explicit=True), Region(text='so 3', explicit=False))
    """
    text = tail(completion)
    if text is None:
        return None
    block = last_tag_block(text, tag)
    region = text if block is None else block
    boxed = last_boxed(region)
    if boxed is not None:
        return Region(boxed, True)
    return Region(region, block is not None)


def scalar_text(value: object) -> str | None:
    """A reference scalar as text: a string as is, a finite real number (not a bool) in decimal; None for
    anything else, including integers too long for ``str`` (> 4,300 digits).

    >>> scalar_text(" Paris "), scalar_text(2.5), scalar_text(True), scalar_text(10 ** 5000), scalar_text(float("nan"))
    (' Paris ', '2.5', None, None, None)
    """
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        text = str(value)
    except ValueError:
        return None
    return None if text.lstrip("-") in ("nan", "inf") else text


def final_line(text: str) -> str:
    """The last line with any non-space character ("" when there is none).

    >>> final_line("step 1\\nso 12 cm\\n\\n ")
    'so 12 cm'
    """
    for line in reversed(text.splitlines()):
        if line.strip():
            return line
    return ""


def normalise(text: str) -> str:
    """Canonical text for equality: NFKC, case-folded, runs of whitespace → one space, punctuation at the
    ends removed (``"  The Eiffel-Tower. "`` → ``"the eiffel-tower"``).

    >>> normalise("  The Eiffel-Tower. "), normalise("**Paris**"), normalise("\\u201cRome\\u201d!")
    ('the eiffel-tower', 'paris', 'rome')
    """
    text = " ".join(unicodedata.normalize("NFKC", text).casefold().split())
    start, end = 0, len(text)
    while start < end and (unicodedata.category(text[start]).startswith("P") or text[start] == " "):
        start += 1
    while end > start and (unicodedata.category(text[end - 1]).startswith("P") or text[end - 1] == " "):
        end -= 1
    return text[start:end]
