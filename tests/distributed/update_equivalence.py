"""One PPO update on a fixed global batch, split over however many processes run this script.

Every process builds the same Trainer (tiny sanity recipe), samples the SAME global batch (same
prompts, same weights, same seed), keeps the whole groups ``g`` with ``g % world == rank`` and runs
``Trainer.advantages`` + ``Trainer.update`` exactly as ``Trainer.train`` does. Rank 0 writes the
initial and updated parameters, the update's metrics and the world size to ``--result``, so a
1-process and a 2-process run can be compared (tests/distributed/test_distributed.py):

    python tests/distributed/update_equivalence.py --out RUN1 --result r1.pt --micro-batch-size 3
    ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 \
        tests/distributed/update_equivalence.py --out RUN2 --result r2.pt --micro-batch-size 5

Under FSDP (``--config_file configs/accelerate/fsdp_cpu_2proc.yaml``) the parameters and gradients are
shards: the rollout runs inside ``Engine.full_parameters`` (as in ``Trainer.train``) and the written
parameters and gradients are gathered whole.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor

from mmrl.cli import exit_process
from mmrl.core.config import load_config
from mmrl.core.rollout import SamplingParams, derive_seed
from mmrl.core.trainer import Trainer

RECIPE = Path(__file__).resolve().parents[2] / "configs" / "sanity" / "tiny_cpu.yaml"
BATCH_SEED = 20240601


def whole_state(trainer: Trainer) -> dict[str, torch.Tensor]:
    """The policy's parameters and buffers, whole, on CPU (under FSDP: gathered; on rank 0 only)."""
    if trainer.engine.sharded:
        return get_model_state_dict(trainer.policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach().cpu().clone() for k, v in trainer.policy.state_dict().items()}


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A gradient, whole (an FSDP2 gradient is a DTensor shard: gathered, a collective)."""
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().cpu().clone()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="Trainer run folder (shared by the processes of one run)")
    parser.add_argument("--result", required=True, help="file rank 0 writes (torch.save)")
    parser.add_argument("--micro-batch-size", type=int, required=True)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--ppo-epochs", type=int, default=1)
    parser.add_argument("--sft-steps", type=int, default=0)
    parser.add_argument("--recipe", default=str(RECIPE), help="the recipe (default: the tiny text sanity one)")
    parser.add_argument("overrides", nargs="*", help="extra dotted config overrides")
    args = parser.parse_args()

    overrides = [f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group_size}",
                 f"trainer.micro_batch_size={args.micro_batch_size}", f"trainer.ppo_epochs={args.ppo_epochs}",
                 "trainer.minibatches=1", f"warm_start.sft_steps={args.sft_steps}", "eval.num_examples=4",
                 "log.progress=false", "log.tensorboard=false", *args.overrides]
    cfg = load_config(args.recipe, overrides)
    trainer = Trainer(cfg, args.out, overwrite=True)
    eng = trainer.engine
    world, rank = eng.world_size, eng.rank
    initial = whole_state(trainer)
    # The (clipped, all-reduced) gradient each optimizer step applies: compared directly, because
    # Adam's first step lr·g/(|g|+eps) turns float-rounding noise in gradients far below eps into
    # parameter differences of up to ~1e-6.
    names = {id(p): n for n, p in trainer.policy.named_parameters()}
    grads: list[dict[str, torch.Tensor]] = []
    getattr(trainer.optimizer, "optimizer", trainer.optimizer).register_step_pre_hook(lambda opt, *_: grads.append(
        {names[id(p)]: whole(p.grad) for g in opt.param_groups for p in g["params"]
         if p.grad is not None}))

    # One global batch, identical on every process.
    examples = trainer.task.sample_batch("train", args.prompts, np.random.default_rng(BATCH_SEED))
    sampling = SamplingParams(cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_new_tokens)
    with eng.full_parameters(trainer.model):
        rollout = trainer.policy.rollout(examples, cfg.rollout.group_size, sampling, seed=derive_seed(BATCH_SEED, 1))
    full = trainer.score(rollout, examples)
    batch = full.select(rollout.group_id % world == rank)

    # As in Trainer.train for step 1.
    trainer.step = 1
    advantages, returns, reference = trainer.advantages(batch)
    metrics = trainer.update(batch.rollout, advantages, returns, reference)

    params = whole_state(trainer)
    # The share of the parameters this process holds (1 unsharded; about 1 / world under FSDP).
    local_fraction = sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in trainer.policy.parameters()) \
        / sum(p.numel() for p in trainer.policy.parameters())
    rank_diff = None  # FSDP: each process holds its own shard, there are no replicas to compare
    if not eng.sharded:
        flat = torch.cat([v.double().flatten() for v in params.values()]).to(eng.device)
        # Largest difference of the updated parameters between processes (0 in a correct DDP run).
        gathered = eng.accelerator.gather(flat.unsqueeze(0)) if world > 1 else flat.unsqueeze(0)
        rank_diff = float((gathered - gathered[0]).abs().max())
    if eng.is_main:
        Path(args.result).parent.mkdir(parents=True, exist_ok=True)
        torch.save({"world_size": world, "initial": initial, "params": params, "metrics": metrics, "grads": grads,
                    "max_rank_param_diff": rank_diff, "rows_per_rank": batch.rollout.num_rows,
                    "distributed_type": str(eng.accelerator.distributed_type), "local_param_fraction": local_fraction,
                    "global_rows": rollout.num_rows, "outcome": full.outcome,
                    "outputs": list(rollout.outputs)}, args.result)
    eng.wait()
    eng.end()


if __name__ == "__main__":
    main()
    exit_process(0)
