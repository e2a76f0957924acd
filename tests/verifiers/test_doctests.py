"""The examples in the verifiers' docstrings run and hold."""

from __future__ import annotations

import doctest

import pytest

from mmrl.verifiers import answers, base, fields, grounding, math_equivalence, spec, text, user

MODULES = [answers, base, fields, grounding, math_equivalence, spec, text, user]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_doctests(module):
    result = doctest.testmod(module)
    assert result.failed == 0 and (result.attempted > 0 or module in (base, user))  # base: types, no examples
