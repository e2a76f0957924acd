"""bench/bench_trl.py: both frameworks get token- and pixel-identical inputs from one saved policy and
both train, one step each at 2 prompts × 2; the recipe maps onto TRL's batch settings as documented."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "bench_trl.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_trl", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_trl"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    del sys.modules["bench_trl"]


@pytest.fixture(scope="module")
def policy(bench, tmp_path_factory):
    # A short warm start (the recipe's is 240 steps): enough for some group rewards to differ within the two
    # steps each side runs (one untimed, one timed), so both update.
    return bench.prepare_policy(tmp_path_factory.mktemp("policy"), ["warm_start.sft_steps=80", "warm_start.batch_size=8"])


def test_one_step_each_side_identical_inputs_and_training(bench, policy, tmp_path):
    results = {}
    for framework, run in (("mmrl", bench.run_mmrl), ("trl", bench.run_trl)):
        spec = bench.RunSpec(framework, "one_step", 2, policy, steps=1, warmup=1, threads=1,
                             inputs_path=str(tmp_path / f"{framework}.pt"), overrides=("rollout.group_size=2",))
        results[framework] = run(spec)
        bench.check_trained(results[framework])
        assert len(results[framework].step_s) == 1 and results[framework].tokens[0] > 0
    compared = bench.check_identical_inputs(tmp_path / "mmrl.pt", tmp_path / "trl.pt")
    assert compared["rows"] == 4 and compared["pixel_values"] is not None

    changed = torch.load(tmp_path / "trl.pt")
    changed["pixel_values"][0, 0] += 1e-3
    torch.save(changed, tmp_path / "changed.pt")
    with pytest.raises(AssertionError, match="pixel_values"):
        bench.check_identical_inputs(tmp_path / "mmrl.pt", tmp_path / "changed.pt")


@pytest.mark.parametrize("setting, prompts, expected", [
    # (per-device batch, accumulation, steps per generation, iterations, optimizer steps for 3 steps)
    ("one_step", 4, (32, 1, 1, 1, 3)),
    ("one_step", 16, (64, 2, 2, 1, 3)),
    ("recipe", 16, (64, 1, 2, 2, 12)),
])
def test_trl_config_matches_the_recipe_batches(bench, policy, tmp_path, setting, prompts, expected):
    spec = bench.RunSpec("trl", setting, prompts, policy, steps=2, warmup=1, threads=1, inputs_path="unused")
    cfg = bench.run_config(spec)
    args = bench.trl_config(cfg, spec, str(tmp_path))
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps, args.steps_per_generation,
            args.num_iterations, args.max_steps) == expected
    assert args.generation_batch_size == prompts * 8 and args.num_generations == 8
    assert (args.beta, args.epsilon, args.epsilon_high, args.loss_type) == (0.0, 0.2, 0.28, "dapo")
    assert (args.bf16, args.fp16, args.gradient_checkpointing, args.use_vllm) == (False, False, False, False)
    assert args.generation_kwargs == {"suppress_tokens": policy.suppressed}


def test_trl_config_refuses_a_recipe_it_cannot_express(bench, policy, tmp_path):
    spec = bench.RunSpec("trl", "one_step", 4, policy, steps=1, warmup=0, threads=1, inputs_path="unused",
                         overrides=("algo.kl_coef=0.01", "trainer.ref_model=copy", "algo.advantage=rloo"))
    with pytest.raises(ValueError, match="advantage"):
        bench.trl_config(bench.run_config(spec), spec, str(tmp_path))


def test_abba_order(bench):
    assert bench.abba(2) == ["mmrl", "trl", "trl", "mmrl"]
