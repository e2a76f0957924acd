"""``json_f1``: field-level F_β between the JSON object of the answer and a reference dict.

The scoring is the VIE task's (:mod:`mmrl.tasks.vie.reward`, arXiv 2506.13363): keys and values
normalised (case, Unicode, number formats), nested objects flattened to dotted keys, one value per key
(listing candidates never pays), empty values meaning "absent". Here it reads the answer region of
:func:`mmrl.verifiers.text.answer_region` (last ``<answer>`` block, else last ``\\boxed{}``, else the
text), takes its first decodable JSON object, and scores the F_β alone (no format bonus: combine with
``format`` for one).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from mmrl.verifiers.base import register_verifier
from mmrl.verifiers.text import answer_region


def reference_fields(answer: object) -> dict | None:
    """The reference as a flat dict (dotted keys); a JSON object string is decoded. None when unreadable."""
    from mmrl.tasks.vie.reward import flatten  # importing mmrl.tasks registers every task: only when used

    if isinstance(answer, str):
        try:
            answer = json.loads(answer)
        except (ValueError, RecursionError):
            return None
    if not isinstance(answer, Mapping):
        return None
    try:
        return dict(flatten(answer))
    except RecursionError:
        return None


@register_verifier("json_f1")
def json_f1(completion: object, answer: object, *, beta: float = 1.0) -> float:
    """F_β of the answer's JSON fields against the reference dict (β > 1 weighs recall more).

    >>> json_f1('<answer>{"Name": "Ada  Lovelace", "age": "36"}</answer>', {"name": "ada lovelace", "age": 36})
    1.0
    >>> json_f1('{"name": "Ada", "city": "London"}', {"name": "Ada", "age": 36})  # P = 1/2, R = 1/2
    0.5
    """
    from mmrl.tasks.vie.reward import field_scores, parse_prediction

    if isinstance(beta, bool) or not (beta > 0 and math.isfinite(beta)):
        raise ValueError(f"beta must be a finite number > 0, got {beta!r}")
    region = answer_region(completion)
    truth = reference_fields(answer)
    if region is None or truth is None:
        return 0.0
    predicted, _reason = parse_prediction(region.text)
    if predicted is None:
        return 0.0
    try:
        return float(field_scores(predicted, truth, beta)["f1"])
    except ValueError:  # a reference integer too long for str() (> 4,300 digits)
        return 0.0
