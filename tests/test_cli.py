"""The ``mmrl`` command line and the per-domain script share one implementation and report user
errors in one line with exit code 2, before touching the run folder."""

from __future__ import annotations

import os
import json
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from mmrl.cli import main

ROOT = Path(__file__).resolve().parent.parent
QUIET = ["log.progress=false", "log.tensorboard=false"]
TINY = ["trainer.steps=2", "eval.num_examples=8", "rollout.prompts_per_step=4", "rollout.group_size=2",
        "trainer.minibatches=1", "warm_start.sft_steps=5"]


def test_list_shows_every_registry(capsys):
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    for name in ("grpo", "rloo", "reinforce_pp", "gae", "ppo_clip", "gspo",
                 "seq-mean-token-sum-norm", "low_var_kl", "adv_clip", "sanity/tiny_cpu", "sanity/ppo_tiny_cpu",
                 "pacs", "frpo", "polychromic", "rw_sft", "weighted_grpo", "none", "rorecomp", "rollout_bandit",
                 "erpo_reactivate", "erpo_full", "hard_focus", "wsrl", "co_rft", "conrft", "expo_ft", "dsrl"):
        assert f"  {name}\n" in text, name
    for name in ("sanity/reverse-v0", "causal_lm"):  # tasks and policies say where they come from
        assert re.search(rf"^  {re.escape(name)} +built-in$", text, re.MULTILINE), name


@pytest.mark.parametrize("argv, message", [
    (["train", "sanity/nope"], "no recipe 'sanity/nope'"),
    (["train", "sanity/tiny_cpu", "algo.advantage=grop"], "Did you mean 'grpo'"),
    (["train", "sanity/tiny_cpu", "trainer.lr=abc"], "trainer.lr expects a number"),
    (["train", "sanity/tiny_cpu", "--resume"], "no run there"),
])
def test_user_errors_exit_2_without_creating_the_run_folder(tmp_path, capsys, argv, message):
    out = tmp_path / "run"
    assert main([*argv, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_overrides_may_follow_out_and_unknown_flags_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train", "sanity/tiny_cpu", "--out", str(tmp_path / "a"), "--bogus"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
    assert main(["train", "sanity/tiny_cpu", "--out", str(tmp_path / "b"), *QUIET, *TINY, "--no-plot"]) == 0
    assert "held-out evaluation, step 0 -> step 2" in capsys.readouterr().out


def test_the_summary_checks_the_last_evaluation_against_the_documented_range(tmp_path, capsys):
    ranges = "log.expected={eval/reward_mean: [0.0, 1.0], eval/exact_match: [2, 3]}"
    assert main(["train", "sanity/tiny_cpu", "--out", str(tmp_path / "r"), *QUIET, *TINY, "--no-plot", ranges]) == 0
    out = capsys.readouterr().out
    assert re.search(r"eval/reward_mean \d\.\d{3}: inside the documented range 0-1", out)
    assert re.search(r"eval/exact_match \d\.\d{3}: OUTSIDE the documented range 2-3", out)
    assert main(["train", "sanity/tiny_cpu", "--out", str(tmp_path / "bad"), "log.expected={eval/x: [1, 0]}"]) == 2
    assert "log.expected.eval/x must be [low, high] with low <= high" in capsys.readouterr().err


def test_the_summary_names_the_best_checkpoint(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["train", "sanity/tiny_cpu", "--out", str(out), *QUIET, *TINY, "--no-plot",
                 "checkpoint.best_metric=eval/position_acc"]) == 0
    record = json.loads((out / "checkpoints" / "best" / "best.json").read_text())
    assert (f"best eval/position_acc {record['value']:.3f} at step {record['step']}: {out / 'checkpoints' / 'best'}"
            in capsys.readouterr().out)


def test_domain_script_runs_the_same_training(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", ["train_sanity.py", "--out", str(out), *QUIET, *TINY])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(ROOT / "scripts" / "train_sanity.py"), run_name="__main__")
    assert exit_info.value.code == 0
    assert (out / "metrics.jsonl").is_file() and (out / "curves.png").is_file()
    assert "sanity/reverse-v0" in (out / "config.yaml").read_text()


def test_plot_of_a_missing_run(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    assert "metrics.jsonl not found" in capsys.readouterr().err


def test_overwrite_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    precious = tmp_path / "notes"
    precious.mkdir()
    (precious / "thesis.txt").write_text("years of work")
    assert main(["train", "sanity/tiny_cpu", "--out", str(precious), "--overwrite", *QUIET, *TINY]) == 2
    assert "not an mmrl run folder" in capsys.readouterr().err
    assert (precious / "thesis.txt").read_text() == "years of work"


@pytest.mark.parametrize("verb", ["sft", "bc"])
def test_warm_start_verb_saves_a_loadable_policy(tmp_path, capsys, verb):
    from mmrl.policies import CausalLMPolicy

    out = tmp_path / "sft"
    assert main([verb, "sanity/tiny_cpu", "--out", str(out), *QUIET, "warm_start.sft_steps=3"]) == 0
    assert "saved to" in capsys.readouterr().out
    assert (out / "config.yaml").is_file() and len(__import__("json").loads((out / "sft_losses.json").read_text())) == 3
    CausalLMPolicy.from_pretrained(out)  # a plain HF folder
    assert main([verb, "sanity/tiny_cpu", "--out", str(out), *QUIET, "warm_start.sft_steps=3"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main([verb, "sanity/tiny_cpu", "--out", str(tmp_path / "none"), *QUIET, "warm_start.sft_steps=0"]) == 2
    assert "sft_steps must be >= 1" in capsys.readouterr().err


def test_eval_of_a_run_equals_the_runs_own_last_evaluation(tmp_path, capsys):
    import json

    from mmrl.core.logging import read_metrics

    run = tmp_path / "run"
    assert main(["train", "sanity/tiny_cpu", "--out", str(run), *QUIET, *TINY, "checkpoint.every=2", "--no-plot"]) == 0
    capsys.readouterr()
    report = tmp_path / "eval.json"
    # the run's eval set: eval.num_examples=8 at eval.seed 1234, greedy, as in TINY
    assert main(["eval", "sanity/tiny_cpu", "--model", str(run), "--num-examples", "8", "--k", "3",
                 "--json", str(report)]) == 0
    printed = capsys.readouterr().out
    assert "[test]" in printed and "pass@3" in printed
    metrics = json.loads(report.read_text())["metrics"]["test"]
    logged = [r for r in read_metrics(run) if "eval/reward_mean" in r][-1]
    assert metrics["reward_mean"] == pytest.approx(logged["eval/reward_mean"], abs=1e-6)
    assert 0.0 <= metrics["pass@3"] <= 1.0 and 0.0 <= metrics["mean@3"] <= 1.0
    # a pass@k curve from n > k samples (the unbiased estimator), printed and plotted
    plot = tmp_path / "curve.png"
    assert main(["eval", "sanity/tiny_cpu", "--model", str(run), "--num-examples", "8", "--k", "4", "--n", "8",
                 "--plot", str(plot), "--json", str(report)]) == 0
    printed = capsys.readouterr().out
    assert "pass@k curve (n = 8 samples per example): k=1: " in printed and plot.stat().st_size > 0
    curve = json.loads(report.read_text())["metrics"]["test"]
    assert 0.0 <= curve["pass@1"] <= curve["pass@2"] <= curve["pass@4"] <= 1.0 and "mean@8" in curve
    assert "pass@8" not in curve  # the curve stops at k, whatever n


@pytest.mark.parametrize("argv, message", [
    (["eval", "sanity/reverse-v0"], "give the weights with --model"),
    (["eval", "sanity/reverse-v0", "--model", "/nonexistent/folder"], "no such folder"),
    (["eval", "sanity/tiny_cpu", "--num-examples", "0"], "--num-examples and --k must be >= 1"),
    (["eval", "sanity/tiny_cpu", "--k", "4", "--n", "2"], "--n (samples per example, 2) must be >= --k (4)"),
])
def test_eval_user_errors_exit_2(capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("runs") / "run"
    assert main(["train", "sanity/tiny_cpu", "--out", str(run), *QUIET, *TINY, "trainer.steps=1", "--no-plot"]) == 0
    return run


def eval_json(tmp_path: Path, target: str, model: Path, *overrides: str) -> dict:
    report = tmp_path / "eval.json"
    assert main(["eval", target, *overrides, "--model", str(model), "--num-examples", "16", "--json", str(report)]) == 0
    return __import__("json").loads(report.read_text())["metrics"]["test"]


def test_eval_of_a_recipe_with_a_run_evaluates_the_recipes_task(tiny_run, tmp_path):
    recipe = tmp_path / "longer.yaml"
    recipe.write_text((ROOT / "configs" / "sanity" / "tiny_cpu.yaml").read_text()
                      .replace("args: {min_len: 3, max_len: 4}", "args: {min_len: 6, max_len: 6}"))
    weights = tiny_run / "checkpoints" / "step_1" / "policy"
    got = eval_json(tmp_path, str(recipe), tiny_run)
    assert got == eval_json(tmp_path, str(recipe), weights)  # the recipe's task, the run's weights
    assert got != eval_json(tmp_path, "sanity/tiny_cpu", tiny_run)  # not the run's own task
    assert eval_json(tmp_path, "sanity/reverse-v0", tiny_run) == eval_json(tmp_path, "sanity/tiny_cpu", weights)


def test_eval_refuses_a_recipe_whose_policy_is_not_the_runs(tiny_run, capsys):
    assert main(["eval", "sanity/ppo_tiny_cpu", "--model", str(tiny_run), "--num-examples", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the recipe's policy differs from the one" in err[0] and "value_head" in err[0], err


def test_eval_compares_the_policy_after_the_overrides(tiny_run, tmp_path):
    # the run trained sanity/tiny_cpu's policy; ppo_tiny_cpu's differs only by its value head
    got = eval_json(tmp_path, "sanity/ppo_tiny_cpu", tiny_run, "policy.args.value_head=false")
    assert got == eval_json(tmp_path, "sanity/tiny_cpu", tiny_run)


def test_eval_of_a_folder_without_a_model_is_one_line(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a model")
    assert main(["eval", "sanity/tiny_cpu", "--model", str(tmp_path), "--num-examples", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--model {tmp_path}: not a model folder" in err[0], err


def test_a_corrupt_image_in_an_image_folder_is_one_line_and_leaves_no_run_folder(tmp_path, capsys):
    import numpy as np
    from PIL import Image

    images = tmp_path / "images"
    images.mkdir()
    for i in range(6):
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(images / f"{i}.png")
    (images / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n cut short")
    out = tmp_path / "run"
    assert main(["train", "spatial_ssrl/tiny_cpu", "task.args.source=folder", f"task.args.image_dir={images}",
                 *QUIET, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"mmrl train: error: {images / 'broken.png'}: not a readable image"), err
    assert not out.exists()


@pytest.mark.parametrize("world_size", ["1", "2"])
def test_a_launched_process_exits_with_the_commands_status_and_its_output_flushed(world_size):
    """``mmrl`` ends each of several launched processes without interpreter teardown (gloo's threads can
    abort it there); the exit status and everything printed, to a pipe, still come out."""
    code = "from mmrl.cli import exit_process; print('summary', flush=False); exit_process(3)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},
                               "WORLD_SIZE": world_size})
    assert proc.returncode == 3
    assert proc.stdout == "summary\n"
