"""Spatial-SSRL recipes (issue 4): the tiny CPU recipe end to end with ``mmrl eval``, the GPU recipes
as the paper's GRPO stage, and the learning run (``slow``; docs/results.md)."""

from __future__ import annotations

import json
import math

import pytest

from mmrl.cli import main
from mmrl.core.config import load_config

QUIET = ["log.progress=false", "log.tensorboard=false"]
TINY = ["trainer.steps=2", "eval.num_examples=8", "rollout.prompts_per_step=4", "rollout.group_size=2",
        "warm_start.sft_steps=2", "warm_start.batch_size=4", "warm_start.cache=false", "eval.every=1",
        "checkpoint.every=2"]


def read_rows(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_tiny_cpu_recipe_trains_and_mmrl_eval_prints_the_accuracy(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "configs/spatial_ssrl/tiny_cpu.yaml", "--out", str(run), "--no-plot", *QUIET, *TINY]) == 0
    rows = read_rows(run)
    assert [r["step"] for r in rows] == [0, 1, 2]
    task = load_config("spatial_ssrl/tiny_cpu").task.name
    pretext = task.split("/")[1].removesuffix("-v0")
    assert {"eval/accuracy", "eval/format_rate", f"eval/accuracy/{pretext}", "reward/accuracy",
            "reward/format"} <= set(rows[-1])
    capsys.readouterr()
    assert main(["eval", task, "--model", str(run), "--num-examples", "8"]) == 0
    printed = capsys.readouterr().out
    assert "accuracy" in printed and f"accuracy/{pretext}" in printed


@pytest.mark.parametrize("size", ["3b", "7b"])
def test_gpu_recipes_are_the_papers_grpo_stage(size):
    """EasyR1 settings of the paper's scripts (seed_tasks.md §1.4); they cannot run here (no GPU,
    no checkpoint) but must load, name a local folder and match the published hyper-parameters."""
    cfg = load_config(f"spatial_ssrl/qwen2_5_vl_{size}_gpu")
    args, algo, trainer = cfg.policy.args, cfg.algo, cfg.trainer
    assert cfg.task.name == "spatial_ssrl/mixture-v0" and cfg.task.args.format_prompt and \
        cfg.task.args.format_weight == 0.1
    assert args.pretrained == f"models/Qwen2.5-VL-{size.upper()}-Instruct" and args.dtype == "bfloat16"
    assert args.lora_rank == 0 and trainer.ref_model == "copy"  # full fine-tuning, KL to the initial model
    assert args.min_pixels == 262144 and args.max_pixels == 4194304 and args.max_prompt_tokens == 4096
    assert cfg.rollout.group_size == 5 and cfg.rollout.prompts_per_step == 256 and trainer.minibatches == 2
    assert cfg.rollout.temperature == 1.0 and cfg.rollout.top_p == 1.0 and cfg.rollout.max_new_tokens == 2048
    assert algo.advantage == "grpo" and algo.norm_adv_by_std and algo.policy_loss == "ppo_clip"
    assert (algo.clip_low, algo.clip_high, algo.dual_clip_c) == (0.2, 0.3, 3.0) and algo.loss_agg == "token-mean"
    assert algo.kl_coef == 0.01 and algo.kl_estimator == "low_var_kl"
    assert trainer.lr == 1e-6 and trainer.weight_decay == 0.01 and trainer.warmup_steps == 0
    assert trainer.grad_clip == 1.0 and trainer.ppo_epochs == 1 and trainer.mixed_precision == "bf16"
    assert cfg.eval.temperature == 0.6
    assert (args.sampler == "vllm") == trainer.recompute_logp_old == (algo.tis_cap is not None)


@pytest.mark.slow
def test_grpo_beats_the_sft_warm_start_on_held_out_puzzles(tmp_path):
    """The recipe as documented in docs/results.md: held-out accuracy after GRPO beats the warm
    start by more than two standard errors of the difference."""
    run = tmp_path / "run"
    assert main(["train", "spatial_ssrl/tiny_cpu", "--out", str(run), "--no-plot", *QUIET]) == 0
    evals = [r for r in read_rows(run) if "eval/accuracy" in r]
    n = load_config("spatial_ssrl/tiny_cpu").eval.num_examples
    first, last = evals[0]["eval/accuracy"], evals[-1]["eval/accuracy"]
    stderr = math.sqrt((first * (1 - first) + last * (1 - last)) / n)
    assert last > first + 2 * stderr, (first, last, stderr)
