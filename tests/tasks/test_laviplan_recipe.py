"""LaViPlan recipes, the easy-setting task options, the plan GIF and scripts/train_driving.py."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmrl.core.config import load_config
from mmrl.core.registry import make_task
from mmrl.tasks.driving.laviplan_gif import plan_frames, write_plans_gif
from mmrl.tasks.driving.laviplan_reward import ParsedPlan

ROOT = Path(__file__).resolve().parents[2]
QUIET = ["log.progress=false", "log.tensorboard=false"]


def read_rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def easy():
    return make_task("driving/laviplan-v0", {"horizon": 3, "dt": 1.0, "speed_in_prompt": True,
                                             "think": "{speed} m/s", "layouts": ["straight", "merge"]})


def test_easy_options_state_the_speed_and_keep_the_layouts(easy):
    examples = easy.sample_batch("train", 6, np.random.default_rng(3))
    for e in examples:
        assert e.scenario.road.layout in ("straight", "merge")
        assert f"Ego speed {e.speed} m/s." in e.prompt and e.speed == round(float(e.scenario.ego[3]))
        reference = easy.reference_output(e)
        assert reference.startswith(f"<think>{e.speed} m/s</think><answer>[(") and reference.count("(") == 3
        assert easy.reward(e, reference).score > 0.75  # whole metres: rounding costs up to 0.71 m of ADE
    # ood_layout keeps its unseen layouts; the default task says no speed and thinks the instruction
    assert {e.scenario.road.layout for e in easy.sample_batch("ood_layout", 4, np.random.default_rng(0))} <= {
        "s_curve", "t_junction"}
    plain = make_task("driving/laviplan-v0", {})
    e = plain.sample_batch("train", 1, np.random.default_rng(3))[0]
    assert "speed" not in e.prompt and plain.reference_output(e).startswith(f"<think>{e.scenario.instruction}</think>")


def test_easy_options_are_validated():
    with pytest.raises(ValueError, match="unknown layout"):
        make_task("driving/laviplan-v0", {"layouts": ["roundabout"]})
    with pytest.raises(ValueError, match="task.args.think"):
        make_task("driving/laviplan-v0", {"think": "{heading}"})
    with pytest.raises(ValueError, match="task.args.agents"):
        make_task("driving/laviplan-v0", {"agents": [5, 2]})
    with pytest.raises(ValueError, match="train_pool"):
        make_task("driving/laviplan-v0", {"train_pool": -1})
    with pytest.raises(ValueError, match="split 'train' has only"):
        make_task("driving/laviplan-v0", {"layouts": ["s_curve"]}).sample_batch("train", 1, np.random.default_rng(0))


def test_denser_traffic_and_the_train_pool():
    task = make_task("driving/laviplan-v0", {"agents": [9, 9], "train_pool": 5})
    dense = task.sample_batch("test", 2, np.random.default_rng(0))
    plain = make_task("driving/laviplan-v0", {}).sample_batch("test", 2, np.random.default_rng(0))
    assert all(len(e.scenario.agents) > 5 for e in dense) and all(len(e.scenario.agents) <= 5 for e in plain)
    assert [e.scenario.seed for e in dense] == [e.scenario.seed for e in plain]  # same scenes, more traffic
    pooled = task.sample_batch("train", 12, np.random.default_rng(1))
    assert {e.scenario.seed for e in pooled} <= set(range(5))
    again = task.sample_batch("train", 12, np.random.default_rng(1))
    assert all(a is b for a, b in zip(pooled, again))  # built once, kept


def test_tiny_recipe_is_sft_then_grpo_under_kl():
    cfg = load_config("laviplan/tiny_cpu")
    assert cfg.task.name == "driving/laviplan-v0" and cfg.policy.args.model_spec == "vlm/qwen2_5_vl_tiny.json"
    assert cfg.warm_start.sft_steps > 0 and cfg.algo.advantage == "grpo"
    assert cfg.algo.kl_coef > 0 and cfg.trainer.ref_model == "copy"  # LaViPlan: "under KL regularization"
    assert {"ood_layout", "ood_dense"} <= set(cfg.eval.extra_splits)
    # collisions must matter and be visible: lead-vehicle scenes, a 3x3-token raster, perception pretraining
    assert cfg.task.args.lead_share > 0 and cfg.task.args.image_size == 84 and cfg.warm_start.vision_steps > 0
    assert "{lead}" in cfg.task.args.think and "{speed}" in cfg.task.args.think


def test_gpu_recipe_validates():
    """The GPU recipe cannot run here (no GPU, no checkpoint) but must be a valid config naming a local
    folder, bf16, with the KL to a kept reference."""
    cfg = load_config("laviplan/qwen2_5_vl_3b_gpu")
    args = cfg.policy.args
    assert cfg.policy.name == "vlm" and args.pretrained.startswith("models/Qwen2.5-VL-3B") and args.dtype == "bfloat16"
    assert cfg.trainer.mixed_precision == "bf16" and cfg.algo.kl_coef > 0 and cfg.trainer.ref_model == "copy"
    assert cfg.task.args.horizon == 6 and cfg.task.args.dt == 0.5 and cfg.task.args.decimals == 1
    assert set(cfg.eval.extra_splits) == {"ood_layout", "ood_obstacles", "ood_dense", "ood_weather"}
    assert cfg.warm_start.sft_steps > 0


def test_plan_gif_plays_plans_and_marks_failures(tmp_path, easy):
    e = easy.sample_batch("test", 1, np.random.default_rng(5))[0]
    expert = ParsedPlan(e.expert, True)
    sideways = ParsedPlan(np.array([[0.0, 10.0], [0.0, 20.0], [0.0, 30.0]]), True)  # leaves the road
    invalid = easy.parse("<answer>[(1,2)]</answer>")
    frames = plan_frames(e, expert, size=96)
    assert len(frames) == 16 and frames[0].shape == (96, 96, 3)  # 3 s at 0.1 s, every 2nd step
    red = lambda frame: bool((frame[1, :, 0] == 255).all() and (frame[1, :, 1] == 40).all())  # noqa: E731
    assert not any(red(f) for f in frames) and red(plan_frames(e, sideways, size=96)[-1])
    path = write_plans_gif(tmp_path / "plans.gif", [e], {"SFT": [invalid], "GRPO": [expert]}, size=96)
    with Image.open(path) as gif:
        assert gif.n_frames == 16 and gif.size == (2 * 96 + 2, 96 + 12)
    with pytest.raises(ValueError, match="one plan per example"):
        write_plans_gif(tmp_path / "x.gif", [e], {"SFT": []})


def test_train_driving_script_runs_on_a_tiny_budget(tmp_path, monkeypatch, capsys):
    out, img = tmp_path / "run", tmp_path / "img"
    tiny = ["trainer.steps=1", "warm_start.sft_steps=2", "warm_start.batch_size=4", "rollout.prompts_per_step=2",
            "rollout.group_size=2", "trainer.minibatches=1", "eval.num_examples=2", "eval.extra_splits=[ood_dense]",
            "warm_start.cache=false"]
    monkeypatch.setattr(sys, "argv", ["train_driving.py", "--out", str(out), *QUIET, *tiny, "--gif-scenes", "1",
                                      "--img-dir", str(img), "--img-name", "lp"])
    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(ROOT / "scripts" / "train_driving.py"), run_name="__main__")
    assert exit_info.value.code == 0
    rows = read_rows(out)
    last = rows[-1]
    for key in ("reward/format", "reward/alignment", "reward/collision", "reward/offroad", "reward/invalid",
                "policy/kl_ref"):
        assert key in rows[1], key
    for key in ("ade", "fde", "collision_rate", "offroad_rate", "success_rate", "valid_rate"):
        assert f"eval/{key}" in last and f"eval/ood_dense/{key}" in last
    assert (img / "lp_curves.png").is_file() and (img / "lp_plans.gif").is_file()
    with Image.open(img / "lp_plans.gif") as gif:
        assert gif.size[0] == 2 * 128 + 2  # SFT | GRPO
    assert "plans:" in capsys.readouterr().out


def greedy_metrics(policy, task, examples) -> dict[str, float]:
    from mmrl.core.evaluate import rollout_metrics, verify
    from mmrl.core.rollout import SamplingParams

    rollout = policy.rollout(examples, 1, SamplingParams(0.0, 1.0, 48), 0)
    return rollout_metrics(task, examples, rollout, verify(task, "driving/laviplan-v0", rollout, examples))


def test_warm_start_learns_to_plan_from_the_expert_answers():
    """The recipe's SFT on a small pool, shortened: from an untrained model whose answers are all
    unusable to greedy plans that parse and land within a few metres of the expert's."""
    import torch

    from mmrl.core.registry import make_policy
    from mmrl.core.warm_start import sft

    cfg = load_config("laviplan/tiny_cpu", ["task.args.train_pool=64", "warm_start.sft_steps=80",
                                            "warm_start.batch_size=16", "warm_start.vision_steps=0", *QUIET])
    task = make_task(cfg.task.name, cfg.task.args)
    policy = make_policy(cfg.policy.name, cfg.policy.args)
    held_out = task.sample_batch("test", 16, np.random.default_rng(0))
    with torch.no_grad():
        before = greedy_metrics(policy, task, held_out)
    losses = sft(policy, cfg)
    with torch.no_grad():
        after = greedy_metrics(policy, task, held_out.copy())
    assert before["valid_rate"] == 0.0 and losses[-1] < losses[0] / 3
    assert after["valid_rate"] >= 0.75 and after["ade"] < 6.0, after


@pytest.mark.slow
def test_grpo_lowers_the_held_out_collision_rate_after_the_warm_start(tmp_path):
    """The recipe as documented (about 25 minutes on 2 cores): the held-out collision rate falls from
    the SFT warm start to the end of GRPO (seeds 0 / 1: 0.13 -> 0.08 / 0.09 of 100 test scenes, at or
    below 0.10 at every evaluation from step 25 on), ADE falls (1.90 -> 1.69 / 1.67 m) and the think
    keeps stating what the image shows (perception accuracy 0.88 -> 0.90 / 0.87)."""
    from mmrl.cli import main

    run = tmp_path / "run"
    assert main(["train", "laviplan/tiny_cpu", "--out", str(run), "--no-plot", *QUIET]) == 0
    evals = [r for r in read_rows(run) if "eval/ade" in r]
    first, last = evals[0], evals[-1]
    assert last["eval/collision_rate"] <= first["eval/collision_rate"] - 0.03, (first, last)
    assert last["eval/ade"] < first["eval/ade"] - 0.1, (first, last)
    assert last["eval/perception_accuracy"] >= first["eval/perception_accuracy"] - 0.05, (first, last)


def test_train_driving_script_trains_other_recipes_without_a_plan_gif(tmp_path, monkeypatch):
    """The traffic-policy recipes (configs/rift/*) run through the same script: training and curves,
    no LaViPlan GIF (a non-planner task gets none)."""
    out = tmp_path / "run"
    tiny = ["trainer.steps=1", "eval.num_examples=4", "rollout.prompts_per_step=4", "rollout.group_size=2"]
    monkeypatch.setattr(sys, "argv", ["train_driving.py", "--recipe", "configs/sanity/tiny_cpu.yaml", "--out",
                                      str(out), *QUIET, *tiny])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(ROOT / "scripts" / "train_driving.py"), run_name="__main__")
    assert exit_info.value.code == 0 and (out / "curves.png").is_file() and not (out / "plans.gif").exists()


def lead_of(example):
    """The added lead vehicle of a scene (the first agent when there is one), or None."""
    return example.scenario.agents[0] if example.has_lead else None


def test_lead_vehicle_scenes_have_the_stated_share_are_seeded_and_make_the_expert_slow():
    from mmrl.envs.driving.world import expert_trajectory, make_scenario

    args = {"horizon": 3, "dt": 1.0, "lead_share": 0.4}
    task = make_task("driving/laviplan-v0", args)
    examples = task.sample_batch("test", 60, np.random.default_rng(0))
    leads = [e for e in examples if lead_of(e) is not None]
    assert 0.2 <= len(leads) / len(examples) <= 0.6  # 0.4 ± 3 binomial SE (0.063)
    again = make_task("driving/laviplan-v0", args).sample_batch("test", 60, np.random.default_rng(0))
    assert [lead_of(e) is None for e in examples] == [lead_of(e) is None for e in again]
    for a, b in zip(examples, again):
        np.testing.assert_array_equal(a.expert, b.expert)
    slowed = 0
    for e in examples:
        base = make_scenario(e.scenario.seed, "test")
        free = expert_trajectory(base, 3.0, 1.0)
        if lead_of(e) is None:  # scenes without a leader are the world's scenes unchanged
            assert len(e.scenario.agents) == len(base.agents)
            np.testing.assert_array_equal(e.expert, free)
            continue
        lead = lead_of(e)
        assert lead.speed <= 3.0 and lead.desired_speed == lead.speed
        assert not task.check(e, e.expert).collision  # the expert can always stop behind it
        slowed += e.expert[-1, 0] < free[-1, 0] - 1.0
        if task.check(e, free).collision:  # driving on at free-flow speed hits the leader: the expert slowed
            assert e.expert[-1, 0] < free[-1, 0] - 1.0
    assert slowed >= len(leads) / 3
    # the OOD splits keep their definitions
    ood = task.sample_batch("ood_dense", 4, np.random.default_rng(0))
    assert all(lead_of(e) is None for e in ood)


def test_raster_scale_and_lead_share_are_options():
    task = make_task("driving/laviplan-v0", {"image_size": 84, "metres_per_px": 0.6})
    e = task.sample_batch("test", 1, np.random.default_rng(0))[0]
    assert e.image.size == (84, 84)
    with pytest.raises(ValueError, match="lead_share"):
        make_task("driving/laviplan-v0", {"lead_share": 1.5})
    with pytest.raises(ValueError, match="metres_per_px"):
        make_task("driving/laviplan-v0", {"metres_per_px": 0.0})


def test_perception_label_and_think_field_describe_the_gap_ahead():
    from mmrl.tasks.driving.laviplan import GAP_WORDS, lead_gap

    task = make_task("driving/laviplan-v0", {"horizon": 3, "dt": 1.0, "lead_share": 1.0, "think": "{speed} m/s, {lead}"})
    assert task.vision_classes == len(GAP_WORDS) == 4
    for e in task.sample_batch("test", 8, np.random.default_rng(2)):
        lead = lead_of(e)
        gap = lead_gap(e.scenario)
        # the added leader sits on the route ahead: the gap is at most its bumper gap (another car may be nearer)
        s = np.hypot(lead.x - e.scenario.ego[0], lead.y - e.scenario.ego[1])
        assert gap <= s - 4.5 + 0.5
        label = task.vision_label(e)
        assert label == int(np.searchsorted((12.0, 25.0, 40.0), gap, side="right")) and label < 3
        assert task.reference_output(e).startswith(f"<think>{e.speed} m/s, {GAP_WORDS[label]}</think><answer>")
    clear = make_task("driving/laviplan-v0", {"horizon": 3, "dt": 1.0})
    labels = [clear.vision_label(e) for e in clear.sample_batch("test", 12, np.random.default_rng(0))]
    assert 3 in labels  # most plain scenes have nobody in the ego's path within 40 m


def test_perception_term_rewards_only_a_think_that_names_the_right_gap_word():
    """task.args.perception_weight: the reasoning's perception statement is verified against the scene;
    naming every word, the wrong one, or the right one outside the think earns nothing."""
    from mmrl.tasks.driving.laviplan import GAP_WORDS

    args = {"horizon": 3, "dt": 1.0, "lead_share": 0.4, "think": "{speed} m/s, {lead}"}
    plain = make_task("driving/laviplan-v0", args)
    task = make_task("driving/laviplan-v0", {**args, "perception_weight": 0.2})
    example = task.sample_batch("test", 1, np.random.default_rng(3))[0]
    right = GAP_WORDS[task.vision_label(example)]
    wrong = next(w for w in GAP_WORDS if w != right)
    reference = task.reference_output(example)
    assert right in reference and "perception" not in plain.reward(example, reference).components
    base = plain.reward(example, reference)
    full = task.reward(example, reference)
    assert full.components["perception"] == 1.0
    # w_fmt·format + w_per·1 + (1 − w_fmt − w_per)·alignment (the rounded reference; no collision/off-road)
    c = base.components
    assert c["collision"] == c["offroad"] == 0.0
    assert full.score == pytest.approx(0.1 * c["format"] + 0.2 + 0.7 * c["alignment"])
    hacks = [reference.replace(right, wrong), reference.replace(right, " ".join(GAP_WORDS)),
             reference.replace(f", {right}", "") + f" {right}", reference.replace("<think>", "<think><think>")]
    for output in hacks:
        result = task.reward(example, output)
        assert result.components.get("perception", 0.0) == 0.0, output
    assert task.reward(example, hacks[0]).score == pytest.approx(full.score - 0.2)
    assert task.reward(example, "garbage").components["perception"] == 0.0
    outputs = [reference, hacks[0], hacks[3]]  # right, wrong word, right word in a malformed output
    metrics = task.metrics([example] * 3, outputs, [task.reward(example, o) for o in outputs])
    assert metrics["perception_accuracy"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="perception_weight"):
        make_task("driving/laviplan-v0", {**args, "perception_weight": 0.95})
