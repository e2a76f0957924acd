"""Why CurveBench needs vision pretraining on the tiny VLM: two measurements on the recipe without it.

    OMP_NUM_THREADS=1 python scripts/results/curvebench_image_blind.py --at 20 80 160
    OMP_NUM_THREADS=1 python scripts/results/curvebench_image_blind.py task.args.max_curves=2 --at 20 80 160

1. **Linear probe of the random-init vision tower.** Pooled image features (mean and max over the
   merged image tokens, ``VLMPolicy.pooled_image_features``) of ``--probe-train`` training images; a
   multinomial logistic regression (L-BFGS, standardised features) predicts the rooted tree;
   accuracy on ``--probe-test`` test images, against the majority class. Also the size of the
   class differences: the mean distance of the class means from the overall mean, relative to the
   mean feature norm. High accuracy with small differences means the image information is there
   but faint.
2. **Does the image reach the answer after SFT?** The recipe's supervised warm start without vision
   pretraining (``warm_start.vision_steps=0``), evaluated after each ``--at`` step count: every one of
   ``--images`` test images is scored with the *same* target text (the first image's reference
   answer), and the log-prob of its first decision token (the first token where the images'
   reference answers differ: the curve count after ``<think>``) is compared across images. A spread
   (max − min) of 0 means the language model's answer does not depend on the image at all.

Recipe overrides come before ``--at``; ``warm_start.vision_steps`` is always set to 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

import numpy as np
import torch

from mmrl.core.config import TrainConfig, load_config
from mmrl.core.registry import make_policy, make_task
from mmrl.core.warm_start import sft

RECIPE = "configs/curvebench/tiny_cpu.yaml"


@torch.no_grad()
def features(policy: Any, examples: list[Any], batch: int = 64) -> torch.Tensor:
    """[N, D] pooled image features, in batches."""
    policy.eval()
    return torch.cat([policy.pooled_image_features(examples[i:i + batch]) for i in range(0, len(examples), batch)])


def tree_labels(examples: list[Any], trees: list[tuple[int, ...]]) -> torch.Tensor:
    """[N] index of each example's rooted tree (its ``parents`` tuple) in ``trees``."""
    return torch.tensor([trees.index(tuple(ex.parents)) for ex in examples])


def linear_probe(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor,
                 classes: int) -> float:
    """Test accuracy of a multinomial logistic regression fitted by full-batch L-BFGS (zero init, so
    deterministic) on standardised features, with a small L2 penalty."""
    mean, std = train_x.mean(0), train_x.std(0) + 1e-6
    x, xt = (train_x - mean) / std, (test_x - mean) / std
    weight = torch.zeros(x.shape[1], classes, requires_grad=True)
    bias = torch.zeros(classes, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=500, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ weight + bias, train_y) + 1e-4 * weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        return float(((xt @ weight + bias).argmax(1) == test_y).float().mean())


def class_separation(x: torch.Tensor, y: torch.Tensor) -> float:
    """Mean distance of the class means from the overall mean, over the mean feature norm."""
    centre = x.mean(0)
    gaps = [float((x[y == c].mean(0) - centre).norm()) for c in y.unique()]
    return float(np.mean(gaps)) / float(x.norm(dim=1).mean())


def probe(cfg: TrainConfig, n_train: int, n_test: int) -> dict[str, float]:
    """Part 1 on the random-init policy."""
    task, policy = make_task(cfg.task.name, cfg.task.args), make_policy(cfg.policy.name, cfg.policy.args)
    train = task.sample_batch("train", n_train, np.random.default_rng(0))
    test = task.sample_batch("test", n_test, np.random.default_rng(cfg.eval.seed))
    trees = sorted({tuple(ex.parents) for ex in train + test})
    train_x, test_x = features(policy, train), features(policy, test)
    train_y, test_y = tree_labels(train, trees), tree_labels(test, trees)
    majority = float((test_y == train_y.mode().values).float().mean())
    return {"trees": len(trees), "probe_accuracy": linear_probe(train_x, train_y, test_x, test_y, len(trees)),
            "majority_class": majority, "class_separation": class_separation(train_x, train_y)}


@torch.no_grad()
def decision_spread(policy: Any, task: Any, examples: list[Any]) -> dict[str, float]:
    """Spread across ``examples`` of the log-prob of the first decision token of one shared target."""
    references = [task.reference_output(ex) for ex in examples]
    ids = policy.target_payload(examples, references).completion_ids  # [N, T]
    differs = (ids != ids[:1]).any(0).nonzero()
    if len(differs) == 0:
        raise ValueError("the test images' reference answers are all the same; draw more images")
    position = int(differs[0])
    policy.eval()
    logp = policy.score(policy.target_payload(examples, [references[0]] * len(examples))).logp[:, position]
    policy.train()
    return {"decision_position": position, "logp_mean": float(logp.mean()),
            "logp_spread": float(logp.max() - logp.min())}


def sft_spreads(cfg: TrainConfig, at: list[int], n_images: int) -> list[dict[str, float]]:
    """Part 2: the recipe's SFT (no vision pretraining), the spread after each step count in ``at``."""
    cfg = dataclasses.replace(cfg, warm_start=dataclasses.replace(cfg.warm_start, vision_steps=0))
    task, policy = make_task(cfg.task.name, cfg.task.args), make_policy(cfg.policy.name, cfg.policy.args)
    examples = task.sample_batch("test", n_images, np.random.default_rng(cfg.eval.seed))
    rows = []

    def measure(step: int, loss: float) -> None:
        if step in at and step > 0:
            rows.append({"sft_steps": step, **decision_spread(policy, task, examples)})
            print(json.dumps({k: round(v, 4) for k, v in rows[-1].items()}), flush=True)

    sft(policy, cfg, steps=max(at), on_step=measure)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="recipe overrides, e.g. task.args.max_curves=2")
    parser.add_argument("--recipe", default=RECIPE)
    parser.add_argument("--at", type=int, nargs="+", default=[20, 80, 160], help="SFT step counts for part 2")
    parser.add_argument("--probe-train", type=int, default=2000)
    parser.add_argument("--probe-test", type=int, default=500)
    parser.add_argument("--images", type=int, default=64, help="test images for part 2")
    args = parser.parse_args()
    if min(args.at) < 1:
        parser.error("--at: step counts must be >= 1")
    cfg = load_config(args.recipe, [*args.overrides, "warm_start.vision_steps=0", "log.progress=false"])
    print(json.dumps({k: round(v, 4) for k, v in probe(cfg, args.probe_train, args.probe_test).items()}), flush=True)
    sft_spreads(cfg, sorted(set(args.at)), args.images)


if __name__ == "__main__":
    main()
