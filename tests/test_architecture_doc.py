"""The worked examples of docs/architecture.md ("Adding a variant", "Adding a task family") run as printed
(in a subprocess, so that what they register does not leak into other tests)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"

CHECK = """
import numpy as np, torch
from mmrl.algos.shaping import SHAPING_HOOKS, ShapingContext
from mmrl.core.config import load_config
from mmrl.core.registry import make_task

mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
ctx = ShapingContext(outcome=torch.zeros(2), rewards=torch.zeros(2), group_id=torch.zeros(2, dtype=torch.long),
                     mask=mask, logp_old=torch.zeros(2, 3), ref_logp=None, entropy=None)
adv = SHAPING_HOOKS.get("length_normalised")(torch.full((2, 3), 2.0) * mask, ctx, None)
assert torch.equal(adv, torch.tensor([[1.0, 1.0, 0.0], [2.0, 0.0, 0.0]])), adv

load_config("sanity/tiny_cpu", ["algo.shaping=[length_normalised]"])  # the recipe line validates
task = make_task("parity/bits-v0", {"digits": 8})
example = task.sample_batch("train", 1, np.random.default_rng(0))[0]
assert len(example.prompt) == 9 and task.reward(example, task.reference_output(example)).score == 1.0
assert task.reward(example, "<garbage>").score == 0.0
print("ok")
"""


def doc_blocks() -> list[str]:
    text = DOC.read_text()
    section = text[text.index("**Adding a variant**"):text.index("## Contracts")]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_worked_examples_run_as_printed():
    blocks = doc_blocks()
    assert len(blocks) == 2
    assert all(len(block.strip().splitlines()) < 30 for block in blocks)  # the doc's promise: under 30 lines each
    done = subprocess.run([sys.executable, "-c", "\n".join(blocks) + CHECK], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_no_module_sits_in_an_import_cycle():
    """docs/architecture.md's promise, lazy imports included (scripts/results/import_cycles.py)."""
    spec = importlib.util.spec_from_file_location("import_cycles", DOC.parents[1] / "scripts/results/import_cycles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    graph = module.import_graph(DOC.parents[1])
    assert len(graph) > 100 and module.cycles(graph) == []
    graph["mmrl.core.rollout"].add("mmrl.core.trainer")  # a planted upward import is found
    assert ["mmrl.core.rollout", "mmrl.core.trainer"] in [sorted(set(c) & {"mmrl.core.rollout", "mmrl.core.trainer"})
                                                        for c in module.cycles(graph)]
