"""``data/rows-v0``: every layout and file kind, image cells, placeholders, templates, seeded splits and
sampling, the batched verifier call, metrics, and one clear error for every kind of bad input."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmrl.core.contracts import IMAGE_PLACEHOLDER, VisualPrompt
from mmrl.core.registry import make_task
from mmrl.core.typed import ConfigError
from mmrl.tasks.data import DataError, RowExample

RED, BLUE = (220, 30, 30), (30, 60, 220)


def png(path: Path, colour: tuple[int, int, int] = RED, size: int = 16) -> Path:
    Image.new("RGB", (size, size), colour).save(path)
    return path


def png_bytes(colour: tuple[int, int, int] = RED) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def rows_task(**args):
    return make_task("data/rows-v0", {"validate_rows": 8, **args})


def one(task, split: str = "train", seed: int = 0) -> RowExample:
    return task.sample_batch(split, 1, np.random.default_rng(seed))[0]


# ------------------------------------------------------------------------------------------------
# layouts and file kinds

def test_llava_sharegpt_layout(tmp_path):
    png(tmp_path / "a.png")
    rows = [{"image": "a.png", "conversations": [{"from": "system", "value": "Be brief."},
                                                 {"from": "human", "value": "<image>\nWhat colour?"},
                                                 {"from": "gpt", "value": "red"}]}]
    task = rows_task(train_files=jsonl(tmp_path / "t.jsonl", rows))
    ex = one(task)
    assert isinstance(ex, VisualPrompt)
    assert (ex.prompt, ex.answer, ex.system) == ("<image>\nWhat colour?", "red", "Be brief.")
    assert len(ex.images) == 1 and ex.images[0].getpixel((3, 3)) == RED
    assert ex.columns["answer"] == "red" and ex.columns["image"] == ex.images
    assert task.reference_output(ex) == "<answer>red</answer>"


def test_openai_messages_layout_with_image_parts(tmp_path):
    png(tmp_path / "a.png"), png(tmp_path / "b.png", BLUE)
    rows = [{"images": ["a.png", "b.png"], "messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " left, right: "}, {"type": "image"},
                                     {"type": "text", "text": " same colour?"}]},
        {"role": "assistant", "content": "no"}]}]
    ex = one(rows_task(train_files=jsonl(tmp_path / "t.jsonl", rows)))
    assert ex.prompt == "<image> left, right: <image> same colour?" and ex.answer == "no"
    assert [im.getpixel((0, 0)) for im in ex.images] == [RED, BLUE]


def test_easyr1_layout_text_only_and_numbers_as_answers(tmp_path):
    task = rows_task(train_files=jsonl(tmp_path / "t.jsonl", [{"problem": "1+2?", "answer": 3}]))
    ex = one(task)
    assert (ex.prompt, ex.answer, ex.images, ex.system) == ("1+2?", "3", (), None)
    assert ex.columns["answer"] == 3  # the verifier sees the cell as stored


def test_column_mapping_and_verifier_aliases(tmp_path):
    rows = [{"q": "Pick one", "gold": "B", "options": ["x", "y"], "sys": "You answer."}]
    task = rows_task(train_files=jsonl(tmp_path / "t.jsonl", rows),
                     columns={"prompt": "q", "answer": "gold", "system": "sys", "choices": "options"})
    ex = one(task)
    assert (ex.prompt, ex.answer, ex.system) == ("Pick one", "B", "You answer.")
    assert ex.columns["choices"] == ["x", "y"] and ex.columns["answer"] == "B" and ex.columns["q"] == "Pick one"


@pytest.mark.parametrize("kind", ["json", "parquet", "csv", "save_to_disk", "dataset_dict", "glob"])
def test_file_kinds_load_through_datasets(tmp_path, kind):
    import datasets

    records = [{"question": f"q{i}", "answer": str(i)} for i in range(5)]
    table = datasets.Dataset.from_list(records)
    if kind == "json":
        path = tmp_path / "d.json"
        path.write_text(json.dumps(records))
    elif kind == "parquet":
        path = tmp_path / "d.parquet"
        table.to_parquet(str(path))
    elif kind == "csv":
        path = tmp_path / "d.csv"
        table.to_csv(str(path), index=False)
    elif kind == "save_to_disk":
        path = tmp_path / "saved"
        table.save_to_disk(str(path))
    elif kind == "dataset_dict":
        path = tmp_path / "saved_dict"
        datasets.DatasetDict({"train": table, "test": table.select([0])}).save_to_disk(str(path))
    else:
        for k in range(2):
            table.select(range(k * 3, min(5, k * 3 + 3))).to_parquet(str(tmp_path / f"shard{k}.parquet"))
        path = tmp_path / "shard*.parquet"
    task = rows_task(train_files=str(path), cache_dir=str(tmp_path / "cache"))
    examples = task.sample_batch("train", 5, np.random.default_rng(0))
    assert sorted(e.prompt for e in examples) == [f"q{i}" for i in range(5)]
    assert all(e.answer == e.prompt[1:] for e in examples)


def test_datasets_image_features_and_byte_cells(tmp_path):
    import datasets

    png(tmp_path / "a.png", BLUE)
    features = datasets.Features({"problem": datasets.Value("string"), "answer": datasets.Value("string"),
                                  "images": datasets.List(datasets.Image())})
    table = datasets.Dataset.from_dict({"problem": ["<image>Colour?"], "answer": ["blue"],
                                        "images": [[str(tmp_path / "a.png")]]}, features=features)
    table.save_to_disk(str(tmp_path / "saved"))
    ex = one(rows_task(train_files=str(tmp_path / "saved")))
    assert ex.images[0].getpixel((0, 0)) == BLUE and ex.images[0].mode == "RGB"
    rows = [{"problem": "Colour?", "answer": "red", "images": [{"bytes": None, "path": "a.png"}]}]
    parquet = tmp_path / "bytes.parquet"
    datasets.Dataset.from_dict({"problem": ["Colour?"], "answer": ["red"], "image": [png_bytes()]}).to_parquet(str(parquet))
    assert one(rows_task(train_files=str(parquet))).images[0].getpixel((0, 0)) == RED
    dict_cell = one(rows_task(train_files=jsonl(tmp_path / "d.jsonl", rows)))
    assert dict_cell.images[0].getpixel((0, 0)) == BLUE


def test_pil_cells_and_image_root(tmp_path):
    (tmp_path / "pics").mkdir()
    png(tmp_path / "pics" / "a.png", BLUE)
    rows = [{"problem": "Colour?", "answer": "blue", "image": "a.png"}]
    ex = one(rows_task(train_files=jsonl(tmp_path / "t.jsonl", rows), image_root=str(tmp_path / "pics")))
    assert ex.images[0].getpixel((0, 0)) == BLUE
    from mmrl.tasks.data.rows import decode_image

    rgba = Image.new("RGBA", (4, 4), (*RED, 255))
    assert decode_image(rgba, None, "row 0").mode == "RGB"


def test_placeholders_prepended_when_missing_and_kept_in_order(tmp_path):
    png(tmp_path / "a.png"), png(tmp_path / "b.png", BLUE)
    rows = [{"problem": "Same?", "answer": "no", "images": ["a.png", "b.png"]}]
    ex = one(rows_task(train_files=jsonl(tmp_path / "t.jsonl", rows)))
    assert ex.prompt == f"{IMAGE_PLACEHOLDER}{IMAGE_PLACEHOLDER}Same?"
    assert [im.getpixel((0, 0)) for im in ex.images] == [RED, BLUE]


def test_templates_python_and_jinja_with_columns(tmp_path):
    path = jsonl(tmp_path / "t.jsonl", [{"problem": "2+2?", "answer": "4", "level": 1}])
    python = one(rows_task(train_files=path, template="[{level}] {prompt} Use <answer></answer>.", system="S"))
    assert python.prompt == "[1] 2+2? Use <answer></answer>." and python.system == "S"
    jinja = one(rows_task(train_files=path, template="{{ content | trim }} \\boxed{} (level {{ level }})"))
    assert jinja.prompt == "2+2? \\boxed{} (level 1)"


def test_seeded_split_is_disjoint_and_reproducible(tmp_path):
    path = jsonl(tmp_path / "t.jsonl", [{"problem": f"p{i}", "answer": str(i)} for i in range(50)])
    a, b = rows_task(train_files=path, test_size=0.2), rows_task(train_files=path, test_size=0.2)
    c = rows_task(train_files=path, test_size=10, split_seed=1)
    assert a.split_sizes() == {"train": 40, "test": 10} == c.split_sizes()
    test_rows = {e.row for e in a.sample_batch("test", 10, np.random.default_rng(0))}
    train_rows = {e.row for e in a.sample_batch("train", 40, np.random.default_rng(0))}
    assert len(test_rows) == 10 and not test_rows & train_rows and len(train_rows) == 40
    assert test_rows == {e.row for e in b.sample_batch("test", 10, np.random.default_rng(5))}
    assert test_rows != {e.row for e in c.sample_batch("test", 10, np.random.default_rng(0))}


def test_sampling_is_seeded_and_covers_the_split_before_repeating(tmp_path):
    path = jsonl(tmp_path / "t.jsonl", [{"problem": f"p{i}", "answer": str(i)} for i in range(7)])
    task = rows_task(train_files=path)
    a = task.sample_batch("train", 10, np.random.default_rng(3))
    assert a == task.sample_batch("train", 10, np.random.default_rng(3))
    assert a != task.sample_batch("train", 10, np.random.default_rng(4))
    assert sorted(e.row for e in a[:7]) == list(range(7))  # a whole shuffle first, then a partial one
    assert len({e.row for e in a[7:]}) == 3


# ------------------------------------------------------------------------------------------------
# reward, metrics, reference outputs

def test_reward_batch_calls_the_verifier_once_with_every_column(tmp_path):
    log = tmp_path / "calls.jsonl"
    reward_file = tmp_path / "my_reward.py"
    reward_file.write_text(
        "import json\n"
        "def score(prompts, completions, answer, level, **kwargs):\n"
        f"    with open({str(log)!r}, 'a') as f:\n"
        "        f.write(json.dumps([list(prompts), list(answer), list(level)]) + '\\n')\n"
        "    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]\n")
    path = jsonl(tmp_path / "t.jsonl", [{"problem": f"p{i}", "answer": str(i), "level": i % 2} for i in range(4)])
    task = rows_task(train_files=path, reward=f"{reward_file}:score")
    examples = task.sample_batch("train", 4, np.random.default_rng(0))
    results = task.reward_batch(examples, [e.answer for e in examples[:2]] + ["wrong", None])
    assert [r.score for r in results] == [1.0, 1.0, 0.0, 0.0]
    assert results[3].info == "empty or non-text output"  # never reaches the verifier
    assert set(results[0].components) == {"score", "errors"}
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls == [[[e.prompt for e in examples[:3]], [e.answer for e in examples[:3]],
                      [int(e.answer) % 2 for e in examples[:3]]]]


def test_failing_user_reward_scores_zero_and_counts_an_error(tmp_path):
    reward_file = tmp_path / "bad.py"
    reward_file.write_text("def score(prompts, completions, **kw):\n    raise RuntimeError('boom')\n")
    path = jsonl(tmp_path / "t.jsonl", [{"problem": "p", "answer": "1"}])
    task = rows_task(train_files=path, reward=f"{reward_file}:score")
    (result,) = task.reward_batch([one(task)], ["1"])
    assert result.score == 0.0 and result.components["errors"] == 1.0 and "boom" in result.info
    assert task.metrics([one(task)], ["1"], [result])["error_rate"] == 1.0
    strict = rows_task(train_files=path, reward=f"{reward_file}:score", strict_reward=True)
    with pytest.raises(RuntimeError, match="boom"):
        strict.reward_batch([one(strict)], ["1"])


def test_exact_reward_and_accuracy_metrics(tmp_path):
    path = jsonl(tmp_path / "t.jsonl", [{"problem": "Colour?", "answer": "Red"}])
    task = rows_task(train_files=path)
    ex = one(task)
    outputs = ["<think>hm</think><answer> red. </answer>", "<answer>blue</answer>", "red", "\\boxed{red}"]
    results = [task.reward(ex, out) for out in outputs]
    assert [r.score for r in results] == [1.0, 0.0, 1.0, 1.0]
    metrics = task.metrics([ex] * 4, outputs, results)
    assert metrics == {"accuracy": 0.75, "exact": 0.75, "error_rate": 0.0}
    assert task.reward_range == (0.0, 1.0)


def test_reference_output_needs_an_answer(tmp_path):
    task = rows_task(train_files=jsonl(tmp_path / "t.jsonl", [{"prompt": "say hi"}]), answer_template="[{answer}]")
    with pytest.raises(DataError, match=r"t.jsonl row 0: no reference answer"):
        task.reference_output(one(task))


def test_examples_are_hashable_and_keyed_by_plain_fields(tmp_path):
    from mmrl.algos.variants.history import prompt_key

    png(tmp_path / "a.png")
    path = jsonl(tmp_path / "t.jsonl", [{"problem": "<image>?", "answer": "x", "image": "a.png"}])
    task = rows_task(train_files=path)
    a, b = one(task), one(task, seed=1)
    assert a == b and hash(a) == hash(b) and prompt_key(a) == prompt_key(b)


# ------------------------------------------------------------------------------------------------
# bad input: one clear error each, when the task is built

def test_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"train_files: no such file or folder .*nope.jsonl"):
        rows_task(train_files=str(tmp_path / "nope.jsonl"))


def test_missing_mapped_column_names_the_columns_there(tmp_path):
    path = jsonl(tmp_path / "t.jsonl", [{"question": "q", "answer": "a"}])
    with pytest.raises(DataError, match=r"columns.prompt: t.jsonl has no column 'text'; its columns: question, answer"):
        rows_task(train_files=path, columns={"prompt": "text"})


def test_unknown_layout_lists_the_recognised_ones(tmp_path):
    path = jsonl(tmp_path / "t.jsonl", [{"foo": "q", "bar": "a"}])
    with pytest.raises(DataError, match=r"unknown data layout \(columns: foo, bar\); recognised layouts: LLaVA/ShareGPT"):
        rows_task(train_files=path)


def test_missing_and_corrupt_images_name_row_and_path(tmp_path):
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    good = [{"problem": "?", "answer": "x", "image": None}] * 3
    missing = jsonl(tmp_path / "m.jsonl", good + [{"problem": "?", "answer": "x", "image": "gone.png"}])
    with pytest.raises(DataError, match=r"m.jsonl row 3: image file '.*gone.png' not found"):
        rows_task(train_files=missing)
    corrupt = jsonl(tmp_path / "c.jsonl", good + [{"problem": "?", "answer": "x", "image": "broken.png"}])
    with pytest.raises(DataError, match=r"c.jsonl row 3: image .*broken.png is unreadable"):
        rows_task(train_files=corrupt)


def test_bad_rows_past_the_eager_check_fail_when_sampled(tmp_path):
    rows = [{"problem": "?", "answer": "x", "image": None}] * 2 + [{"problem": "?", "answer": "x", "image": "gone.png"}]
    task = rows_task(train_files=jsonl(tmp_path / "t.jsonl", rows), validate_rows=1)
    with pytest.raises(DataError, match=r"t.jsonl row 2: image file .*gone.png' not found"):
        task.sample_batch("train", 3, np.random.default_rng(0))


def test_placeholder_count_mismatch_names_the_row(tmp_path):
    png(tmp_path / "a.png")
    rows = [{"problem": "<image> and <image>?", "answer": "x", "image": "a.png"}]
    with pytest.raises(DataError, match=r"t.jsonl row 0: the prompt has 2 <image> placeholder\(s\) but the row has 1"):
        rows_task(train_files=jsonl(tmp_path / "t.jsonl", rows))


def test_template_that_drops_the_prompt_or_uses_unknown_fields(tmp_path):
    png(tmp_path / "a.png")
    path = jsonl(tmp_path / "t.jsonl", [{"problem": "<image>?", "answer": "x", "image": "a.png"}])
    with pytest.raises(DataError, match="templated prompt has 0 <image> placeholder"):
        rows_task(train_files=path, template="Answer:")
    with pytest.raises(DataError, match=r"template uses 'level' which the row lacks; fields: .*problem"):
        rows_task(train_files=path, template="{level} {prompt}")
    with pytest.raises(DataError, match=r"template failed .*'level' is undefined"):
        rows_task(train_files=path, template="{{ level }} {{ prompt }}")


def test_empty_split_and_split_settings(tmp_path):
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match=r"e.jsonl: the file is empty"):
        rows_task(train_files=str(empty))
    (tmp_path / "header.csv").write_text("problem,answer\n")
    with pytest.raises(DataError, match=r"header.csv: the file has no rows"):
        rows_task(train_files=str(tmp_path / "header.csv"))
    path = jsonl(tmp_path / "t.jsonl", [{"problem": "p", "answer": "1"}] * 3)
    with pytest.raises(DataError, match="test_size=0.1 leaves 0 test and 3 train rows"):
        rows_task(train_files=path, test_size=0.1)
    with pytest.raises(ConfigError, match="test_files or test_size, not both"):
        rows_task(train_files=path, test_files=path, test_size=0.5)
    with pytest.raises(DataError, match=r"no split 'test' .*set task.args.test_files or task.args.test_size"):
        rows_task(train_files=path).sample_batch("test", 1, np.random.default_rng(0))


def test_corrupt_file_and_unknown_suffix(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "p", "answer": \n')
    with pytest.raises(DataError, match=r"bad.jsonl: cannot be read as json"):
        rows_task(train_files=str(bad))
    odd = tmp_path / "d.xlsx"
    odd.write_text("x")
    with pytest.raises(DataError, match=r"unknown data file type '.xlsx'"):
        rows_task(train_files=str(odd))


def test_multi_turn_conversations_are_refused_clearly(tmp_path):
    turns = [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}, {"from": "human", "value": "c"}]
    with pytest.raises(DataError, match=r"t.jsonl row 0: the conversation has 0 system, 2 user, 1 assistant turns"):
        rows_task(train_files=jsonl(tmp_path / "t.jsonl", [{"conversations": turns}]))


def test_bad_reward_spec_and_answer_template(tmp_path):
    path = jsonl(tmp_path / "t.jsonl", [{"problem": "p", "answer": "1"}])
    with pytest.raises(ConfigError, match=r"task.args.reward: unknown verifier 'exactly'"):
        rows_task(train_files=path, reward="exactly")
    with pytest.raises(ConfigError, match=r"answer_template .* must contain \{answer\}"):
        rows_task(train_files=path, answer_template="<answer></answer>")


def test_cli_prints_a_data_error_as_one_line(tmp_path, capsys):
    from mmrl.cli import main

    missing = str(tmp_path / "missing.jsonl")
    code = main(["train", "data/text_tiny_cpu", "--out", str(tmp_path / "run"), f"task.args.train_files={missing}",
                 "log.progress=false", "log.tensorboard=false"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "no such file or folder" in err and "missing.jsonl" in err


# ------------------------------------------------------------------------------------------------
# hints (algo.guide, warm_start.hint_fraction)

def test_hint_template_fields_and_partial_answer_prefix(tmp_path):
    rows = [{"problem": "2 + 2?", "answer": "1234", "why": "add"}]
    path = jsonl(tmp_path / "t.jsonl", rows)
    task = rows_task(train_files=path, template="Q: {prompt}\nA:", hint_template="H: {answer_prefix} ({why})\n{prompt}")
    ex = one(task)
    hinted = task.hinted(ex)
    assert hinted.prompt == "H: 12 (add)\nQ: 2 + 2?\nA:"  # the first half of "1234", then a column
    assert (hinted.answer, hinted.columns, hinted.row) == (ex.answer, ex.columns, ex.row)  # the same answer
    assert task.reference_output(hinted) == task.reference_output(ex)
    for fraction, prefix in ((0.0, ""), (0.3, "1"), (0.6, "12"), (0.7, "123"), (1.0, "1234")):  # round(f · 4)
        task = rows_task(train_files=path, hint_template="{answer_prefix}|{prompt}", answer_prefix_fraction=fraction)
        assert task.hinted(one(task)).prompt == f"{prefix}|2 + 2?"


def test_answer_prefix_is_seeles_hint_prefix_half_to_even(tmp_path):
    from mmrl.algos.variants.guidance import hint_prefix

    path = jsonl(tmp_path / "t.jsonl", [{"problem": "p", "answer": "7"}, {"problem": "q", "answer": "15"}])
    task = rows_task(train_files=path, hint_template="{answer_prefix}|{prompt}")
    prompts = {task.example("train", i).answer: task.hinted(task.example("train", i)).prompt for i in range(2)}
    assert prompts == {"7": "|p", "15": "1|q"}  # round(0.5) = 0, round(1.0) = 1
    assert hint_prefix("7", 0.5) == "" and hint_prefix("15", 0.5) == "1"


def test_bad_hint_settings_are_named(tmp_path):
    path = jsonl(tmp_path / "t.jsonl", [{"problem": "p", "answer": "7"}])
    with pytest.raises(ConfigError, match="answer_prefix_fraction must be in"):
        rows_task(train_files=path, hint_template="{answer_prefix}", answer_prefix_fraction=1.5)
    task = rows_task(train_files=path, hint_template="{nope} {prompt}")
    with pytest.raises(DataError, match=r"t.jsonl row 0: task.args.hint_template cannot be filled.*answer_prefix"):
        task.hinted(one(task))
    with pytest.raises(ConfigError, match="hint_template"):
        rows_task(train_files=path).hinted(one(rows_task(train_files=path)))
