"""A TRL-compatible reward file: these functions have the signature of TRL's ``reward_funcs``
(``fn(prompts, completions, **kwargs) -> list[float | None]``), so the same file serves
``trl.GRPOTrainer(reward_funcs=[accuracy, format_bonus])`` and an mmrl recipe::

    task:
      args:
        reward: {examples/trl_reward.py:accuracy: 1.0, examples/trl_reward.py:format_bonus: 0.2}

The dataset must have an ``answer`` column (TRL passes every column as a keyword argument).
"""

from __future__ import annotations

import re

FINAL_LINE = re.compile(r"[^\n]*\S[^\n]*$")


def final_line(text: str) -> str:
    """The last non-blank line of a completion, stripped."""
    match = FINAL_LINE.search(text[-4096:])
    return match.group().strip() if match else ""


def accuracy(prompts: list[str], completions: list[str], answer: list[str], **kwargs) -> list[float | None]:
    """1.0 when the completion's last line (after an optional "Answer:") equals the reference answer,
    ignoring case and surrounding spaces; None for rows without a reference (not applicable)."""
    scores: list[float | None] = []
    for completion, reference in zip(completions, answer):
        if reference is None:
            scores.append(None)
            continue
        line = final_line(completion)
        line = line.split(":", 1)[1] if line.lower().startswith("answer:") else line
        scores.append(1.0 if line.strip().lower() == str(reference).strip().lower() else 0.0)
    return scores


def format_bonus(completions: list[str], **kwargs) -> list[float]:
    """1.0 when the completion ends with an "Answer: ..." line, else 0.0."""
    return [1.0 if final_line(c).lower().startswith("answer:") else 0.0 for c in completions]
