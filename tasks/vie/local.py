"""Real documents from a local folder: ``name.png`` / ``name.jpg`` (/ ``.jpeg``) + ``name.json``.

``name.json`` holds the annotation: a JSON object (nested objects flatten to dotted keys, lists to
indices, as in the reward). An optional ``schema.json`` maps keys to descriptions; keys it lacks
are described by their own name. Everything is checked when the folder is loaded: a corrupt image,
bad JSON, or an image without annotation is a :class:`ValueError` naming the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from mmrl.core.contracts import DataError
from mmrl.tasks.vie.reward import flatten

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


@dataclass(frozen=True)
class LocalDocument:
    name: str  # file stem
    image_path: str
    fields: tuple[tuple[str, str], ...]  # flattened annotation, values as text ("" = absent)


def _value_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else json.dumps(value)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DataError(f"{path}: not valid JSON ({error})") from error


def load_local_folder(folder: str) -> tuple[list[LocalDocument], dict[str, str]]:
    """The annotated documents of ``folder`` (sorted by name) and the key descriptions."""
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"task.args.local_dir: {folder} is not a folder")
    schema: dict[str, str] = {}
    if (root / "schema.json").is_file():
        raw = _read_json(root / "schema.json")
        if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
            raise DataError(f"{root / 'schema.json'}: must be a JSON object of key → description strings")
        schema = dict(raw)
    documents = []
    for image_path in sorted(p for p in root.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES):
        annotation = image_path.with_suffix(".json")
        if not annotation.is_file():
            raise DataError(f"{image_path}: no annotation {annotation.name} beside it")
        try:
            with Image.open(image_path) as image:
                image.load()
        except (OSError, ValueError, SyntaxError) as error:
            raise DataError(f"{image_path}: not a readable image ({error})") from error
        truth = _read_json(annotation)
        if not isinstance(truth, dict) or not truth:
            raise DataError(f"{annotation}: the annotation must be a non-empty JSON object")
        fields = tuple((k, _value_text(v)) for k, v in flatten(truth))
        documents.append(LocalDocument(image_path.stem, str(image_path), fields))
    if not documents:
        raise DataError(f"task.args.local_dir: no {'/'.join(IMAGE_SUFFIXES)} images in {folder}")
    keys = {k for d in documents for k, _ in d.fields}
    return documents, {k: schema.get(k, k) for k in sorted(keys)}
