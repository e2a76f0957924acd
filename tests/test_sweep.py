"""``mmrl sweep`` (mmrl/experiments/sweep.py) on a tiny budget: every (arm, seed) trains, the table / JSON / plot hold
the numbers of the runs, finished runs are reused, bad arguments are one-line errors. Also the pass@k
estimator the sweep's evaluation uses (``eval.pass_k``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mmrl.cli import main
from mmrl.core.config import ConfigError
from mmrl.core.paths import recipes_dir
from mmrl.experiments.sweep import SWEEP_ARMS, mean_std, parse_sweep_arguments, resolve_sweep
from mmrl.core.evaluate import pass_at_k

TINY = ["trainer.steps=2", "eval.every=0", "eval.num_examples=8", "rollout.prompts_per_step=8", "rollout.group_size=4",
        "warm_start.sft_steps=20", "checkpoint.every=0", "log.tensorboard=false"]


def test_pass_at_k_golden():
    # 3 examples × 2 samples: example 0 passes once, example 1 never (0.99 < 1), example 2 twice → 2/3
    scores = torch.tensor([1.0, 0.2, 0.99, 0.5, 1.0, 1.0], dtype=torch.float64)
    index = torch.tensor([0, 0, 1, 1, 2, 2])
    assert pass_at_k(scores, index, 3, 1.0) == pytest.approx(2 / 3)
    assert pass_at_k(scores, index, 3, 0.5) == pytest.approx(1.0)


def test_mean_std_is_the_sample_std():
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0) and mean_std([0.5]) == (0.5, 0.0)


def test_sweep_writes_table_json_and_plot(tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["sweep", "sanity/tiny_cpu", "algo=grpo,f_grpo", "seeds=0,1", *TINY, "--out", str(out), "--pass-k", "2"]
    assert main(argv) == 0
    results = json.loads((out / "sweep.json").read_text())
    assert results["arms"] == ["grpo", "f_grpo"] and results["seeds"] == [0, 1] and results["pass_k"] == 2
    table = (out / "sweep.md").read_text()
    assert table in capsys.readouterr().out
    for arm in ("grpo", "f_grpo"):
        finals = [results["runs"][arm][s]["final"] for s in ("0", "1")]
        for seed in ("0", "1"):
            rows = [json.loads(line) for line in (out / "runs" / arm / f"seed_{seed}" / "metrics.jsonl").open()]
            assert rows[-1]["step"] == 2 and results["runs"][arm][seed]["final"]["eval/reward_mean"] == \
                rows[-1]["eval/reward_mean"]
            assert results["runs"][arm][seed]["rollouts_generated"] == 2 * 8 * 4
        mean, std = mean_std([f["eval/pass@2"] for f in finals])
        row = next(line for line in table.splitlines() if line.startswith(f"| {arm} |"))
        assert f"{mean:.3f} ± {std:.3f}" in row and "| 64 | 64 |" in row
        assert f"{np.mean([f['eval/reward_mean'] for f in finals]):.3f} ±" in row
    # seeds change the RL phase only: the held-out set and the warm start are shared
    assert len({json.dumps(results["runs"][a][s]["initial"]) for a in ("grpo", "f_grpo") for s in ("0", "1")}) == 1
    assert "pass@2" in table.splitlines()[2] and "(before RL)" in table
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a second call reuses the finished runs
    assert main(argv) == 0
    assert capsys.readouterr().out.count("reusing") == 4


def test_bad_sweep_arguments_are_user_errors(tmp_path, capsys):
    with pytest.raises(ConfigError, match="Did you mean 'f_grpo'"):
        parse_sweep_arguments(["algo=grpo,f_grp", "seeds=0"])
    with pytest.raises(ConfigError, match="seeds="):
        parse_sweep_arguments(["algo=grpo"])
    assert parse_sweep_arguments(["algo=grpo", "seeds=0,2", "trainer.lr=1e-4"]).overrides == ("trainer.lr=1e-4",)
    assert main(["sweep", "sanity/tiny_cpu", "algo=nope", "seeds=0", "--out", str(tmp_path / "s")]) == 2
    assert "unknown sweep arm 'nope'" in capsys.readouterr().err


def test_every_arm_builds_a_valid_config():
    from mmrl.core.config import load_config

    for arm in SWEEP_ARMS.names():
        load_config("sanity/tiny_cpu", list(SWEEP_ARMS.get(arm).overrides))


def test_the_polychromic_vine_arm_turns_on_vine_sampling_and_follows_polychromic_in_the_seed_sweeps():
    from mmrl.algos.hooks import ROLLOUT_HOOKS
    from mmrl.algos.variants import variant_params
    from mmrl.core.config import load_config

    cfg = load_config("sanity/tiny_cpu", list(SWEEP_ARMS.get("polychromic_vine").overrides))
    assert cfg.algo.advantage == "polychromic" and variant_params(cfg.algo, "polychromic").vine_states == 4
    assert "polychromic_vine" in [name for name, spec in ROLLOUT_HOOKS.entries() if spec.selected(cfg)]
    plain = load_config("sanity/tiny_cpu", list(SWEEP_ARMS.get("polychromic").overrides))
    assert "polychromic_vine" not in [name for name, spec in ROLLOUT_HOOKS.entries() if spec.selected(plain)]
    for name in ("sweeps/seed_methods_sanity", "sweeps/seed_methods_vqa"):
        arms = resolve_sweep(name, [])[1].arms
        assert arms[arms.index("polychromic") + 1] == "polychromic_vine"


def write_sweep_file(tmp_path, body: str):
    path = tmp_path / "s.yaml"
    path.write_text(body)
    return str(path)


def test_a_sweep_file_holds_the_command_and_the_command_line_refines_it(tmp_path, capsys):
    path = write_sweep_file(tmp_path, "sweep:\n  recipe: sanity/tiny_cpu\n  arms: [grpo, f_grpo]\n  seeds: [0, 1]\n"
                                      f"  overrides: {TINY!r}\n  arm_overrides:\n    f_grpo: [trainer.lr=1.0e-4]\n")
    recipe, spec = resolve_sweep(path, [])
    assert recipe == "sanity/tiny_cpu" and spec.arms == ("grpo", "f_grpo") and spec.seeds == (0, 1)
    assert spec.overrides == tuple(TINY) and spec.overrides_of("f_grpo") == ("trainer.lr=1.0e-4",)
    assert spec.overrides_of("grpo") == ()
    # algo= / seeds= on the command line replace the file's; other overrides come after its own
    _, spec = resolve_sweep(path, ["algo=f_grpo", "seeds=0", "trainer.steps=1"])
    assert spec.arms == ("f_grpo",) and spec.seeds == (0,) and spec.overrides == (*TINY, "trainer.steps=1")
    # a recipe is still a recipe
    assert resolve_sweep("sanity/tiny_cpu", ["algo=grpo", "seeds=3"])[1].seeds == (3,)
    out = tmp_path / "out"
    assert main(["sweep", path, "algo=f_grpo", "seeds=0", "trainer.steps=1", "--out", str(out), "--pass-k", "0"]) == 0
    config = (out / "runs" / "f_grpo" / "seed_0" / "config.yaml").read_text()
    assert "lr: 0.0001" in config and "steps: 1" in config  # the arm's own override reached its run
    assert "Only `f_grpo`: `trainer.lr=1.0e-4`" in capsys.readouterr().out


@pytest.mark.parametrize("body, message", [
    ("sweep:\n  recipe: sanity/tiny_cpu\n  arms: [grpo]\n  seeds: [0]\n  seed: [1]\n", "unknown sweep key.*seed"),
    ("sweep:\n  arms: [grpo]\n  seeds: [0]\n", "sweep.recipe"),
    ("sweep:\n  recipe: sanity/tiny_cpu\n  arms: grpo\n  seeds: [0]\n", "sweep.arms must be a list"),
    ("sweep:\n  recipe: sanity/tiny_cpu\n  arms: [grpo, nope]\n  seeds: [0]\n", "unknown sweep arm 'nope'"),
    ("sweep:\n  recipe: sanity/tiny_cpu\n  arms: [grpo]\n  seeds: [0]\n  arm_overrides: [x]\n", "arm_overrides must map"),
    ("sweep: [grpo]\n", "'sweep' must be a mapping"),
])
def test_bad_sweep_files_are_user_errors(tmp_path, body, message):
    with pytest.raises(ConfigError, match=message):
        resolve_sweep(write_sweep_file(tmp_path, body), [])


@pytest.mark.parametrize("name", sorted(f"sweeps/{p.stem}" for p in (recipes_dir() / "sweeps").glob("*.yaml")))
def test_every_shipped_sweep_file_builds_a_valid_config_per_arm(name):
    from mmrl.core.config import load_config

    recipe, spec = resolve_sweep(name, [])
    assert len(spec.arms) >= 10 and spec.seeds == (0, 1, 2)
    for arm in spec.arms:
        load_config(recipe, [*spec.overrides, *SWEEP_ARMS.get(arm).overrides, *spec.overrides_of(arm)])
