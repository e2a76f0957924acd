"""A local copy of the published CurveBench data (HF ``AmirMohseni/CurveBench-Easy`` /
``AmirMohseni/CurveBench``): columns ``image``, ``num_nodes``, ``tree`` (list of ``(parent,
child)`` edges, root 0), and optionally ``category``.

Accepted layouts, nothing downloaded:

- a ``.parquet`` file, or a folder of them (as ``datasets`` stores a split; needs ``pyarrow``, which
  is optional: without it a clear error says so). ``image`` is the ``datasets`` Image struct
  ``{"bytes": …, "path": …}``, raw bytes or a path relative to the file;
- a folder with ``metadata.jsonl`` (one JSON object per line: ``file_name`` or ``image`` = an image
  path relative to the folder, ``num_nodes``, ``tree``), as ``datasets``' imagefolder writes it.

Every row is checked on load: an unreadable image, a tree that is not rooted at 0 on nodes
``0..num_nodes``, or a missing column is a :class:`ValueError` naming the row.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

from mmrl.core.contracts import DataError
from mmrl.tasks.curvebench.examples import LoadedExample
from mmrl.tasks.curvebench.trees import canonical_parents, rooted_tree_problem

COLUMNS = ("image", "num_nodes", "tree")


def _open_image(value: Any, base: Path, where: str) -> Image.Image:
    if isinstance(value, dict):
        value = value.get("bytes") or value.get("path")
    try:
        if isinstance(value, (bytes, bytearray)):
            image = Image.open(io.BytesIO(value))
        elif isinstance(value, str):
            image = Image.open(base / value)
        else:
            raise DataError(f"{where}: image must be bytes, a path or a {{bytes, path}} struct, "
                             f"got {type(value).__name__}")
        image.load()
    except (OSError, UnidentifiedImageError) as error:
        raise DataError(f"{where}: unreadable image ({error})") from error
    return image.convert("RGB")


def _row_example(row: dict[str, Any], base: Path, where: str, category: str, system: str | None):
    missing = [c for c in COLUMNS if c not in row]
    if missing:
        raise DataError(f"{where}: missing column(s) {missing}; a CurveBench row has {list(COLUMNS)}")
    try:
        edges = [(int(p), int(c)) for p, c in row["tree"]]
    except (TypeError, ValueError) as error:
        raise DataError(f"{where}: tree must be a list of (parent, child) integer pairs ({error})") from error
    problem = rooted_tree_problem(edges) if edges else ""
    if problem or int(row["num_nodes"]) != len(edges):
        raise DataError(f"{where}: tree is not a rooted tree on 0..num_nodes={row['num_nodes']} "
                         f"({problem or f'{len(edges)} edges'})")
    image = _open_image(row["image"], base, where)
    return LoadedExample(str(row.get("category") or category), where, canonical_parents(edges), image, system)


def _parquet_rows(files: list[Path]) -> list[tuple[str, dict[str, Any]]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as error:
        raise ImportError(f"reading {files[0]} needs pyarrow (`pip install pyarrow`); or convert the split to a "
                          "folder with metadata.jsonl (see mmrl/tasks/curvebench/local.py)") from error
    rows = []
    for file in files:
        for i, row in enumerate(pq.read_table(file).to_pylist()):
            rows.append((f"{file}[{i}]", row))
    return rows


def _jsonl_rows(file: Path) -> list[tuple[str, dict[str, Any]]]:
    rows = []
    for i, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(f"{file}:{i}: not valid JSON ({error})") from error
        if not isinstance(row, dict):
            raise DataError(f"{file}:{i}: each line must be a JSON object")
        if "image" not in row and "file_name" in row:
            row["image"] = row["file_name"]
        rows.append((f"{file}:{i}", row))
    return rows


def load_local(path: str, system: str | None = None) -> list:
    """Every row of the local dataset at ``path`` as a ``LoadedExample`` (checked)."""
    root = Path(path)
    if root.is_file() and root.suffix == ".parquet":
        rows, base = _parquet_rows([root]), root.parent
    elif root.is_dir() and (root / "metadata.jsonl").is_file():
        rows, base = _jsonl_rows(root / "metadata.jsonl"), root
    elif root.is_dir() and sorted(root.glob("*.parquet")):
        rows, base = _parquet_rows(sorted(root.glob("*.parquet"))), root
    else:
        raise FileNotFoundError(f"task.args train_path/test_path: {path} is not a .parquet file or a folder with "
                                "metadata.jsonl or .parquet files")
    if not rows:
        raise DataError(f"{path}: no rows")
    return [_row_example(row, base, where, root.stem, system) for where, row in rows]
