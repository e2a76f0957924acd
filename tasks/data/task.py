"""``data/rows-v0``: the user's own dataset (file, folder or Hub id) with a verifier from ``mmrl.verifiers``.

Each row becomes a :class:`RowExample` (a :class:`~mmrl.core.contracts.VisualPrompt`, also usable by
the text-only ``causal_lm`` policy through its ``prompt``). The reward is the recipe's verifier spec
(``task.args.reward``: ``exact``, ``{math: 0.9, format: 0.1}``, ``my_rewards.py:fn``, ...), called once
per batch with every dataset column by name and the reference answer as ``columns["answer"]`` (TRL's
convention); its components are logged as ``reward/<name>`` and ``reward/errors`` is the share of rows
whose verifier failed. Range: the verifier's ``reward_range``.

With ``tools`` (``[calc]``), an answer may call a tool (``<tool>calc(7+3)</tool>``; the task is a
:class:`~mmrl.core.contracts.ToolTask`, trained with ``algo.tool_turns``): the result is the next turn, and the
call itself scores the floor.

Rows are read lazily: building the task opens the files (memory-mapped Arrow) and checks the first
``validate_rows`` rows of each split fully (columns, placeholders, images); other rows are decoded,
and their images opened, only when a batch samples them. A bad row found then is a ``DataError``
naming the file, the row and the image path.
"""

from __future__ import annotations

import dataclasses

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mmrl.core.contracts import IMAGE_PLACEHOLDER, FollowUp, RewardResult, hint_prefix
from mmrl.core.registry import UnknownNameError
from mmrl.core.typed import ConfigError
from mmrl.tasks.data.loading import (DataError, Part, RowTable, as_list, default_cache_dir, load_parts,
                                     split_indices)
from mmrl.tasks.data.tools import TOOLS, holds_call, run_tool
from mmrl.tasks.data.rows import (Layout, Template, answer_text, decode_image, detect_layout, place_images,
                                  row_fields)
from mmrl.tasks.parsing import text_problem

TASK_ID = "data/rows-v0"


@dataclass(frozen=True)
class RowsConfig:
    train_files: str | tuple[str, ...]
    """Training rows: a .jsonl / .json / .parquet / .csv file, a glob, a ``save_to_disk`` folder or a Hub
    dataset id (``owner/name`` or ``owner/name@split``), or a list of them. Relative paths are read from
    the working directory, then from the package's assets folder."""
    test_files: str | tuple[str, ...] | None = None
    """Held-out rows, given like ``train_files``. Excludes ``test_size``."""
    test_size: float | None = None
    """Instead of ``test_files``: hold out this share (< 1) or number (>= 1) of the training rows, drawn
    with ``split_seed``. Neither given: the task has only a train split."""
    split_seed: int = 0
    """Seed of the ``test_size`` split (independent of the training seed, so every run holds out the same rows)."""
    columns: dict[str, str] = field(default_factory=dict)
    """Column roles when the layout is not recognised or you want others: ``prompt`` (text) or
    ``conversations`` (list of turns), ``answer``, ``images``, ``system``; any other key passes that
    column to the verifier under the key's name (``{choices: options}``)."""
    template: str | None = None
    """Prompt template: a Python format string (``"{prompt}\\nAnswer in <answer></answer>."``; write literal
    braces as ``{{``/``}}``) or a Jinja template when it contains ``{{`` (EasyR1's ``{{ content }}``). Fields:
    ``prompt`` / ``content`` (the row's text) and every column. None: the row's text as is."""
    system: str | None = None
    """System prompt for rows without one of their own (None: the model's chat-template default)."""
    reward: str | dict = "exact"
    """Verifier spec for ``mmrl.verifiers.build_reward``: a name (``exact``, ``math``, ``number``, ...), a
    weighted mapping (``{math: 0.9, format: 0.1}``) or a user function ``file.py:fn`` / ``pkg.mod:fn``."""
    strict_reward: bool = False
    """True: a failing user reward function stops the run (else the row scores 0 and ``reward/errors`` counts it)."""
    answer_template: str = "<answer>{answer}</answer>"
    """The reference output for SFT warm starts, from the row's answer; the verifiers read the last
    ``<answer>…</answer>`` block, so the default is what they extract."""
    accuracy_threshold: float = 1.0
    """``eval/accuracy`` is the share of rows whose score is at least this."""
    image_root: str | None = None
    """Folder relative image paths are read from (default: the folder of the row's data file)."""
    cache_dir: str | None = None
    """Arrow cache of converted files (default ``$MMRL_CACHE/datasets``; ``datasets``' own default is under ~)."""
    validate_rows: int = 8
    """Rows of each split checked fully (images opened) when the task is built, before training."""
    feedback_template: str | None = None
    """The user turn after a wrong answer, for multi-turn feedback (``algo.feedback_turns``): a Python format
    string with ``{output}``, ``{reason}`` (the verifier's note), ``{score}`` and every column, e.g.
    ``"\\nNo ({reason}). Try again.\\nA:"``. None: the task gives no feedback."""
    tools: tuple[str, ...] = ()
    """Tools an answer may call, written ``<tool>name(arguments)</tool>`` (mmrl/tasks/data/tools.py: ``calc``, a safe
    integer calculator); trained with ``algo.tool_turns``. An answer that opens ``<tool>`` is a call: the tool's
    result (or an ``error: ...`` string) becomes the next turn, and the call itself scores the floor. Empty: no tools."""
    tool_result_template: str = "\n={result}\nA:"
    """The turn after a call: a Python format string with ``{result}`` (and every column); it carries whatever
    re-prompt the prompt template needs (the default continues ``"Q: ...\nA:"`` prompts)."""
    tool_reference: str | None = None
    """The reference call of the supervised warm start's transcripts: a Python format string with every column
    (``"<tool>calc({expression})</tool>"``); the transcript is this call, the tool's real result, then the
    reference answer. None: the reference is the answer alone (no call)."""
    hint_template: str | None = None
    """The prompt with a hint, for Guide (``algo.guide``) and hint-trained warm starts (``warm_start.hint_fraction``):
    a Python format string with ``{prompt}`` (the templated prompt), ``{answer_prefix}`` (the first
    ``answer_prefix_fraction`` of the reference answer, a partial hint) and every column, e.g.
    ``"{prompt}\nHint: {solution}"`` or ``"Hint: {answer_prefix}\n{prompt}"``. None: the task gives no hints."""
    answer_prefix_fraction: float = 0.5
    """Share of the reference answer's characters in ``hint_template``'s ``{answer_prefix}``: its first
    round(fraction · len) characters (SEELE's ``hint_prefix``; half to even, so 0.5 of a 1-character answer is
    empty). In [0, 1]."""


@dataclass(frozen=True)
class RowExample:
    """One dataset row, ready for a policy. Satisfies :class:`mmrl.core.contracts.VisualPrompt`.

    Identity (equality, hashing, per-prompt history keys) is the plain fields; ``images`` and
    ``columns`` (every cell of the row, for the verifier) ride along outside it.
    """

    split: str
    row: int  # index of the row in its split's files (several files count on from one another)
    where: str  # "<file> row <k>", for messages
    prompt: str  # templated user text, one IMAGE_PLACEHOLDER per image
    answer: str | None  # the reference answer as text (None: the row has none)
    system: str | None
    images: tuple[Any, ...] = field(default=(), compare=False, repr=False)  # PIL images, placeholder order
    columns: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


def build_verifier(spec: str | Mapping[str, Any], strict: bool) -> Any:
    """The recipe's reward, with a spec error reported as a one-line ``ConfigError``."""
    from mmrl.verifiers import RewardSpecError, build_reward

    try:
        return build_reward(spec, strict=strict)
    except RewardSpecError as err:
        raise ConfigError(f"task.args.reward: {err}") from None


def undecoded_images(dataset: Any, column: str | None) -> Any:
    """``dataset`` with its ``datasets.Image`` column (or list of them) left as ``{bytes, path}`` dicts, so
    images are opened by :func:`decode_image` (clear errors, only for sampled rows)."""
    import datasets

    if column is None:
        return dataset
    feature = dataset.features[column]
    if isinstance(feature, datasets.Image):
        return dataset.cast_column(column, datasets.Image(decode=False))
    inner = getattr(feature, "feature", None)
    if isinstance(feature, (datasets.List, datasets.Sequence)) and isinstance(inner, datasets.Image):
        return dataset.cast_column(column, datasets.List(datasets.Image(decode=False)))
    return dataset


class RowsTask:
    """Rows of the user's files, sampled with the trainer's generator (see the module docstring)."""

    def __init__(self, cfg: RowsConfig):
        self.cfg = cfg
        self.id = TASK_ID
        self.verifier = build_verifier(cfg.reward, cfg.strict_reward)
        self.reward_range = tuple(float(v) for v in self.verifier.reward_range)
        self.template = Template(cfg.template)
        check_answer_template(cfg.answer_template)
        for name in cfg.tools:
            try:
                TOOLS.get(name)
            except UnknownNameError as err:
                raise ConfigError(f"task.args.tools: {err}") from None
        self.tool_names = tuple(cfg.tools)
        if not 0.0 <= cfg.answer_prefix_fraction <= 1.0:
            raise ConfigError(f"task.args.answer_prefix_fraction must be in [0, 1], got {cfg.answer_prefix_fraction}")
        if cfg.validate_rows < 0:
            raise ConfigError(f"task.args.validate_rows must be >= 0, got {cfg.validate_rows}")
        self.splits = self._load_splits()
        self.layouts = {id(part): self._layout_of(part) for table, _ in self.splits.values() for part in table.parts}
        for split in self.splits:
            self._validate(split)

    # -- loading ---------------------------------------------------------------------------------
    def _load_splits(self) -> dict[str, tuple[RowTable, np.ndarray]]:
        cfg = self.cfg
        if cfg.test_files is not None and cfg.test_size is not None:
            raise ConfigError("task.args: give test_files or test_size, not both")
        cache = Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()
        train = RowTable(self._undecoded(load_parts(cfg.train_files, "train", cache, cfg.image_root, "train_files")))
        if len(train) == 0:
            raise DataError(f"the train split is empty: {', '.join(as_list(cfg.train_files))} has no rows")
        splits = {"train": (train, np.arange(len(train)))}
        if cfg.test_files is not None:
            test = RowTable(self._undecoded(load_parts(cfg.test_files, "test", cache, cfg.image_root, "test_files")))
            if len(test) == 0:
                raise DataError(f"the test split is empty: {', '.join(as_list(cfg.test_files))} has no rows")
            splits["test"] = (test, np.arange(len(test)))
        elif cfg.test_size is not None:
            train_rows, test_rows = split_indices(len(train), cfg.test_size, cfg.split_seed)
            splits = {"train": (train, train_rows), "test": (train, test_rows)}
        return splits

    def _undecoded(self, parts: list[Part]) -> list[Part]:
        return [Part(undecoded_images(p.dataset, self._layout_of(p).images), p.name, p.image_root) for p in parts]

    def _layout_of(self, part: Part) -> Layout:
        return detect_layout(part.dataset.column_names, self.cfg.columns, part.name)

    def _validate(self, split: str) -> None:
        _, rows = self.splits[split]
        for position in range(min(self.cfg.validate_rows, len(rows))):
            self.example(split, position)

    # -- examples --------------------------------------------------------------------------------
    def example(self, split: str, position: int) -> RowExample:
        """The example of the ``position``-th row of ``split``: decoded now, images opened now."""
        table, rows = self.splits[split]
        row = int(rows[position])
        cells, part, local = table.row(row)
        where = f"{part.name} row {local}"
        layout = self.layouts[id(part)]
        fields = row_fields(cells, layout, where)
        text = place_images(fields.text, len(fields.image_cells), where)
        prompt = self.template.render(text, cells, where)
        if prompt.count(IMAGE_PLACEHOLDER) != len(fields.image_cells):
            raise DataError(f"{where}: the templated prompt has {prompt.count(IMAGE_PLACEHOLDER)} {IMAGE_PLACEHOLDER} "
                            f"placeholder(s) for {len(fields.image_cells)} image(s): task.args.template must keep "
                            f"the row's text (and add no placeholder)")
        images = tuple(decode_image(c, part.image_root, where) for c in fields.image_cells)
        columns = {name: value for name, value in cells.items() if name != layout.images}
        columns |= {alias: cells[column] for alias, column in layout.aliases.items()}
        if layout.images:
            columns[layout.images] = images
        columns["answer"] = fields.answer
        system = fields.system if fields.system is not None else self.cfg.system
        return RowExample(split, row, where, prompt, answer_text(fields.answer), system, images, columns)

    def sample_batch(self, split: str, n: int, rng: np.random.Generator) -> list[RowExample]:
        """``n`` rows of ``split`` in an order drawn from ``rng``: a seeded shuffle without repeats while
        ``n`` ≤ the split's rows (a longer batch goes through whole shuffles, then part of another)."""
        if split not in self.splits:
            hint = "" if split != "test" else "; set task.args.test_files or task.args.test_size"
            raise DataError(f"{self.id} has no split {split!r} (it has {sorted(self.splits)}){hint}")
        size = len(self.splits[split][1])
        rounds, rest = divmod(n, size)
        order = [rng.permutation(size) for _ in range(rounds)] + [rng.choice(size, rest, replace=False)]
        return [self.example(split, int(p)) for p in np.concatenate(order)]

    def split_sizes(self) -> dict[str, int]:
        return {split: len(rows) for split, (_, rows) in self.splits.items()}

    def rows_read(self) -> int:
        """Rows decoded into Python so far, over all files (the rest stay in the memory-mapped table)."""
        tables = {id(t): t for t, _ in self.splits.values()}
        return sum(t.rows_read for t in tables.values())

    # -- reward ----------------------------------------------------------------------------------
    def reward(self, example: RowExample, output: Any) -> RewardResult:
        return self.reward_batch([example], [output])[0]

    def reward_batch(self, examples: Sequence[RowExample], outputs: Sequence[Any]) -> list[RewardResult]:
        """The verifier's verdicts in one call; outputs that are no usable text score the floor unread."""
        results: list[RewardResult | None] = [None] * len(outputs)
        zeros = {name: 0.0 for name in self.verifier.names}
        floor = min(max(0.0, self.reward_range[0]), self.reward_range[1])
        scored = []
        for i, output in enumerate(outputs):
            problem = text_problem(output)
            if not problem and self.cfg.tools and holds_call(output):
                problem = "a tool call, not an answer"
            if problem:
                results[i] = RewardResult(floor, {**zeros, "errors": 0.0}, problem)
            else:
                scored.append(i)
        if scored:
            rows = [examples[i] for i in scored]
            names = sorted({name for ex in rows for name in ex.columns})
            batch = self.verifier([ex.prompt for ex in rows], [outputs[i] for i in scored],
                                  {name: [ex.columns.get(name) for ex in rows] for name in names})
            for k, i in enumerate(scored):
                error = batch.errors[k]
                components = {name: float(values[k]) for name, values in batch.components.items()}
                results[i] = RewardResult(float(batch.scores[k]), {**components, "errors": float(error is not None)},
                                          error or "")
        return results  # type: ignore[return-value]  # every slot is filled above

    def metrics(self, examples: Sequence[RowExample], outputs: Sequence[Any],
                results: Sequence[RewardResult]) -> dict[str, float]:
        """``accuracy`` (share of rows scoring ≥ ``accuracy_threshold``), each component's mean and ``error_rate``."""
        metrics = {"accuracy": float(np.mean([r.score >= self.cfg.accuracy_threshold for r in results]))}
        for name in self.verifier.names:
            metrics[name] = float(np.mean([r.components.get(name, 0.0) for r in results]))
        metrics["error_rate"] = float(np.mean([r.components.get("errors", 0.0) for r in results]))
        return metrics

    def feedback(self, example: RowExample, output: Any, result: RewardResult) -> str | None:
        """``feedback_template`` filled for a wrong answer (score below ``accuracy_threshold``); else None."""
        if self.cfg.feedback_template is None:
            raise ConfigError("algo.feedback_turns needs feedback: set task.args.feedback_template "
                              "(e.g. \"\\nNo ({reason}). Try again.\\nA:\")")
        if result.score >= self.cfg.accuracy_threshold:
            return None
        try:
            return self.cfg.feedback_template.format(**{**example.columns, "output": output, "reason": result.info,
                                                        "score": result.score})
        except (KeyError, IndexError, ValueError) as err:
            raise DataError(f"{example.where}: task.args.feedback_template cannot be filled ({err!r}); its fields "
                            f"are output, reason, score and the columns {sorted(example.columns)}") from None

    def hinted(self, example: RowExample) -> RowExample:
        """``example`` with ``hint_template`` applied to its prompt (Guide; hint-trained warm starts)."""
        if self.cfg.hint_template is None:
            raise ConfigError("algo.guide needs hints: set task.args.hint_template (e.g. \"{prompt}\\nHint: {hint}\")")
        fields = {**example.columns, "prompt": example.prompt}
        if example.answer is not None:  # a row without an answer has no prefix: the template fails below if it asks
            fields["answer_prefix"] = hint_prefix(example.answer, self.cfg.answer_prefix_fraction)
        try:
            prompt = self.cfg.hint_template.format(**fields)
        except (KeyError, IndexError, ValueError) as err:
            raise DataError(f"{example.where}: task.args.hint_template cannot be filled ({err!r}); its fields are "
                            f"prompt, answer_prefix (rows with an answer) and the columns "
                            f"{sorted(example.columns)}") from None
        if prompt.count(IMAGE_PLACEHOLDER) != len(example.images):
            raise DataError(f"{example.where}: task.args.hint_template must keep the prompt's {IMAGE_PLACEHOLDER} "
                            f"placeholders (write {{prompt}} once)")
        return dataclasses.replace(example, prompt=prompt)

    def call(self, example: RowExample, output: Any) -> str | None:
        """With ``tools``: the turn after an ``output`` that opens ``<tool>`` (the tool's result, or an error
        string for a malformed call or a refused argument); None for a final answer (and always without tools)."""
        if not self.cfg.tools or not isinstance(output, str) or not holds_call(output):
            return None
        return self._fill(self.cfg.tool_result_template, example, "tool_result_template",
                          result=run_tool(output, self.cfg.tools))

    def reference_turns(self, example: RowExample) -> tuple[tuple[Any, str], ...]:
        """The warm start's transcript: with ``tool_reference``, the call (answered by the real tool) and then the
        answer in the context of both; else the answer alone."""
        answer = self.reference_output(example)
        if self.cfg.tool_reference is None:
            return ((example, answer),)
        call = self._fill(self.cfg.tool_reference, example, "tool_reference")
        result = self.call(example, call)
        if result is None:
            raise ConfigError(f"task.args.tool_reference {self.cfg.tool_reference!r} must write a call "
                              f"(<tool>name(arguments)</tool>) and task.args.tools must name its tool")
        return (example, call), (FollowUp(example, (("assistant", call), ("user", result))), answer)

    def _fill(self, template: str, example: RowExample, key: str, **fields: Any) -> str:
        try:
            return template.format(**{**example.columns, **fields})
        except (KeyError, IndexError, ValueError) as err:
            raise DataError(f"{example.where}: task.args.{key} cannot be filled ({err!r}); its fields are "
                            f"{sorted({*fields, *example.columns})}") from None

    def reference_output(self, example: RowExample) -> str:
        if example.answer is None:
            raise DataError(f"{example.where}: no reference answer for the SFT warm start; give an answer column "
                            f"(task.args.columns.answer) or set warm_start.sft_steps: 0")
        return self.cfg.answer_template.format(answer=example.answer)


def check_answer_template(template: str) -> None:
    """``answer_template`` must format with one field, ``{answer}``."""
    try:
        template.format(answer="x")
    except (KeyError, IndexError, ValueError) as err:
        raise ConfigError(f"task.args.answer_template {template!r} must use only the field {{answer}} ({err})") from None
    if "{answer}" not in template:
        raise ConfigError(f"task.args.answer_template {template!r} must contain {{answer}}")
