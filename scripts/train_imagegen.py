"""Train the tiny text-to-image models with RL on verifiable image rewards (imagegen/shapes-v0).

    python scripts/train_imagegen.py --out runs/ddpo                                  # DDPO (DDIM, η = 1)
    python scripts/train_imagegen.py --out runs/flow --recipe configs/flow_grpo/tiny_cpu.yaml  # Flow-GRPO
    python scripts/train_imagegen.py --out runs/x "task.args.reward_weights={jpeg_compressibility: 1.0}"
    mmrl sample runs/ddpo --rlg-weights 0,0.5,1,1.5,2                                 # RL guidance sweep

The starting pipelines are pretrained on first use (``mmrl pretrain-imagegen``, a few minutes on
CPU) and cached in ``$MMRL_CACHE/imagegen``. The same implementation as ``mmrl train``.
"""

from mmrl.cli import exit_process, script_main

if __name__ == "__main__":
    exit_process(script_main("configs/ddpo/tiny_cpu.yaml", __doc__))
