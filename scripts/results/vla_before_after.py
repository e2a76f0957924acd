"""Side-by-side rollout GIF of a VLA before and after RL on the same held-out layouts.

    OMP_NUM_THREADS=1 python scripts/results/vla_before_after.py configs/metaworld/tiny_cpu.yaml \\
        task.name=robot/metaworld-drawer-close-v0 --before warm_start --after runs/mw_drawer_close \\
        --out docs/img/metaworld_drawer_close_before_after.gif

Both policies play greedy episodes on the same ``--episodes`` seeds of ``--split`` (drawn with ``--seed``,
the trainer's held-out set). The GIF shows the first ``--show`` layouts where the two outcomes differ
(before | after, one row per layout; a frame border is green on success, red on failure), or the first
layouts when none differ. ``--before`` / ``--after``: a run folder, an ``mmrl bc`` folder or ``warm_start``
(the recipe's own warm start, from ``$MMRL_CACHE``), as in ``paired_eval.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import numpy as np
import torch

from mmrl.core.registry import make_task
from mmrl.core.rollout import SamplingParams

_spec = importlib.util.spec_from_file_location("paired_eval", Path(__file__).with_name("paired_eval.py"))
paired_eval = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(paired_eval)

GREEN, RED = np.array([40, 200, 60], np.uint8), np.array([220, 40, 40], np.uint8)


def framed(frame: np.ndarray, success: bool, width: int = 2) -> np.ndarray:
    """``frame`` with a coloured border: green for a successful episode, red for a failed one."""
    out = frame.copy()
    colour = GREEN if success else RED
    out[:width], out[-width:], out[:, :width], out[:, -width:] = colour, colour, colour, colour
    return out


def tile(episodes: list[list[tuple[list[np.ndarray], bool]]]) -> list[np.ndarray]:
    """Frames of a grid (rows: layouts, columns: policies); an episode that ended holds its last frame."""
    length = max(len(frames) for row in episodes for frames, _ in row)
    grid = []
    for t in range(length):
        rows = [np.concatenate([framed(frames[min(t, len(frames) - 1)], ok) for frames, ok in row], axis=1)
                for row in episodes]
        grid.append(np.concatenate(rows, axis=0))
    return grid


@torch.no_grad()
def play(policy, examples: list) -> list[tuple[list[np.ndarray], bool]]:
    """Greedy episodes of ``policy`` on ``examples``: (frames, success) each."""
    policy.eval()
    rollout = policy.rollout(examples, 1, SamplingParams(temperature=0.0), seed=0, record_frames=True)
    return [(frames, summary.success) for frames, summary in zip(policy.last_frames, rollout.outputs)]


def main() -> None:
    from mmrl.tasks.robot.videos import write_gif

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe")
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", required=True)
    parser.add_argument("--out", required=True, help="the GIF to write")
    parser.add_argument("--split", default="test")
    parser.add_argument("--episodes", type=int, default=8, help="layouts both policies play")
    parser.add_argument("--show", type=int, default=2, help="layouts in the GIF")
    parser.add_argument("--seed", type=int, default=1234, help="seed of the held-out layouts (eval.seed)")
    parser.add_argument("--stride", type=int, default=2, help="keep every this many frames (a smaller GIF)")
    parser.add_argument("overrides", nargs="*", help="recipe overrides for both policies (right after the recipe)")
    args = parser.parse_args()
    played = []
    for model in (args.before, args.after):
        cfg, policy = paired_eval.load_policy(args.recipe, model, args.overrides)
        task = make_task(cfg.task.name, cfg.task.args)
        examples = task.sample_batch(args.split, args.episodes, np.random.default_rng(args.seed))
        played.append(play(policy, examples))
    pairs = list(zip(*played))
    differ = [i for i, (b, a) in enumerate(pairs) if b[1] != a[1]]
    chosen = (differ + [i for i in range(len(pairs)) if i not in differ])[:args.show]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    frames = tile([list(pairs[i]) for i in chosen])
    write_gif(frames[::args.stride] + frames[-1:], Path(args.out), scale=2, fps=max(1, 20 // args.stride))
    outcome = lambda ok: "success" if ok else "fail"  # noqa: E731
    print(f"{args.out}: layouts {chosen}; before/after: "
          + ", ".join(f"{outcome(pairs[i][0][1])}/{outcome(pairs[i][1][1])}" for i in chosen)
          + f"; success over {len(pairs)} layouts: before {sum(b[1] for b, _ in pairs)}, after {sum(a[1] for _, a in pairs)}")


if __name__ == "__main__":
    main()
