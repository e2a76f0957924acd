"""The diffusion policy: on-policy re-scoring, seeding, pipeline folders, LoRA, bad input, NaN
trajectories, and short DDPO / Flow-GRPO learning runs through the shared trainer."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch

from mmrl.core.config import load_config
from mmrl.models.imagegen_pretrain import pretrain
from mmrl.policies.diffusion import DiffusionConfig, DiffusionPolicy
from mmrl.core.registry import make_task
from mmrl.core.rollout import SamplingParams

QUIET = ["log.progress=false", "log.tensorboard=false"]


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory):
    """Barely pretrained pipelines of both kinds (10 steps: seconds to build)."""
    root = tmp_path_factory.mktemp("pipelines")
    return {kind: pretrain(f"assets/imagegen/{kind}_tiny.json", root / kind, progress=False, steps=10)
            for kind in ("ddim", "flow")}


def policy_of(pipelines, kind: str, **changes) -> DiffusionPolicy:
    cfg = DiffusionConfig(pretrained=str(pipelines[kind]), num_steps=4, eval_num_steps=5, **changes)
    return DiffusionPolicy.from_config(cfg)


def prompts(n: int):
    return make_task("imagegen/shapes-v0").sample_batch("train", n, np.random.default_rng(0))


@pytest.mark.parametrize("kind", ["ddim", "flow"])
def test_on_policy_logprobs_match_the_sampler(pipelines, kind):
    """Re-scoring the sampled trajectory under the same weights (CFG, all steps in one call)
    gives the sampler's per-step log-probs: the PPO ratio is exactly 1 on-policy."""
    policy = policy_of(pipelines, kind, train_window=(1, 3))
    rollout = policy.rollout(prompts(3), 2, SamplingParams(), seed=5)
    assert rollout.logp.shape == (6, 4)
    assert rollout.mask.tolist() == [[0.0, 1.0, 1.0, 0.0]] * 6
    assert (rollout.logp[:, [0, 3]] == 0).all() and torch.isfinite(rollout.logp).all()
    out = policy(rollout)
    torch.testing.assert_close(out.logp, rollout.logp, atol=2e-5, rtol=0)
    assert torch.exp(out.logp - rollout.logp)[rollout.mask > 0].sub(1).abs().max() < 1e-4
    assert out.mean.shape == (6, 4, 3, 16, 16) and out.std.shape == (6, 4)
    out.logp.sum().backward()
    assert all(p.grad is None for p in policy.text_encoder.parameters())  # frozen
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.unet.parameters())


@pytest.mark.parametrize("kind", ["ddim", "flow"])
def test_rollouts_are_seeded_and_eval_is_deterministic(pipelines, kind):
    policy = policy_of(pipelines, kind)
    a = policy.rollout(prompts(2), 2, SamplingParams(), seed=1)
    b = policy.rollout(prompts(2), 2, SamplingParams(), seed=1)
    c = policy.rollout(prompts(2), 2, SamplingParams(), seed=2)
    assert torch.equal(a.payload.latents, b.payload.latents) and torch.equal(a.logp, b.logp)
    assert not torch.equal(a.payload.latents, c.payload.latents)
    assert a.group_id.tolist() == [0, 0, 1, 1]
    ev = policy.rollout(prompts(2), 1, SamplingParams(temperature=0.0), seed=1)
    assert ev.logp.shape == (2, 5) and ev.mask.sum() == 0  # eval_num_steps, no decisions
    assert ev.outputs[0].dtype == np.uint8 and ev.outputs[0].shape == (16, 16, 3)
    with pytest.raises(ValueError, match="temperature 1"):
        policy.rollout(prompts(1), 1, SamplingParams(temperature=0.7), seed=0)


def test_payload_select_and_concat(pipelines):
    policy = policy_of(pipelines, "ddim")
    a = policy.rollout(prompts(2), 2, SamplingParams(), seed=1)
    both = type(a).concat([a, a.select(torch.tensor([1, 2]))])
    assert both.payload.latents.shape[0] == 6
    torch.testing.assert_close(policy(both).logp, both.logp, atol=2e-5, rtol=0)
    other = policy_of(pipelines, "ddim", eta=0.5).rollout(prompts(1), 1, SamplingParams(), seed=1)
    with pytest.raises(ValueError, match="different denoising schedules"):
        type(a).concat([a, other])


def test_pipeline_folder_round_trip_loads_with_diffusers(pipelines, tmp_path):
    from diffusers import DDIMScheduler, UNet2DModel
    from transformers import CLIPTextModel

    policy = policy_of(pipelines, "ddim")
    policy.save_pretrained(str(tmp_path / "saved"))
    index = json.loads((tmp_path / "saved" / "model_index.json").read_text())
    assert index["unet"] == ["diffusers", "UNet2DModel"] and index["scheduler"] == ["diffusers", "DDIMScheduler"]
    UNet2DModel.from_pretrained(tmp_path / "saved" / "unet")  # loads without mmrl
    CLIPTextModel.from_pretrained(tmp_path / "saved" / "text_encoder")
    assert not DDIMScheduler.from_pretrained(tmp_path / "saved" / "scheduler").config.set_alpha_to_one
    again = DiffusionPolicy.from_config(DiffusionConfig(pretrained=str(tmp_path / "saved"), num_steps=4))
    a = policy.rollout(prompts(2), 1, SamplingParams(), seed=3)
    b = again.rollout(prompts(2), 1, SamplingParams(), seed=3)
    torch.testing.assert_close(a.payload.latents, b.payload.latents)


def test_bad_pipeline_folders_and_prompts(pipelines, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(pipelines["ddim"], broken)
    shutil.rmtree(broken / "text_encoder")
    with pytest.raises(FileNotFoundError, match="lacks the components \\['text_encoder'\\]"):
        DiffusionPolicy.from_config(DiffusionConfig(pretrained=str(broken)))
    with pytest.raises(FileNotFoundError, match="no model_index.json"):
        DiffusionPolicy.from_config(DiffusionConfig(pretrained=str(tmp_path)))
    with pytest.raises(ValueError, match="exactly one of pretrained"):
        DiffusionPolicy.from_config(DiffusionConfig())
    one = tmp_path / "alpha_one"
    shutil.copytree(pipelines["ddim"], one)
    sched_file = one / "scheduler" / "scheduler_config.json"
    sched_file.write_text(json.dumps({**json.loads(sched_file.read_text()), "set_alpha_to_one": True}))
    with pytest.raises(ValueError, match="set_alpha_to_one"):
        DiffusionPolicy.from_config(DiffusionConfig(pretrained=str(one)))
    policy = policy_of(pipelines, "ddim")
    with pytest.raises(ValueError, match=r"\['purple'\] are not in the text encoder's vocabulary"):
        policy.generate(["one purple circle left"], seed=0)
    with pytest.raises(ValueError, match="train_window"):
        policy_of(pipelines, "ddim", train_window=(2, 9))


def test_lora_adapters_reference_and_save(pipelines, tmp_path):
    policy = policy_of(pipelines, "ddim", lora_rank=2, lora_target_modules=("conv1", "conv2"))
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora" in n for n in trainable)
    rollout = policy.rollout(prompts(2), 1, SamplingParams(), seed=0)
    with torch.no_grad():  # move the adapters away from B = 0
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.add_(0.05)
    tuned = policy(rollout).logp
    with policy.adapter_disabled():
        base = policy(rollout).logp
    torch.testing.assert_close(base, rollout.logp, atol=2e-5, rtol=0)  # adapters off = the base
    assert (tuned - base).abs().max() > 1e-4
    policy.save_pretrained(str(tmp_path / "lora"))
    fresh = policy_of(pipelines, "ddim", lora_rank=2, lora_target_modules=("conv1", "conv2"))
    fresh.load_weights(str(tmp_path / "lora"))
    torch.testing.assert_close(fresh(rollout).logp, tuned)


def test_non_finite_trajectories_are_masked_and_score_zero(pipelines):
    policy = policy_of(pipelines, "flow")
    with torch.no_grad():
        policy.unet.conv_out.bias.fill_(float("nan"))
    rollout = policy.rollout(prompts(2), 2, SamplingParams(), seed=0)
    assert rollout.mask.sum() == 0 and rollout.stats["rollout/nonfinite_rows"] == 4
    assert torch.isfinite(rollout.logp).all()
    out = policy(rollout)  # nothing to evaluate: finite zeros, still connected to the weights
    assert torch.isfinite(out.logp).all() and out.logp.requires_grad
    task = make_task("imagegen/shapes-v0")
    result = task.reward(prompts(2)[0], rollout.outputs[0])
    assert result.score == 0.0 and "non-finite" in result.info


@pytest.fixture(scope="module")
def ddpo_run(pipelines, tmp_path_factory):
    """A short DDPO run through the shared trainer: brightness (a pixel-statistics reward a barely
    pretrained model can move in a few steps) from the 10-step pipeline."""
    from mmrl.core.trainer import train

    overrides = [*QUIET, "policy.args.pretrain_config=null", f"policy.args.pretrained={pipelines['ddim']}",
                 "task.args.reward_weights={brightness: 1.0}", "policy.args.num_steps=4",
                 "policy.args.train_window=[]", "policy.args.eval_num_steps=4", "eval.temperature=0.0",
                 "rollout.prompts_per_step=4", "rollout.group_size=4", "trainer.steps=10", "trainer.lr=1e-3",
                 "trainer.minibatches=1", "eval.every=0", "eval.num_examples=16", "checkpoint.every=0"]
    cfg = load_config("ddpo/tiny_cpu", overrides)
    root = tmp_path_factory.mktemp("ddpo_runs")
    return cfg, train(cfg, root / "a"), root


def test_ddpo_recipe_learns_through_the_shared_trainer(ddpo_run):
    """The held-out reward rises; no update was skipped; the seeded run reproduces exactly."""
    from mmrl.core.logging import read_metrics
    from mmrl.core.trainer import train

    cfg, out, root = ddpo_run
    rows = read_metrics(out)
    evals = [r["eval/reward_mean"] for r in rows if "eval/reward_mean" in r]
    assert evals[-1] > evals[0] + 0.04, evals
    assert all(r["train/skipped_updates"] == 0 for r in rows if "train/skipped_updates" in r)
    assert all(r["rollout/nonfinite_rows"] == 0 for r in rows if "rollout/nonfinite_rows" in r)
    again = read_metrics(train(cfg, root / "b"))
    assert [r.get("reward/mean") for r in again] == [r.get("reward/mean") for r in rows]


def test_rlg_weight_moves_the_reward_monotonically(ddpo_run):
    """RL guidance v = v_base + w (v_RL − v_base): w = 0 is the base, w = 1 the RL model; the
    reward rises with w (interpolation, then extrapolation) and so does the distance to the base."""
    from mmrl.experiments.imagegen_sample import load_for_sampling, rlg_sweep

    _, out, _ = ddpo_run
    policy, base, task = load_for_sampling(out, None)
    prompts_ = task.sample_batch("test", 32, np.random.default_rng(0))
    rows = rlg_sweep(policy, base, task, prompts_, [0.0, 0.5, 1.0, 1.5, 2.0], seed=0)
    rewards = [r["reward_mean"] for r in rows]
    distances = [r["distance_to_base"] for r in rows]
    assert distances[0] == 0.0
    assert all(b > a for a, b in zip(rewards, rewards[1:])), rewards
    assert all(b > a for a, b in zip(distances, distances[1:])), distances
    same = policy.generate([p.prompt for p in prompts_[:4]], seed=0)
    guided = policy.generate([p.prompt for p in prompts_[:4]], seed=0, base=base, rlg_weight=1.0)
    # w = 1 is the RL model itself (up to float rounding of base + (tuned − base))
    assert max(np.abs(a.astype(int) - b.astype(int)).max() for a, b in zip(same, guided)) <= 1


def test_sample_and_pretrain_verbs(ddpo_run, pipelines, tmp_path, capsys):
    from mmrl.cli import main

    _, out, _ = ddpo_run
    assert main(["sample", str(out), "--rlg-weight", "1.5", "--per-prompt", "2", "--out", str(tmp_path / "g.png")]) == 0
    from PIL import Image

    assert Image.open(tmp_path / "g.png").size[0] == 2 * (16 * 4 + 1) + 1
    assert main(["sample", str(pipelines["ddim"]), "--prompts", "one red circle left", "--out",
                 str(tmp_path / "p.png")]) == 0
    assert main(["sample", str(pipelines["ddim"]), "--prompts", "one mauve circle", "--out",
                 str(tmp_path / "q.png")]) == 2
    assert "not in the text encoder's vocabulary" in capsys.readouterr().err
    assert main(["sample", str(pipelines["ddim"]), "--rlg-weight", "0.5", "--prompts", "one red circle left"]) == 2
    assert main(["pretrain-imagegen", "assets/imagegen/flow_tiny.json", "--steps", "2", "--no-progress",
                 "--out", str(tmp_path / "flow")]) == 0
    assert (tmp_path / "flow" / "model_index.json").is_file()
    assert main(["pretrain-imagegen", "assets/imagegen/flow_tiny.json", "--steps", "2", "--no-progress",
                 "--out", str(tmp_path / "flow")]) == 2  # exists: --overwrite needed


def test_flow_grpo_recipe_runs_with_the_kl_on_the_mean(pipelines, tmp_path):
    """Flow-GRPO through the trainer: the window sets the decisions per image, the Gaussian-mean
    KL to the frozen copy starts at 0 and grows once the policy moves."""
    from mmrl.core.logging import read_metrics
    from mmrl.core.trainer import train

    overrides = [*QUIET, "policy.args.pretrain_config=null", f"policy.args.pretrained={pipelines['flow']}",
                 "task.args.reward_weights={brightness: 1.0}", "policy.args.num_steps=4",
                 "policy.args.train_window=[0, 3]", "policy.args.eval_num_steps=4", "rollout.prompts_per_step=2",
                 "rollout.group_size=4", "trainer.steps=2", "trainer.lr=1e-3", "eval.num_examples=4",
                 "checkpoint.every=0"]
    rows = read_metrics(train(load_config("flow_grpo/tiny_cpu", overrides), tmp_path / "run"))
    steps = [r for r in rows if r["step"] > 0]
    assert all(r["rollout/len_mean"] == 3.0 for r in steps)
    assert steps[0]["policy/kl_ref"] >= 0 and steps[1]["policy/kl_ref"] > 0 and steps[1]["loss/kl"] > 0
    assert all(r["train/skipped_updates"] == 0 for r in steps)


def test_flow_grpo_runs_the_reference_once_per_step(pipelines, tmp_path):
    """The frozen reference scores each rollout once (in micro-batches), not again in every PPO
    epoch: its means are kept and sliced per micro-batch for the KL on the mean."""
    from mmrl.core.trainer import Trainer

    overrides = [*QUIET, "policy.args.pretrain_config=null", f"policy.args.pretrained={pipelines['flow']}",
                 "task.args.reward_weights={brightness: 1.0}", "policy.args.num_steps=3",
                 "policy.args.train_window=[0, 2]", "policy.args.eval_num_steps=3", "rollout.prompts_per_step=2",
                 "rollout.group_size=4", "trainer.steps=2", "trainer.ppo_epochs=2", "trainer.minibatches=2",
                 "trainer.micro_batch_size=2", "eval.num_examples=4", "eval.every=0", "checkpoint.every=0"]
    trainer = Trainer(load_config("flow_grpo/tiny_cpu", overrides), tmp_path / "run")
    calls = []
    forward = trainer.ref.forward
    trainer.ref.forward = lambda rows, *a, **k: calls.append(rows.num_rows) or forward(rows, *a, **k)
    trainer.train()
    assert calls == [2, 2, 2, 2] * 2  # 8 rows per step in micro-batches of 2, for 2 steps; none in the epochs


def test_diffusion_run_resumes_exactly(pipelines, tmp_path):
    """Stop after step 1, resume to step 2: the same metrics as an uninterrupted 2-step run."""
    import dataclasses as dc

    from mmrl.core.logging import read_metrics
    from mmrl.core.trainer import Trainer, train

    overrides = [*QUIET, "policy.args.pretrain_config=null", f"policy.args.pretrained={pipelines['flow']}",
                 "task.args.reward_weights={brightness: 1.0}", "policy.args.num_steps=3",
                 "policy.args.train_window=[0, 2]", "policy.args.eval_num_steps=3", "rollout.prompts_per_step=2",
                 "rollout.group_size=4", "trainer.steps=2", "eval.num_examples=4", "checkpoint.every=1",
                 "trainer.lr=1e-3"]
    cfg = load_config("flow_grpo/tiny_cpu", overrides)
    full = read_metrics(train(cfg, tmp_path / "full"))
    train(dc.replace(cfg, trainer=dc.replace(cfg.trainer, steps=1)), tmp_path / "split")
    resumed = Trainer(cfg, tmp_path / "split", resume=True)
    resumed.train()
    split = read_metrics(tmp_path / "split")
    keys = ("reward/mean", "loss/policy", "loss/kl", "policy/kl_ref", "policy/grad_norm")
    trained = [[r[k] for k in keys] for r in full if r["step"] > 0]
    assert trained[1][2] > 0  # the second step moved away from the reference
    assert [[r[k] for k in keys] for r in split if r["step"] > 0] == trained
    assert [r["eval/reward_mean"] for r in split if r["step"] == 2] == [full[-1]["eval/reward_mean"]]


def tiny_latent_pipeline(folder):
    """A Stable-Diffusion-shaped folder at toy size: cross-attention UNet2DConditionModel, VAE,
    CLIP text encoder, DDIM scheduler (the same code path as a real local SD folder on a GPU)."""
    from diffusers import AutoencoderKL, DDIMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from mmrl.models.imagegen_pretrain import word_tokenizer
    from mmrl.models.diffusers_folder import save_pipeline
    from mmrl.tasks.imagegen import prompt_vocabulary

    torch.manual_seed(0)
    tokenizer = word_tokenizer(prompt_vocabulary())
    text = CLIPTextModel(CLIPTextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=8,
                                        pad_token_id=0, eos_token_id=1, bos_token_id=1))
    unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, block_out_channels=(16, 32),
                                layers_per_block=1, norm_num_groups=8, cross_attention_dim=32,
                                attention_head_dim=4,
                                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 16),
                        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                        norm_num_groups=8, sample_size=16)
    scheduler = DDIMScheduler(beta_schedule="scaled_linear", clip_sample=False, set_alpha_to_one=False, steps_offset=1)
    save_pipeline(folder, unet, scheduler, text, tokenizer, vae)
    return folder


def test_latent_cross_attention_pipeline_takes_the_same_path(tmp_path):
    folder = tiny_latent_pipeline(tmp_path / "sd_like")
    policy = DiffusionPolicy.from_config(DiffusionConfig(pretrained=str(folder), num_steps=3, eval_num_steps=3,
                                                         lora_rank=2))
    assert policy.cross_attention and policy.vae is not None
    rollout = policy.rollout(prompts(2), 2, SamplingParams(), seed=0)
    assert rollout.payload.latents.shape == (4, 4, 4, 8, 8) and rollout.outputs[0].shape == (16, 16, 3)
    torch.testing.assert_close(policy(rollout).logp, rollout.logp, atol=2e-5, rtol=0)
    assert all("lora" in n for n, p in policy.named_parameters() if p.requires_grad)


def tiny_sd3_pipeline(folder):
    """A Stable-Diffusion-3-shaped folder at toy size, written by diffusers' own
    ``StableDiffusion3Pipeline.save_pretrained``: an SD3 transformer, two CLIP encoders with
    projections, a T5 encoder, a VAE with a shift factor and the flow-matching scheduler."""
    from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel,
                           StableDiffusion3Pipeline)
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    from mmrl.models.imagegen_pretrain import word_tokenizer
    from mmrl.tasks.imagegen import prompt_vocabulary

    torch.manual_seed(0)
    tok = word_tokenizer(prompt_vocabulary())

    def clip():
        return CLIPTextModelWithProjection(CLIPTextConfig(
            vocab_size=len(tok), hidden_size=16, intermediate_size=32, projection_dim=16, num_hidden_layers=1,
            num_attention_heads=2, max_position_embeddings=8, pad_token_id=0, eos_token_id=1, bos_token_id=1))

    transformer = SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=1,
                                        attention_head_dim=8, num_attention_heads=2, joint_attention_dim=32,
                                        caption_projection_dim=16, pooled_projection_dim=32, out_channels=4,
                                        pos_embed_max_size=8)
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 16),
                        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                        norm_num_groups=8, sample_size=16, shift_factor=0.1, scaling_factor=1.5)
    t5 = T5EncoderModel(T5Config(vocab_size=len(tok), d_model=32, d_kv=8, d_ff=32, num_layers=1, num_heads=2))
    StableDiffusion3Pipeline(transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae,
                             text_encoder=clip(), tokenizer=tok, text_encoder_2=clip(), tokenizer_2=tok,
                             text_encoder_3=t5, tokenizer_3=tok).save_pretrained(folder)
    return folder


def test_sd3_folder_takes_the_same_path(tmp_path):
    """An SD3 folder loads unchanged: prompts encoded by diffusers' StableDiffusion3Pipeline, LoRA on
    the transformer, re-scoring equal to sampling on-policy, adapters saved and reloaded, and one
    Flow-GRPO step through the shared trainer with the reference as the adapters-off base."""
    from mmrl.core.logging import read_metrics
    from mmrl.core.trainer import train

    folder = tiny_sd3_pipeline(tmp_path / "sd3")
    cfg = DiffusionConfig(pretrained=str(folder), num_steps=3, eval_num_steps=3, lora_rank=2, max_sequence_length=8)
    policy = DiffusionPolicy.from_config(cfg)
    rollout = policy.rollout(prompts(2), 2, SamplingParams(), seed=0)
    # per row: (8 CLIP + 8 T5 tokens) x 32 + 32 pooled; latents [rows, steps + 1, 4, 8, 8]; 16 px images
    assert rollout.payload.cond.shape == (4, 16 * 32 + 32) and rollout.payload.latents.shape == (4, 4, 4, 8, 8)
    assert rollout.outputs[0].shape == (16, 16, 3)
    torch.testing.assert_close(policy(rollout).logp, rollout.logp, atol=2e-5, rtol=0)
    assert all("lora" in n for n, p in policy.named_parameters() if p.requires_grad)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.add_(0.05)
    policy.save_pretrained(str(tmp_path / "adapters"))
    again = DiffusionPolicy.from_config(cfg)
    again.load_weights(str(tmp_path / "adapters"))
    torch.testing.assert_close(again(rollout).logp, policy(rollout).logp)

    (folder / "text_encoder_2").rename(folder / "moved")
    with pytest.raises(FileNotFoundError, match="text_encoder_2"):
        DiffusionPolicy.from_config(cfg)
    (folder / "moved").rename(folder / "text_encoder_2")

    overrides = [*QUIET, "policy.args.pretrain_config=null", f"policy.args.pretrained={folder}",
                 "policy.args.lora_rank=2", "policy.args.max_sequence_length=8", "policy.args.num_steps=3",
                 "policy.args.train_window=[0, 2]", "policy.args.eval_num_steps=3",
                 "task.args.reward_weights={brightness: 1.0}", "rollout.prompts_per_step=2", "rollout.group_size=2",
                 "trainer.steps=1", "trainer.lr=1e-2", "trainer.ref_model=adapter_disabled", "eval.num_examples=2",
                 "checkpoint.every=0"]
    rows = read_metrics(train(load_config("flow_grpo/tiny_cpu", overrides), tmp_path / "run"))
    assert rows[-1]["step"] == 1 and rows[-1]["train/skipped_updates"] == 0 and rows[-1]["policy/kl_ref"] >= 0


def test_sd3_folder_with_bf16_weights_loads_in_float32(tmp_path):
    """Published SD3.5 folders hold bf16 / fp16 weights. transformers 5 loads a text encoder in its saved dtype,
    diffusers the transformer in float32: without one dtype for the pipeline, sampling failed at the first step
    (``mat1 and mat2 must have the same dtype``, the pooled prompt embedding)."""
    from diffusers import SD3Transformer2DModel
    from transformers import AutoModel

    folder = tiny_sd3_pipeline(tmp_path / "sd3")
    for name in ("transformer", "text_encoder", "text_encoder_2", "text_encoder_3"):
        loaded = (SD3Transformer2DModel if name == "transformer" else AutoModel).from_pretrained(folder / name)
        loaded.to(torch.bfloat16).save_pretrained(folder / name)
    policy = DiffusionPolicy.from_config(DiffusionConfig(pretrained=str(folder), num_steps=3, eval_num_steps=3,
                                                         max_sequence_length=8))
    assert {p.dtype for p in policy.parameters()} == {torch.float32}
    rollout = policy.rollout(prompts(2), 2, SamplingParams(), seed=0)
    torch.testing.assert_close(policy(rollout).logp, rollout.logp, atol=2e-5, rtol=0)


def test_sd3_folder_without_t5_loads_and_samples(tmp_path):
    """SD3 runs without its T5 encoder (zeros of its shape instead); diffusers' own save of such a pipeline
    writes ``text_encoder_3: [null, null]``, which its ``from_pretrained`` refuses unless told."""
    from diffusers import StableDiffusion3Pipeline

    full = StableDiffusion3Pipeline.from_pretrained(tiny_sd3_pipeline(tmp_path / "full"))
    components = {name: getattr(full, name) for name in ("transformer", "scheduler", "vae", "text_encoder",
                                                          "tokenizer", "text_encoder_2", "tokenizer_2")}
    StableDiffusion3Pipeline(**components, text_encoder_3=None, tokenizer_3=None).save_pretrained(tmp_path / "no_t5")
    assert json.loads((tmp_path / "no_t5" / "model_index.json").read_text())["text_encoder_3"] == [None, None]
    policy = DiffusionPolicy.from_config(DiffusionConfig(pretrained=str(tmp_path / "no_t5"), num_steps=3,
                                                         eval_num_steps=3, max_sequence_length=8))
    assert policy.sd3.text_encoder_3 is None
    rollout = policy.rollout(prompts(2), 2, SamplingParams(), seed=0)
    assert rollout.payload.cond.shape == (4, 16 * 32 + 32)  # 8 CLIP + 8 (zero) T5 tokens, as with T5
    torch.testing.assert_close(policy(rollout).logp, rollout.logp, atol=2e-5, rtol=0)


@pytest.mark.parametrize("recipe", ["ddpo/sd15_lora_gpu", "flow_grpo/sd3_5_medium_lora_gpu"])
def test_gpu_recipes_validate(recipe):
    """The GPU recipes cannot run here (no GPU, no checkpoints) but must be valid configs: a local
    folder, LoRA with the matching reference, the paper's sampler settings."""
    cfg = load_config(recipe)
    args = cfg.policy.args
    assert args.pretrained.startswith("/models/") and args.lora_rank > 0 and cfg.trainer.mixed_precision == "bf16"
    assert (cfg.algo.kl_coef > 0) == (cfg.trainer.ref_model == "adapter_disabled")
    assert cfg.task.args.size == 512 and args.num_steps <= args.eval_num_steps


@pytest.mark.gpu
def test_local_sd3_folder_on_gpu():
    """A real local SD3 / SD3.5 folder (set MMRL_SD3_PIPELINE): LoRA, ratio 1 on-policy (fp32)."""
    import os

    if not torch.cuda.is_available() or "MMRL_SD3_PIPELINE" not in os.environ:
        pytest.skip("needs a CUDA device and MMRL_SD3_PIPELINE=<local Stable Diffusion 3 pipeline folder>")
    cfg = DiffusionConfig(pretrained=os.environ["MMRL_SD3_PIPELINE"], num_steps=4, lora_rank=4, guidance_scale=4.5,
                          max_sequence_length=128)
    policy = DiffusionPolicy.from_config(cfg).cuda()
    rollout = policy.rollout(prompts(1), 2, SamplingParams(), seed=0)
    torch.testing.assert_close(policy(rollout).logp.cpu(), rollout.logp, atol=1e-3, rtol=0)


@pytest.mark.gpu
def test_local_stable_diffusion_folder_on_gpu():
    """A real local SD folder (set MMRL_SD_PIPELINE): LoRA, DDIM from its config, ratio 1 on-policy."""
    import os

    if not torch.cuda.is_available() or "MMRL_SD_PIPELINE" not in os.environ:
        pytest.skip("needs a CUDA device and MMRL_SD_PIPELINE=<local Stable Diffusion pipeline folder>")
    cfg = DiffusionConfig(pretrained=os.environ["MMRL_SD_PIPELINE"], scheduler="ddim", num_steps=4, lora_rank=4,
                          guidance_scale=5.0)
    policy = DiffusionPolicy.from_config(cfg).cuda()
    rollout = policy.rollout(prompts(1), 2, SamplingParams(), seed=0)
    torch.testing.assert_close(policy(rollout).logp.cpu(), rollout.logp, atol=1e-3, rtol=0)
