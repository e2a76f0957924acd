"""The learned simulator: model format, data collection, metrics, mmrl/WM-Reach-v0 and its bad input."""

from __future__ import annotations

import json

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import mmrl.envs  # noqa: F401  (registers the ids)
from mmrl.core.config import ConfigError
from mmrl.envs.world_model import WM_ENV_IDS, WorldModelEnv, WorldModelVectorEnv
from mmrl.envs.world_model.data import (behaviour_schedule, collect, concatenate, warm_start_demonstrations,
                                        warm_start_seeds)
from mmrl.envs.world_model.metrics import SSIM_C1, frame_distance, mae, ssim
from mmrl.envs.world_model.model import (CONFIG_FILE, POOL_FILE, LatentWorldModel, WorldModelConfig,
                                         load_world_model, read_config)
from mmrl.envs.world_model.training import (OptimConfig, accuracy, background, fit, load_recipe, prediction_loss,
                                            reference_pool, resolve_world_model)

TINY = WorldModelConfig(task="reach", image_size=32, action_dims=2, latent=16, channels=8, hidden=32, max_steps=5)


def small_data(episodes: int = 4, steps: int = 5):
    return collect("reach", 32, 700_000 + np.arange(episodes), ["expert", "noisy", "random", "expert"][:episodes],
                   steps, (0.5,), rng_seed=0)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny (untrained) world model at 32 px with a real reference pool of 2 expert episodes."""
    out = tmp_path_factory.mktemp("wm")
    torch.manual_seed(0)
    LatentWorldModel(TINY).save(out)
    np.savez_compressed(out / POOL_FILE, **reference_pool(small_data()))
    return out


def make_env(checkpoint, **kwargs) -> WorldModelEnv:
    return gymnasium.make("mmrl/WM-Reach-v0", world_model=str(checkpoint), image_size=32,
                          disable_env_checker=True, **kwargs).unwrapped


# -- metrics ---------------------------------------------------------------------------------------
def test_ssim_and_mae_golden_values():
    a, b = torch.full((1, 3, 16, 16), 0.2), torch.full((1, 3, 16, 16), 0.6)
    # constant images: variances and covariance are 0, SSIM = (2·μa·μb + C1) / (μa² + μb² + C1)
    expected = (2 * 0.2 * 0.6 + SSIM_C1) / (0.2 ** 2 + 0.6 ** 2 + SSIM_C1)
    assert ssim(a, b).item() == pytest.approx(expected, rel=1e-4)
    assert mae(a, b).item() == pytest.approx(0.4)
    x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(ssim(x, x), torch.ones(2))
    assert torch.allclose(frame_distance(x, x), torch.zeros(2), atol=1e-6)


def test_metrics_are_total_on_nan_and_reject_shape_mismatch():
    x = torch.full((1, 3, 8, 8), float("nan"))
    d = frame_distance(x, torch.rand(1, 3, 8, 8))
    assert torch.isfinite(d).all() and 0 <= d.item() <= 3
    with pytest.raises(ValueError, match="one shape"):
        ssim(torch.rand(1, 3, 8, 8), torch.rand(1, 3, 9, 8))


# -- data ------------------------------------------------------------------------------------------
def test_behaviour_schedule_counts_and_unknown_names():
    schedule = behaviour_schedule(20, {"expert": 0.25, "random": 0.15})
    assert (schedule.count("expert"), schedule.count("random"), schedule.count("noisy")) == (5, 3, 12)
    with pytest.raises(ValueError, match="unknown behaviours"):
        behaviour_schedule(4, {"teleport": 1.0})


def test_collect_shapes_real_steps_and_determinism():
    a, b = small_data(), small_data()
    assert a.images.shape == (4, 6, 32, 32, 3) and a.actions.shape == (4, 5, 2) and a.proprio.shape == (4, 6, 4)
    assert a.real_steps == 20
    np.testing.assert_array_equal(a.images, b.images)
    np.testing.assert_array_equal(a.actions, b.actions)
    np.testing.assert_allclose(a.actions[0], a.expert_actions[0])  # the expert episode executes the clean labels
    assert np.abs(a.actions).max() <= 1.0


def test_warm_start_demonstrations_are_exactly_what_bc_trains_on():
    """The world model's demonstration data is the BC warm start's: the same seeds, drawn by the same
    calls as mmrl.core.warm_start.sft, and the same frames and labels as RobotTask.demonstrate."""
    from mmrl.tasks.robot.tabletop import EpisodeExample, RobotTask, RobotTaskConfig

    task = RobotTask("reach", RobotTaskConfig(image_size=32, demo_noise=0.3))
    rng = np.random.default_rng(5)
    drawn = [ex.seed for _ in range(3) for ex in task.sample_batch("train", 4, rng)]
    seeds = warm_start_seeds("reach", 32, 0.3, batches=3, batch_size=4, seed=5)
    assert seeds == list(dict.fromkeys(drawn))
    data = warm_start_demonstrations("reach", 32, 0.3, seeds[:3], steps=30)
    assert data.real_steps == int(data.lengths.sum()) and data.behaviours == ["demonstration"] * 3
    for i, seed in enumerate(seeds[:3]):
        demo = task.demonstrate(EpisodeExample("mmrl/Reach-v0", seed))
        n = int(data.lengths[i])
        assert n == len(demo.actions) and data.success[i] == demo.success
        np.testing.assert_array_equal(data.images[i, :n], demo.images)  # the frames BC saw, plus the last one
        np.testing.assert_allclose(data.expert_actions[i, :n], demo.actions)
        assert (data.actions[i, n:] == 0).all() and (data.images[i, n + 1:] == data.images[i, n]).all()  # padding


def test_short_episodes_padding_is_never_a_target_and_the_pool_uses_successful_demonstrations():
    demos = warm_start_demonstrations("reach", 32, 0.3, [11, 12, 13], steps=30)
    assert (demos.lengths < 30).all()
    data = concatenate([demos, small_data(1, 30)])
    assert data.real_steps == int(demos.lengths.sum()) + 30
    torch.manual_seed(0)
    model = LatentWorldModel(TINY)
    bg, cfg = background(data.images), OptimConfig(frames_per_sequence=3)
    loss = prediction_loss(model, data, bg, cfg, torch.Generator().manual_seed(0))[0].item()
    scrambled = data.select(np.arange(4))
    for i, n in enumerate(scrambled.lengths):  # change everything after each episode's end
        scrambled.images[i, n + 1:] = 255 - scrambled.images[i, n + 1:]
        scrambled.proprio[i, n + 1:] += 0.7
    assert prediction_loss(model, scrambled, bg, cfg, torch.Generator().manual_seed(0))[0].item() == pytest.approx(loss)
    pool = reference_pool(data)
    successful = [s for s, ok in zip(demos.seeds, demos.success) if ok]
    assert list(pool["seeds"]) == successful and pool["expert_actions"].shape[1] == 30
    np.testing.assert_array_equal(pool["expert_actions"], demos.actions[demos.success])  # executed, 0 after the end


# -- model format ----------------------------------------------------------------------------------
def test_save_load_roundtrip(checkpoint):
    model = load_world_model(checkpoint)
    assert model.cfg == TINY
    frames = torch.zeros(2, 32, 32, 3, dtype=torch.uint8)
    latents = model.rollout_latents(frames, torch.zeros(2, 5, 2))
    assert latents.shape == (2, 6, 16)
    assert torch.allclose(latents[:, 0], latents[:, -1])  # the dynamics start as the identity map
    assert model.decode(latents[:, 0], frames).shape == (2, 3, 32, 32)


def test_read_config_rejects_non_checkpoints(tmp_path):
    with pytest.raises(FileNotFoundError, match="train-world-model"):
        read_config(tmp_path)
    (tmp_path / CONFIG_FILE).write_text(json.dumps({"architecture": "mmrl.VLAPolicy"}))
    with pytest.raises(ValueError, match="not a world-model checkpoint"):
        read_config(tmp_path)
    (tmp_path / CONFIG_FILE).write_text(json.dumps({"architecture": "mmrl.LatentWorldModel", "colour": 3}))
    with pytest.raises(ValueError, match="unknown world-model fields"):
        read_config(tmp_path)
    with pytest.raises(ValueError, match="multiple of 16"):
        WorldModelConfig(image_size=40).validate()


def test_resolve_world_model_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_world_model(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="neither"):
        resolve_world_model(str(tmp_path / "missing"))


def test_recipe_unknown_key_raises(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("model: {task: reach}\ntrain: {stepz: 3}\n")
    with pytest.raises(ConfigError, match="stepz"):
        load_recipe(recipe)
    cfg, _ = load_recipe("configs/world_model/reach_tiny.yaml")
    assert cfg.model.image_size == 64 and cfg.data.episodes > 0


# -- the env ---------------------------------------------------------------------------------------
def test_registered_and_passes_check_env(checkpoint):
    assert WM_ENV_IDS == ["mmrl/WM-Reach-v0"]
    env = make_env(checkpoint)
    check_env(env, skip_render_check=True)


def test_same_seed_same_start_and_fixed_horizon_reward_on_last_step(checkpoint):
    env = make_env(checkpoint)
    first, info = env.reset(seed=5)
    again, _ = env.reset(seed=5)
    np.testing.assert_array_equal(first["image"], again["image"])
    index = info["pool_index"]
    np.testing.assert_array_equal(first["image"], env.sim.first_frames[index])  # a real first frame
    rewards = []
    for t in range(5):
        _, r, terminated, truncated, step_info = env.step(env.sim.expert_actions[index, t])
        rewards.append(r)
    assert terminated and not truncated and not step_info["success"]
    assert rewards[:4] == [0.0] * 4
    assert rewards[-1] == pytest.approx(0.0, abs=1e-6)  # the expert's own actions match the reference


def test_reward_is_negative_frame_distance_for_other_actions(checkpoint):
    env = make_env(checkpoint)
    torch.manual_seed(1)
    with torch.no_grad():  # a model whose dynamics react to actions
        for p in env.sim.model.dynamics.parameters():
            p.add_(0.3 * torch.randn_like(p))
    env.sim._reference.clear()
    _, info = env.reset(seed=2)
    index = info["pool_index"]
    for t in range(5):
        _, r, *_ = env.step(-env.sim.expert_actions[index, t] if t % 2 else np.ones(2, np.float32))
    assert -3.0 <= r < 0.0


def test_vector_env_matches_single_envs(checkpoint):
    vec = WorldModelVectorEnv(3, world_model=str(checkpoint), image_size=32)
    obs, _ = vec.reset(seed=[4, 9, 4])
    singles = [make_env(checkpoint) for _ in range(3)]
    single_obs = [e.reset(seed=s)[0] for e, s in zip(singles, (4, 9, 4))]
    for i in range(3):
        np.testing.assert_array_equal(obs["image"][i], single_obs[i]["image"])
        assert obs["instruction"][i] == single_obs[i]["instruction"]
    rng = np.random.default_rng(0)
    for _ in range(5):
        actions = rng.uniform(-1, 1, (3, 2)).astype(np.float32)
        obs, rewards, terminated, _, _ = vec.step(actions)
        outs = [e.step(a) for e, a in zip(singles, actions)]
        for i in range(3):
            np.testing.assert_allclose(obs["proprio"][i], outs[i][0]["proprio"], atol=1e-5)
            assert np.abs(obs["image"][i].astype(int) - outs[i][0]["image"].astype(int)).max() <= 1
            assert rewards[i] == pytest.approx(outs[i][1], abs=1e-5)
    assert terminated.all()
    np.testing.assert_array_equal(vec.reset(seed=[4, 9, 4])[0]["image"][0], single_obs[0]["image"])


@pytest.mark.parametrize("action, match", [(np.zeros(3, np.float32), "shape"),
                                           (np.array([np.nan, 0.0], np.float32), "finite"),
                                           (np.array([1.5, 0.0], np.float32), r"\[-1, 1\]")])
def test_bad_actions_raise_and_leave_state_unchanged(checkpoint, action, match):
    env = make_env(checkpoint)
    env.reset(seed=0)
    z = env._z.clone()
    with pytest.raises(ValueError, match=match):
        env.step(action)
    assert torch.equal(env._z, z) and env._t == 0


@pytest.mark.parametrize("kwargs, names", [({"image_size": 64}, ("image_size=32", "image_size=64")),
                                           ({"image_size": 32, "action_dims": 4}, ("action_dims=2", "action_dims=4"))])
def test_checkpoint_mismatch_names_both(checkpoint, kwargs, names):
    with pytest.raises(ValueError) as err:
        WorldModelEnv(world_model=str(checkpoint), **kwargs)
    for name in names:
        assert name in str(err.value)


def test_missing_pool_is_a_clear_error(checkpoint, tmp_path):
    load_world_model(checkpoint).save(tmp_path)
    with pytest.raises(FileNotFoundError, match="reference pool"):
        WorldModelEnv(world_model=str(tmp_path), image_size=32)


# -- training --------------------------------------------------------------------------------------
def test_fit_reduces_the_prediction_loss_and_accuracy_reports_horizons():
    data = small_data(4, 5)
    torch.manual_seed(0)
    model = LatentWorldModel(TINY)
    history = fit(model, data, OptimConfig(steps=60, batch_size=4, lr=3e-3, frames_per_sequence=3), log_every=20)
    after = accuracy(model, data, horizons=(1, 5))["all"]
    assert history[-1]["loss"] < 0.9 * history[0]["loss"]
    assert set(after) == {"1", "5"} and {"mae", "ssim", "copy_first_mae", "copy_first_ssim"} <= set(after["1"])


def test_loss_options_weigh_the_first_frames_arm_and_l1_and_bad_values_raise(tmp_path):
    data = small_data(4, 5)
    torch.manual_seed(0)
    model = LatentWorldModel(TINY)
    bg = background(data.images)
    losses = {}
    for pixel_loss in ("mse", "l1"):
        for foreground in ("target", "target_and_first"):
            cfg = OptimConfig(frames_per_sequence=3, pixel_loss=pixel_loss, foreground=foreground, proprio_weight=0.0)
            losses[pixel_loss, foreground] = prediction_loss(model, data, bg, cfg, torch.Generator().manual_seed(0))[0].item()
    # the same sampled frames: adding the first frame's arm to the foreground only adds weight where the
    # untrained decoder errs, and |e| > e² for the pixel errors (all < 1) of the untrained model
    assert losses["mse", "target_and_first"] > losses["mse", "target"]
    assert losses["l1", "target"] > losses["mse", "target"]
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("model: {task: reach}\ntrain: {pixel_loss: huber}\n")
    with pytest.raises(ConfigError, match="pixel_loss"):
        load_recipe(recipe)


def test_vector_env_refuses_out_of_range_actions_and_leaves_state_unchanged(checkpoint):
    vec = WorldModelVectorEnv(2, world_model=str(checkpoint), image_size=32)
    vec.reset(seed=[0, 1])
    z = vec._z.clone()
    with pytest.raises(ValueError, match=r"\[-1, 1\].*unchanged"):
        vec.step(np.array([[0.0, 0.0], [0.0, -1.2]], np.float32))
    with pytest.raises(ValueError, match="shape"):
        vec.step(np.zeros((3, 2), np.float32))
    assert torch.equal(vec._z, z) and (vec._t == 0).all()
