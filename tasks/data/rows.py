"""Row layouts, image cells and prompt templates: one dataset row → prompt, answer, system and images.

Layouts recognised from the column names (or fixed by ``task.args.columns``):

- **conversations** (LLaVA / ShareGPT): ``conversations: [{from: human|user, value: "<image>\\n..."},
  {from: gpt|assistant, value: ...}]``; also OpenAI-style ``messages: [{role, content}]`` whose content
  is a string or a list of ``{type: text, text}`` / ``{type: image}`` parts. One user turn, optionally
  a system turn first and an assistant turn after it (its text is the answer).
- **columns** (EasyR1 and plain tables): the prompt in the first of :data:`PROMPT_COLUMNS`, the answer
  in the first of :data:`ANSWER_COLUMNS`.

In both, images come from the first of :data:`IMAGE_COLUMNS` and a ``system`` column, when present,
is the row's system prompt. An image cell is a path (relative to the data file's folder or
``image_root``), bytes, a ``datasets.Image`` dict (``{bytes, path}``), a PIL image, or a list of those.
"""

from __future__ import annotations

import io
import json
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from mmrl.core.contracts import IMAGE_PLACEHOLDER
from mmrl.tasks.data.loading import DataError

CONVERSATION_COLUMNS = ("conversations", "messages")
PROMPT_COLUMNS = ("prompt", "problem", "question")
ANSWER_COLUMNS = ("answer", "solution", "ground_truth")
IMAGE_COLUMNS = ("images", "image")
ROLES = ("prompt", "conversations", "answer", "images", "system")
"""Keys of ``task.args.columns`` with a meaning; any other key renames a column for the verifier."""
USER_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "model": "assistant",
              "bot": "assistant", "system": "system"}
LAYOUTS_HELP = ("recognised layouts: LLaVA/ShareGPT ('conversations': [{from, value}]), OpenAI 'messages' "
                "([{role, content}]), or a prompt column (one of " + ", ".join(PROMPT_COLUMNS) + ") with an answer "
                "column (one of " + ", ".join(ANSWER_COLUMNS) + "), images in one of " + ", ".join(IMAGE_COLUMNS) +
                "; or map your columns with task.args.columns: {prompt: ..., answer: ..., images: ...}")


@dataclass(frozen=True)
class Layout:
    """Which column plays which role in one data source."""

    prompt: str | None  # a text column (columns layout)
    conversations: str | None  # a list-of-turns column (conversations layout); exactly one of the two is set
    answer: str | None
    images: str | None
    system: str | None
    aliases: Mapping[str, str] = field(default_factory=dict)  # verifier name → column


def detect_layout(columns: Sequence[str], mapping: Mapping[str, str], where: str) -> Layout:
    """The :class:`Layout` of a source with these ``columns``; ``mapping`` (``task.args.columns``) wins."""
    missing = {role: col for role, col in mapping.items() if col not in columns}
    if missing:
        role, col = next(iter(missing.items()))
        raise DataError(f"task.args.columns.{role}: {where} has no column {col!r}; its columns: {', '.join(columns)}")

    def pick(role: str, candidates: Sequence[str]) -> str | None:
        if role in mapping:
            return mapping[role]
        return next((c for c in candidates if c in columns), None)

    prompt = mapping.get("prompt")
    conversations = mapping.get("conversations")
    if prompt and conversations:
        raise DataError("task.args.columns: give prompt (a text column) or conversations (a list of turns), not both")
    if not (prompt or conversations):
        conversations = pick("conversations", CONVERSATION_COLUMNS)
        if conversations is None:
            prompt = pick("prompt", PROMPT_COLUMNS)
    if not (prompt or conversations):
        raise DataError(f"{where}: unknown data layout (columns: {', '.join(columns)}); {LAYOUTS_HELP}")
    aliases = {name: col for name, col in mapping.items() if name not in ROLES}
    return Layout(prompt, conversations, pick("answer", ANSWER_COLUMNS), pick("images", IMAGE_COLUMNS),
                  pick("system", ("system",)), aliases)


@dataclass(frozen=True)
class RowFields:
    """What a row says, before templating: user text (with its ``<image>`` placeholders as written),
    reference answer, system prompt and the undecoded image cells."""

    text: str
    answer: Any
    system: str | None
    image_cells: tuple[Any, ...]


def row_fields(cells: Mapping[str, Any], layout: Layout, where: str) -> RowFields:
    """Read one row through its layout; a malformed row is a :class:`DataError` naming it (``where``)."""
    system = cells.get(layout.system) if layout.system else None
    answer = cells.get(layout.answer) if layout.answer else None
    if layout.conversations:
        text, turn_system, turn_answer = read_turns(cells.get(layout.conversations), where)
        system = system if system is not None else turn_system
        answer = answer if answer is not None else turn_answer
    else:
        text = cells.get(layout.prompt)
        if not isinstance(text, str):
            raise DataError(f"{where}: column {layout.prompt!r} must hold text, got {type(text).__name__}")
    if system is not None and not isinstance(system, str):
        raise DataError(f"{where}: the system prompt must be text, got {type(system).__name__}")
    return RowFields(text, answer, system, image_cells(cells.get(layout.images) if layout.images else None))


def read_turns(turns: Any, where: str) -> tuple[str, str | None, str | None]:
    """(user text, system text, assistant text) of a single-turn conversation in either turn style."""
    if not isinstance(turns, list) or not all(isinstance(t, Mapping) for t in turns):
        raise DataError(f"{where}: the conversation must be a list of turns ({{from, value}} or {{role, content}}), "
                        f"got {type(turns).__name__}")
    by_role: dict[str, list[str]] = {"system": [], "user": [], "assistant": []}
    for k, turn in enumerate(turns):
        raw_role = turn.get("from", turn.get("role"))
        role = USER_ROLES.get(str(raw_role).lower())
        if role is None:
            raise DataError(f"{where}: turn {k} has role {raw_role!r}; known roles: {', '.join(USER_ROLES)}")
        by_role[role].append(turn_text(turn.get("value", turn.get("content")), where, k))
    if len(by_role["user"]) != 1 or len(by_role["assistant"]) > 1 or len(by_role["system"]) > 1:
        counts = ", ".join(f"{len(v)} {r}" for r, v in by_role.items())
        raise DataError(f"{where}: the conversation has {counts} turns; data tasks train single-turn prompts "
                        f"(at most one system turn, one user turn, at most one assistant turn)")
    assistant = by_role["assistant"][0] if by_role["assistant"] else None
    return by_role["user"][0], (by_role["system"] or [None])[0], assistant


def turn_text(content: Any, where: str, k: int) -> str:
    """A turn's text; OpenAI content parts become text, with one placeholder per ``{type: image}`` part."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for part in content:
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind == "text":
                pieces.append(str(part.get("text", "")))
            elif kind in ("image", "image_url"):
                pieces.append(IMAGE_PLACEHOLDER)
            else:
                raise DataError(f"{where}: turn {k} has a content part {part!r}; parts are {{type: text, text}} "
                                f"or {{type: image}}")
        return "".join(pieces)
    raise DataError(f"{where}: turn {k} content must be text or a list of parts, got {type(content).__name__}")


def image_cells(cell: Any) -> tuple[Any, ...]:
    """A row's image cell as a tuple of single images (a missing cell is no image)."""
    if cell is None:
        return ()
    if isinstance(cell, (list, tuple)):
        return tuple(cell)
    return (cell,)


def decode_image(cell: Any, root: Path | None, where: str) -> Image.Image:
    """An RGB PIL image from one image cell, fully read now; a DataError names the row and the path."""
    path: Path | None = None
    data: bytes | None = None
    if isinstance(cell, Image.Image):
        image = cell
    else:
        if isinstance(cell, Mapping):  # datasets.Image(decode=False) cells: {"bytes": ..., "path": ...}
            data, raw_path = cell.get("bytes"), cell.get("path")
            path = Path(raw_path) if data is None and raw_path else None
        elif isinstance(cell, (bytes, bytearray)):
            data = bytes(cell)
        elif isinstance(cell, str):
            path = Path(cell).expanduser()
        else:
            raise DataError(f"{where}: an image cell must be a path, bytes, an Image dict or a PIL image, "
                            f"got {type(cell).__name__}")
        if path is not None:
            if not path.is_absolute() and root is not None:
                path = root / path
            if not path.is_file():
                raise DataError(f"{where}: image file {str(path)!r} not found (relative paths are read from "
                                f"task.args.image_root, default the data file's folder)")
        if data is None and path is None:
            raise DataError(f"{where}: an image cell has neither bytes nor a path")
        try:
            image = Image.open(io.BytesIO(data) if data is not None else path)
        except Exception as err:  # PIL raises several kinds for unreadable files
            raise DataError(f"{where}: image {str(path) if path else '(bytes)'} is unreadable ({err})") from None
    try:
        image.load()
    except Exception as err:
        raise DataError(f"{where}: image {str(path) if path else '(bytes)'} is corrupt or truncated ({err})") from None
    return image if image.mode == "RGB" else image.convert("RGB")


def place_images(text: str, count: int, where: str) -> str:
    """``text`` with one placeholder per image: as written, or prepended when the text has none."""
    found = text.count(IMAGE_PLACEHOLDER)
    if found == count:
        return text
    if found == 0:
        return IMAGE_PLACEHOLDER * count + text
    raise DataError(f"{where}: the prompt has {found} {IMAGE_PLACEHOLDER} placeholder(s) but the row has {count} "
                    f"image(s); write one placeholder per image (or none: images are then put first)")


class Template:
    """The prompt template: a Python format string (``"{prompt}\\nAnswer in <answer></answer>."``), or a
    Jinja template when it contains ``{{`` or ``{%`` (as EasyR1's ``format_prompt``: ``{{ content }}``).

    Fields: ``prompt`` (also ``content``) is the row's user text; every column is a field too.
    """

    def __init__(self, source: str | None):
        self.source = source
        self.jinja = None
        if source is not None and ("{{" in source or "{%" in source):
            import jinja2

            try:
                self.jinja = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(source)
            except jinja2.TemplateSyntaxError as err:
                raise DataError(f"task.args.template is not a valid Jinja template: {err}") from None
        elif source is not None:
            try:
                list(string.Formatter().parse(source))
            except ValueError as err:
                raise DataError(f"task.args.template is not a valid format string ({err}); write literal braces "
                                f"as {{{{ and }}}}") from None

    def render(self, text: str, cells: Mapping[str, Any], where: str) -> str:
        if self.source is None:
            return text
        fields = {**cells, "prompt": text, "content": text}
        try:
            if self.jinja is not None:
                return self.jinja.render(**fields)
            return self.source.format(**fields)
        except (KeyError, IndexError, AttributeError, ValueError) as err:
            raise DataError(f"{where}: task.args.template uses {err} which the row lacks; fields: "
                            f"{', '.join(sorted(fields))}") from None
        except Exception as err:  # jinja2.UndefinedError and friends
            raise DataError(f"{where}: task.args.template failed ({err}); fields: {', '.join(sorted(fields))}") from None


def answer_text(answer: Any) -> str | None:
    """The reference answer as text (numbers as written, lists and dicts as JSON)."""
    if answer is None or isinstance(answer, str):
        return answer
    if isinstance(answer, (list, dict)):
        return json.dumps(answer, ensure_ascii=False)
    return str(answer)
