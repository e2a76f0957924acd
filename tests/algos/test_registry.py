"""The algorithm registries (mmrl/core/registry.py, mmrl/algos/__init__.py): contents match the package
docstring, unknown names get a "did you mean" error, and a name cannot be silently re-bound."""

from __future__ import annotations

import re

import pytest

import mmrl.algos as algos
from mmrl.core.registry import Registry, UnknownNameError


def _documented_names() -> dict[str, list[str]]:
    """Registry name → names listed in its line of the ``mmrl.algos`` docstring."""
    documented = {}
    for line in algos.__doc__.splitlines():
        match = re.match(r"- ``(\w+)``: (.*)$", line.strip())
        if match:
            listed = re.sub(r"\(.*\)", "", match.group(2))  # drop "(+ the variants of ...)"
            documented[match.group(1)] = [name.strip() for name in listed.split(",") if name.strip()]
    return documented


def test_docstring_lists_every_registry():
    assert set(_documented_names()) == {"ADVANTAGE_ESTIMATORS", "POLICY_LOSSES", "AGGREGATIONS", "KL_ESTIMATORS",
                                        "SHAPING_HOOKS"}


def test_advantage_estimators_include_the_documented_ones():
    # the docstring names the core estimators; the paper variants add more (docs/algorithms.md)
    expected = ["grpo", "rloo", "reinforce_pp", "gae", "returns"]
    assert _documented_names()["ADVANTAGE_ESTIMATORS"] == expected
    assert set(expected) <= set(algos.ADVANTAGE_ESTIMATORS.names())


def test_policy_losses_include_the_documented_ones():
    # the docstring names the core objectives; the paper variants add more (rw_sft, docs/algorithms.md)
    expected = ["ppo_clip", "gspo", "gspo_token", "reinforce", "none"]
    assert _documented_names()["POLICY_LOSSES"] == expected
    assert set(expected) <= set(algos.POLICY_LOSSES.names())


@pytest.mark.parametrize(("registry", "expected"), [
    ("AGGREGATIONS", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]),
    ("KL_ESTIMATORS", ["k1", "k2", "k3", "low_var_kl"]),
])
def test_core_registries_match_the_docstring(registry, expected):
    assert _documented_names()[registry] == expected
    assert getattr(algos, registry).names() == sorted(expected)


def test_shaping_hooks_include_the_documented_ones():
    # the docstring names the core hook; experimental variants may add more (documented in docs/algorithms.md)
    documented = _documented_names()["SHAPING_HOOKS"]
    assert documented == ["adv_clip"]
    assert set(documented) <= set(algos.SHAPING_HOOKS.names())


def test_unknown_name_suggests_a_close_match():
    with pytest.raises(UnknownNameError) as info:
        algos.ADVANTAGE_ESTIMATORS.get("grp0")
    message = str(info.value)
    assert "Did you mean 'grpo'" in message
    assert "advantage estimator" in message and "'grp0'" in message
    assert isinstance(info.value, KeyError)


def test_unknown_name_without_close_match_lists_registered():
    with pytest.raises(UnknownNameError) as info:
        algos.KL_ESTIMATORS.get("wasserstein")
    message = str(info.value)
    assert "Did you mean" not in message
    assert "k1, k2, k3, low_var_kl" in message


def test_double_registration_of_a_different_object_raises():
    registry: Registry = Registry("thing")

    def first():
        return 1

    def second():
        return 2

    registry.register("x", first)
    registry.register("x", first)  # the same object again is a no-op
    with pytest.raises(ValueError, match="already registered"):
        registry.register("x", second)
    assert registry.get("x") is first
    assert len(registry) == 1 and "x" in registry and list(registry) == ["x"]


def test_decorator_registration():
    registry: Registry = Registry("thing")

    @registry.register("double")
    def double(x):
        return 2 * x

    assert registry.get("double") is double and double(3) == 6
