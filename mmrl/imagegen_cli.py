"""Arguments of the image-generation verbs ``mmrl pretrain-imagegen`` and ``mmrl sample`` (kept free
of heavy imports so that ``mmrl --help`` stays fast); the work is in :mod:`mmrl.imagegen_pretrain`
and :mod:`mmrl.imagegen_sample`."""

from __future__ import annotations

import argparse


def add_pretrain_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="pretraining config JSON: assets/imagegen/ddim_tiny.json, flow_tiny.json "
                                       "or var_tiny.json (next-scale VAR)")
    parser.add_argument("--out", required=True, help="folder for the diffusers pipeline")
    parser.add_argument("--steps", type=int, help="override the config's train.steps")
    parser.add_argument("--overwrite", action="store_true", help="replace a folder written by pretrain-imagegen")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_sample_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="a diffusion run folder (mmrl train --out) or a diffusers pipeline folder")
    parser.add_argument("--base", help="base pipeline folder for RLG (default for a run: its starting point)")
    parser.add_argument("--rlg-weight", type=float, default=1.0,
                        help="RLG weight w: 0 base, 1 the RL model, (0,1) interpolates, > 1 extrapolates")
    parser.add_argument("--rlg-weights", help="comma-separated weights: print reward and distance to the base per w")
    parser.add_argument("--prompts", nargs="*", help="prompts (default: the run's task prompts of --split)")
    parser.add_argument("--split", default="test", help="task split whose prompts are drawn (run folders)")
    parser.add_argument("--num-prompts", type=int, default=64, help="prompts drawn from the split for --rlg-weights")
    parser.add_argument("--per-prompt", type=int, default=4, help="samples per prompt in the grid")
    parser.add_argument("--steps", type=int, help="denoising steps (default: the policy's eval_num_steps)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the initial noise")
    parser.add_argument("--out", default="samples.png", help="PNG grid to write")
