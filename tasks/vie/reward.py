"""Field-level balanced precision / recall reward for JSON extraction (arXiv 2506.13363, section 3.3 of
our spec; the formula is INFERRED: the paper says "balanced precision-recall reward", not which one).

1. Parse: the first ``<answer>…</answer>`` block (fallback: the whole output), and in it the first
   ``{…}`` that decodes as a JSON object. Nested objects flatten to dotted keys (``a.b``), lists to
   indices (``a.0``), so nested ground truth works the same way.
2. Normalise keys (NFKC, case-fold, spaces / hyphens → ``_``) and values (NFKC, case-fold, collapsed
   whitespace, numbers canonical: ``"1,234.50"`` = ``1234.5`` = ``"1234.50"``, no space before a unit).
3. Empty convention: ``""`` / ``null`` / a missing key mean "field absent". Predicted pairs are the
   non-empty predicted values, one per normalised key (unrequested keys included); ground-truth pairs
   are the requested keys with non-empty values. One value per key: a key given several different
   non-empty values (``{"triage": "red", "triage": "green"}``, or ``"Age"`` and ``"age"``) is one
   predicted pair that is wrong, so listing candidate values never pays (repeating the same value is
   one claim). A GT pair is matched at most once.
4. P = correct / predicted pairs, R = correct / GT pairs (both 1 when both sets are empty; P = 0 when
   nothing is predicted but something was expected), F_β = (1+β²)PR / (β²P + R).
5. score = (1 − w)·F_β + w·format, format = exactly one ``<think>…</think><answer>…</answer>``.
   No JSON object, or an output longer than :data:`~mmrl.tasks.parsing.MAX_OUTPUT_CHARS` → 0, with the
   reason in ``info``.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Mapping
from typing import Any

from mmrl.core.contracts import RewardResult
from mmrl.tasks.parsing import tag_blocks, text_problem

MAX_JSON_STARTS = 64
"""How many ``{`` positions are tried as the start of the JSON object."""
WELL_FORMED = re.compile(r"\s*<think>(?:(?!<think>|</think>).)*</think>\s*<answer>(?:(?!<answer>).)*?</answer>\s*",
                         re.DOTALL)
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w.]*\d)")
NUMBER_THEN_UNIT = re.compile(r"(\d)\s+(?=[^\W\d_]|%)")
ZERO = {"precision": 0.0, "recall": 0.0, "f1": 0.0, "format": 0.0, "json_valid": 0.0}


def normalise_key(key: str) -> str:
    """Canonical key: NFKC, case-folded, runs of spaces / hyphens → ``_``.

    >>> normalise_key(" Patient-Name ")
    'patient_name'
    """
    text = unicodedata.normalize("NFKC", key).casefold().strip()
    return re.sub(r"[\s\-]+", "_", text)


def _canonical_number(match: re.Match) -> str:
    text = match.group(0).replace(",", "")
    if len(text) > 40:  # int() refuses > 4300 digits; such strings are compared verbatim
        return text
    value = float(text)
    if not math.isfinite(value):
        return text
    return f"{value:.10f}".rstrip("0").rstrip(".") if "." in text else str(int(text))


def normalise_value(value: Any) -> str:
    """Canonical text of a value; "" means absent.

    >>> normalise_value(" 1,234.50 "), normalise_value(1234.5), normalise_value("5.20  MMOL/L")
    ('1234.5', '1234.5', '5.2mmol/l')
    >>> normalise_value(None), normalise_value(True), normalise_value("007")
    ('', 'true', '7')
    """
    if value is None:
        return ""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, int):  # exact: math.isfinite would convert it to a float (OverflowError past 1e308)
        text = str(value)
    elif isinstance(value, float):
        text = repr(value) if math.isfinite(value) else str(value)
    elif isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    text = unicodedata.normalize("NFKC", text).casefold()
    text = re.sub(r"\s+", " ", text).strip().rstrip(".").strip()
    text = NUMBER.sub(_canonical_number, text)
    return NUMBER_THEN_UNIT.sub(r"\1", text)


def flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Pairs of a (possibly nested) JSON value: objects → dotted keys, lists → indices; keeps duplicates.

    >>> flatten([("a", [("b", 1)]), ("c", [2, 3])])
    [('a.b', 1), ('c.0', 2), ('c.1', 3)]
    """
    pairs: list[tuple[str, Any]] = []
    items = value.items() if isinstance(value, Mapping) else value
    for key, item in items:
        name = f"{prefix}{key}"
        if isinstance(item, (Mapping, list)) and _is_pairs(item):
            pairs += flatten(item, name + ".")
        elif isinstance(item, list):
            pairs += flatten(list(enumerate(item)), name + ".")
        else:
            pairs.append((name, item))
    return pairs


def _is_pairs(item: Any) -> bool:
    """A JSON object as decoded with ``object_pairs_hook=list``: a list of (str, value) tuples."""
    if isinstance(item, Mapping):
        return True
    return all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in item) and bool(item)


def parse_prediction(output: str) -> tuple[list[tuple[str, Any]] | None, str]:
    """The predicted pairs of the first JSON object in the answer block (else the whole output)."""
    blocks = tag_blocks(output, "answer")
    region = blocks[0] if blocks else output
    decoder = json.JSONDecoder(object_pairs_hook=list)
    start = region.find("{")
    for _ in range(MAX_JSON_STARTS):
        if start < 0:
            break
        try:
            value, _end = decoder.raw_decode(region, start)
        except (ValueError, RecursionError):
            start = region.find("{", start + 1)
            continue
        try:
            return flatten(value), ""
        except RecursionError:
            return None, "JSON object nested too deeply"
    where = "<answer> block" if blocks else "output (no <answer> block)"
    return None, f"no JSON object in the {where}"


def one_value_per_key(predicted: list[tuple[str, Any]]) -> list[tuple[str, str | None]]:
    """Normalised (key, value) claims, one per key in first-seen order; empty values are absent, and a
    key given several different values claims None (never right). See the module docstring, step 3.

    >>> one_value_per_key([("Age", 42), ("age", "42"), ("sex", ""), ("triage", "red"), ("triage", "green")])
    [('age', '42'), ('triage', None)]
    """
    values: dict[str, set[str]] = {}
    for key, value in predicted:
        if text := normalise_value(value):
            values.setdefault(normalise_key(key), set()).add(text)
    return [(key, next(iter(texts)) if len(texts) == 1 else None) for key, texts in values.items()]


def field_scores(predicted: list[tuple[str, Any]], truth: Mapping[str, Any], beta: float) -> dict[str, float]:
    """Precision, recall and F_β over normalised pairs (see the module docstring, step 3–4)."""
    wanted = Counter((normalise_key(k), normalise_value(v)) for k, v in truth.items() if normalise_value(v))
    claims = one_value_per_key(predicted)
    remaining = wanted.copy()
    correct = 0
    for pair in claims:
        if remaining[pair] > 0:
            remaining[pair] -= 1
            correct += 1
    n_true, n_pred = sum(wanted.values()), len(claims)
    if n_true == 0 and n_pred == 0:
        return {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    precision = correct / n_pred if n_pred else 0.0
    recall = correct / n_true if n_true else 1.0
    denominator = beta * beta * precision + recall
    f_beta = (1 + beta * beta) * precision * recall / denominator if denominator > 0 else 0.0
    return {"precision": precision, "recall": recall, "f1": f_beta}


def extraction_reward(output: object, truth: Mapping[str, Any], beta: float = 1.0,
                      format_weight: float = 0.1) -> RewardResult:
    """(1 − w)·F_β + w·format over the requested ``truth`` pairs; total for any input.

    >>> extraction_reward('<think>r</think><answer>{"age": "42"}</answer>', {"age": "42"}).score
    1.0
    >>> r = extraction_reward('<answer>{"age": 42, "sex": "M"}</answer>', {"age": "42"})
    >>> round(r.score, 4), r.components["precision"], r.components["recall"]
    (0.6, 0.5, 1.0)
    >>> extraction_reward("age is 42", {"age": "42"}).info
    'no JSON object in the output (no <answer> block)'
    """
    if problem := text_problem(output):
        return RewardResult(0.0, dict(ZERO), problem)
    predicted, reason = parse_prediction(output)
    if predicted is None:
        return RewardResult(0.0, dict(ZERO), reason)
    scores = field_scores(predicted, truth, beta)
    well_formed = float(WELL_FORMED.fullmatch(output) is not None)
    score = (1.0 - format_weight) * scores["f1"] + format_weight * well_formed
    if scores["f1"] < 1.0:
        info = f"field P={scores['precision']:.2f} R={scores['recall']:.2f}"
    elif not well_formed:
        info = "all fields right, but not exactly <think>…</think><answer>…</answer>"
    else:
        info = ""
    return RewardResult(score, scores | {"format": well_formed, "json_valid": 1.0}, info)


def extraction_feedback(output: object, truth: Mapping[str, Any]) -> str | None:
    """What a checker can say about a wrong extraction without giving the values away: the requested fields
    that are missing or wrong, and the fields given that were not asked for (None when every field is right).

    >>> extraction_feedback('<answer>{"age": "41", "sex": "M"}</answer>', {"age": "42", "name": "Ann"})
    'Wrong or missing: age, name. Not asked for: sex. Answer again with one JSON object in <answer></answer>.'
    """
    if problem := text_problem(output):
        return f"Your answer could not be read ({problem}). Answer with one JSON object in <answer></answer>."
    predicted, reason = parse_prediction(output)
    if predicted is None:
        return f"There was {reason}. Answer with one JSON object in <answer></answer>."
    claims = dict(one_value_per_key(predicted))
    wanted = {normalise_key(k): normalise_value(v) for k, v in truth.items()}
    wrong = [k for k, v in truth.items() if normalise_value(v) and claims.get(normalise_key(k)) != wanted[normalise_key(k)]]
    extra = [k for k in claims if k not in wanted]
    if not wrong and not extra:
        return None
    parts = ([f"Wrong or missing: {', '.join(wrong)}."] if wrong else []) + \
        ([f"Not asked for: {', '.join(extra)}."] if extra else [])
    return " ".join(parts + ["Answer again with one JSON object in <answer></answer>."])
