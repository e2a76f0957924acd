"""Rows from the user's files: local JSONL / JSON / parquet / CSV, ``save_to_disk`` folders and Hub ids.

Everything goes through the ``datasets`` library, whose Arrow tables are memory-mapped: opening a
file (once converted to the Arrow cache) reads no row into Python. A row becomes Python objects only
when :meth:`RowTable.row` is asked for it, i.e. for the rows a batch samples. The cache lives in
``cache_dir`` (default ``$MMRL_CACHE/datasets``), never in the Hugging Face default under ``~``.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mmrl.core.paths import assets_dir, cache_root
from mmrl.core.typed import ConfigError

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
"""File suffix → ``datasets`` builder."""
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+(@[\w.\-]+)?$")
"""``owner/name`` or ``owner/name@split`` (the split is the task's own split by default)."""


class DataError(ConfigError):
    """A dataset that cannot be used as given: a missing file, column or image, a bad row, an empty split.

    A :class:`~mmrl.core.typed.ConfigError`, so the command line prints it as one line; raised when the
    task is built (before training) or, for a row no eager check reached, when the row is sampled.
    """


@dataclass(frozen=True)
class Part:
    """One loaded source: its Arrow-backed dataset, a name for messages and the folder relative image
    paths of its rows are read from."""

    dataset: Any  # datasets.Dataset
    name: str
    image_root: Path | None


class RowTable:
    """Several parts seen as one sequence of rows (row ``i`` of the table is in exactly one part)."""

    def __init__(self, parts: Sequence[Part]):
        self.parts = list(parts)
        self.offsets = np.cumsum([0] + [len(p.dataset) for p in self.parts])
        self.rows_read = 0
        """Rows turned into Python objects so far (the laziness tests read it)."""

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def locate(self, index: int) -> tuple[Part, int]:
        """The part holding table row ``index`` and the row's index inside it."""
        k = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return self.parts[k], index - int(self.offsets[k])

    def row(self, index: int) -> tuple[dict[str, Any], Part, int]:
        """Row ``index`` as a dict of Python values (decoded now, from the memory-mapped table)."""
        part, local = self.locate(index)
        self.rows_read += 1
        return part.dataset[local], part, local


def default_cache_dir() -> Path:
    return cache_root() / "datasets"


def as_list(files: str | Sequence[str] | None) -> list[str]:
    if files is None:
        return []
    return [files] if isinstance(files, str) else list(files)


def local_path(spec: str) -> Path | None:
    """``spec`` as an existing local path: as given (absolute or relative to the working directory), else
    inside the package's assets folder (``assets/data/...``, also from an installed wheel). None if neither."""
    path = Path(spec).expanduser()
    if path.exists():
        return path
    inside = assets_dir() / (path.relative_to("assets") if path.parts[:1] == ("assets",) else path)
    return inside if inside.exists() else None


def load_parts(files: str | Sequence[str], split: str, cache_dir: Path, image_root: str | None,
               key: str) -> list[Part]:
    """Load every entry of ``files`` (``key`` names the recipe field in errors) as a :class:`Part`."""
    import datasets

    datasets.disable_progress_bars()  # one bar per file conversion would drown the run's own output
    entries = as_list(files)
    if not entries:
        raise DataError(f"task.args.{key} is empty: give a data file, a save_to_disk folder or a Hub id")
    parts = []
    for spec in entries:
        for dataset, name, folder in load_entry(spec, split, cache_dir, key):
            root = Path(image_root).expanduser() if image_root is not None else folder
            parts.append(Part(dataset, name, root))
    return parts


def load_entry(spec: str, split: str, cache_dir: Path, key: str) -> list[tuple[Any, str, Path | None]]:
    """One recipe entry → (dataset, name, folder of the file) triples (a glob may match several files)."""
    if any(c in spec for c in "*?["):
        matches = sorted(glob.glob(str(Path(spec).expanduser())))
        if not matches:
            raise DataError(f"task.args.{key}: the pattern {spec!r} matches no file")
        return [t for match in matches for t in load_entry(match, split, cache_dir, key)]
    path = local_path(spec)
    if path is not None:
        if path.is_dir():
            return [(load_folder(path, split, key), path.name, path)]
        return [(load_file(path, cache_dir), path.name, path.parent)]
    if Path(spec).suffix.lower() in BUILDERS or not HUB_ID.match(spec):
        raise DataError(f"task.args.{key}: no such file or folder {spec!r} (looked in {Path.cwd()} and "
                        f"{assets_dir()})")
    return [(load_hub(spec, split, cache_dir, key), spec, None)]


def load_file(path: Path, cache_dir: Path) -> Any:
    """A local data file as a memory-mapped ``datasets.Dataset`` (converted to the Arrow cache once)."""
    import datasets

    builder = BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise DataError(f"{path}: unknown data file type {path.suffix!r}; use one of {', '.join(BUILDERS)}, "
                        f"or a save_to_disk folder")
    if path.stat().st_size == 0:
        raise DataError(f"{path}: the file is empty (no rows)")
    try:
        return datasets.load_dataset(builder, data_files=str(path.resolve()), split="train",
                                     cache_dir=str(cache_dir))
    except Exception as err:  # pyarrow / datasets say what is wrong with the file; name the file
        if "corresponds to no data" in str(err):  # datasets' words for a file without rows
            raise DataError(f"{path}: the file has no rows") from None
        raise DataError(f"{path}: cannot be read as {builder} ({type(err).__name__}: {str(err)[:300]})") from None


def load_folder(path: Path, split: str, key: str) -> Any:
    """A ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` folder (memory-mapped as saved)."""
    import datasets

    if not ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()):
        raise DataError(f"task.args.{key}: {path} is a folder but not a save_to_disk folder (no dataset_info.json "
                        f"or dataset_dict.json); give its data files instead (a glob such as {path}/*.parquet works)")
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as err:
        raise DataError(f"{path}: cannot be read as a save_to_disk folder ({type(err).__name__}: {str(err)[:300]})"
                        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DataError(f"task.args.{key}: {path} holds the splits {sorted(loaded)}, not {split!r}")
        return loaded[split]
    return loaded


def load_hub(spec: str, split: str, cache_dir: Path, key: str) -> Any:
    """A Hub dataset ``owner/name[@split]`` through the same ``load_dataset`` call (downloads to ``cache_dir``)."""
    import datasets

    name, _, hub_split = spec.partition("@")
    try:
        return datasets.load_dataset(name, split=hub_split or split, cache_dir=str(cache_dir))
    except Exception as err:
        raise DataError(f"task.args.{key}: {spec!r} is no local file or folder, and loading it as a Hugging Face "
                        f"Hub dataset failed ({type(err).__name__}: {str(err)[:300]})") from None


def split_indices(n: int, test_size: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded train / test row indices of a table of ``n`` rows: ``test_size`` < 1 is a fraction of the
    rows, ≥ 1 a count. Both index arrays are sorted (file order within a split)."""
    count = int(round(test_size * n)) if test_size < 1 else int(test_size)
    if test_size <= 0 or (test_size >= 1 and test_size != int(test_size)):
        raise DataError(f"task.args.test_size must be a fraction in (0, 1) or a whole count >= 1, got {test_size}")
    if not 1 <= count < n:
        raise DataError(f"task.args.test_size={test_size} leaves {count} test and {n - count} train rows of {n}; "
                        f"both splits need rows")
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[count:]), np.sort(order[:count])
