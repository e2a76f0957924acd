"""Shared fixtures: an isolated warm-start cache and quiet, short sanity-task configs."""

from __future__ import annotations

import os

import pytest

QUIET = ["log.progress=false", "log.tensorboard=false"]


@pytest.fixture(autouse=True, scope="session")
def isolated_cache(tmp_path_factory):
    """Warm starts built by the tests go to a fresh folder, never the user's ~/.cache/mmrl."""
    if "MMRL_CACHE" not in os.environ:
        os.environ["MMRL_CACHE"] = str(tmp_path_factory.mktemp("mmrl_cache"))
    yield


@pytest.fixture
def sanity_config():
    """A factory: the sanity recipe with overrides, validated."""
    from mmrl.core.config import load_config

    def make(*overrides: str):
        return load_config("sanity/tiny_cpu", [*QUIET, *overrides])

    return make
