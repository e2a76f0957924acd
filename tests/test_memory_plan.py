"""``mmrl plan``: exact parameter terms, activation estimates against measured update steps, sharding by the
accelerate configs, the Qwen2.5-VL-3B config, and the command line (docs/memory_plan.md)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from mmrl.cli import main
from mmrl.core.config import load_config
from mmrl.core.paths import recipes_dir
from mmrl.core.registry import make_policy
from mmrl.experiments.memory_measure import measure_update_step
from mmrl.experiments.memory_plan import (GENERATION_LOGIT_COPIES, GENERATION_TOP_P_COPIES, SINGLE, MemoryPlan,
                                          plan_memory, prompts_per_micro_batch, read_accelerate_config, state_terms)
from mmrl.experiments.meta_model import RowShape, build_meta_model, count_parameters, read_model_config

QUIET = ["log.progress=false", "log.tensorboard=false"]
ACCELERATE = recipes_dir() / "accelerate"

# Planned / measured bounds of the update step (docs/memory_plan.md has the measured ratios: 0.998-1.045 for
# the saved activations, 0.975-1.133 for the peak).
SAVED_RANGE = (0.85, 1.15)
PEAK_RANGE = (0.8, 1.25)


def planned_for_measured(recipe: str, rows: int, *overrides: str) -> tuple[MemoryPlan, object]:
    """The plan of ``recipe`` for the shape of one real, measured update micro-batch of ``rows`` rows (whole groups:
    the VLM policy scores each distinct prompt once)."""
    cfg = load_config(recipe, [*QUIET, f"trainer.micro_batch_size={rows}", *overrides])
    measured = measure_update_step(cfg, rows)
    model = build_meta_model(cfg)
    cfg = load_config(recipe, [*QUIET, f"trainer.micro_batch_size={rows}",
                               f"rollout.max_new_tokens={measured.completion_tokens}", *overrides])
    plan = plan_memory(cfg, recipe, model, SINGLE, 80.0,
                       RowShape(measured.prompt_tokens, measured.patches_per_row, "measured"))
    assert (plan.workload.update_rows, plan.workload.update_prompts) == (measured.rows, measured.prompts)
    return plan, measured


def saved_activations(plan: MemoryPlan) -> int:
    return sum(t.bytes for t in plan.terms if t.name.startswith("activations"))


@pytest.mark.parametrize("recipe, rows, overrides", [
    ("sanity/tiny_cpu", 64, ()),
    ("spatial_ssrl/tiny_cpu", 16, ()),  # 2 prompts run once, 16 completions over their cache
    ("spatial_ssrl/tiny_cpu", 16, ("policy.args.gradient_checkpointing=true",)),  # row by row
    ("spatial_ssrl/tiny_cpu", 16, ("policy.args.gradient_checkpointing=true",
                                   "policy.args.share_prompts_under_checkpointing=true")),  # shared, checkpointed
    ("spatial_ssrl/tiny_cpu", 16, ("policy.args.dtype=bfloat16",)),
    ("spatial_ssrl/tiny_cpu", 16, ("policy.args.attn_implementation=eager",)),
    ("spatial_ssrl/tiny_cpu", 16, ("policy.args.lora_rank=8",)),  # frozen base and vision tower save less
])
def test_the_plan_matches_a_measured_update_step(recipe, rows, overrides):
    plan, measured = planned_for_measured(recipe, rows, *overrides)
    counts = plan.model.counts
    assert (counts.total, counts.trainable) == (measured.parameters, measured.trainable)
    saved = saved_activations(plan) / measured.saved_bytes
    peak = plan.phase("update") / measured.peak_bytes  # gradients + saved activations + transient buffers
    assert SAVED_RANGE[0] <= saved <= SAVED_RANGE[1], (saved, measured)
    assert PEAK_RANGE[0] <= peak <= PEAK_RANGE[1], (peak, measured)


def test_a_shared_prefix_plans_each_prompt_once():
    """Groups of 8 (the prompt run once per group) against one row per prompt (every row runs its own)."""
    rows = RowShape(53, 36, "given")
    plans = {}
    for name, overrides in (("shared", ()), ("own", ("rollout.group_size=1", "rollout.prompts_per_step=128"))):
        cfg = load_config("spatial_ssrl/tiny_cpu", [*QUIET, "trainer.micro_batch_size=16", *overrides])
        plan = plan_memory(cfg, "spatial_ssrl/tiny_cpu", build_meta_model(cfg), SINGLE, 80.0, rows)
        plans[name] = (plan.workload, {t.name: t.bytes for t in plan.terms})
    (shared, shared_terms), (own, own_terms) = plans["shared"], plans["own"]
    assert (shared.shared_prefix, shared.update_rows, shared.update_prompts) == (True, 16, 2)
    assert (own.shared_prefix, own.update_rows, own.update_prompts) == (False, 16, 16)
    vision = "activations: vision encoder"
    assert shared_terms[vision] * 8 == own_terms[vision]  # 2 prompts' images instead of 16 rows'
    assert shared_terms["activations: log-softmax"] == own_terms["activations: log-softmax"]
    # 2 × 53 + 16 × 39 computed tokens instead of 16 × 93 (every completion still reads its prompt's keys)
    assert 0.4 < shared_terms["activations: decoder"] / own_terms["activations: decoder"] < 0.7


def test_micro_batches_hold_whole_groups_or_straddle_one():
    # 64 rows of groups of 8 in micro-batches of 16: 2 prompts each; of 64: all 8.
    assert prompts_per_micro_batch(64, 16, 8) == 2 and prompts_per_micro_batch(64, 64, 8) == 8
    # 15 rows of groups of 3 in micro-batches of 5: rows 5-9 hold groups 1, 2 and 3.
    assert prompts_per_micro_batch(15, 5, 3) == 3
    assert prompts_per_micro_batch(8, 3, 1) == 3  # one row per prompt


def test_generation_keeps_one_step_of_logits():
    model_config = "assets/vlm/qwen2_5_vl_3b_config.json"
    terms = {}
    for tokens, top_p in ((256, 1.0), (2048, 1.0), (2048, 0.9)):
        cfg = load_config("vlm_sanity/qwen2_5_vl_3b_gpu", [*QUIET, f"rollout.max_new_tokens={tokens}",
                                                             f"rollout.top_p={top_p}"])
        plan = plan_memory(cfg, "vlm_sanity", build_meta_model(cfg, model_config), SINGLE, 80.0, None)
        terms[tokens, top_p] = {t.name: t.bytes for t in plan.terms if t.phase == "generation"}
    rows_vocab = 64 * 151_936  # generation_batch_rows × vocabulary
    assert terms[256, 1.0]["generation logits"] == terms[2048, 1.0]["generation logits"] \
        == (GENERATION_LOGIT_COPIES * 4 + 2) * rows_vocab
    assert terms[2048, 0.9]["generation logits"] == (GENERATION_TOP_P_COPIES * 4 + 2) * rows_vocab
    # The cache holds prompt (max_prompt_tokens 2048) + completion tokens.
    assert terms[2048, 1.0]["KV cache"] * (2048 + 256) == terms[256, 1.0]["KV cache"] * (2048 + 2048)


def test_weights_gradients_and_optimizer_are_exact_counts_of_the_real_model():
    cfg = load_config("sanity/tiny_cpu", [*QUIET, "policy.args.lora_rank=4", "trainer.ref_model=copy"])
    policy = make_policy(cfg.policy.name, cfg.policy.args)
    real = count_parameters(policy)
    planned = build_meta_model(cfg)
    assert planned.counts == real  # LoRA adapters counted by peft itself, on the meta device
    assert 0 < real.trainable < real.total
    terms = {t.name: t.bytes for t in state_terms(planned, SINGLE, "copy")}
    assert terms == {"weights": 4 * real.total, "reference copy": 4 * real.total,
                     "gradients": 4 * real.trainable, "optimizer (AdamW)": 2 * 4 * real.trainable}
    assert "reference copy" not in {t.name for t in state_terms(planned, SINGLE, "adapter_disabled")}


def test_qwen2_5_vl_3b_has_its_published_parameter_count_and_lora_adapters():
    config = read_model_config("assets/vlm/qwen2_5_vl_3b_config.json")
    cfg = load_config("vlm_sanity/qwen2_5_vl_3b_gpu", [*QUIET, "policy.args.lora_rank=64"])
    model = build_meta_model(cfg, model_config="assets/vlm/qwen2_5_vl_3b_config.json")
    assert abs(model.counts.total - model.counts.trainable - 3.75e9) / 3.75e9 < 0.01  # the Hub's 3.75 B
    text = config.text_config
    kv = text.num_key_value_heads * text.hidden_size // text.num_attention_heads
    # LoRA (Hu et al. 2021): r × (in + out) per adapted matrix; q, k, v, o of every decoder layer.
    per_layer = 64 * (2 * (2048 + 2048) + 2 * (2048 + kv))
    assert model.counts.trainable == text.num_hidden_layers * per_layer == 29_491_200
    assert model.architecture.vision.depth == 32 and model.param_dtype == "bfloat16"


@pytest.mark.parametrize("name, kind, shards", [
    ("single_gpu", "single process", (False, False, False)),
    ("multi_gpu_ddp", "DDP", (False, False, False)),
    ("fsdp", "FSDP FULL_SHARD", (True, True, True)),
    ("deepspeed_zero2", "DeepSpeed ZeRO-2", (False, True, True)),
    ("deepspeed_zero3", "DeepSpeed ZeRO-3", (True, True, True)),
])
def test_the_accelerate_configs_shard_what_their_backend_shards(name, kind, shards):
    parallel = read_accelerate_config(ACCELERATE / f"{name}.yaml")
    assert parallel.name == kind
    assert (parallel.shard_weights, parallel.shard_gradients, parallel.shard_optimizer) == shards
    assert parallel.processes == (1 if name == "single_gpu" else 8)
    cfg = load_config("sanity/tiny_cpu", QUIET)
    model = build_meta_model(cfg)
    single = {t.name: t.bytes for t in state_terms(model, dataclasses.replace(parallel, processes=1), "none")}
    eight = {t.name: t.bytes for t in state_terms(model, parallel, "none")}
    for term, sharded in zip(("weights", "gradients", "optimizer (AdamW)"), shards):
        assert eight[term] == (single[term] // 8 if sharded else single[term]), term


def test_deepspeed_keeps_fp32_masters_and_a_bf16_model():
    cfg = load_config("sanity/tiny_cpu", QUIET)
    model = build_meta_model(cfg)
    parallel = read_accelerate_config(ACCELERATE / "deepspeed_zero2.yaml", num_processes=2)
    n, terms = model.counts.total, {t.name: t.bytes for t in state_terms(model, parallel, "none")}
    assert terms == {"weights": 2 * n, "gradients": 2 * n // 2, "optimizer (AdamW)": 12 * n // 2}


def test_the_cli_prints_a_table_and_json(capsys):
    assert main(["plan", "sanity/tiny_cpu", "--gpu-gib", "1"]) == 0
    table = capsys.readouterr().out
    assert "activations: decoder" in table and "fits in 1 GiB: yes" in table
    assert main(["plan", "sanity/tiny_cpu", "--accelerate-config", str(ACCELERATE / "fsdp.yaml"),
                 "--gpu-gib", "0.001", "--json", *QUIET]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["parallelism"]["processes"] == 8 and data["fits"] is False
    assert data["peak_bytes"] == data["phases"]["persistent"] + max(data["phases"]["update"],
                                                                    data["phases"]["generation"])


@pytest.mark.parametrize("argv, message", [
    (["plan", "sanity/tiny_cpu", "--accelerate-config", "nowhere.yaml"], "accelerate config nowhere.yaml not found"),
    (["plan", "sanity/tiny_cpu", "--gpu-gib", "0"], "--gpu-gib must be > 0"),
    (["plan", "ddpo/tiny_cpu"], "mmrl plan counts the policies"),
    (["plan", "sanity/tiny_cpu", "--model-config", "nowhere/config.json"], "no transformers config.json"),
])
def test_bad_input_is_one_clear_error(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
