"""``mmrl plan`` against measured update steps of the tiny CPU models (the table in docs/memory_plan.md).

    OMP_NUM_THREADS=1 python scripts/results/memory_plan_check.py

For each case: the recipe's real policy draws ``rows`` rows (whole groups, so a group's rows share their prompt)
and scores them with one forward (with entropy) + backward
(:func:`mmrl.experiments.memory_measure.measure_update_step`); the plan is made for the same shape (rows, distinct
prompts, prompt and completion lengths, patches per prompt). Printed: the planned saved activations against the
bytes autograd saved, and the planned update phase (gradients + saved + transient) against the allocation peak of
the step.
"""

from __future__ import annotations

import torch

from mmrl.core.config import load_config
from mmrl.experiments.memory_measure import measure_update_step
from mmrl.experiments.memory_plan import SINGLE, plan_memory
from mmrl.experiments.meta_model import RowShape, build_meta_model

QUIET = ["log.progress=false", "log.tensorboard=false"]
CASES = [
    ("sanity/tiny_cpu", 64, ()),
    ("spatial_ssrl/tiny_cpu", 16, ()),
    ("spatial_ssrl/tiny_cpu", 64, ()),
    ("spatial_ssrl/tiny_cpu", 64, ("policy.args.gradient_checkpointing=true",)),
    ("spatial_ssrl/tiny_cpu", 64, ("policy.args.gradient_checkpointing=true",
                                   "policy.args.share_prompts_under_checkpointing=true")),
    ("spatial_ssrl/tiny_cpu", 64, ("policy.args.dtype=bfloat16",)),
    ("spatial_ssrl/tiny_cpu", 16, ("policy.args.attn_implementation=eager",)),
    ("spatial_ssrl/tiny_cpu", 16, ("policy.args.lora_rank=8",)),
]


def mib(value: int) -> str:
    return f"{value / 2 ** 20:.2f}"


def main() -> None:
    torch.set_num_threads(1)
    print("| recipe | overrides | rows (prompts) × (prompt + completion), patches/prompt "
          "| saved: planned / measured MiB | ratio | update peak: planned / measured MiB | ratio |")
    print("|---|---|---|---|---|---|---|")
    for recipe, rows, overrides in CASES:
        base = [*QUIET, f"trainer.micro_batch_size={rows}", *overrides]
        measured = measure_update_step(load_config(recipe, base), rows)
        cfg = load_config(recipe, [*base, f"rollout.max_new_tokens={measured.completion_tokens}"])
        plan = plan_memory(cfg, recipe, build_meta_model(cfg), SINGLE, 80.0,
                           RowShape(measured.prompt_tokens, measured.patches_per_row, "measured"))
        if (plan.workload.update_rows, plan.workload.update_prompts) != (measured.rows, measured.prompts):
            raise RuntimeError(f"{recipe}: planned {plan.workload.update_rows} rows of {plan.workload.update_prompts} "
                               f"prompts, measured {measured.rows} of {measured.prompts}")
        saved = sum(t.bytes for t in plan.terms if t.name.startswith("activations"))
        update = plan.phase("update")
        print(f"| {recipe} | {' '.join(overrides) or '-'} | {measured.rows} ({measured.prompts}) × "
              f"({measured.prompt_tokens} + {measured.completion_tokens}), {measured.patches_per_row} "
              f"| {mib(saved)} / {mib(measured.saved_bytes)} "
              f"| {saved / measured.saved_bytes:.3f} | {mib(update)} / {mib(measured.peak_bytes)} "
              f"| {update / measured.peak_bytes:.3f} |")


if __name__ == "__main__":
    main()
