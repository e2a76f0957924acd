"""``data/mixture-v0`` / ``mixture``: seeded weighted sampling, routing of rewards and reference outputs to
each source, per-source metrics, the policy-kind check and the errors of a bad source list."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mmrl.core.contracts import VisualPrompt
from mmrl.core.registry import UnknownNameError, make_task
from mmrl.core.typed import ConfigError
from mmrl.tasks.data import DataError, SourcedExample

ARITH = {"train_files": "assets/data/arith_train.jsonl", "test_files": "assets/data/arith_test.jsonl"}
TEXT_RECIPE_CHARS = " .,:?!<>/=+-\n0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
VQA = {"train_files": "assets/data/train.jsonl", "test_files": "assets/data/test.jsonl"}


def mixture(*sources: dict):
    return make_task("mixture", {"sources": list(sources)})


@pytest.fixture(scope="module")
def text_mix():
    return mixture({"name": "arith", "task": "data/rows-v0", "args": ARITH, "weight": 3.0},
                   {"name": "reverse", "task": "sanity/reverse-v0", "weight": 1.0})


def test_alias_builds_the_versioned_task(text_mix):
    assert text_mix.id == "data/mixture-v0" and text_mix.policy_kinds == {"text"}


def test_sampling_follows_the_weights_and_is_seeded(text_mix):
    batch = text_mix.sample_batch("train", 2000, np.random.default_rng(0))
    share = np.mean([ex.source == "arith" for ex in batch])
    assert abs(share - 0.75) < 0.03  # binomial sd at n = 2000: 0.01
    again = text_mix.sample_batch("train", 50, np.random.default_rng(7))
    assert again == text_mix.sample_batch("train", 50, np.random.default_rng(7))
    assert again != text_mix.sample_batch("train", 50, np.random.default_rng(8))
    assert all(isinstance(ex, SourcedExample) and isinstance(ex.prompt, str) for ex in again)


def test_rewards_and_reference_outputs_route_to_the_source(text_mix):
    batch = text_mix.sample_batch("train", 40, np.random.default_rng(1))
    references = [text_mix.reference_output(ex) for ex in batch]
    for ex, ref in zip(batch, references):
        child = text_mix.children[ex.source]
        assert ref == child.reference_output(ex.example)
    results = text_mix.reward_batch(batch, references)
    assert [r.score for r in results] == [1.0] * len(batch)
    wrong = text_mix.reward_batch(batch, ["nope"] * len(batch))
    assert [r.score for r in wrong] == [text_mix.reward(ex, "nope").score for ex in batch]
    assert {ex.source for ex in batch} == {"arith", "reverse"}


def test_metrics_per_source(text_mix):
    batch = text_mix.sample_batch("test", 60, np.random.default_rng(2))
    outputs = [text_mix.reference_output(ex) if ex.source == "arith" else "0" for ex in batch]
    results = text_mix.reward_batch(batch, outputs)
    metrics = text_mix.metrics(batch, outputs, results)
    assert metrics["arith/reward_mean"] == 1.0 and metrics["arith/accuracy"] == 1.0
    assert metrics["reverse/exact_match"] == 0.0 and metrics["reverse/reward_mean"] < 1.0
    n_arith = sum(ex.source == "arith" for ex in batch)
    assert metrics["arith/share"] == pytest.approx(n_arith / 60)
    overall = np.mean([r.score for r in results])  # the trainer's eval/reward_mean
    assert overall == pytest.approx(metrics["arith/share"] * 1.0 + metrics["reverse/share"] * metrics["reverse/reward_mean"])


def test_vlm_sources_mix_and_expose_visual_prompts():
    mix = mixture({"name": "vqa", "task": "data/rows-v0", "args": VQA},
                  {"name": "shapes", "task": "vlm_sanity/shape_color-v0", "weight": 0.5},
                  {"name": "arith", "task": "data/rows-v0", "args": ARITH, "weight": 0.5})
    assert mix.policy_kinds == {"vlm"}  # text rows suit a VLM too
    batch = mix.sample_batch("train", 30, np.random.default_rng(0))
    assert all(isinstance(ex, VisualPrompt) for ex in batch)
    assert {len(ex.images) for ex in batch if ex.source != "arith"} == {1}
    assert all(ex.images == () and ex.system is None for ex in batch if ex.source == "arith")


def test_text_and_vlm_only_sources_are_refused():
    with pytest.raises(ConfigError, match=r"need one kind of policy, but 'reverse' suits text prompts .* 'vqa' suits "
                                          r"VLM prompts"):
        mixture({"name": "reverse", "task": "sanity/reverse-v0"}, {"name": "vqa", "task": "data/rows-v0", "args": VQA})


@pytest.mark.parametrize("sources, error, message", [
    ([], ConfigError, "task.args.sources is empty"),
    ([{"name": "a/b", "task": "sanity/reverse-v0"}], ConfigError, "name 'a/b' must be letters"),
    ([{"name": "a", "task": "sanity/reverse-v0"}, {"name": "a", "task": "sanity/reverse-v0"}], ConfigError,
     "'a' is used twice"),
    ([{"name": "a", "task": "sanity/reverse-v0", "weight": 0}], ConfigError, "weight must be a positive number"),
    ([{"name": "a", "task": "sanity/revers-v0"}], UnknownNameError, r"sources\[0\] \(a\)\.task: unknown task .*Did you mean"),
    ([{"name": "a", "task": "data/rows-v0", "args": {"train_files": "nope.jsonl"}}], DataError,
     r"task.args.sources\[0\] \(a\): task.args.train_files: no such file"),
])
def test_bad_source_lists(sources, error, message):
    with pytest.raises(error, match=message):
        make_task("data/mixture-v0", {"sources": sources})


def test_mixture_trains_and_logs_per_source_eval_metrics(tmp_path):
    from mmrl.cli import main

    recipe = tmp_path / "mix.yaml"
    recipe.write_text(json.dumps({
        "task": {"name": "mixture", "args": {"sources": [
            {"name": "arith", "task": "data/rows-v0", "args": ARITH, "weight": 0.5},
            {"name": "reverse", "task": "sanity/reverse-v0", "weight": 0.5}]}},
        "policy": {"name": "causal_lm", "args": {"model_config": "assets/data/qwen2_tiny_text.json",
                                                 "tokenizer_chars": TEXT_RECIPE_CHARS,
                                                 "init_seed": 0}},
        "rollout": {"prompts_per_step": 4, "group_size": 2, "max_new_tokens": 4},
        "trainer": {"steps": 1, "minibatches": 1}, "eval": {"num_examples": 12},
        "warm_start": {"sft_steps": 2, "batch_size": 4},
        "log": {"progress": False, "tensorboard": False}}))
    assert main(["train", str(recipe), "--out", str(tmp_path / "run"), "--no-plot"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    final = [r for r in rows if "eval/reward_mean" in r][-1]
    assert {"eval/arith/reward_mean", "eval/arith/accuracy", "eval/reverse/reward_mean",
            "eval/reverse/exact_match"} <= set(final)
