"""The adversarial output corpus every registered task's reward must survive (test_reward_adversarial.py).

Text a model can emit (malformed, empty, huge, deeply nested, repeated tags, hedges, huge integers,
non-finite numbers, unicode) and the non-text outputs of the other task kinds with adversarial values
(NaN / huge / wrongly shaped arrays, out-of-range indices, episode summaries with absurd returns).
Every task gets every output: a reward is total for *any* output, not only for its own type.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from PIL import Image

from mmrl.samplers.gym_runner import EpisodeSummary
from mmrl.tasks.parsing import MAX_OUTPUT_CHARS
from mmrl.tasks.robot import EpisodeExample

HUGE = 100_000  # characters: three times the reward length cap

TEXT: dict[str, str] = {
    "empty": "",
    "whitespace": " \n\t" * 100,
    "plain": "the answer is red",
    "malformed tags": "<think>unclosed <answer>red</answr></think><answer",
    "well formed": "<think>ok</think><answer>red</answer>",
    "huge text": "a" * HUGE,
    "huge whitespace run": "a" + " " * HUGE + "b",
    "whitespace run under the cap": "<think>a" + " \t\n" * (MAX_OUTPUT_CHARS // 3 - 30) + "</think> \\boxed{A}",
    "repeated answer tags": "<answer>" * (HUGE // 8),
    "repeated answer tags under the cap": "<answer>" * (MAX_OUTPUT_CHARS // 8 - 1),
    "repeated think closers": "<think>" + "</think>" * (MAX_OUTPUT_CHARS // 8 - 1),
    "repeated full blocks": "<think>t</think><answer>1</answer>" * 900,
    "deeply nested json": "<answer>" + '{"a": ' * 5000 + "1" + "}" * 5000 + "</answer>",
    "deeply nested lists": "<answer>" + "[" * 30_000 + "</answer>",
    "unbalanced braces": "<answer>" + "{" * 30_000 + "</answer>",
    "nested boxed": "\\boxed{" * 4000,
    "hedge answers": "<think>t</think><answer>red</answer><answer>blue</answer><answer>3</answer>",
    "hedge boxed": "<think>t</think>\\boxed{A}\\boxed{B}\\boxed{C}\\boxed{D}",
    "hedge json keys": '<answer>{"triage": "red", "triage": "green", "triage": "yellow", "age": "1", "age": "2"}</answer>',
    "hedge list": "<answer>red, blue, green, yellow, purple, orange, 1, 2, 3</answer>",
    "hedge edges": "<answer>3\n1 0\n2 0\n3 0\n2 1\n3 1\n3 2\n</answer>",
    "huge json integer": '<answer>{"age": ' + "9" * 400 + "}</answer>",
    "json integer at the conversion limit": '<answer>{"age": ' + "9" * 4300 + "}</answer>",
    "json integer past the conversion limit": '<answer>{"age": ' + "9" * 4301 + "}</answer>",
    "huge count line": "<answer>" + "9" * 4301 + "\n1 0</answer>",
    "huge edge line": "<answer>1\n" + "9" * 4301 + " -" + "9" * 5000 + "</answer>",
    "huge boxed integer": "<think>t</think>\\boxed{" + "9" * 5000 + "}",
    "non-finite json": '<answer>{"age": NaN, "sex": Infinity, "x": -Infinity, "y": 1e999}</answer>',
    "non-finite words": "<think>nan</think><answer>nan inf -inf 1e999</answer>",
    "non-finite waypoints": "<think>t</think><answer>[(nan,inf),(1e999,-1e999),(-inf,nan)]</answer>",
    "huge waypoints": "<think>t</think><answer>[(" + "9" * 400 + ",1),(1e308,1e308),(1,1)]</answer>",
    "many waypoints": "<think>t</think><answer>[" + ",".join(["(1,1)"] * 5000) + "]</answer>",
    "unicode": "<think>🙂 ﷽ \u202e ß İ \u0301\u0301</think><answer>\u0663 ٣ 红 ＲＥＤ\x00</answer>",
    "control characters": "\x00\x01\x7f\ufeff<answer>\x00</answer>\udc80",
    "json of everything": "<answer>" + json.dumps({"k" * 1000: ["v" * 100] * 100, "n": [[[[1.5e308]]]]}) + "</answer>",
}


def images() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    speckled = np.full((512, 512, 3), 200, np.uint8)
    speckled[rng.random((512, 512)) < 0.3] = 0
    return {
        "nan image": np.full((16, 16, 3), np.nan),
        "inf image": np.full((16, 16, 3), np.inf, np.float32),
        "huge values": np.full((16, 16, 3), 1e300),
        "negative values": np.full((16, 16, 3), -5, np.int64),
        "speckled 512": speckled,
        "noise 256": rng.integers(0, 256, (256, 256, 3)).astype(np.uint8),
        "flat": np.zeros((16, 16, 3), np.uint8),
        "grey 2d": np.zeros((16, 16), np.uint8),
        "four channels": np.zeros((16, 16, 4), np.uint8),
        "tiny": np.zeros((1, 1, 3), np.uint8),
        "empty array": np.zeros((0, 0, 3), np.uint8),
        "bool image": np.ones((16, 16, 3), bool),
        "complex image": np.full((16, 16, 3), 1 + 2j),
        "object array": np.array([[None, "x"], ["y", 1]], dtype=object),
        "string array": np.full((40, 2), "1"),
        "pil image": Image.new("RGB", (16, 16), (255, 0, 0)),
        "pil grey": Image.new("L", (8, 8)),
    }


VALUES: dict[str, Any] = {
    "none": None, "true": True, "zero": 0, "minus one": -1, "big index": 10 ** 18,
    "integer past the conversion limit": 10 ** 5000, "int64 max": np.int64(2 ** 63 - 1), "float": 3.5,
    "nan": float("nan"), "inf": float("inf"), "bytes": b"<answer>red</answer>", "list": ["red"], "dict": {"a": 1},
    "trajectory of nans": np.full((40, 2), np.nan), "trajectory of infs": np.full((40, 2), np.inf),
    "trajectory far away": np.full((40, 2), 1e308), "trajectory of zeros": np.zeros((40, 2)),
    "trajectory wrong shape": np.zeros((41, 2)), "trajectory of ints": np.zeros((40, 2), np.int64),
}


def episode_summaries(example: Any) -> dict[str, Any]:
    """Summaries of the example's own episode (when it is an episode) with absurd returns, and of another."""
    if not isinstance(example, EpisodeExample):
        return {"summary of some episode": EpisodeSummary("mmrl/Reach-v0", 0, True, 1e9, 5)}
    def own(ret: Any, success: Any = True) -> EpisodeSummary:
        return EpisodeSummary(example.env_id, example.seed, success, ret, 5)
    return {"return 1e9": own(1e9), "return -1e9": own(-1e9, False), "return nan": own(float("nan")),
            "return inf": own(float("inf")), "return 10**400": own(10 ** 400), "return text": own("1.0"),
            "other seed": EpisodeSummary(example.env_id, example.seed + 1, True, 2.0, 5)}


def adversarial_outputs(example: Any) -> dict[str, Any]:
    """Every adversarial output, by name, for ``example``."""
    return {**TEXT, **images(), **VALUES, **episode_summaries(example)}


@pytest.fixture
def adversarial_corpus():
    return adversarial_outputs
