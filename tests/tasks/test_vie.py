"""VIE task (issue 4, in progress): synthetic documents, key sampling, splits, the F_β reward, local data."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from mmrl.core.registry import make_task
from mmrl.tasks.vie.reward import extraction_reward

TRUTH = {"patient_name": "Ana Ruiz", "glucose": "1,234.50 mg/dL"}


def task(**args):
    return make_task("vie/extract-v0", args)


def test_examples_are_seeded_visual_prompts_with_a_key_subset():
    t = task()
    a = t.sample_batch("train", 6, np.random.default_rng(0))
    b = t.sample_batch("train", 6, np.random.default_rng(0))
    assert [e.truth for e in a] == [e.truth for e in b]
    for e, f in zip(a, b):
        assert e.prompt.count("<image>") == len(e.images) == 1
        assert set(e.truth) <= {k for k, _ in e.document.fields} and e.truth
        assert np.array_equal(np.asarray(e.images[0]), np.asarray(f.images[0]))


def test_train_and_test_documents_never_overlap():
    t = task(doc_types=["card"])
    train = {repr(e.document) for e in t.sample_batch("train", 60, np.random.default_rng(1))}
    test = {repr(e.document) for e in t.sample_batch("test", 30, np.random.default_rng(1))}
    assert train and test and not train & test


def test_the_reference_answer_scores_one():
    t = task()
    for e in t.sample_batch("test", 8, np.random.default_rng(2)):
        assert t.reward(e, t.reference_output(e)).score == pytest.approx(1.0)


def test_values_are_normalised_and_hallucinated_keys_cost_precision():
    assert extraction_reward('<think>r</think><answer>{"Patient Name": "ana  ruiz", "glucose": '
                             '"1234.5 mg/dL"}</answer>', TRUTH).score == pytest.approx(1.0)
    extra = extraction_reward('<answer>{"patient_name": "Ana Ruiz", "glucose": "1234.5 mg/dL", "sex": "F"}</answer>',
                              TRUTH)
    assert extra.components["precision"] == pytest.approx(2 / 3) and extra.components["recall"] == 1.0


@pytest.mark.parametrize("output, reason", [
    ("no json here", "no JSON object"),
    ("<answer>{not json}</answer>", ""),
    ("<answer>" + "{" * 5000 + "</answer>", ""),
])
def test_unparseable_json_scores_zero_with_a_reason(output, reason):
    result = extraction_reward(output, TRUTH)
    assert result.score == 0.0 and reason in result.info and result.info


def test_hacking_probes_do_not_score_as_correct():
    every_key = {k: "Ana Ruiz" for k in ("patient_name", "glucose", "sex", "age", "date", "doctor")}
    assert extraction_reward(f"<answer>{json.dumps(every_key)}</answer>", TRUTH).score < 0.5
    dup = '<answer>{"patient_name": "Ana Ruiz", "Patient_Name": "x", "glucose": "1", "GLUCOSE": "1,234.50 mg/dL"}</answer>'
    assert extraction_reward(dup, TRUTH).score < 0.9


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.text().map(lambda s: f"<answer>{{\"a\": \"{s}\"}}</answer>" * 2),
                 st.none(), st.integers(), st.dictionaries(st.text(), st.text())))
def test_reward_is_total_and_in_range(output):
    assert 0.0 <= extraction_reward(output, TRUTH).score <= 1.0


def test_a_local_folder_loads_and_a_corrupt_image_is_named(tmp_path):
    for i in range(12):
        Image.new("RGB", (64, 32), "white").save(tmp_path / f"doc{i}.png")
        (tmp_path / f"doc{i}.json").write_text(json.dumps({"total": str(i), "date": "2026-01-0%d" % (i % 9 + 1)}))
    (tmp_path / "schema.json").write_text(json.dumps({"total": "amount due"}))
    t = task(local_dir=str(tmp_path), test_fraction=0.5)
    e = t.sample_batch("train", 3, np.random.default_rng(0))[0]
    assert e.images[0].size == (64, 32) and t.reward(e, t.reference_output(e)).score == pytest.approx(1.0)
    (tmp_path / "doc3.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match="doc3.png"):
        task(local_dir=str(tmp_path))


def test_missing_local_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="local_dir"):
        task(local_dir=str(tmp_path / "absent"))


@pytest.mark.parametrize("digits", [309, 400, 4300])
def test_huge_json_integers_are_wrong_values_not_crashes(digits):
    """JSON ints beyond 1e308 used to raise OverflowError (math.isfinite converts to float)."""
    result = extraction_reward('<answer>{"age": ' + "9" * digits + '}</answer>', {"age": "42"})
    assert result.score == 0.0 and result.components["json_valid"] == 1.0
    assert extraction_reward('<answer>{"age": ' + "9" * 5000 + '}</answer>', {"age": "42"}).score == 0.0


def test_listing_every_candidate_value_of_a_key_never_pays():
    """Duplicate keys used to count as separate claims: all four triage colours averaged 0.36 (0.225
    for committing to one). A key given several different values is one wrong claim."""
    colours = ("red", "yellow", "green", "black")
    hedge = '<answer>{' + ", ".join(f'"triage": "{c}"' for c in colours) + '}</answer>'
    hedged = np.mean([extraction_reward(hedge, {"triage": c}).score for c in colours])
    committed = np.mean([extraction_reward('<answer>{"triage": "red"}</answer>', {"triage": c}).score for c in colours])
    assert hedged == 0.0 and committed == pytest.approx(0.225)
    same_twice = extraction_reward('<answer>{"triage": "red", "Triage": "RED", "bed": ""}</answer>', {"triage": "red"})
    assert same_twice.score == pytest.approx(0.9)  # the same value repeated is one claim


def test_a_repeated_answer_tag_is_scored_quickly():
    import time

    start = time.perf_counter()
    extraction_reward("<answer>" * 4000, TRUTH)
    assert time.perf_counter() - start < 0.25
