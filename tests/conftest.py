"""Shared fixtures: an isolated warm-start cache and quiet, short sanity-task configs."""

from __future__ import annotations

import os

import pytest

QUIET = ["log.progress=false", "log.tensorboard=false"]


# Where experiment trackers keep state outside a run folder (trackio's store, wandb's staging and config).
TRACKER_HOMES = ("TRACKIO_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR")


@pytest.fixture(autouse=True, scope="session")
def isolated_cache(tmp_path_factory):
    """Warm starts built by the tests go to a fresh folder, never the user's ~/.cache/mmrl; trackers write
    to fresh folders too, never the user's stores."""
    if "MMRL_CACHE" not in os.environ:
        os.environ["MMRL_CACHE"] = str(tmp_path_factory.mktemp("mmrl_cache"))
    saved = {name: os.environ.get(name) for name in TRACKER_HOMES}
    for name in TRACKER_HOMES:
        os.environ[name] = str(tmp_path_factory.mktemp(name.lower()))
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def sanity_config():
    """A factory: the sanity recipe with overrides, validated."""
    from mmrl.core.config import load_config

    def make(*overrides: str):
        return load_config("sanity/tiny_cpu", [*QUIET, *overrides])

    return make
