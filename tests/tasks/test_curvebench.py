"""CurveBench (``curvebench/*``): tree utilities with golden values, the published parser, the
rooted / unrooted rewards with hacking probes and fuzzing, the curve generator checked against the
OpenCV re-derivation of the tree for every category, disjoint splits, the local dataset loader, and
the recipes (tiny end to end + ``mmrl eval``; the learning run is ``slow``)."""

from __future__ import annotations

import collections
import json
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from mmrl.cli import main
from mmrl.core.contracts import VisualPrompt
from mmrl.core.registry import make_task
from mmrl.tasks.curvebench.curves import CATEGORIES, Pen, extract_tree, layout_problem
from mmrl.tasks.curvebench.local import load_local
from mmrl.tasks.curvebench.task import TEST_SEED_START
from mmrl.tasks.curvebench.trees import (all_topologies, answer_text, canonical_parents, edges_of, judge,
                                         parse_answer, rooted_canonical, rooted_tree_problem, unrooted_isomorphic)

QUIET = ["log.progress=false", "log.tensorboard=false"]
TINY = ["trainer.steps=2", "eval.num_examples=8", "rollout.prompts_per_step=4", "rollout.group_size=2",
        "trainer.minibatches=1", "warm_start.vision_steps=2", "warm_start.sft_steps=3", "warm_start.batch_size=8",
        "rollout.max_new_tokens=8", "checkpoint.every=2"]
CHAIN3 = (0, 1, 2)  # 0 ⊃ 1 ⊃ 2 ⊃ 3


def answer(body: str, think: str = "t") -> str:
    return f"<think>{think}</think><answer>\n{body}\n</answer>"


# ------------------------------------------------------------------------------------------------
# Trees


def test_topologies_are_every_rooted_tree_once():
    assert [len(all_topologies(k)) for k in range(7)] == [1, 1, 2, 4, 9, 20, 48]  # OEIS A000081
    assert all_topologies(3) == ((0, 0, 0), (0, 0, 1), (0, 1, 1), (0, 1, 2))
    for k in range(1, 6):
        codes = [rooted_canonical(edges_of(t)) for t in all_topologies(k)]
        assert len(set(codes)) == len(codes)
    with pytest.raises(ValueError, match="0..8 curves"):
        all_topologies(9)


def test_canonical_numbering_ignores_labels_and_child_order():
    a = [(0, 1), (0, 2), (2, 3), (2, 4)]
    b = [(0, 4), (4, 2), (0, 3), (4, 1)]
    assert canonical_parents(a) == canonical_parents(b) == (0, 0, 1, 1)  # the bigger subtree first
    assert rooted_canonical(a) == rooted_canonical(b) == "((()())())"
    assert rooted_canonical(edges_of((0, 1))) == "((()))"


def test_published_parser():
    parsed = parse_answer("<think>x</think><ANSWER>\n 3\n1 0\nnot an edge\n2 0\n3 1\n</ANSWER>")
    assert parsed.count == 3 and parsed.edges == ((0, 1), (0, 2), (1, 3)) and parsed.skipped_lines == 1
    assert parse_answer("<answer>three\n1 0</answer>") is None  # unparsable count line fails the parse
    assert parse_answer("no tags 1 0") is None
    first = parse_answer("<answer>1\n1 0</answer><answer>2\n1 0\n2 0</answer>")
    assert first.count == 1  # the first block, as published
    assert answer_text((0, 0, 1)) == "3\n1 0\n2 0\n3 1"


@pytest.mark.parametrize("edges, problem", [
    ([(0, 1), (1, 2)], ""),
    ([], "no edges"),
    ([(0, 1), (1, 1)], "self loop"),
    ([(0, 1), (0, 1)], "duplicated edge"),
    ([(0, 1), (0, 5)], "node id outside 0..2"),
    ([(0, 1), (-1, 2)], "node id outside"),
    ([(1, 0), (0, 2)], "the root 0 has a parent"),
    ([(0, 1), (2, 1)], "two parents"),
    ([(0, 1), (2, 3), (3, 2)], "cycle or node not reachable"),
    ([(0, 1), (3, 2), (2, 3)], "cycle or node not reachable"),
])
def test_rooted_tree_problems(edges, problem):
    found = rooted_tree_problem(edges)
    assert problem in found and (found == "") == (problem == "")


# ------------------------------------------------------------------------------------------------
# Reward


@pytest.mark.parametrize("output, tree, unrooted, count, fmt, reason", [
    (answer("3\n1 0\n2 1\n3 2"), 1, 1, 1, 1, ""),
    (answer("3\n3 0\n1 3\n2 1"), 1, 1, 1, 1, ""),  # any labelling of the right tree
    ("<answer>3\n1 0\n2 1\n3 2</answer>", 1, 1, 1, 0, "not exactly"),
    (answer("3\n1 0\n2 1\n3 2") + " more", 1, 1, 1, 0, "not exactly"),
    # re-rooted: the same path 3-2-1-0 read from the middle passes the published check only
    (answer("3\n1 0\n2 0\n3 1"), 0, 1, 1, 1, "wrong tree"),
    (answer("3\n1 0\n2 0\n3 0"), 0, 0, 1, 1, "wrong tree"),  # right count, wrong edges
    (answer("3\n1 0\n2 1\n3 2\n3 2"), 0, 1, 1, 1, "duplicated edge"),  # duplicates collapse in networkx
    (answer("3\n1 0\n2 1\n1 2"), 0, 0, 1, 1, "two parents"),
    (answer("3\n1 1\n2 1\n3 2"), 0, 0, 1, 1, "self loop"),
    (answer("3\n1 0\n7 1\n9 7"), 0, 1, 1, 1, "outside 0..3"),
    (answer("2\n1 0\n2 1\n3 2"), 1, 1, 0, 1, ""),  # the tree reward ignores the count line, as published
    (answer("x\n1 0\n2 1\n3 2"), 0, 0, 0, 1, "first line is the curve count"),
    ("3\n1 0\n2 1\n3 2", 0, 0, 0, 0, "no <answer>"),
    ("", 0, 0, 0, 0, "empty"),
    (None, 0, 0, 0, 0, "non-text"),
])
def test_tree_verdict_golden_values(output, tree, unrooted, count, fmt, reason):
    v = judge(output, CHAIN3)
    assert (v.tree, v.tree_unrooted, v.node_count, v.format) == (tree, unrooted, count, fmt)
    assert reason in v.info


def test_weighted_reward_and_its_range():
    task = make_task("curvebench/easy-v0", {"node_count_weight": 0.3, "format_weight": 0.1})
    example = task.example_from_seed(3)
    right = task.reference_output(example)
    assert task.reward(example, right).score == pytest.approx(1.0)
    count_only = answer(f"{len(example.parents)}\n1 0")
    wrong = task.reward(example, count_only)
    if len(example.parents) > 1:
        assert wrong.score == pytest.approx(0.9 * 0.3 + 0.1) and wrong.components["node_count"] == 1
    assert task.reward(example, "junk").score == 0.0
    assert task.reward_range == (0.0, 1.0)


def test_unrooted_check_matches_the_published_semantics():
    assert unrooted_isomorphic([(0, 1), (1, 2)], [(0, 1), (0, 2)])  # path 1-0-2 == path 0-1-2
    assert not unrooted_isomorphic([(0, 1), (0, 2), (0, 3)], [(0, 1), (1, 2), (2, 3)])
    assert unrooted_isomorphic([], []) and not unrooted_isomorphic([], [(0, 1)])


def test_hacking_probes_never_score_as_correct():
    truth = (0, 0, 1, 1)
    probes = [
        "<answer>4\n1 0\n2 1\n3 2\n4 3</answer>" + answer("4\n1 0\n2 0\n3 1\n4 1") * 5,  # repeated blocks: first only
        "<answer><answer>4\n1 0\n2 0\n3 1\n4 1</answer></answer>",  # nested tags
        answer("4\n" + "\n".join(f"{c} {p}" for p in range(5) for c in range(5))),  # every possible edge
        answer('{"count": 4, "tree": [[0, 1], [0, 2], [1, 3], [1, 4]], "edges": "all"}'),  # JSON with every key
        answer("4\n1 0\n2 0\n3 0\n4 0"),  # count right, edges wrong
        answer("4\n" + "1 0\n" * 4),  # one edge repeated
        answer("4\n1 2\n2 0\n3 2\n4 1"),  # re-rooted: node 2 as the root's only child
        answer("4\n1 0\n2 0\n3 1\n4 1\n0 0"),  # self loop on the root
        answer("4\n1 0\n2 0\n3 1\n4 1\n5 4\n6 5"),  # extra curves
        answer("4\n1 0\n2 0\n3 1\n4 1" + "\n1 0" * 200_000),  # huge answer
    ]
    for probe in probes:
        assert judge(probe, truth).tree == 0.0, probe[:80]


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.text(),
    st.text().map(lambda s: f"<answer>{s}</answer>"),
    st.lists(st.tuples(st.integers(-3, 9), st.integers(-3, 9)), max_size=12).map(
        lambda es: answer(f"{len(es)}\n" + "\n".join(f"{c} {p}" for p, c in es))),
    st.text(alphabet="<>/answerthik0123 \n\u00e9\U0001f642", max_size=300),
))
def test_reward_is_total_on_arbitrary_text(text):
    task = make_task("curvebench/easy-v0", {"node_count_weight": 0.3, "format_weight": 0.1})
    result = task.reward(FIXED_EXAMPLE, text)
    assert 0.0 <= result.score <= 1.0 and set(result.components) == {"tree", "tree_unrooted", "node_count", "format"}


FIXED_EXAMPLE = make_task("curvebench/easy-v0", {}).example_from_seed(0)


def test_reward_is_total_on_odd_objects():
    task = make_task("curvebench/easy-v0", {})
    for junk in (b"<answer>1\n1 0</answer>", 3, ["x"], "\x00" * 1000, "<answer>" * 10_000, "9" * 100_000):
        assert 0.0 <= task.reward(FIXED_EXAMPLE, junk).score <= 1.0


def test_integers_beyond_pythons_conversion_limit_are_wrong_not_crashes():
    """int() raises ValueError on >= 4,301 digits; such a count is wrong and such an id is outside the tree."""
    big = "9" * 4301
    count = judge(answer(f"{big}\n1 0"), (0,))
    assert count.node_count == 0.0 and count.tree == 1.0
    edge = judge(answer(f"1\n{big} 0"), (0,))
    assert edge.tree == 0.0 and "node id outside" in edge.info
    assert parse_answer(answer(f"1\n1 -{big}")).edges == ((-10 ** 18, 1),)


@pytest.mark.parametrize("output", ["<answer>" * 8000, "<ANSWER>" * 4000 + "1\n1 0", "<think>" + "</think>" * 4000])
def test_repeated_tags_are_judged_quickly(output):
    """The lazy <answer>(.*?)</answer> search took 7.8 s on "<answer>" repeated to 64k characters."""
    start = time.perf_counter()
    judge(output, CHAIN3)
    assert time.perf_counter() - start < 0.25


# ------------------------------------------------------------------------------------------------
# Generator and OpenCV re-derivation


@pytest.mark.parametrize("category", CATEGORIES)
def test_opencv_contour_tree_agrees_with_the_construction_tree(category):
    task = make_task(f"curvebench/{category}-v0", {"image_size": 448})
    examples = task.sample_batch("train", 12, np.random.default_rng(7))
    for e in examples:
        assert e.category == category
        assert not layout_problem(e.parents, e.curves, Pen.for_size(448), 448)
        assert extract_tree(e.images[0]) == e.parents, (category, e.seed)
    assert len({e.parents for e in examples}) > 1


def test_tiny_setting_draws_every_topology_and_reads_back():
    task = make_task("curvebench/easy-v0", {"image_size": 112, "max_curves": 3})
    examples = task.sample_batch("test", 140, np.random.default_rng(0))
    counts = collections.Counter(e.parents for e in examples)
    assert set(counts) == {t for k in (1, 2, 3) for t in all_topologies(k)}
    assert min(counts.values()) >= 8  # ~uniform over the 7 topologies
    for e in examples[:40]:
        assert extract_tree(e.images[0]) == e.parents


def test_layout_check_catches_touching_and_crossing_curves():
    pen, size = Pen.for_size(448), 448
    circle = lambda cx, cy, r: tuple((cx + r * np.cos(a), cy + r * np.sin(a)) for a in np.linspace(0, 6.28, 64, endpoint=False))
    assert layout_problem((0, 0), (circle(150, 200, 60), circle(300, 200, 60)), pen, size) == ""
    assert "closer than" in layout_problem((0, 0), (circle(150, 200, 60), circle(272, 200, 60)), pen, size)
    assert "overlap" in layout_problem((0, 0), (circle(150, 200, 60), circle(200, 200, 60)), pen, size)
    assert "should nest" in layout_problem((0, 1), (circle(150, 200, 60), circle(300, 200, 30)), pen, size)
    assert "leaves the image" in layout_problem((0,), (circle(20, 200, 60),), pen, size)
    bowtie = ((100, 100), (200, 200), (200, 100), (100, 200))
    assert "intersects itself" in layout_problem((0,), (bowtie,), pen, size)


def test_examples_are_deterministic_visual_prompts():
    task = make_task("curvebench/hard-v0", {})
    a = task.sample_batch("train", 8, np.random.default_rng(5))
    b = task.sample_batch("train", 8, np.random.default_rng(5))
    assert a == b and all(isinstance(e, VisualPrompt) for e in a)
    assert {e.category for e in a} <= {"polygon", "topographic", "maze", "counting"}
    assert a[0].prompt.count("<image>") == 1 and "root node is always 0" in a[0].system
    assert np.array_equal(np.asarray(a[0].images[0]), np.asarray(b[0].images[0]))
    assert a[0].images[0].size == (448, 448)


def test_splits_never_overlap():
    task = make_task("curvebench/easy-v0", {"image_size": 112, "max_curves": 3})
    rng = np.random.default_rng(0)
    train, test = task.sample_batch("train", 200, rng), task.sample_batch("test", 200, rng)
    assert all(e.seed < TEST_SEED_START for e in train) and all(e.seed >= TEST_SEED_START for e in test)
    assert not {e.curves for e in train} & {e.curves for e in test}
    with pytest.raises(ValueError, match="unknown split 'val'"):
        task.sample_batch("val", 1, rng)


def test_metrics_per_category():
    task = make_task("curvebench/hard-v0", {})
    examples = [task.example_from_seed(s) for s in range(8)]  # seed % 4 picks the category
    outputs = [task.reference_output(e) if e.category != "maze" else "no" for e in examples]
    metrics = task.metrics(examples, outputs, [task.reward(e, o) for e, o in zip(examples, outputs)])
    assert metrics["tree_accuracy"] == 0.75 and metrics["tree_accuracy_unrooted"] == 0.75
    assert metrics["tree_accuracy/maze"] == 0.0 and metrics["tree_accuracy/polygon"] == 1.0
    assert metrics["node_count_accuracy"] == 0.75 and metrics["format_rate"] == 0.75


def test_bad_task_args_are_rejected_early():
    with pytest.raises(ValueError, match="too small to draw"):
        make_task("curvebench/easy-v0", {"image_size": 112, "max_curves": 5})
    with pytest.raises(ValueError, match="min_curves <= max_curves"):
        make_task("curvebench/easy-v0", {"min_curves": 4, "max_curves": 2})
    with pytest.raises(ValueError, match="fixes task.args.category"):
        make_task("curvebench/maze-v0", {"category": "polygon"})
    with pytest.raises(ValueError, match=">= 256"):
        make_task("curvebench/counting-v0", {"image_size": 128})
    with pytest.raises(ValueError, match="node_count_weight"):
        make_task("curvebench/easy-v0", {"node_count_weight": 1.5})


# ------------------------------------------------------------------------------------------------
# Local copy of the published dataset


def write_folder(root, rows, images):
    root.mkdir()
    for name, image in images.items():
        image.save(root / name)
    (root / "metadata.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return root


def test_local_folder_loads_and_scores(tmp_path):
    task = make_task("curvebench/easy-v0", {"image_size": 224})
    drawn = [task.example_from_seed(s) for s in range(3)]
    rows = [{"file_name": f"{i}.png", "num_nodes": len(e.parents), "tree": [list(x) for x in edges_of(e.parents)]}
            for i, e in enumerate(drawn)]
    folder = write_folder(tmp_path / "easy_test", rows, {f"{i}.png": e.images[0] for i, e in enumerate(drawn)})
    loaded = load_local(str(folder))
    assert [e.parents for e in loaded] == [e.parents for e in drawn] and loaded[0].category == "easy_test"
    local = make_task("curvebench/easy-v0", {"test_path": str(folder)})
    examples = local.sample_batch("test", 6, np.random.default_rng(0))
    assert all(isinstance(e, VisualPrompt) for e in examples)
    assert all(local.reward(e, local.reference_output(e)).score == 1.0 for e in examples)
    assert all(extract_tree(e.images[0]) == e.parents for e in examples)
    assert local.sample_batch("train", 1, np.random.default_rng(0))[0].seed < TEST_SEED_START  # still procedural


def test_local_folder_errors_name_the_row(tmp_path):
    good = {"file_name": "a.png", "num_nodes": 1, "tree": [[0, 1]]}
    white = {"a.png": Image.new("RGB", (32, 32), "white")}
    cases = {
        "bad_tree": ({**good, "tree": [[1, 2]], "num_nodes": 1}, "not a rooted tree"),
        "bad_count": ({**good, "num_nodes": 2}, "not a rooted tree"),
        "no_column": ({"file_name": "a.png", "tree": [[0, 1]]}, "missing column"),
        "no_image": ({**good, "file_name": "b.png"}, "unreadable image"),
    }
    for name, (row, message) in cases.items():
        folder = write_folder(tmp_path / name, [row], white)
        with pytest.raises(ValueError, match=message):
            load_local(str(folder))
    corrupt = tmp_path / "corrupt"
    write_folder(corrupt, [good], {})
    (corrupt / "a.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match=r"metadata.jsonl:1: unreadable image"):
        load_local(str(corrupt))
    with pytest.raises(FileNotFoundError, match="not a .parquet file or a folder"):
        load_local(str(tmp_path / "missing"))


def test_parquet_needs_pyarrow_or_loads(tmp_path, monkeypatch):
    import io
    import sys

    image = make_task("curvebench/easy-v0", {"image_size": 224}).example_from_seed(1)
    buffer = io.BytesIO()
    image.images[0].save(buffer, format="PNG")
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        (tmp_path / "x.parquet").write_bytes(b"PAR1")
        monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
        with pytest.raises(ImportError, match="needs pyarrow"):
            load_local(str(tmp_path / "x.parquet"))
        return
    table = pa.table({"image": [{"bytes": buffer.getvalue(), "path": None}], "num_nodes": [len(image.parents)],
                      "tree": [[list(e) for e in edges_of(image.parents)]]})
    pq.write_table(table, tmp_path / "x.parquet")
    assert load_local(str(tmp_path / "x.parquet"))[0].parents == image.parents


# ------------------------------------------------------------------------------------------------
# Recipes


def read_rows(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_tiny_cpu_recipe_trains_and_mmrl_eval_prints_the_metrics(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "configs/curvebench/tiny_cpu.yaml", "--out", str(run), "--no-plot", *QUIET, *TINY]) == 0
    rows = read_rows(run)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert {"eval/tree_accuracy", "eval/tree_accuracy/easy", "eval/tree_accuracy_unrooted",
            "eval/node_count_accuracy", "reward/tree", "reward/tree_unrooted"} <= set(rows[-1])
    capsys.readouterr()
    assert main(["eval", "curvebench/tiny_cpu", "--model", str(run), "--num-examples", "8"]) == 0
    printed = capsys.readouterr().out
    assert "tree_accuracy/easy" in printed and "tree_accuracy_unrooted" in printed


def test_mmrl_eval_of_a_run_equals_the_trainers_last_evaluation(tmp_path):
    """``mmrl eval curvebench/easy-v0 --model RUN`` keeps the run's task arguments (1-3 curves at
    112 px, not the id's defaults) and its latest checkpoint, so it reproduces the logged numbers."""
    run = tmp_path / "run"
    assert main(["train", "configs/curvebench/tiny_cpu.yaml", "--out", str(run), "--no-plot", *QUIET, *TINY,
                 "rollout.max_new_tokens=40"]) == 0
    logged = {k.removeprefix("eval/"): v for k, v in read_rows(run)[-1].items() if k.startswith("eval/")}
    out = tmp_path / "eval.json"
    assert main(["eval", "curvebench/easy-v0", "--model", str(run), "--num-examples", "8", "--json", str(out)]) == 0
    printed = json.loads(out.read_text())["metrics"]["test"]
    assert set(printed) == set(logged) and "tree_accuracy/easy" in printed
    assert printed == pytest.approx(logged, abs=1e-9)


def test_vision_label_is_the_curve_count_and_the_nesting_depth():
    """The vision-pretraining label (count, depth) leaves (0, 0, 1) and (0, 1, 1) to the VLM."""
    task = make_task("curvebench/easy-v0", {"image_size": 112, "max_curves": 3})
    assert task.vision_classes == 9
    labels = {}
    for seed in range(200):
        ex = task.example_from_seed(seed)
        labels.setdefault(ex.parents, set()).add(task.vision_label(ex))
    assert labels == {(0,): {0}, (0, 0): {3}, (0, 1): {4}, (0, 0, 0): {6}, (0, 0, 1): {7}, (0, 1, 1): {7},
                      (0, 1, 2): {8}}
    hard = make_task("curvebench/maze-v0", {"image_size": 256})
    with pytest.raises(ValueError, match="easy category only"):
        hard.vision_label(hard.example_from_seed(0))


@pytest.mark.slow
def test_grpo_raises_held_out_tree_accuracy_after_the_warm_start(tmp_path):
    """The goal of the tiny recipe (issue 4): the warm start (vision pretraining + SFT) reads the
    image but is undecided, and GRPO raises held-out rooted tree accuracy on 200 greedy test images.

    The last evaluation alone swings by several points between builds and thread counts (docs/results.md:
    +0.135 / +0.130 for seeds 0 / 1, +0.045 at one thread on a fresh machine), so the check is on the mean
    of the evaluations at steps 30-100: +0.16, +0.15 and +0.095 over the warm start in those three runs."""
    run = tmp_path / "run"
    assert main(["train", "curvebench/tiny_cpu", "--out", str(run), "--no-plot", *QUIET,
                 "warm_start.cache=false"]) == 0
    evals = [r for r in read_rows(run) if "eval/tree_accuracy" in r]
    start, end = evals[0]["eval/tree_accuracy"], evals[-1]["eval/tree_accuracy"]
    assert 0.3 <= start <= 0.75  # image-dependent (one constant tree scores <= 0.17) but not saturated
    late = [r["eval/tree_accuracy"] for r in evals if r["step"] >= 30]
    assert sum(late) / len(late) >= start + 0.05, (start, late, end)
    assert evals[-1]["eval/reward_mean"] > evals[0]["eval/reward_mean"]


def test_gpu_recipe_is_dr_grpo_as_published():
    from mmrl.core.config import load_config

    cfg = load_config("curvebench/qwen3_vl_8b_gpu")
    assert cfg.task.name == "curvebench/easy-v0" and cfg.policy.args.pretrained.startswith("models/Qwen3-VL-8B")
    assert cfg.rollout.group_size == 8 and cfg.algo.kl_coef == 0.001 and cfg.trainer.lr == 8e-5
    assert cfg.algo.loss_agg == "seq-mean-token-sum-norm" and cfg.algo.norm_adv_by_std is False
    assert cfg.policy.args.lora_rank == 4 and cfg.policy.args.lora_alpha == 8 and cfg.trainer.steps == 250
    assert cfg.rollout.max_new_tokens == 4096


def test_gpu_recipe_validates():
    """The GPU recipe cannot run here (no GPU, no checkpoint) but must be a valid config (as
    test_vlm_sanity.py::test_gpu_recipes_validate): a local folder, bf16, LoRA with the adapter-disabled
    reference that the KL term needs, HF sampling without the vLLM-only corrections, a task that builds
    (every 1-5 curve topology fits at 448 px), prompts within the token budget."""
    from mmrl.core.config import load_config

    cfg = load_config("curvebench/qwen3_vl_8b_gpu")
    args = cfg.policy.args
    assert cfg.policy.name == "vlm" and args.pretrained.startswith("models/") and args.dtype == "bfloat16"
    assert cfg.trainer.mixed_precision == "bf16" and args.gradient_checkpointing
    assert (args.lora_rank > 0) == (cfg.trainer.ref_model == "adapter_disabled") == (cfg.algo.kl_coef > 0)
    assert (args.sampler == "vllm") == cfg.trainer.recompute_logp_old == (cfg.algo.tis_cap is not None)
    assert cfg.warm_start.sft_steps == 0  # RL from the released checkpoint, as the paper
    task = make_task(cfg.task.name, cfg.task.args)
    assert task.cfg.node_count_weight == 0.0 and task.cfg.format_weight == 0.0 and task.cfg.system_prompt
    assert len(task._topologies) == 1 + 2 + 4 + 9 + 20
    assert args.max_pixels >= task.cfg.image_size ** 2  # the drawn image is not shrunk
    # the variants the recipe's header documents validate too
    vllm = load_config("curvebench/qwen3_vl_8b_gpu", ["policy.args.sampler=vllm", "trainer.recompute_logp_old=true",
                                                      "algo.tis_cap=2.0"])
    assert vllm.policy.args.sampler == "vllm"
    hard = load_config("curvebench/qwen3_vl_8b_gpu", ["task.name=curvebench/hard-v0", "task.args.node_count_weight=0.3"])
    assert make_task(hard.task.name, hard.task.args).cfg.category == "hard"
