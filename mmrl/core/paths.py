"""Where recipes and assets live: ``configs/`` and ``assets/`` of a source checkout, or their copies
installed inside the package as ``mmrl.configs`` and ``mmrl.assets``."""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent  # mmrl/
_CHECKOUT = _PACKAGE.parent


def _folder(name: str) -> Path:
    if (_CHECKOUT / name).is_dir() and (_CHECKOUT / "pyproject.toml").is_file():
        return _CHECKOUT / name
    return _PACKAGE / name  # installed from a wheel: mmrl/configs, mmrl/assets


def recipes_dir() -> Path:
    return _folder("configs")


def assets_dir() -> Path:
    return _folder("assets")


def resolve_asset(path: str) -> Path:
    """``path`` as given if it exists, else relative to the assets folder (``assets/x`` or ``x``)."""
    candidate = Path(path)
    if candidate.exists():
        return candidate
    inside = assets_dir() / (candidate.relative_to("assets") if candidate.parts[:1] == ("assets",) else candidate)
    if inside.exists():
        return inside
    raise FileNotFoundError(f"{path} not found (looked in the working directory and {assets_dir()})")


def cache_root() -> Path:
    """Where built artefacts are cached (warm starts, pretrained embedded models): ``$MMRL_CACHE`` or ~/.cache/mmrl."""
    return Path(os.environ.get("MMRL_CACHE", Path.home() / ".cache" / "mmrl"))
