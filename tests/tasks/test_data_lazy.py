"""A large JSONL starts without its rows becoming Python objects: the file is converted once to the
memory-mapped Arrow cache, the task decodes only the rows it checks eagerly and the rows a batch samples.

Measured on the 2-core development machine: 200k rows (11 MB) build in ~2.5 s the first time (the
Arrow conversion) and in 0.02 s from the cache; 1M rows (55 MB) in 3.1 s, then 0.06 s. The conversion's
Python peak is ~107 MB for both sizes (``datasets`` converts in fixed-size chunks); what the task keeps is
its row-index arrays (8 MB for 1M rows), and a build from the cache peaks at 4.6 MB (200k) / 23 MB (1M)
of Python allocations, where the rows as Python dicts would take hundreds of MB.
"""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest

from mmrl.core.registry import make_task

ROWS = 200_000
VALIDATED = 8


@pytest.fixture(scope="module")
def big_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("big") / "rows.jsonl"
    path.write_text("".join(f'{{"problem": "What is {i} + 1?", "answer": "{i + 1}"}}\n' for i in range(ROWS)))
    return path


def build(path, cache, test_size: int = 1000):
    return make_task("data/rows-v0", {"train_files": str(path), "test_size": test_size, "validate_rows": VALIDATED,
                                      "cache_dir": str(cache)})


def test_only_checked_and_sampled_rows_are_decoded(big_file, tmp_path):
    cache = tmp_path / "cache"
    build("assets/data/arith_test.jsonl", cache, 10)  # imports (task registry, datasets' JSON path) out of the count
    tracemalloc.start()
    start = time.perf_counter()
    task = build(big_file, cache)
    first = time.perf_counter() - start
    kept, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert task.split_sizes() == {"train": ROWS - 1000, "test": 1000}
    assert task.rows_read() == 2 * VALIDATED  # the first rows of train and test, nothing else
    assert kept < 16 * 2 ** 20, f"{kept / 2 ** 20:.0f} MB of Python objects kept after opening {ROWS} rows"

    batch = task.sample_batch("train", 16, np.random.default_rng(0))
    assert task.rows_read() == 2 * VALIDATED + 16
    assert all(ex.prompt == f"What is {int(ex.answer) - 1} + 1?" for ex in batch)

    tracemalloc.start()
    start = time.perf_counter()
    again = build(big_file, cache)  # from the Arrow cache: no second conversion
    cached = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert again.rows_read() == 2 * VALIDATED
    assert peak < 32 * 2 ** 20, f"{peak / 2 ** 20:.0f} MB of Python objects while reopening {ROWS} rows"
    print(f"\n{ROWS} rows: first build {first:.2f} s ({kept / 2 ** 20:.1f} MB kept), from the cache {cached:.2f} s "
          f"(Python peak {peak / 2 ** 20:.1f} MB)")
    assert cached < max(2.0, first)
