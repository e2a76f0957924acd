"""scripts/results/vla_before_after.py: the before | after grid of episodes of different lengths."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("vla_before_after", ROOT / "scripts/results/vla_before_after.py")
vba = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vba)


def frames(n: int, value: int) -> list[np.ndarray]:
    return [np.full((8, 8, 3), value + t, np.uint8) for t in range(n)]


def test_grid_holds_each_episodes_last_frame_and_colours_its_outcome():
    grid = vba.tile([[(frames(2, 10), False), (frames(4, 100), True)]])
    assert len(grid) == 4 and grid[0].shape == (8, 16, 3)  # the longer episode sets the length; columns side by side
    assert (grid[3][4, 4] == 11).all()  # the 2-frame episode holds its last frame
    assert (grid[3][4, 12] == 103).all()
    assert (grid[0][0, 0] == vba.RED).all() and (grid[0][0, 15] == vba.GREEN).all()  # failed | succeeded borders
