"""Shared reward guards (tasks/parsing.py): the length cap, linear tag blocks, bounded integers."""

from __future__ import annotations

import doctest
import re
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from mmrl.tasks import parsing
from mmrl.tasks.parsing import MAX_OUTPUT_CHARS, parse_int, tag_blocks, text_problem


def test_doctests():
    assert doctest.testmod(parsing).failed == 0


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(["<answer>", "</answer>", "<ANSWER>", "</Answer>", "<answer", "x", "\n", " "]),
                max_size=30).map("".join))
def test_tag_blocks_are_the_lazy_regex_findall(text):
    assert tag_blocks(text, "answer") == re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    assert tag_blocks(text, "answer", ignore_case=True) == re.findall(r"<answer>(.*?)</answer>", text,
                                                                      re.DOTALL | re.IGNORECASE)


def test_repeated_opening_tags_take_linear_time():
    start = time.perf_counter()
    assert tag_blocks("<answer>" * 100_000, "answer", ignore_case=True) == []  # the regex: minutes
    assert time.perf_counter() - start < 0.5


def test_the_cap_and_huge_integers():
    assert text_problem("x" * MAX_OUTPUT_CHARS) == ""
    assert "too long" in text_problem("x" * (MAX_OUTPUT_CHARS + 1))
    assert parse_int("12") == 12 and parse_int("-" + "9" * 5000) == -10 ** 18 and parse_int("0" * 5000 + "3") == 3
