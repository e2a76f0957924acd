"""Model-based rewards on tiny models (conftest.py: random weights, word-level tokenizers): deterministic,
batched == one row at a time, sensitive to their inputs, equal to the formula computed by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from mmrl.verifiers import RewardSpecError, build_reward
from mmrl.verifiers.models import JUDGE_TEMPLATE, load_model

PROMPTS = ["what is two plus two ?", "what is two plus two ?", "the answer ?", "two"]
COMPLETIONS = ["four", "the answer is five , five , five", "yes", "four four four four four four"]
ANSWERS = ["four", "four", "no", "two"]


def run(spec: dict) -> list[float]:
    return build_reward(spec)(PROMPTS, COMPLETIONS, {"answer": ANSWERS}).scores


def check_scores(one_at_a_time: list[float], batched: list[float], again: list[float]) -> None:
    assert all(0.0 < s < 1.0 for s in batched)
    assert batched == again  # deterministic
    assert batched == pytest.approx(one_at_a_time, abs=1e-5)  # padding changes nothing
    assert len({round(s, 6) for s in batched}) == len(batched)  # every input scores differently


def test_classifier_single_logit(classifier_dirs):
    spec = {"model": classifier_dirs["single"]}
    check_scores(run({"classifier": {**spec, "batch_size": 1}}), run({"classifier": {**spec, "batch_size": 4}}),
                 run({"classifier": {**spec, "batch_size": 3}}))


def test_classifier_matches_the_formula(classifier_dirs):
    model, tokenizer = load_model("classifier", Path(classifier_dirs["pair"]).resolve(),
                                  torch.device("cpu"), "float32")
    batch = tokenizer(PROMPTS[:1], COMPLETIONS[:1], return_tensors="pt")
    with torch.no_grad():
        expected = torch.sigmoid(model(**batch).logits[0, 1]).item()
    scores = build_reward({"classifier": {"model": classifier_dirs["pair"], "label": "good"}})(
        PROMPTS[:1], COMPLETIONS[:1], {}).scores
    assert scores == pytest.approx([expected], abs=1e-6)
    by_index = build_reward({"classifier": {"model": classifier_dirs["pair"], "label": 1}})(PROMPTS[:1], COMPLETIONS[:1], {})
    assert by_index.scores == scores


def test_classifier_is_loaded_once(classifier_dirs):
    build_reward({"classifier": {"model": classifier_dirs["single"]}})
    hits = load_model.cache_info().hits
    build_reward({"classifier": {"model": classifier_dirs["single"]}, "format": 0.1})
    assert load_model.cache_info().hits == hits + 1


@pytest.mark.parametrize("options, message", [
    ({}, r"the classifier has 2 labels \(\{0: 'bad', 1: 'good'\}\); set label"),
    ({"label": "great"}, r"label 'great' is not one of the classifier's labels \['bad', 'good'\]"),
    ({"label": 2}, r"label 2 is out of range for a classifier with 2 labels"),
    ({"label": 1, "batch_size": 0}, r"batch_size must be >= 1"),
    ({"label": 1, "dtype": "float64"}, r"dtype must be one of 'float32', 'bfloat16', 'float16'"),
    ({"label": 1, "device": "nonsense"}, r"device 'nonsense' is not a torch device"),
])
def test_classifier_spec_errors(classifier_dirs, options, message):
    with pytest.raises(RewardSpecError, match=message):
        build_reward({"classifier": {"model": classifier_dirs["pair"], **options}})


@pytest.mark.parametrize("kind", ["plain", "chat"])
def test_judge(judge_dirs, kind):
    spec = {"model": judge_dirs[kind]}
    check_scores(run({"judge": {**spec, "batch_size": 1}}), run({"judge": {**spec, "batch_size": 4}}),
                 run({"judge": {**spec, "batch_size": 3}}))


def test_judge_reads_the_reference_and_matches_the_formula(judge_dirs):
    reward = build_reward({"judge": {"model": judge_dirs["plain"], "judge_template": "{question} {reference} {response} ?"}})
    with_four = reward(PROMPTS[:1], COMPLETIONS[:1], {"answer": ["four"]}).scores
    with_five = reward(PROMPTS[:1], COMPLETIONS[:1], {"answer": ["five"]}).scores
    assert with_four != with_five
    model, tokenizer = load_model("judge", Path(judge_dirs["plain"]).resolve(),
                                  torch.device("cpu"), "float32")
    ids = tokenizer(f"{PROMPTS[0]} four {COMPLETIONS[0]} ?", return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        logits = model(**ids).logits[0, -1]
    yes, no = tokenizer.convert_tokens_to_ids(["yes", "Yes"]), tokenizer.convert_tokens_to_ids(["no", "No"])
    expected = torch.sigmoid(torch.logsumexp(logits[yes], 0) - torch.logsumexp(logits[no], 0)).item()
    assert with_four == pytest.approx([expected], abs=1e-6)


def test_judge_spec_errors(judge_dirs, tmp_path, word_tokenizer_factory):
    with pytest.raises(RewardSpecError, match=r"judge_template must contain \{response\}"):
        build_reward({"judge": {"model": judge_dirs["plain"], "judge_template": "Is {question} right?"}})
    tokenizer = word_tokenizer_factory({"pad_token": "<pad>", "eos_token": "<eos>", "unk_token": "<unk>"},
                                       drop=("yes", "Yes"))
    Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(RewardSpecError, match=r"no single-token spelling of yes"):
        build_reward({"judge": {"model": str(tmp_path)}})


def test_default_template_names_its_fields():
    assert all(field in JUDGE_TEMPLATE for field in ("{question}", "{reference}", "{response}"))


def test_non_text_rows_score_without_raising(judge_dirs, classifier_dirs):
    reward = build_reward({"judge": {"model": judge_dirs["plain"]}, "classifier": {"model": classifier_dirs["single"]}})
    batch = reward([None, "q"], [None, "x" * 100_000], {"answer": [None, 10 ** 5000]})
    assert batch.errors == [None, None] and all(0 < s < 2 for s in batch.scores)
