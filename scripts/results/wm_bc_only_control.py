"""Control run for the drift-gated BC regulariser (docs/results.md, VLA-RFT section): a training run
with every advantage zeroed and the BC gate held at 1, so the only update is behaviour cloning on the
warm start's own demonstrations, with the run's optimizer, lr, batch, steps and real-simulator evals.

    python scripts/results/wm_bc_only_control.py runs/world_model/bc_only_gate_open_s0 \\
        task.args.world_model=runs/wm/reach_demos_cov trainer.lr=1e-3 trainer.steps=40 \\
        checkpoint.every=40 algo.bc_coef=0.1 trainer.ref_model=copy

(An experiment, not a feature: it patches two trainer functions for this process only.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import mmrl.core.trainer as trainer_module
from mmrl.core.config import load_config


def main(argv: list[str]) -> None:
    if len(argv) < 1:
        raise SystemExit(__doc__)
    advantages = trainer_module.Trainer.advantages

    def zero_advantages(self, batch):
        adv, values, reference = advantages(self, batch)
        return adv * 0.0, values, reference

    trainer_module.Trainer.advantages = zero_advantages
    trainer_module.drift_gate = lambda drift, threshold: 1.0
    cfg = load_config("world_model_rft/tiny_cpu", ["log.tensorboard=false", *argv[1:]])
    if cfg.algo.bc_coef <= 0:
        raise SystemExit("set algo.bc_coef > 0 (and trainer.ref_model=copy): it is the only update here")
    trainer_module.train(cfg, Path(argv[0]))


if __name__ == "__main__":
    main(sys.argv[1:])
