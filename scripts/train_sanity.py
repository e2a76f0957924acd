"""Train the sanity task: a tiny Qwen2 LM learns to reverse digit strings (SFT warm start → GRPO).

    python scripts/train_sanity.py --out runs/sanity
    python scripts/train_sanity.py --out runs/sanity_ppo --recipe configs/sanity/ppo_tiny_cpu.yaml
    python scripts/train_sanity.py --out runs/x trainer.lr=1e-4 rollout.group_size=16
    ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 scripts/train_sanity.py --out runs/x2

The same implementation as ``mmrl train``: a recipe, dotted overrides, one trainer loop.
"""

from mmrl.cli import exit_process, script_main

if __name__ == "__main__":
    exit_process(script_main("configs/sanity/tiny_cpu.yaml", __doc__))
