"""Does the world model's verified reward rank episodes as the REAL simulator does?

For ``--states`` initial states of the world model's reference pool, ``--group`` episodes of the
policy are sampled (temperature 1) in the real MuJoCo env from the same seed; the same executed
actions are replayed open-loop in the world model from the same real first frame and scored with
the env's reward −mean_t (MAE + 1 − SSIM) against the expert's imagined rollout. Printed: the
mean within-group Spearman correlation of that reward with the real return (Φ_T − Φ_0) and with
real success, i.e. how often GRPO's group-relative advantage points the right way.

    python scripts/results/wm_reward_alignment.py --world-model runs/wm/reach --policy $MMRL_CACHE/warm_start/<key>
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

import mmrl.envs  # noqa: F401
from mmrl.envs.world_model.env import WorldModelSim
from mmrl.policies.vla import VLAConfig, VLAPolicy
from mmrl.core.rollout import SamplingParams
from mmrl.tasks.robot import EpisodeExample


def average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 0..n-1 with ties sharing their mean rank (success is 0/1: many ties)."""
    order = x.argsort(kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x), dtype=float)
    for value in np.unique(x):
        ranks[x == value] = ranks[x == value].mean()
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (NaN when either side is constant).

    >>> round(spearman(np.array([0.1, 0.2, 0.3]), np.array([0.0, 1.0, 1.0])), 3)
    0.866
    """
    ra, rb = average_ranks(a), average_ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


@torch.no_grad()
def imagined_reward(sim: WorldModelSim, index: int, actions: np.ndarray) -> float:
    """World-model reward of executing ``actions`` [T', A] (padded with 0 = stay to the horizon)."""
    padded = np.zeros((sim.horizon, actions.shape[1]), np.float32)
    padded[:len(actions)] = np.clip(actions[:sim.horizon], -1, 1)
    z, _, _ = sim.start(np.array([index]))
    frames = []
    for t in range(sim.horizon):
        z, frame, _ = sim.advance(z, padded[t:t + 1], np.array([index]))
        frames.append(frame[0])
    return sim.reward(index, frames)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-model", required=True)
    parser.add_argument("--policy", required=True, help="a VLA folder (save_pretrained), e.g. the cached warm start")
    parser.add_argument("--states", type=int, default=8)
    parser.add_argument("--group", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=64)
    args = parser.parse_args()
    sim = WorldModelSim("reach", args.world_model, args.image_size, 2)
    seeds = np.load(f"{args.world_model}/reference_pool.npz")["seeds"]
    policy = VLAPolicy.from_config(VLAConfig(action_head="gaussian", image_size=args.image_size, value_head=False,
                                             max_decisions=30, num_envs=args.group, pretrained=args.policy)).eval()
    by_return, by_success, rows = [], [], []
    for index in range(min(args.states, len(seeds))):
        example = EpisodeExample("mmrl/Reach-v0", int(seeds[index]))
        rollout = policy.rollout([example], args.group, SamplingParams(temperature=1.0), seed=index)
        lengths = rollout.lengths.tolist()
        actions = rollout.payload.actions.float().numpy()  # [G, T, A] raw Gaussian samples
        wm = np.array([imagined_reward(sim, index, actions[g, :lengths[g]]) for g in range(args.group)])
        real = np.array([o.episode_return for o in rollout.outputs])
        success = np.array([float(o.success) for o in rollout.outputs])
        by_return.append(spearman(wm, real))
        by_success.append(spearman(wm, success))
        rows.append({"pool_index": index, "spearman_return": by_return[-1], "spearman_success": by_success[-1],
                     "real_success": success.mean(), "wm_reward_mean": wm.mean(), "wm_reward_std": wm.std()})
        print(json.dumps(rows[-1]), flush=True)
    print(f"mean within-group Spearman(world-model reward, real return) = {np.nanmean(by_return):.3f}; "
          f"(…, real success) = {np.nanmean(by_success):.3f} over {len(rows)} states × {args.group} episodes")


if __name__ == "__main__":
    main()
