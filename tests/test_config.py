"""Recipes, overrides and validation: bad input fails before any work, with a message that fixes it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mmrl.algos.config import AlgoConfig
from mmrl.core.config import (FIELD_RANGES, ConfigError, TrainConfig, apply_overrides, build, load_config, resolve_recipe,
                         to_dict)
from mmrl.tasks.sanity import ReverseConfig


def test_recipe_loads_typed(sanity_config):
    cfg = sanity_config()
    assert isinstance(cfg, TrainConfig)
    assert isinstance(cfg.task.args, ReverseConfig)  # component args are typed by the registry
    assert cfg.algo.advantage == "grpo" and cfg.algo.clip_high == 0.28


def test_overrides_parse_yaml_values(sanity_config):
    cfg = sanity_config("trainer.lr=3e-4", "algo.shaping=[adv_clip]", "algo.adv_clip=5",
                        "algo.dual_clip_c=null", "trainer.steps=7", "task.args.max_len=5")
    assert cfg.trainer.lr == pytest.approx(3e-4)  # "3e-4" is a string in YAML 1.1: accepted as a float
    assert cfg.algo.shaping == ("adv_clip",) and cfg.algo.adv_clip == 5.0
    assert cfg.trainer.steps == 7 and cfg.task.args.max_len == 5


def test_unknown_key_names_valid_keys_and_suggests():
    with pytest.raises(ConfigError, match=r"unknown key 'lrr' in trainer \(did you mean 'lr'\?\); valid keys: seed"):
        load_config("sanity/tiny_cpu", ["trainer.lrr=1"])


def test_unknown_key_in_component_args():
    with pytest.raises(ConfigError, match=r"unknown key 'maxlen' in task.args.*valid keys: min_len, max_len"):
        load_config("sanity/tiny_cpu", ["task.args.maxlen=3"])


@pytest.mark.parametrize("override, message", [
    ("trainer.steps=ten", "trainer.steps expects an integer, got 'ten'"),
    ("trainer.lr=fast", "trainer.lr expects a number"),
    ("trainer.mixed_precision=fp8", "trainer.mixed_precision must be one of 'no', 'bf16', 'fp16'"),
    ("log.progress=3", "log.progress expects true or false"),
    ("algo.advantage=grp0", "unknown advantage estimator 'grp0'. Did you mean 'grpo'"),
    ("algo.policy_loss=ppo", "unknown policy loss 'ppo'"),
    ("algo.loss_agg=token_mean", "Did you mean 'token-mean'"),
    ("algo.shaping=[focal]", "unknown advantage shaping hook 'focal'"),
    ("task.name=sanity/revers-v0", "Did you mean 'sanity/reverse-v0'"),
    ("policy.name=causal", "unknown policy 'causal'"),
])
def test_bad_values_fail_with_a_clear_message(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config("sanity/tiny_cpu", [override])


@pytest.mark.parametrize("overrides, message", [
    (["algo.kl_coef=0.1", "trainer.ref_model=none"], "kl_coef > 0 needs a reference: trainer.ref_model: copy"),
    (["algo.tis_cap=2"], "tis_cap needs trainer.recompute_logp_old"),
    (["algo.dynamic_sampling=true", "rollout.group_size=1"], "dynamic_sampling needs rollout.group_size >= 2"),
    (["trainer.minibatches=3"], "must be divisible by trainer.minibatches"),
    (["rollout.group_size=0"], "rollout.group_size must be >= 1"),
])
def test_cross_field_constraints(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("sanity/tiny_cpu", overrides)


def test_missing_recipe_suggests_names():
    with pytest.raises(ConfigError, match=r"no recipe 'sanity/tiny_cp'.*Did you mean 'sanity/tiny_cpu'"):
        resolve_recipe("sanity/tiny_cp")


def test_recipe_by_path_name_or_configs_prefix():
    a, b = resolve_recipe("sanity/tiny_cpu"), resolve_recipe("configs/sanity/tiny_cpu.yaml")
    assert a.resolve() == b.resolve() and a.name == "tiny_cpu.yaml"


def test_malformed_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: {name: [unclosed\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(str(bad))
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(str(bad))


def test_missing_required_section(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("task: {name: sanity/reverse-v0}\n")
    with pytest.raises(ConfigError, match="missing required key 'policy'"):
        load_config(str(recipe))


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="must look like section.key=value"):
        apply_overrides({}, ["trainer.lr"])
    with pytest.raises(ConfigError, match="'trainer' is not a section"):
        apply_overrides({"trainer": 3}, ["trainer.lr=1"])


def test_round_trip_through_plain_data(sanity_config):
    cfg = sanity_config("algo.shaping=[adv_clip]", "algo.adv_clip=2")
    again = build(TrainConfig, to_dict(cfg))
    assert to_dict(again) == to_dict(cfg)
    assert build(AlgoConfig, {}) == AlgoConfig()


# -- ranges of the numeric fields ----------------------------------------------------------------
def numeric_fields() -> list[str]:
    """Dotted paths of the int / float fields (optional ones included) of every config section."""
    import typing

    from mmrl.core import config

    paths = []
    for section in dataclasses.fields(TrainConfig):
        cls = typing.get_type_hints(TrainConfig)[section.name]
        if cls is config.ComponentConfig or not dataclasses.is_dataclass(cls):  # task / policy; imports
            continue
        for f, hint in zip(dataclasses.fields(cls), typing.get_type_hints(cls).values()):
            if {int, float} & {hint, *typing.get_args(hint)}:
                paths.append(f"{section.name}.{f.name}")
    return paths


def test_every_numeric_field_has_a_range():
    assert sorted(numeric_fields()) == sorted(FIELD_RANGES)


def just_outside(allowed) -> object:
    if allowed.low is not None:
        return allowed.low if allowed.low_open else allowed.low - 1
    if allowed.high is not None:
        return allowed.high if allowed.high_open else allowed.high + 1
    return ".nan"


@pytest.mark.parametrize("key", sorted(FIELD_RANGES))
def test_each_numeric_field_rejects_a_value_outside_its_range(key):
    with pytest.raises(ConfigError, match=rf"^invalid config: .*{key} must be "):
        load_config("sanity/tiny_cpu", [f"{key}={just_outside(FIELD_RANGES[key])}"])


@pytest.mark.parametrize("override, message", [
    ("warm_start.batch_size=0", "warm_start.batch_size must be >= 1, got 0"),
    ("eval.num_examples=0", "eval.num_examples must be >= 1, got 0"),
    ("trainer.lr=-1", "trainer.lr must be > 0, got -1.0"),
    ("rollout.temperature=-1", "rollout.temperature must be > 0, got -1.0"),
    ("eval.every=-1", "eval.every must be >= 0, got -1"),
    ("checkpoint.every=-1", "checkpoint.every must be >= 0, got -1"),
    ("checkpoint.keep_last=-1", "checkpoint.keep_last must be >= 0, got -1"),
    ("warm_start.sft_steps=-1", "warm_start.sft_steps must be >= 0, got -1"),
    ("rollout.top_p=0", "rollout.top_p must be in (0, 1], got 0.0"),
    ("algo.clip_low=-0.2", "algo.clip_low must be >= 0, got -0.2"),
    ("algo.gamma=1.5", "algo.gamma must be in [0, 1], got 1.5"),
    ("algo.dual_clip_c=1", "algo.dual_clip_c must be > 1, got 1.0"),
    ("trainer.lr=.nan", "trainer.lr must be > 0, got nan"),
])
def test_out_of_range_values_are_one_line_from_the_cli(tmp_path, capsys, override, message):
    from mmrl.cli import main

    out = tmp_path / "run"
    assert main(["train", "sanity/tiny_cpu", override, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"mmrl train: error: invalid config: {message}"]
    assert not out.exists()


def test_several_problems_are_listed_in_one_error():
    with pytest.raises(ConfigError, match=r"trainer.lr must be > 0, got -1.0; .*eval.every must be >= 0, got -1"):
        load_config("sanity/tiny_cpu", ["trainer.lr=-1", "eval.every=-1"])


RECIPES = sorted(p for p in (Path(__file__).resolve().parent.parent / "configs").rglob("*.yaml")
                 if p.parent.name not in ("accelerate", "sweeps", "world_model"))  # world_model/: world-model training


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_shipped_recipe_and_each_of_its_stages_loads(recipe):
    """Every recipe in configs/ validates (and each stage with its overrides); the CPU recipes' tasks build
    (GPU recipes name data and models that are not shipped; world_model_rft's task trains its world model)."""
    from mmrl.core.program import stage_config
    from mmrl.core.registry import make_task

    cfg = load_config(str(recipe), [])
    configs = [cfg, *(stage_config(cfg, stage) for stage in cfg.stages)]
    if not recipe.stem.endswith("_gpu") and recipe.parent.name != "world_model_rft":
        for c in configs:
            make_task(c.task.name, c.task.args)
