"""Held-out fit of a PRFT run's reward model (``algo.extra.<wsrl|co_rft>.reward_model: true``): the frozen model
saved in ``<run>/offpolicy/offline.pt`` against the env's rewards of scripted-expert demonstrations it was not
trained on (the run's task args, so the same demonstration noise), one line per split: MSE of its
per-decision rewards, MSE of predicting their mean (the baseline a useful model beats) and their correlation.
``test`` is the source domain's held-out split, ``ood_color`` the target domain of vla_reach/prft_tiny_cpu.

    python scripts/results/prft_reward_fit.py runs/prft/prft --splits test ood_color --demos 128
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from mmrl.algos.offpolicy.episodes import episode_from_demonstration
from mmrl.algos.offpolicy.reward_model import RewardModel, reward_fit
from mmrl.algos.offpolicy.wsrl import OFFLINE_FILE, STATE_DIR
from mmrl.algos.variants.params import variant_params
from mmrl.core.config import load_config
from mmrl.core.registry import load_plugins, make_policy, make_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path)
    parser.add_argument("--splits", nargs="+", default=["test", "ood_color"])
    parser.add_argument("--demos", type=int, default=128, help="demonstrations per split")
    parser.add_argument("--seed", type=int, default=1, help="seed of the examples drawn from each split")
    args = parser.parse_args()
    load_plugins()
    cfg = load_config(str(args.run / "config.yaml"))
    p = variant_params(cfg.algo, cfg.algo.offpolicy)
    saved = torch.load(args.run / STATE_DIR / OFFLINE_FILE, weights_only=True)
    if "reward_model" not in saved:
        raise SystemExit(f"{args.run} has no reward model ({STATE_DIR}/{OFFLINE_FILE}): not a PRFT run")
    policy = make_policy(cfg.policy.name, cfg.policy.args)  # its weights are replaced by the saved encoder's
    model = RewardModel.from_policy(policy, int(saved["reward_model_chunk"]), p.reward_model_width, 0,
                                    p.reward_model_train_encoder, p.reward_model_head, p.reward_model_success_bonus)
    model.load_state_dict(saved["reward_model"])
    model.requires_grad_(False).eval()
    task = make_task(cfg.task.name, cfg.task.args)
    for split in args.splits:
        demos = [task.reference_output(e)
                 for e in task.sample_batch(split, args.demos, np.random.default_rng(args.seed))]
        episodes = [episode_from_demonstration(d, policy.encode_instructions([d.instruction])[0].numpy(),
                                               policy.decision_size // d.executed_actions.shape[1]) for d in demos]
        fit = reward_fit(model, episodes)
        print(json.dumps({"split": split, "demos": len(episodes), "decisions": sum(e.length for e in episodes),
                          **{k: round(v, 4) for k, v in fit.items()}}))


if __name__ == "__main__":
    main()
