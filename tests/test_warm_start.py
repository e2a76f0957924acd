"""The warm start's vision pretraining (``warm_start.vision_steps``): it leaves the cache keys of
recipes that do not use it unchanged, trains the vision encoder alone and lowers its loss, and
refuses tasks without image labels."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
import yaml

from mmrl.core.config import ConfigError, load_config, to_dict
from mmrl.core.registry import make_policy, make_task
from mmrl.core.paths import recipes_dir
from mmrl.core.warm_start import VisionLabels, cache_root, pretrain_vision, warm_start_key, warm_start_path

QUIET = ["log.progress=false", "log.tensorboard=false"]
RECIPES = sorted(f"{p.parent.name}/{p.stem}" for p in recipes_dir().glob("*/*.yaml")
                 if {"task", "policy"} <= set(yaml.safe_load(p.read_text())))  # training recipes only


def key_before_vision_pretraining(cfg) -> str:
    """The cache key as computed before ``vision_steps`` / ``vision_lr`` / ``init_from`` / ``hint_fraction`` existed."""
    ws = {k: v for k, v in to_dict(cfg.warm_start).items()
          if k not in ("vision_steps", "vision_lr", "init_from", "hint_fraction")}
    policy, task = to_dict(cfg.policy), to_dict(cfg.task)
    policy["args"].pop("video", None)  # policy.args.video (VLM) came later too
    policy["args"].pop("value_stop_gradient", None)  # RL-only (vla_vlm): never in the key
    if policy["args"].get("share_prompts_under_checkpointing") is False:  # and this VLM option, at its default
        del policy["args"]["share_prompts_under_checkpointing"]
    if policy["args"].get("squash") == "none":  # and the VLA's tanh squashing, at its default
        del policy["args"]["squash"]
    from mmrl.policies.consistency import NoiseLevels

    for key, default in (("consistency_levels", to_dict(NoiseLevels())), ("consistency_steps", 1),
                         ("consistency_width", 128)):  # and the VLA's consistency head settings, at their defaults
        if key in policy["args"] and policy["args"][key] == default:
            del policy["args"][key]
    for key, default in (("context_smoothing", None), ("timestep_policy", "none"),  # and CSP / TMRL, when off,
                         ("flow_steps", 10), ("flow_width", 128)):  # and the flow head's settings at their defaults
        if key in policy["args"] and policy["args"][key] == default:
            del policy["args"][key]
    if cfg.task.name == "driving/rift-v0":  # as did RLFTSim's reward: each left out at its default
        from mmrl.tasks.driving.realism import RlftsimWeights

        if task["args"].get("reward") == "rift":
            del task["args"]["reward"]
        if task["args"].get("rlftsim") == to_dict(RlftsimWeights()):
            del task["args"]["rlftsim"]
    if cfg.task.name == "data/rows-v0":  # and the tool options and the hint prefix, each left out at its default
        for key, default in (("tools", []), ("tool_result_template", "\n={result}\nA:"), ("tool_reference", None),
                             ("answer_prefix_fraction", 0.5)):
            if task["args"].get(key, default) == default:
                task["args"].pop(key, None)
    return json.dumps({"task": task, "policy": policy, "warm_start": ws}, sort_keys=True)


def keeps_the_old_key(recipe: str) -> bool:
    """A recipe whose warm start uses none of the fields with a key of their own (vision pretraining, hints)."""
    ws = load_config(recipe).warm_start
    return ws.vision_steps == 0 and ws.hint_fraction == 0


OLD_KEY_RECIPES = [r for r in RECIPES if keeps_the_old_key(r)]


def test_every_recipe_loads_and_most_keep_the_old_key():
    assert len(RECIPES) > 10
    assert len(OLD_KEY_RECIPES) > len(RECIPES) // 2


@pytest.mark.parametrize("recipe", OLD_KEY_RECIPES)
def test_recipes_without_vision_pretraining_keep_their_cache_key(recipe):
    """Existing cached warm starts must still be found (and not silently retrained differently)."""
    cfg = load_config(recipe)
    old = key_before_vision_pretraining(cfg)
    assert warm_start_key(cfg) == old
    assert warm_start_path(cfg) == cache_root() / "warm_start" / hashlib.sha256(old.encode()).hexdigest()[:16]


def test_vision_pretraining_settings_enter_the_cache_key():
    off = load_config("curvebench/tiny_cpu", ["warm_start.vision_steps=0"])
    on = load_config("curvebench/tiny_cpu", ["warm_start.vision_steps=10"])
    faster = load_config("curvebench/tiny_cpu", ["warm_start.vision_steps=10", "warm_start.vision_lr=1e-2"])
    paths = {warm_start_path(c) for c in (off, on, faster)}
    assert len(paths) == 3
    assert '"vision_lr"' in warm_start_key(on) and '"vision_lr"' not in warm_start_key(off)


def test_vision_pretraining_trains_only_the_encoder_and_lowers_its_loss():
    cfg = load_config("curvebench/tiny_cpu", [*QUIET, "warm_start.vision_steps=40", "warm_start.batch_size=16"])
    task = make_task(cfg.task.name, cfg.task.args)
    assert isinstance(task, VisionLabels)
    policy = make_policy(cfg.policy.name, cfg.policy.args)
    encoder = {id(p) for p in policy.vision_encoder.parameters()}
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    losses = pretrain_vision(policy, task, cfg, np.random.default_rng(0))
    assert len(losses) == 40
    # chance is log(6) = 1.79 over the 6 (count, depth) pairs of 1-3 curves
    assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.2
    for name, p in policy.named_parameters():
        changed = not torch.equal(p.detach(), before[name])
        assert changed == (id(p) in encoder), name
    assert all(p.grad is None for p in policy.parameters())


def test_vision_pretraining_needs_a_task_with_image_labels():
    cfg = load_config("vie/tiny_cpu", [*QUIET, "warm_start.vision_steps=2"])
    task = make_task(cfg.task.name, cfg.task.args)
    policy = make_policy(cfg.policy.name, cfg.policy.args)
    with pytest.raises(ConfigError, match="vision_label"):
        pretrain_vision(policy, task, cfg, np.random.default_rng(0))


def test_vision_pretraining_is_deterministic_whatever_the_global_rng():
    cfg = load_config("curvebench/tiny_cpu", [*QUIET, "warm_start.vision_steps=3", "warm_start.batch_size=4"])
    task = make_task(cfg.task.name, cfg.task.args)
    runs = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        policy = make_policy(cfg.policy.name, cfg.policy.args)
        runs.append(pretrain_vision(policy, task, cfg, np.random.default_rng(0)))
    assert runs[0] == runs[1]


@pytest.mark.parametrize("vision_steps", [0, 2])
def test_warm_start_examples_replays_exactly_what_sft_trained_on(monkeypatch, vision_steps):
    """The BC regulariser (algo.bc_coef) reuses the warm start's data; its replay must be that data."""
    from mmrl.core.warm_start import sft, warm_start_examples

    cfg = load_config("curvebench/tiny_cpu", [*QUIET, f"warm_start.vision_steps={vision_steps}",
                                              "warm_start.sft_steps=3", "warm_start.batch_size=2"])
    policy = make_policy(cfg.policy.name, cfg.policy.args)
    seen = []

    def recording_sft_loss(examples, targets):
        seen.extend(examples)
        return sum(p.sum() for p in policy.parameters()) * 0.0

    monkeypatch.setattr(policy, "sft_loss", recording_sft_loss)
    sft(policy, cfg)
    replay = warm_start_examples(make_task(cfg.task.name, cfg.task.args), cfg)
    assert len(replay) == 6 and [ex.seed for ex in replay] == [ex.seed for ex in seen]


# ------------------------------------------------------------------------------------------------
# Hint-trained warm starts (warm_start.hint_fraction): a share of each SFT batch sees the task's hint

HINTS = "task.args.hint_template='H: {answer_prefix}. {prompt}'"


def recorded_sft(monkeypatch, cfg) -> tuple[list, list]:
    """The (examples, targets) batches ``sft`` hands to ``policy.sft_loss``, without training."""
    from mmrl.core.warm_start import sft

    policy = make_policy(cfg.policy.name, cfg.policy.args)
    batches = []

    def recording_sft_loss(examples, targets):
        batches.append((list(examples), list(targets)))
        return sum(p.sum() for p in policy.parameters()) * 0.0

    monkeypatch.setattr(policy, "sft_loss", recording_sft_loss)
    sft(policy, cfg)
    return [b[0] for b in batches], [b[1] for b in batches]


def test_hint_fraction_hints_exactly_the_chosen_rows_with_the_same_targets(monkeypatch):
    from mmrl.core.warm_start import hint_generator, hinted_rows

    base = [*QUIET, HINTS, "warm_start.sft_steps=3", "warm_start.batch_size=8"]
    plain_examples, plain_targets = recorded_sft(monkeypatch, load_config("data/text_tiny_cpu", base))
    cfg = load_config("data/text_tiny_cpu", [*base, "warm_start.hint_fraction=0.25"])
    examples, targets = recorded_sft(monkeypatch, cfg)
    task = make_task(cfg.task.name, cfg.task.args)
    # golden: round(0.25 · 8) = 2 rows per batch, from the generator np.random.default_rng([seed, 63])
    chosen = [[0, 4], [0, 6], [3, 6]]
    rng = hint_generator(cfg.warm_start.seed)
    assert [hinted_rows(8, 0.25, rng) for _ in range(3)] == chosen
    assert targets == plain_targets  # the same rows, the same answers
    for batch, plain, rows in zip(examples, plain_examples, chosen):
        assert [ex.row for ex in batch] == [ex.row for ex in plain]
        hinted = [i for i, (ex, p) in enumerate(zip(batch, plain)) if ex.prompt != p.prompt]
        assert hinted == rows
        for i in rows:
            assert batch[i] == task.hinted(plain[i]) and batch[i].prompt.startswith("H: ")


def test_hint_fraction_zero_is_the_warm_start_as_before(monkeypatch):
    """With hint_fraction 0 the warm start is bit for bit the one built before the option existed: the old
    loop (the task's reference batches on one generator) gives the same losses and the same weights."""
    from mmrl.core.warm_start import fit, sft

    cfg = load_config("data/text_tiny_cpu", [*QUIET, HINTS, "warm_start.sft_steps=4", "warm_start.batch_size=8"])
    assert cfg.warm_start.hint_fraction == 0 and '"hint_fraction"' not in warm_start_key(cfg)
    torch.manual_seed(0)
    new = make_policy(cfg.policy.name, cfg.policy.args)
    new_losses = sft(new, cfg)
    torch.manual_seed(0)
    old = make_policy(cfg.policy.name, cfg.policy.args)
    task = make_task(cfg.task.name, cfg.task.args)

    def old_reference_batch(rng):
        examples = task.sample_batch("train", cfg.warm_start.batch_size, rng)
        return examples, [task.reference_output(ex) for ex in examples]

    old_losses = fit(old, old_reference_batch, np.random.default_rng(cfg.warm_start.seed), 4, cfg.warm_start.lr,
                     "old", False)
    assert new_losses == old_losses
    for (name, a), b in zip(new.named_parameters(), old.parameters()):
        assert torch.equal(a, b), name


def test_hint_fraction_enters_the_cache_key_and_the_bc_replay(monkeypatch):
    from mmrl.core.warm_start import warm_start_examples

    off = load_config("data/text_tiny_cpu", [*QUIET, HINTS])
    on = load_config("data/text_tiny_cpu", [*QUIET, HINTS, "warm_start.hint_fraction=0.5"])
    assert warm_start_path(on) != warm_start_path(off) and '"hint_fraction": 0.5' in warm_start_key(on)
    cfg = load_config("data/text_tiny_cpu", [*QUIET, HINTS, "warm_start.hint_fraction=0.5",
                                             "warm_start.sft_steps=2", "warm_start.batch_size=4"])
    examples, _ = recorded_sft(monkeypatch, cfg)
    assert warm_start_examples(make_task(cfg.task.name, cfg.task.args), cfg) == [ex for b in examples for ex in b]
    assert sum(ex.prompt.startswith("H: ") for b in examples for ex in b) == 4


def test_hint_fraction_needs_a_task_with_hints():
    from mmrl.core.warm_start import sft

    for recipe, overrides, message in (("sanity/tiny_cpu", [], "gives no hints"),
                                       ("data/text_tiny_cpu", [], "hint_template")):
        cfg = load_config(recipe, [*QUIET, "warm_start.hint_fraction=0.5", "warm_start.sft_steps=2", *overrides])
        with pytest.raises(ConfigError, match=message):
            sft(make_policy(cfg.policy.name, cfg.policy.args), cfg)
    with pytest.raises(ConfigError, match="hint_fraction"):
        load_config("data/text_tiny_cpu", [*QUIET, HINTS, "warm_start.hint_fraction=1.5"])
    with pytest.raises(ConfigError, match="hint_fraction hints rows of the SFT warm start"):
        load_config("data/text_tiny_cpu", [*QUIET, HINTS, "warm_start.hint_fraction=0.5", "warm_start.sft_steps=0"])
