"""Synthetic documents for visual information extraction, rendered with PIL, with exact JSON truth.

A :class:`Document` is pure data (fields + layout); :func:`render` draws it deterministically. Four
document types (INFERRED from the paper's domain, arXiv 2506.13363: medical reports / lab sheets):

- ``lab_report``: patient fields, then a table test / value / unit / reference range / flag (↑ ↓);
- ``invoice``: number, dates, vendor, line items (description, quantity, amount), total;
- ``form``: key-value blocks of patient / visit data;
- ``card``: a short card of 2–4 big key: value lines;
- ``triage``: an emergency triage tag whose colour is the ``triage`` field (START triage colours),
  with up to two more key: value lines (``bed``, ``ward``): the tiny CPU setting, since a ~1 M-parameter
  VLM trained for minutes reads colours but not glyphs (docs/tasks.md).

Ground truth is a flat ``{key: value}`` mapping (tables flatten to ``<test>_value`` / ``_unit`` /
``_range`` / ``_flag``; line items to ``item<i>_...``); :data:`KEY_DESCRIPTIONS` is the schema.
A flag that is not raised is the empty string: "" means "the field is absent" (docs/tasks.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from mmrl.core.paths import resolve_asset

DOC_TYPES = ("lab_report", "invoice", "form", "card", "triage")
FONTS = ("sans", "serif", "mono")
"""``sans``: Pillow's embedded default face; ``serif`` / ``mono``: DejaVu (assets/fonts, free licence)."""
_FONT_FILES = {"serif": "fonts/DejaVuSerif.ttf", "mono": "fonts/DejaVuSansMono.ttf"}

# name, unit, normal low, normal high, decimals
LAB_TESTS = (("glucose", "mmol/L", 3.9, 6.1, 1), ("hemoglobin", "g/dL", 12.0, 17.5, 1),
             ("wbc", "10^9/L", 4.0, 11.0, 1), ("platelets", "10^9/L", 150, 400, 0),
             ("sodium", "mmol/L", 135, 145, 0), ("potassium", "mmol/L", 3.5, 5.1, 1),
             ("creatinine", "umol/L", 62, 115, 0), ("alt", "U/L", 7, 56, 0),
             ("cholesterol", "mmol/L", 3.0, 5.2, 2), ("crp", "mg/L", 0.0, 5.0, 1))
SURNAMES = ("Smith", "Garcia", "Chen", "Muller", "Rossi", "Kowalski", "Nguyen", "Silva", "Dubois", "Okafor")
GIVEN = ("Anna", "Ben", "Carla", "David", "Elena", "Farid", "Grace", "Hugo", "Iris", "Jonas")
VENDORS = ("MedSupply Ltd", "Apex Labs", "Northwind Pharma", "City Clinic", "BlueCross Diagnostics")
ITEMS = ("Blood panel", "X-ray", "Consultation", "Ultrasound", "MRI scan", "Vaccine", "ECG", "Bandages")
DEPARTMENTS = ("Cardiology", "Neurology", "Oncology", "Pediatrics", "Radiology", "Surgery")
CARD_KEYS = ("id", "age", "bed", "ward")
CARD_KEY_DESCRIPTIONS = {"id": "patient id number", "age": "patient age in years", "bed": "bed number",
                         "ward": "ward number"}

TRIAGE_COLOURS = {"red": (210, 30, 30), "yellow": (235, 205, 35), "green": (40, 160, 60), "black": (25, 25, 25)}
"""START triage categories (immediate, delayed, minor, expectant) and the tag's paper colour."""
TRIAGE_EXTRA_KEYS = ("bed", "ward")

KEY_DESCRIPTIONS: dict[str, str] = {
    "triage": "triage category: the colour of the tag (red, yellow, green or black)",
    "patient_name": "full name of the patient", "patient_id": "patient identifier",
    "sex": "patient sex (M/F)", "age": "patient age in years", "date": "date of the report (YYYY-MM-DD)",
    "invoice_number": "invoice number", "invoice_date": "date the invoice was issued (YYYY-MM-DD)",
    "due_date": "payment due date (YYYY-MM-DD)", "vendor": "name of the issuing company",
    "total": "total amount due, a number", "currency": "currency code of the amounts",
    "department": "hospital department", "doctor": "name of the attending doctor",
    "diagnosis_code": "ICD-10 diagnosis code", "blood_type": "blood group with Rh factor",
    "weight": "body weight with unit", "height": "body height with unit",
    **CARD_KEY_DESCRIPTIONS,
}
for _name, _unit, *_ in LAB_TESTS:
    KEY_DESCRIPTIONS |= {f"{_name}_value": f"measured {_name} value, a number", f"{_name}_unit": f"unit of {_name}",
                         f"{_name}_range": f"reference range of {_name} (low-high)",
                         f"{_name}_flag": f"{_name} flag: H if above range, L if below, empty if normal"}
for _i in range(1, 5):
    KEY_DESCRIPTIONS |= {f"item{_i}_description": f"line item {_i}: description",
                         f"item{_i}_quantity": f"line item {_i}: quantity", f"item{_i}_amount": f"line item {_i}: amount"}


@dataclass(frozen=True)
class Layout:
    """How a document is drawn; part of its identity (two layouts of the same fields are two documents)."""

    width: int  # pixels
    font: str  # one of FONTS
    font_size: int  # pixels
    margin_x: int
    margin_y: int
    line_gap: int  # extra pixels between lines
    ink: tuple[int, int, int]
    paper: tuple[int, int, int]


@dataclass(frozen=True)
class Document:
    doc_type: str  # one of DOC_TYPES
    title: str
    lines: tuple[tuple[str, ...], ...]  # rows of cells, drawn left to right in columns
    fields: tuple[tuple[str, str], ...]  # the ground truth, in reading order
    layout: Layout


@lru_cache(maxsize=64)
def load_font(name: str, size: int) -> ImageFont.FreeTypeFont:
    if name == "sans":
        return ImageFont.load_default(size=size)  # type: ignore[return-value]
    return ImageFont.truetype(str(resolve_asset(_FONT_FILES[name])), size)


def render(doc: Document) -> Image.Image:
    """Draw ``doc``: a title line, then rows whose cells sit in equal-width columns."""
    lay = doc.layout
    font = load_font(lay.font, lay.font_size)
    title_font = load_font(lay.font, lay.font_size + max(2, lay.font_size // 4))
    step = lay.font_size + lay.line_gap
    rows = ([doc.title] if doc.title else []) + list(doc.lines)
    height = 2 * lay.margin_y + step * len(rows) + (lay.font_size // 2 if doc.title else 0)
    image = Image.new("RGB", (lay.width, height), lay.paper)
    pen = ImageDraw.Draw(image)
    y = lay.margin_y
    if doc.title:
        pen.text((lay.margin_x, y), doc.title, fill=lay.ink, font=title_font)
        y += step + lay.font_size // 2
    for row in doc.lines:
        column = (lay.width - 2 * lay.margin_x) // max(1, len(row))
        for j, cell in enumerate(row):
            colour = (200, 20, 20) if cell in ("↑", "H ↑", "↓", "L ↓") else lay.ink
            pen.text((lay.margin_x + j * column, y), cell, fill=colour, font=font)
        y += step
    return image


def _pick(rng: np.random.Generator, items):
    return items[int(rng.integers(len(items)))]


def _date(rng: np.random.Generator) -> str:
    return f"{int(rng.integers(2019, 2026))}-{int(rng.integers(1, 13)):02d}-{int(rng.integers(1, 29)):02d}"


def _name(rng: np.random.Generator) -> str:
    return f"{_pick(rng, GIVEN)} {_pick(rng, SURNAMES)}"


def _layout(rng: np.random.Generator, width: int, font_size: tuple[int, int]) -> Layout:
    shade = int(rng.integers(235, 256))
    ink = int(rng.integers(0, 60))
    return Layout(width=width, font=_pick(rng, FONTS), font_size=int(rng.integers(font_size[0], font_size[1] + 1)),
                  margin_x=int(rng.integers(4, 16)), margin_y=int(rng.integers(4, 12)),
                  line_gap=int(rng.integers(2, 7)), ink=(ink, ink, ink), paper=(shade, shade, max(0, shade - 10)))


def lab_report(rng: np.random.Generator, n_tests: int) -> tuple[str, list[tuple[str, ...]], list[tuple[str, str]]]:
    name, pid, date = _name(rng), f"P{int(rng.integers(10000, 99999))}", _date(rng)
    sex, age = _pick(rng, ("M", "F")), str(int(rng.integers(18, 90)))
    lines: list[tuple[str, ...]] = [(f"Patient: {name}", f"ID: {pid}"), (f"Sex: {sex}", f"Age: {age}"),
                                    (f"Date: {date}",), ("Test", "Result", "Unit", "Range", "Flag")]
    fields = [("patient_name", name), ("patient_id", pid), ("sex", sex), ("age", age), ("date", date)]
    for t in rng.choice(len(LAB_TESTS), size=n_tests, replace=False).tolist():
        test, unit, low, high, decimals = LAB_TESTS[t]
        value = float(rng.uniform(low - 0.3 * (high - low), high + 0.3 * (high - low)))
        value = max(value, 0.0)
        shown = f"{value:,.{decimals}f}"
        flag = "H" if value > high else ("L" if value < low else "")
        ref = f"{low:.{decimals}f}-{high:.{decimals}f}"
        arrow = {"H": "H ↑", "L": "L ↓", "": ""}[flag]
        lines.append((test.upper() if test in ("wbc", "alt", "crp") else test.capitalize(), shown, unit, ref, arrow))
        fields += [(f"{test}_value", shown), (f"{test}_unit", unit), (f"{test}_range", ref), (f"{test}_flag", flag)]
    return "Laboratory Report", lines, fields


def invoice(rng: np.random.Generator, n_items: int) -> tuple[str, list[tuple[str, ...]], list[tuple[str, str]]]:
    number, vendor, currency = f"INV-{int(rng.integers(1000, 99999))}", _pick(rng, VENDORS), _pick(rng, ("EUR", "USD"))
    issued, due = _date(rng), _date(rng)
    lines: list[tuple[str, ...]] = [(f"Invoice no: {number}",), (f"Vendor: {vendor}",),
                                    (f"Issued: {issued}", f"Due: {due}"), ("Item", "Qty", f"Amount ({currency})")]
    fields = [("invoice_number", number), ("vendor", vendor), ("invoice_date", issued), ("due_date", due),
              ("currency", currency)]
    total = 0.0
    for i, item in enumerate(rng.choice(len(ITEMS), size=n_items, replace=False).tolist(), start=1):
        qty, amount = int(rng.integers(1, 10)), round(float(rng.uniform(5, 2500)), 2)
        total += amount
        lines.append((ITEMS[item], str(qty), f"{amount:,.2f}"))
        fields += [(f"item{i}_description", ITEMS[item]), (f"item{i}_quantity", str(qty)),
                   (f"item{i}_amount", f"{amount:,.2f}")]
    lines.append(("", "Total", f"{total:,.2f}"))
    return "INVOICE", lines, fields + [("total", f"{total:,.2f}")]


def form(rng: np.random.Generator, n_fields: int) -> tuple[str, list[tuple[str, ...]], list[tuple[str, str]]]:
    pool = [("patient_name", "Name", _name(rng)), ("patient_id", "Patient ID", f"P{int(rng.integers(10000, 99999))}"),
            ("age", "Age", str(int(rng.integers(1, 95)))), ("sex", "Sex", _pick(rng, ("M", "F"))),
            ("department", "Department", _pick(rng, DEPARTMENTS)), ("doctor", "Doctor", f"Dr. {_pick(rng, SURNAMES)}"),
            ("date", "Visit date", _date(rng)),
            ("diagnosis_code", "ICD-10", f"{_pick(rng, 'EIJKM')}{int(rng.integers(10, 99))}.{int(rng.integers(0, 9))}"),
            ("blood_type", "Blood type", _pick(rng, ("A+", "A-", "B+", "B-", "O+", "O-", "AB+", "AB-"))),
            ("weight", "Weight", f"{int(rng.integers(40, 120))} kg"), ("height", "Height", f"{int(rng.integers(140, 200))} cm")]
    chosen = sorted(rng.choice(len(pool), size=n_fields, replace=False).tolist())
    lines = [(f"{pool[i][1]}: {pool[i][2]}",) for i in chosen]
    return _pick(rng, ("Patient Intake Form", "Admission Form", "Visit Record")), lines, \
        [(pool[i][0], pool[i][2]) for i in chosen]


def card(rng: np.random.Generator, n_fields: int, values: tuple[str, ...], labels: bool = True
         ) -> tuple[str, list, list]:
    """``key: value`` lines, or (``labels`` false) the values alone, one per line in key order."""
    keys = sorted(rng.choice(len(CARD_KEYS), size=n_fields, replace=False).tolist())
    fields = [(CARD_KEYS[k], _pick(rng, values)) for k in keys]
    return "", [(f"{k}: {v}" if labels else v,) for k, v in fields], fields


def triage(rng: np.random.Generator, n_fields: int, values: tuple[str, ...]) -> tuple[str, list, list, str]:
    """A triage tag: the ``triage`` colour first, then ``n_fields - 1`` of bed / ward with ``values``."""
    colour = _pick(rng, tuple(TRIAGE_COLOURS))
    extra = sorted(rng.choice(len(TRIAGE_EXTRA_KEYS), size=n_fields - 1, replace=False).tolist())
    fields = [("triage", colour)] + [(TRIAGE_EXTRA_KEYS[k], _pick(rng, values)) for k in extra]
    return "", [("TRIAGE",)] + [(f"{k}: {v}",) for k, v in fields[1:]], fields, colour


def make_document(rng: np.random.Generator, doc_type: str, size: int, card_values: tuple[str, ...],
                  width: int, font_size: tuple[int, int], card_labels: bool = True) -> Document:
    """One document of ``doc_type`` with ``size`` tests / items / fields, drawn from ``rng`` only."""
    if doc_type == "lab_report":
        title, lines, fields = lab_report(rng, size)
    elif doc_type == "invoice":
        title, lines, fields = invoice(rng, size)
    elif doc_type == "form":
        title, lines, fields = form(rng, size)
    elif doc_type == "card":
        title, lines, fields = card(rng, size, card_values, card_labels)
    else:
        title, lines, fields, colour = triage(rng, size, card_values)
        layout = _layout(rng, width, font_size)
        ink = (245, 245, 245) if colour in ("red", "black") else (20, 20, 20)
        layout = replace(layout, paper=TRIAGE_COLOURS[colour], ink=ink)
        return Document(doc_type, title, tuple(tuple(r) for r in lines), tuple(fields), layout)
    return Document(doc_type, title, tuple(tuple(r) for r in lines), tuple(fields), _layout(rng, width, font_size))
