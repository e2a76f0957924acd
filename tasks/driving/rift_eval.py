"""Closed-loop before/after evaluation of a RIFT run, and a BEV rollout GIF.

    python -m mmrl.tasks.driving.rift_eval --run runs/rift --episodes 64 \
        --json runs/rift/closed_loop.json --gif docs/img/rift_before_after.gif

"before" is the imitation warm start (read from the warm-start cache, ``$MMRL_CACHE``, that the run
used), "after" the run's latest checkpoint, named after the run's reward (``rift`` or ``rlftsim``). Each is
driven closed loop for 8 s from the same held-out states (``--splits``, seeds drawn from ``--seed``) and
compared with the rule-based log of the same states, in the run's own simulator: our world for
``driving/rift-v0`` (:func:`mmrl.tasks.driving.rift.closed_loop_metrics`), highway-env for
``driving/rift-highway-v0`` (:meth:`mmrl.tasks.driving.rift_highway.RiftHighwayTask.closed_loop_metrics`; its
splits are ``test`` and ``ood``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from mmrl.core import checkpoint as ckpt
from mmrl.core.config import load_config
from mmrl.envs.driving.render import render_bev
from mmrl.core.registry import make_policy, make_task
from mmrl.core.warm_start import warm_start_path

CBV_COLOUR = (255, 220, 0)


def load_policies(run: Path):
    """(imitation start, fine-tuned) policies of a run folder and its task (a RIFT task of either simulator)."""
    cfg = load_config(str(run / "config.yaml"))  # validated: typed args, the key the trainer cached under
    before, after = (make_policy(cfg.policy.name, cfg.policy.args) for _ in range(2))
    start = warm_start_path(cfg)
    if not start.is_dir():
        raise FileNotFoundError(f"{start}: the run's warm start is not in the cache (set MMRL_CACHE as for the run)")
    before.load_weights(str(start))
    latest = ckpt.latest_checkpoint(run)
    if latest is None:
        raise FileNotFoundError(f"{run}: no checkpoint")
    after.load_weights(str(latest / "policy"))
    task = make_task(cfg.task.name, cfg.task.args)
    if not hasattr(task, "closed_loop_metrics"):
        raise ValueError(f"{run}: task {cfg.task.name} is not a RIFT traffic task (driving/rift-v0, driving/rift-highway-v0)")
    return before.eval(), after.eval(), task


def frames(state, episode, size: int = 160, label: str = "") -> list[Image.Image]:
    """BEV frames (every 0.5 s) centred on the CBV; the CBV is drawn yellow over the raster."""
    out = []
    scenario = dataclasses.replace(state.scenario, agents=state.others)  # the scenario's ego is one of them
    for t in range(0, len(episode.cbv), 5):
        # render from the CBV's point of view: the renderer's "ego" box is drawn at the CBV pose
        img = render_bev(scenario, ego_pose=episode.cbv[t], agent_poses=episode.others[t], size=size,
                         metres_per_px=0.5, show_route=False, apply_weather=False)
        pil = Image.fromarray(img)
        draw = ImageDraw.Draw(pil)
        c, r = size / 2, 0.75 * size
        draw.rectangle([c - 2, r - 4, c + 2, r + 4], outline=CBV_COLOUR)
        crashed = episode.collision and t + 5 >= len(episode.cbv)
        draw.text((3, 3), f"{label} t={t / 10:.1f}s" + (" COLLISION" if crashed else ""),
                  fill=(255, 80, 80) if crashed else (255, 255, 255))
        out.append(pil)
    return out


def write_gif(pairs, path: Path, size: int = 160, label: str = "RIFT") -> None:
    """Side-by-side GIF: imitation start (left) and fine-tuned (right, ``label``), one pair of episodes each."""
    sequence = []
    for state, ep_before, ep_after in pairs:
        left, right = frames(state, ep_before, size, "IL"), frames(state, ep_after, size, label)
        n = max(len(left), len(right))
        left += [left[-1]] * (n - len(left))
        right += [right[-1]] * (n - len(right))
        for a, b in zip(left, right):
            canvas = Image.new("RGB", (2 * size + 4, size), (0, 0, 0))
            canvas.paste(a, (0, 0))
            canvas.paste(b, (size + 4, 0))
            sequence.append(canvas)
    path.parent.mkdir(parents=True, exist_ok=True)
    sequence[0].save(path, save_all=True, append_images=sequence[1:], duration=150, loop=0, optimize=True)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, type=Path)
    parser.add_argument("--splits", default="test", help="comma-separated splits of the run's task")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--seed", type=int, default=4321)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--gif", type=Path)
    parser.add_argument("--gif-episodes", type=int, default=3)
    args = parser.parse_args(argv)
    before, after, task = load_policies(args.run)
    reward = task.cfg.reward
    results: dict = {}
    for split in args.splits.split(","):
        seeds = np.random.default_rng(args.seed).integers(0, task.seed_high, size=args.episodes)
        runs_before, runs_after = [], []
        results[split] = {"imitation": task.closed_loop_metrics(before.choose, split, seeds, runs_before),
                          reward: task.closed_loop_metrics(after.choose, split, seeds, runs_after)}
        for name, m in results[split].items():
            print(f"[{split}] {name:<9} " + "  ".join(f"{k} {v:.3f}" for k, v in m.items()))
        if args.gif and split == args.splits.split(",")[0]:
            # one episode each: imitation collides and the fine-tuned policy does not; the reverse; choices differ
            b, a = [r[1] for r in runs_before], [r[1] for r in runs_after]
            kinds = [lambda i: b[i].collision and not a[i].collision, lambda i: a[i].collision and not b[i].collision,
                     lambda i: b[i].choices != a[i].choices]
            picked = []
            for kind in kinds:
                picked += [i for i in range(len(seeds)) if kind(i) and i not in picked][:1]
            pairs = [(runs_before[i][0], b[i], a[i]) for i in picked[:args.gif_episodes]]
            if not pairs:
                print(f"gif: not written: no held-out episode of {split} differs between the two policies")
                continue
            write_gif(pairs, args.gif, label=reward.upper())
            print(f"gif: {args.gif} ({args.gif.stat().st_size / 1e3:.0f} kB)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
