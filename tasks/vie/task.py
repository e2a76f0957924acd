"""``vie/extract-v0``: visual information extraction to JSON (arXiv 2506.13363, "Efficient Medical VIE
via Reinforcement Learning"), on synthetic documents or a local folder of real ones.

Per query a random subset of the document's keys (size k ~ U[min_keys, max_keys]) is requested, with
their descriptions in the prompt, and the ground truth is that subset: the paper's sampling strategy,
which turns one annotated image into many distinct queries. The reward is the balanced field-level
F_β of :mod:`mmrl.tasks.vie.reward`. Train and test documents are disjoint: a hash of the document
(fields and layout; the file name for local data) picks its split.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from PIL import Image

from mmrl.core.contracts import IMAGE_PLACEHOLDER, RewardResult
from mmrl.tasks.vie.documents import DOC_TYPES, KEY_DESCRIPTIONS, Document, make_document, render
from mmrl.tasks.vie.local import LocalDocument, load_local_folder
from mmrl.tasks.vie.reward import extraction_feedback, extraction_reward

SPLITS = ("train", "test")
SYSTEM_PROMPT = ("You read document images and extract fields. First reason step by step inside <think></think>, "
                 "then give exactly one JSON object inside <answer></answer>.")
"""System prompt of ``system_prompt: true`` (INFERRED: the paper's template is not public)."""
SIZE_LIMITS = {"lab_report": (1, 10), "invoice": (1, 4), "form": (1, 11), "card": (1, 4), "triage": (1, 3)}
"""How many tests / line items / fields each document type can hold."""
TRAIN_POOL_SEED = 20250616
"""Seed of the generator that draws a fixed training pool (``train_documents``)."""
DEFAULT_SIZES = {"lab_report": (3, 6), "invoice": (2, 4), "form": (4, 8), "card": (2, 4), "triage": (1, 3)}


@dataclass(frozen=True)
class VIEConfig:
    doc_types: tuple[str, ...] = ("lab_report", "invoice", "form")
    """Synthetic document types to draw from (lab_report, invoice, form, card, triage), uniformly."""
    doc_size: tuple[int, int] | None = None
    """[lo, hi] tests / items / fields per document (null: per-type defaults 3–6, 2–4, 4–8, 2–4)."""
    width: int = 448
    """Width of a synthetic page in pixels (height follows from its lines)."""
    font_size: tuple[int, int] = (14, 20)
    """[lo, hi] font size in pixels, drawn per document."""
    card_values: tuple[str, ...] = ("1", "2", "3", "4", "5", "6", "7", "8", "9")
    """Values printed on ``card`` documents (and the bed / ward lines of ``triage`` tags)."""
    card_labels: bool = True
    """Cards print ``key: value`` lines; false: the values alone, one per line in key order (the
    tiny CPU setting: a large glyph fills the image, docs/tasks.md)."""
    min_keys: int = 1
    """Fewest keys requested per query."""
    max_keys: int = 0
    """Most keys requested per query (0: all the document's keys); k ~ U[min_keys, min(max_keys, |keys|)]."""
    describe_keys: bool = True
    """Put the schema's key descriptions in the prompt (the paper's prompt); false: key names only (short)."""
    system_prompt: bool = False
    """Send :data:`SYSTEM_PROMPT` (reason in <think></think>, then answer; the paper trains with reasoning).
    False: none, for tiny models with short contexts."""
    beta: float = 1.0
    """β of the F_β reward (1: F1; > 1 weighs recall more)."""
    format_weight: float = 0.1
    """Weight w of the think/answer format term."""
    test_fraction: float = 0.2
    """Share of documents held out for the test split."""
    train_documents: int = 0
    """> 0: the train split is a fixed pool of this many documents (the paper's 100 annotated samples),
    each drawn again with a fresh random key subset per query; 0: a new document per query."""
    local_dir: str | None = None
    """A folder of real ``name.png|jpg`` + ``name.json`` (+ optional schema.json) used instead of synthetic data."""


@dataclass(frozen=True)
class VIEExample:
    """Satisfies :class:`mmrl.core.contracts.VisualPrompt`."""

    document: Document | LocalDocument
    requested: tuple[tuple[str, str], ...]  # (key, description) asked for, in reading order
    describe_keys: bool
    system: str | None = None

    @property
    def prompt(self) -> str:
        if self.describe_keys:
            schema = json.dumps(dict(self.requested), ensure_ascii=False)
            return (f"{IMAGE_PLACEHOLDER}Extract these fields from the document as one JSON object inside "
                    f"<answer></answer> (use \"\" for a field that is absent): {schema}")
        return f"{IMAGE_PLACEHOLDER}Extract {', '.join(k for k, _ in self.requested)} as JSON."

    @property
    def images(self) -> tuple[Image.Image, ...]:
        if isinstance(self.document, LocalDocument):
            with Image.open(self.document.image_path) as image:
                return (image.convert("RGB"),)
        return (cached_render(self.document),)

    @property
    def truth(self) -> dict[str, str]:
        values = dict(self.document.fields)
        return {k: values[k] for k, _ in self.requested}

    @property
    def doc_type(self) -> str:
        return self.document.doc_type if isinstance(self.document, Document) else "local"


@lru_cache(maxsize=128)
def cached_render(document: Document) -> Image.Image:
    return render(document)


class VIETask:
    def __init__(self, cfg: VIEConfig):
        self._validate(cfg)
        self.cfg = cfg
        self.id = "vie/extract-v0"
        self.reward_range = (0.0, 1.0)
        self.local, self.local_schema = load_local_folder(cfg.local_dir) if cfg.local_dir else ([], {})
        self.train_pool = self._train_pool(cfg.train_documents) if cfg.train_documents else []

    @staticmethod
    def _validate(cfg: VIEConfig) -> None:
        unknown = [t for t in cfg.doc_types if t not in DOC_TYPES]
        if unknown or not cfg.doc_types:
            raise ValueError(f"task.args.doc_types must be some of {DOC_TYPES}, got {list(cfg.doc_types)}")
        for t in cfg.doc_types:
            lo, hi = cfg.doc_size or DEFAULT_SIZES[t]
            if not SIZE_LIMITS[t][0] <= lo <= hi <= SIZE_LIMITS[t][1]:
                raise ValueError(f"task.args.doc_size [{lo}, {hi}] must lie in {list(SIZE_LIMITS[t])} for {t}")
        if cfg.min_keys < 1 or (cfg.max_keys and cfg.max_keys < cfg.min_keys):
            raise ValueError(f"task.args: need 1 <= min_keys <= max_keys (or max_keys 0), got "
                             f"{cfg.min_keys}, {cfg.max_keys}")
        if not 8 <= cfg.font_size[0] <= cfg.font_size[1] or cfg.width < 56:
            raise ValueError(f"task.args: need 8 <= font_size[0] <= font_size[1] and width >= 56, got "
                             f"{list(cfg.font_size)}, {cfg.width}")
        if not cfg.card_values or not all(isinstance(v, str) and v for v in cfg.card_values):
            raise ValueError(f"task.args.card_values must be non-empty strings, got {list(cfg.card_values)}")
        if not (cfg.beta > 0 and np.isfinite(cfg.beta)):
            raise ValueError(f"task.args.beta must be a positive number, got {cfg.beta}")
        if cfg.train_documents < 0:
            raise ValueError(f"task.args.train_documents must be >= 0 (0: unlimited), got {cfg.train_documents}")
        if not 0 <= cfg.format_weight < 1 or not 0 < cfg.test_fraction < 1:
            raise ValueError(f"task.args: need format_weight in [0, 1) and test_fraction in (0, 1), got "
                             f"{cfg.format_weight}, {cfg.test_fraction}")

    def split_of(self, document: Document | LocalDocument) -> str:
        key = document.name if isinstance(document, LocalDocument) else repr(document)
        return "test" if zlib.crc32(key.encode()) % 1000 < 1000 * self.cfg.test_fraction else "train"

    def _train_pool(self, size: int) -> list[Document | LocalDocument]:
        """The first ``size`` training documents: of the local folder (sorted by name), or of the
        generator under a fixed seed, so every run and seed sees the same annotated set."""
        if self.local:
            pool = [d for d in self.local if self.split_of(d) == "train"][:size]
            if len(pool) < size:
                raise ValueError(f"task.args.train_documents={size}, but {self.cfg.local_dir} has only "
                                 f"{len(pool)} training documents")
            return pool
        rng, pool = np.random.default_rng(TRAIN_POOL_SEED), []
        while len(pool) < size:
            document = self._draw_document(rng)
            if self.split_of(document) == "train":
                pool.append(document)
        return pool

    def _draw_document(self, rng: np.random.Generator) -> Document | LocalDocument:
        cfg = self.cfg
        if self.local:
            return self.local[int(rng.integers(len(self.local)))]
        doc_type = cfg.doc_types[int(rng.integers(len(cfg.doc_types)))]
        lo, hi = cfg.doc_size or DEFAULT_SIZES[doc_type]
        return make_document(rng, doc_type, int(rng.integers(lo, hi + 1)), cfg.card_values, cfg.width, cfg.font_size,
                             cfg.card_labels)

    def _query(self, document: Document | LocalDocument, rng: np.random.Generator) -> VIEExample:
        keys = [k for k, _ in document.fields]
        top = min(self.cfg.max_keys or len(keys), len(keys))
        k = int(rng.integers(min(self.cfg.min_keys, top), top + 1))
        picked = sorted(rng.choice(len(keys), size=k, replace=False).tolist())
        schema = self.local_schema if isinstance(document, LocalDocument) else KEY_DESCRIPTIONS
        return VIEExample(document, tuple((keys[i], schema.get(keys[i], keys[i])) for i in picked),
                          self.cfg.describe_keys, SYSTEM_PROMPT if self.cfg.system_prompt else None)

    def sample_batch(self, split: str, n: int, rng: np.random.Generator) -> list[VIEExample]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; {self.id} has {SPLITS}")
        if self.local and not any(self.split_of(d) == split for d in self.local):
            raise ValueError(f"{self.cfg.local_dir}: no document falls in split {split!r} "
                             f"(test_fraction {self.cfg.test_fraction}, {len(self.local)} documents)")
        if split == "train" and self.train_pool:
            return [self._query(self.train_pool[int(rng.integers(len(self.train_pool)))], rng) for _ in range(n)]
        examples: list[VIEExample] = []
        while len(examples) < n:
            document = self._draw_document(rng)
            if self.split_of(document) == split:
                examples.append(self._query(document, rng))
        return examples

    def reward(self, example: VIEExample, output: str) -> RewardResult:
        return extraction_reward(output, example.truth, self.cfg.beta, self.cfg.format_weight)

    def feedback(self, example: VIEExample, output: str, result: RewardResult) -> str | None:
        """Which fields are wrong or missing (multi-turn feedback, ``algo.feedback_turns``); never the values."""
        return extraction_feedback(output, example.truth)

    def reference_output(self, example: VIEExample) -> str:
        keys = ", ".join(k for k, _ in example.requested)
        answer = json.dumps(example.truth, ensure_ascii=False)
        return f"<think>I read {keys}.</think><answer>{answer}</answer>"

    def metrics(self, examples: Sequence[VIEExample], outputs: Sequence[str],
                results: Sequence[RewardResult]) -> dict[str, float]:
        def mean(name: str, rows: Sequence[RewardResult]) -> float:
            return float(np.mean([r.components[name] for r in rows])) if rows else float("nan")

        metrics = {name: mean(name, results) for name in ("f1", "precision", "recall")}
        metrics["exact_match"] = float(np.mean([r.components["precision"] == r.components["recall"] == 1.0
                                                and r.components["json_valid"] == 1.0
                                                for r in results])) if results else float("nan")
        metrics["json_valid_rate"] = mean("json_valid", results)
        metrics["format_rate"] = mean("format", results)
        types = sorted({e.doc_type for e in examples})
        if len(types) > 1:
            for t in types:
                metrics[f"f1_{t}"] = mean("f1", [r for e, r in zip(examples, results) if e.doc_type == t])
        return metrics
