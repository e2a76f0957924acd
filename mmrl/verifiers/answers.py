"""Short-answer verifiers: ``exact`` (normalised text), ``choice`` (multiple choice), ``number`` (numeric
with tolerances) and ``format`` (``<think>…</think>`` then ``<answer>…</answer>``).

Each reads the answer through :func:`mmrl.verifiers.text.answer_region` (last ``<answer>`` block, else
last balanced ``\\boxed{}``, else the text) and is total: any completion and any reference value give a
score in [0, 1] (a reference it cannot read scores 0).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping

from mmrl.verifiers.base import register_verifier
from mmrl.verifiers.text import answer_region, final_line, normalise, scalar_text

# ------------------------------------------------------------------------------------------------
# exact


@register_verifier("exact")
def exact(completion: object, answer: object) -> float:
    """1.0 when the answer equals the reference after :func:`~mmrl.verifiers.text.normalise` (case,
    whitespace, punctuation at the ends); a list reference lists accepted answers.

    >>> exact("<answer> The Eiffel Tower. </answer>", "the eiffel tower"), exact("Rome", ["Roma", "rome"])
    (1.0, 1.0)
    >>> exact("<answer>Paris, France</answer>", "Paris")
    0.0
    """
    region = answer_region(completion)
    if region is None:
        return 0.0
    predicted = normalise(region.text)
    accepted = answer if isinstance(answer, (list, tuple)) else [answer]
    for reference in accepted:
        text = scalar_text(reference)
        if text is not None and (text := normalise(text)) and predicted == text:
            return 1.0
    return 0.0


# ------------------------------------------------------------------------------------------------
# choice

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
LONE_LETTER = re.compile(r"[(\[]?([A-Za-z])[)\]]?[.:]?")
LETTER_LIST = re.compile(r"[(\[]?[A-Za-z][)\]]?(?:(?:\s*(?:[,/&;|]|\bor\b|\band\b)\s*|\s+)[(\[]?[A-Za-z][)\]]?)+\.?")
LIST_LETTER = re.compile(r"(?<![A-Za-z])[A-Za-z](?![A-Za-z])")
# Each whitespace run is matched by one quantifier (never two adjacent ``\s*``), so no pattern backtracks
# quadratically over a long run of spaces.
CUE_LETTERS = (
    re.compile(r"(?<![A-Za-z])\(([A-Z])\)"),  # (B)
    # answer: B / the answer is (B) / option B
    re.compile(r"(?i:\b(?:answer|option|choice)\b)(?:\s*+(?i:is)\b)?(?:\s*+[:=])?\s*+\(?([A-Z])(?![A-Za-z])"),
    re.compile(r"(?i:\bis)\s++\(?([A-Z])\)?[.!]?\s*+$"),  # it is B
    re.compile(r"^\(?([A-Z])[.):]\s"),  # B. Paris / B) Paris
)
MARKUP = "_'\" \t\n"


def choice_options(choices: object) -> list[str]:
    """Option texts from a list of strings or a mapping letter → text (in letter order); [] otherwise."""
    if isinstance(choices, Mapping):
        items = sorted((str(k).strip().upper(), v) for k, v in choices.items())
        if [k for k, _ in items] != list(LETTERS[:len(items)]):
            return []
        choices = [v for _, v in items]
    if not isinstance(choices, (list, tuple)) or len(choices) > len(LETTERS):
        return []
    return [c if isinstance(c, str) else str(c) for c in choices]


def option_by_text(text: str, options: list[str]) -> str | None:
    """The letter of the one option whose text the answer is or contains; None when none or several do.

    Options contained in another matched option ("red" in "dark red") do not count as a second match.
    """
    answer = normalise(text)
    if not answer:
        return None
    texts = [normalise(option) for option in options]
    for letter, option in zip(LETTERS, texts):
        if option and answer == option:
            return letter
    found = [(letter, option) for letter, option in zip(LETTERS, texts)
             if option and re.search(rf"(?<!\w){re.escape(option)}(?!\w)", answer)]
    found = [(letter, option) for letter, option in found
             if not any(option != other and option in other for _, other in found)]
    return found[0][0] if len({option for _, option in found}) == 1 else None


def letters_in(text: str, valid: str) -> set[str] | None:
    """The option letters ``text`` states: a lone letter ("B", "(b)", "B."), a list of them ("A or B": a
    hedge), or cue forms ("the answer is B", "(B)", "B. Paris"). None when it states no letter."""
    stripped = text.replace("*", "").replace("`", "").strip(MARKUP)
    lone = LONE_LETTER.fullmatch(stripped)
    if lone:
        return {lone.group(1).upper()} & set(valid) or None
    if len(stripped) <= 64 and LETTER_LIST.fullmatch(stripped):
        letters = {m.group().upper() for m in LIST_LETTER.finditer(stripped)}
        if letters <= set(valid):
            return letters
    cues = {m.group(1) for pattern in CUE_LETTERS for m in pattern.finditer(stripped)} & set(valid)
    return cues or None


def reference_letter(answer: object, options: list[str]) -> str | None:
    """The reference as a letter: a letter ("B", "(B)"), a 0-based option index, or an option's text."""
    if isinstance(answer, bool):
        return None
    if isinstance(answer, numbers.Integral):
        index = int(answer)
        return LETTERS[index] if 0 <= index < (len(options) or len(LETTERS)) else None
    if not isinstance(answer, str):
        return None
    lone = LONE_LETTER.fullmatch(answer.strip(MARKUP))
    if lone:
        return lone.group(1).upper()
    return option_by_text(answer, options) if options else None


@register_verifier("choice", row_columns=("choices",))
def choice(completion: object, answer: object, *, choices: tuple[str, ...] | None = None) -> float:
    """1.0 when the completion picks the reference option, by letter or by the option's text.

    The reference is a letter ("B"), a 0-based index (1 → "B") or an option's text; ``choices`` (the
    option texts, from the recipe or the row's ``choices`` column: a list, or a mapping letter → text)
    lets the completion answer with the text. Stating several letters ("A or B") is a hedge: 0. Without
    a marked answer only the last line is read.

    >>> choice("<answer>(B)</answer>", "B"), choice("The answer is B.", 1)
    (1.0, 1.0)
    >>> choice("Paris", "B", choices=["Rome", "Paris"])
    1.0
    >>> choice("<answer>A or B</answer>", "B"), choice("<answer>C</answer>", "B")
    (0.0, 0.0)
    """
    region = answer_region(completion)
    if region is None:
        return 0.0
    text = region.text if region.explicit else final_line(region.text)
    options = choice_options(choices)
    valid = LETTERS[:len(options)] if options else LETTERS
    target = reference_letter(answer, options)
    if target is None:  # a free-text reference without options to map it to a letter
        return exact(text, answer) if isinstance(answer, str) and not options else 0.0
    letters = letters_in(text, valid)
    if letters is None and options:
        picked = option_by_text(text, options)
        letters = {picked} if picked else None
    return 1.0 if letters == {target} else 0.0


# ------------------------------------------------------------------------------------------------
# number

_DIGITS = r"(?:\d{1,3}(?:,\d{3})+(?![\d])|\d+)(?:\.\d+)?|\.\d+"
NUMBER = re.compile(rf"(?<![\w.])([-+]?)({_DIGITS})(?:[eE]([-+]?\d+))?(?:\s*/\s*({_DIGITS}))?")
LATEX_FRACTION = re.compile(r"\\[dt]?frac\s*\{\s*([-+]?[\d.,]+)\s*\}\s*\{\s*([-+]?[\d.,]+)\s*\}")
MAX_NUMBERS = 64
"""An answer stating more numbers than this is not one number (and is not parsed further)."""


def number_value(match: re.Match) -> float:
    """The value of one :data:`NUMBER` match (thousands separators dropped, ``a/b`` divided); may be inf/nan."""
    sign, digits, exponent, denominator = match.groups()
    text = digits.replace(",", "") + (f"e{exponent}" if exponent else "")
    value = float(text)
    if denominator is not None:
        below = float(denominator.replace(",", ""))
        value = value / below if below != 0 else math.nan
    return -value if sign == "-" else value


def stated_numbers(text: str) -> list[float]:
    """Every number stated in ``text``: units and ``%`` are ignored, ``1,200`` is 1200, ``3/4`` and
    ``\\frac{3}{4}`` are 0.75, ``−2e3`` is -2000 (at most :data:`MAX_NUMBERS` + 1 are read).

    >>> stated_numbers("12.5 cm"), stated_numbers("1,200 and -2e3"), stated_numbers("\\\\frac{3}{4} = 75%")
    ([12.5], [1200.0, -2000.0], [0.75, 75.0])
    """
    text = LATEX_FRACTION.sub(r"\1/\2", text.replace("\u2212", "-").replace("\\,", "").replace("{,}", ","))
    values = []
    for match in NUMBER.finditer(text):
        values.append(number_value(match))
        if len(values) > MAX_NUMBERS:
            break
    return values


def single_number(text: str) -> float | None:
    """The one finite value ``text`` states (repeating it is fine); None for none, several, or inf / nan."""
    values = stated_numbers(text)
    if not values or len(values) > MAX_NUMBERS or not all(math.isfinite(v) for v in values):
        return None
    return values[0] if len(set(values)) == 1 else None


def reference_number(answer: object) -> float | None:
    if isinstance(answer, bool):
        return None
    if isinstance(answer, numbers.Real):
        try:
            value = float(answer)
        except (OverflowError, ValueError):
            return None
        return value if math.isfinite(value) else None
    return single_number(answer[:1000]) if isinstance(answer, str) else None


@register_verifier("number")
def number(completion: object, answer: object, *, rel_tol: float = 1e-6, abs_tol: float = 0.0) -> float:
    """1.0 when the answer states exactly one number and it is within tolerance of the reference
    (``math.isclose(predicted, reference, rel_tol=rel_tol, abs_tol=abs_tol)``).

    Units are ignored ("12.5 cm" is 12.5), thousands separators dropped ("1,200" is 1200), fractions
    divided ("3/4", "\\frac{3}{4}" are 0.75); ``%`` is a unit like any other: "50%" is 50, not 0.5.
    Two different numbers ("12 or 13", "between 3 and 5") are a hedge: 0. Without a marked answer only
    the last line is read.

    >>> number("<answer>1,200 m</answer>", 1200), number("it is 3/4", "0.75"), number("12 or 13", 12)
    (1.0, 1.0, 0.0)
    >>> number("\\\\boxed{3.14}", "3.14159", rel_tol=0.01)
    1.0
    """
    if isinstance(rel_tol, bool) or not (rel_tol >= 0 and math.isfinite(rel_tol)):
        raise ValueError(f"rel_tol must be a finite number >= 0, got {rel_tol!r}")
    if isinstance(abs_tol, bool) or not (abs_tol >= 0 and math.isfinite(abs_tol)):
        raise ValueError(f"abs_tol must be a finite number >= 0, got {abs_tol!r}")
    region = answer_region(completion)
    reference = reference_number(answer)
    if region is None or reference is None:
        return 0.0
    predicted = single_number(region.text if region.explicit else final_line(region.text))
    if predicted is None:
        return 0.0
    return 1.0 if math.isclose(predicted, reference, rel_tol=rel_tol, abs_tol=abs_tol) else 0.0


# ------------------------------------------------------------------------------------------------
# format

TAG_NAME = re.compile(r"[A-Za-z][\w\-]*")


@register_verifier("format", uses_answer=False)
def format_tags(completion: object, answer: object = None, *, think_tag: str = "think",
                answer_tag: str = "answer") -> float:
    """1.0 for exactly ``<think>…</think>`` then ``<answer>…</answer>`` (non-blank answer), with only
    whitespace around and between them; else 0.0. Linear: counts and finds, no regex over the text.

    >>> format_tags("<think>2+2</think>\\n<answer>4</answer>"), format_tags("<answer>4</answer>")
    (1.0, 0.0)
    >>> format_tags("<reasoning>r</reasoning><final>4</final>", think_tag="reasoning", answer_tag="final")
    1.0
    """
    for tag in (think_tag, answer_tag):
        if not isinstance(tag, str) or not TAG_NAME.fullmatch(tag):
            raise ValueError(f"a tag name is letters, digits, '_' or '-' (starting with a letter), got {tag!r}")
    if think_tag == answer_tag:
        raise ValueError(f"think_tag and answer_tag must differ, both are {think_tag!r}")
    if not isinstance(completion, str):
        return 0.0
    text = completion.strip()
    marks = [f"<{think_tag}>", f"</{think_tag}>", f"<{answer_tag}>", f"</{answer_tag}>"]
    if any(text.count(mark) != 1 for mark in marks):
        return 0.0
    think_open, think_close, answer_open, answer_close = (text.find(mark) for mark in marks)
    if not (think_open == 0 and think_open < think_close < answer_open < answer_close):
        return 0.0
    if text[think_close + len(marks[1]):answer_open].strip():
        return 0.0
    if not text.endswith(marks[3]) or not text[answer_open + len(marks[2]):answer_close].strip():
        return 0.0
    return 1.0
