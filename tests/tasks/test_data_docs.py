"""Every example in docs/data.md runs: Python blocks execute (a block opening with ``# <name>.py`` is
written to that file instead), YAML blocks with a ``task`` section build their task, JSON rows load as
one-row datasets through ``data/rows-v0``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from mmrl.core.paths import assets_dir
from mmrl.core.registry import make_task

DOC = Path(__file__).resolve().parents[2] / "docs" / "data.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.DOTALL | re.MULTILINE)


def blocks(language: str) -> list[str]:
    return [body for lang, body in BLOCK.findall(DOC.read_text()) if lang == language]


def test_the_doc_has_examples_of_each_kind():
    assert len(blocks("python")) >= 2 and len(blocks("yaml")) >= 4 and len(blocks("json")) >= 3


def test_python_and_yaml_examples_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # files the doc writes land here; assets/ paths resolve to the package's
    for body in blocks("python"):
        name = re.match(r"# (\S+\.py)\n", body)
        if name:
            (tmp_path / name.group(1)).write_text(body)
        else:
            exec(compile(body, str(DOC), "exec"), {})
    tasks = 0
    for body in blocks("yaml"):
        section = yaml.safe_load(body)["task"]
        task = make_task(section["name"], section.get("args", {}))
        examples = task.sample_batch("train", 4, np.random.default_rng(0))
        results = [task.reward(ex, task.reference_output(ex)) for ex in examples]
        assert all(r.score == 1.0 for r in results), [r.info for r in results]
        tasks += 1
    assert tasks == len(blocks("yaml"))


@pytest.mark.parametrize("index", range(3))
def test_json_rows_load(tmp_path, index):
    row = json.loads(blocks("json")[index])
    (tmp_path / "row.jsonl").write_text(json.dumps(row) + "\n")
    task = make_task("data/rows-v0", {"train_files": str(tmp_path / "row.jsonl"),
                                      "image_root": str(assets_dir() / "data")})
    (example,) = task.sample_batch("train", 1, np.random.default_rng(0))
    assert example.answer and example.prompt.count("<image>") == len(example.images)
