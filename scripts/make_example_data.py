"""Write the example datasets of ``assets/data/`` (deterministic: the same files on every run).

- ``train.jsonl`` / ``test.jsonl`` + ``images/``: small VQA in the LLaVA / ShareGPT layout. Each 48x48 PNG
  shows coloured shapes; the question asks the shape's colour (one shape) or how many shapes there are
  (1-3); the answer is the assistant turn ("red", "2").
- ``arith_train.jsonl`` / ``arith_test.jsonl``: one-step arithmetic word problems in the EasyR1 layout
  (``problem``, ``answer``), e.g. "Ann has 3 cats and gets 4 more. How many cats?" → "7".
- ``arith_tool_train.jsonl`` / ``arith_tool_test.jsonl``: the same rows with an ``expression`` column ("3+4"), the
  calculator call of the tool-use recipe's reference transcripts (configs/data/tool_tiny_cpu.yaml).

Run from the repository root:  python scripts/make_example_data.py
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 60, 220), "yellow": (235, 200, 20)}
SHAPES = ("circle", "square", "triangle")
SIZE = 48
NAMES = ("Ann", "Bob", "Eve", "Tom", "Sam", "Kim")
THINGS = ("apple", "cat", "pen", "cup", "hat", "book")


def draw_shape(pen: ImageDraw.ImageDraw, kind: str, box: tuple[int, int, int, int], fill: tuple[int, int, int]) -> None:
    x0, y0, x1, y1 = box
    if kind == "circle":
        pen.ellipse(box, fill=fill)
    elif kind == "square":
        pen.rectangle(box, fill=fill)
    else:
        pen.polygon([((x0 + x1) / 2, y0), (x0, y1), (x1, y1)], fill=fill)


def vqa_row(rng: np.random.Generator, image_path: Path, relative: str, index: int) -> dict:
    """Draw one image (saved to ``image_path``) and return its LLaVA-layout row."""
    image = Image.new("RGB", (SIZE, SIZE), (245, 245, 245))
    pen = ImageDraw.Draw(image)
    colour_names = list(COLOURS)
    if rng.random() < 0.5:  # colour question: one large shape
        colour = colour_names[int(rng.integers(len(colour_names)))]
        size = int(rng.integers(24, 40))
        x, y = (int(v) for v in rng.integers(0, SIZE - size, size=2))
        draw_shape(pen, SHAPES[int(rng.integers(3))], (x, y, x + size - 1, y + size - 1), COLOURS[colour])
        question, answer = "What colour is the shape?", colour
    else:  # count question: 1-3 shapes in distinct quadrants
        count = int(rng.integers(1, 4))
        for cell in rng.permutation(4)[:count].tolist():
            size = int(rng.integers(12, 22))
            x0, y0 = (cell % 2) * SIZE // 2, (cell // 2) * SIZE // 2
            x, y = x0 + int(rng.integers(0, SIZE // 2 - size + 1)), y0 + int(rng.integers(0, SIZE // 2 - size + 1))
            fill = COLOURS[colour_names[int(rng.integers(len(colour_names)))]]
            draw_shape(pen, SHAPES[int(rng.integers(3))], (x, y, x + size - 1, y + size - 1), fill)
        question, answer = "How many shapes are there?", str(count)
    image.save(image_path, optimize=True)
    return {"id": f"shape_{index:04d}", "image": relative,
            "conversations": [{"from": "human", "value": f"<image>\n{question}"}, {"from": "gpt", "value": answer}]}


def arith_row(rng: np.random.Generator) -> dict:
    """One word problem: ``a + b`` (gets more) or ``a - b`` (gives away), single digits, answer >= 0; with the
    ``expression`` that computes it."""
    name, thing = NAMES[int(rng.integers(len(NAMES)))], THINGS[int(rng.integers(len(THINGS)))]
    a, b = (int(v) for v in rng.integers(1, 10, size=2))
    if rng.random() < 0.5:
        return {"problem": f"{name} has {a} {thing}s and gets {b} more. How many {thing}s?", "answer": str(a + b),
                "expression": f"{a}+{b}"}
    a, b = max(a, b), min(a, b)
    return {"problem": f"{name} has {a} {thing}s and gives away {b}. How many {thing}s?", "answer": str(a - b),
            "expression": f"{a}-{b}"}


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="assets/data", help="output folder (default assets/data)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vqa", type=int, nargs=2, default=(300, 100), help="train and test VQA rows")
    parser.add_argument("--arith", type=int, nargs=2, default=(400, 100), help="train and test arithmetic rows")
    args = parser.parse_args()
    out = Path(args.out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    index = 0
    for split, count in zip(("train", "test"), args.vqa):
        rows = []
        for _ in range(count):
            relative = f"images/{split}_{index:04d}.png"
            rows.append(vqa_row(rng, out / relative, relative, index))
            index += 1
        write_jsonl(out / f"{split}.jsonl", rows)
    for split, count in zip(("train", "test"), args.arith):
        rows = [arith_row(rng) for _ in range(count)]
        write_jsonl(out / f"arith_{split}.jsonl", [{k: v for k, v in row.items() if k != "expression"} for row in rows])
        write_jsonl(out / f"arith_tool_{split}.jsonl", rows)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {out}: {index} images, {total / 1024:.0f} KiB in all")


if __name__ == "__main__":
    main()
