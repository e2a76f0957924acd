"""The VAR policy: rollouts (shapes, masks, greedy), one-pass re-scoring equal to the sampling
log-probs for every decision kind, save / load, config errors, registration and the recipe."""

import numpy as np
import pytest
import torch

from mmrl.core.config import load_config
from mmrl.models.var import MultiScaleVQ, NextScaleTransformer, VARSpec
from mmrl.policies.var import VARConfig, VARPayload, VARPolicy
from mmrl.core.registry import POLICIES, make_task
from mmrl.core.rollout import Rollout, SamplingParams
from mmrl.tasks.imagegen.task import ShapesConfig, ShapesTask
from mmrl.models.var_pretrain import prompt_word_ids, save_var


def tiny_policy(**kwargs) -> VARPolicy:
    torch.manual_seed(0)
    spec = VARSpec(scales=(1, 2, 4, 8), image_size=16, codebook_size=32, code_dim=8, vq_channels=16, d_model=32,
                   num_layers=2, num_heads=2, vocab_size=16)
    return VARPolicy(MultiScaleVQ(spec), NextScaleTransformer(spec), VARConfig(**kwargs))


def prompts(n=3):
    return ShapesTask(ShapesConfig()).sample_batch("train", n, np.random.default_rng(0))


@pytest.mark.parametrize("decision, width", [("token", 85), ("scale_mean", 4), ("scale_sum", 4)])
@pytest.mark.parametrize("guidance, top_k", [(1.0, 0), (2.0, 5)])
def test_rescoring_equals_sampling_logp(decision, width, guidance, top_k):
    policy = tiny_policy(decision=decision, guidance_scale=guidance, top_k=top_k)
    rollout = policy.rollout(prompts(), 4, SamplingParams(temperature=0.8), seed=3)
    assert rollout.logp.shape == rollout.mask.shape == (12, width)
    assert bool((rollout.mask == 1).all())
    assert torch.equal(rollout.group_id, torch.arange(3).repeat_interleave(4))
    out = policy(rollout, with_entropy=True)
    assert torch.allclose(out.logp, rollout.logp, atol=1e-4)  # GRPO ratio 1 on-policy
    assert out.entropy.shape == (12, width) and bool((out.entropy >= -1e-5).all())
    assert out.logp.requires_grad


def test_scale_decisions_aggregate_token_logps():
    tok = tiny_policy(decision="token")
    rollout = tok.rollout(prompts(2), 2, SamplingParams(1.0), seed=0)
    per_token = rollout.logp
    sums = torch.stack([per_token[:, :1].sum(1), per_token[:, 1:5].sum(1), per_token[:, 5:21].sum(1),
                        per_token[:, 21:].sum(1)], 1)
    for decision, expected in (("scale_sum", sums), ("scale_mean", sums / torch.tensor([1., 4., 16., 64.]))):
        other = tiny_policy(decision=decision)  # same seed: same weights
        assert torch.allclose(other.rollout(prompts(2), 2, SamplingParams(1.0), seed=0).logp, expected, atol=1e-5)


def test_train_scales_mask_and_zero_logp_outside():
    policy = tiny_policy(train_scales=(0, 1))
    rollout = policy.rollout(prompts(1), 2, SamplingParams(1.0), seed=0)
    assert rollout.mask[0].tolist() == [1.0] * 5 + [0.0] * 80
    assert bool((rollout.logp[:, 5:] == 0).all()) and bool((rollout.logp[:, :5] < 0).any())
    scale = tiny_policy(decision="scale_mean", train_scales=(2,))
    assert scale.rollout(prompts(1), 2, SamplingParams(1.0), seed=0).mask[0].tolist() == [0.0, 0.0, 1.0, 0.0]


def test_rollout_is_seeded_and_images_are_uint8():
    policy = tiny_policy()
    a = policy.rollout(prompts(), 2, SamplingParams(1.0), seed=5)
    b = policy.rollout(prompts(), 2, SamplingParams(1.0), seed=5)
    c = policy.rollout(prompts(), 2, SamplingParams(1.0), seed=6)
    assert torch.equal(a.payload.tokens, b.payload.tokens) and not torch.equal(a.payload.tokens, c.payload.tokens)
    assert a.outputs[0].shape == (16, 16, 3) and a.outputs[0].dtype == np.uint8
    task = ShapesTask(ShapesConfig())
    assert 0.0 <= task.reward(prompts()[0], a.outputs[0]).score <= 1.0


def test_greedy_rollout_has_no_decisions_and_is_deterministic():
    policy = tiny_policy(guidance_scale=2.0)
    a = policy.rollout(prompts(), 2, SamplingParams(0.0), seed=1)
    b = policy.rollout(prompts(), 2, SamplingParams(0.0), seed=2)
    assert float(a.mask.sum()) == 0.0 and torch.equal(a.payload.tokens, b.payload.tokens)


def test_training_changes_logp_and_concat_keeps_settings():
    policy = tiny_policy()
    rollout = Rollout.concat([policy.rollout(prompts(2), 2, SamplingParams(1.0), seed=s) for s in (0, 1)])
    assert rollout.num_rows == 8
    opt = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=0.5)
    (-policy(rollout).logp.mean()).backward()
    assert all(p.grad is None for p in policy.vq.parameters())  # the VQ is frozen
    opt.step()
    assert not torch.allclose(policy(rollout).logp, rollout.logp, atol=1e-3)
    other = VARPayload(rollout.payload.tokens, rollout.payload.words, 3.0, 1.0, 0)
    with pytest.raises(ValueError, match="cannot be concatenated"):
        VARPayload.concat([rollout.payload, other])


def test_save_and_load_round_trip(tmp_path):
    policy = tiny_policy()
    with torch.no_grad():
        policy.model.head.bias.add_(1.0)
    policy.save_pretrained(str(tmp_path / "p"))
    loaded = VARPolicy.from_config(VARConfig(pretrained=str(tmp_path / "p")))
    rollout = policy.rollout(prompts(), 2, SamplingParams(1.0), seed=0)
    assert torch.allclose(loaded(rollout).logp, rollout.logp, atol=1e-5)
    fresh = tiny_policy()
    fresh.load_weights(str(tmp_path / "p"))
    assert torch.allclose(fresh(rollout).logp, rollout.logp, atol=1e-5)
    with pytest.raises(FileNotFoundError, match="not a VAR model folder"):
        fresh.load_weights(str(tmp_path))


def test_config_errors(tmp_path):
    with pytest.raises(ValueError, match="exactly one of pretrained"):
        VARPolicy.from_config(VARConfig())
    with pytest.raises(FileNotFoundError, match="not a VAR model folder"):
        VARPolicy.from_config(VARConfig(pretrained=str(tmp_path)))
    with pytest.raises(ValueError, match="train_scales"):
        tiny_policy(train_scales=(4,))
    with pytest.raises(ValueError, match="top_p"):
        tiny_policy().rollout(prompts(), 1, SamplingParams(1.0, top_p=0.9), seed=0)


def test_prompt_word_ids():
    ids = prompt_word_ids(["one red circle left", "", "two blue squares top"], 16)
    assert ids.shape == (3, 4) and bool((ids[1] == 0).all()) and bool((ids[0] > 0).all())
    with pytest.raises(ValueError, match="not in the VAR vocabulary"):
        prompt_word_ids(["one purple circle"], 16)
    with pytest.raises(ValueError, match="vocab_size"):
        prompt_word_ids(["one red circle left"], 8)


def test_registered_and_recipe_builds(tmp_path):
    assert "var" in POLICIES.names()
    cfg = load_config("var/tiny_cpu")
    assert cfg.policy.name == "var" and cfg.eval.extra_splits == ("ood",)
    task = make_task(cfg.task.name, cfg.task.args)
    ood = {p.prompt for p in task.prompts["ood"]}
    assert ood and not ood & {p.prompt for p in task.prompts["train"] + task.prompts["test"]}
    folder = tmp_path / "m"
    policy = tiny_policy()
    save_var(folder, policy.vq, policy.model)
    assert (folder / "var_spec.json").is_file()


def fixed_noise_mean(policy, task, prompts_, per_prompt, key, seed=7):
    """Mean reward component ``key`` of ``per_prompt`` samples of each prompt, sampled with ``seed``
    (the same noise for any policy given the same arguments; scripts/sample_var.py's evaluation)."""
    images = policy.generate([p.prompt for p in prompts_ for _ in range(per_prompt)], seed=seed)
    return float(np.mean([task.reward(p, img).components[key]
                          for p, img in zip([p for p in prompts_ for _ in range(per_prompt)], images)]))


def test_grpo_through_the_trainer_raises_held_out_brightness(tmp_path):
    """A short VAR-GRPO run through the shared trainer (recipe var/tiny_cpu) on a barely pretrained
    VAR (20 steps per stage): the brightness reward (a pixel statistic, a quick signal) rises on the
    held-out prompts, measured before / after with the same sampling noise; the KL to the frozen copy
    grows."""
    from mmrl.core.logging import read_metrics
    from mmrl.core.trainer import train
    from mmrl.models.var_pretrain import pretrain_var

    folder = pretrain_var("assets/imagegen/var_tiny.json", tmp_path / "var20", progress=False, steps=20)
    overrides = ["log.progress=false", "log.tensorboard=false", "policy.args.pretrain_config=null",
                 f"policy.args.pretrained={folder}", "task.args.reward_weights={brightness: 1.0}",
                 "rollout.prompts_per_step=4", "rollout.group_size=8", "trainer.steps=12", "trainer.lr=1e-2",
                 "eval.every=0", "eval.num_examples=8", "checkpoint.every=0"]
    out = train(load_config("var/tiny_cpu", overrides), tmp_path / "run")
    rows = [r for r in read_metrics(out) if r["step"] > 0]
    assert rows[-1]["policy/kl_ref"] > rows[0]["policy/kl_ref"]  # (step 1's 2nd minibatch is already off-policy)
    task = make_task("imagegen/shapes-v0", {"test_fraction": 0.4, "exclude_ood": True})
    start = VARPolicy.from_config(VARConfig(pretrained=str(folder), guidance_scale=2.0))  # the recipe's CFG
    trained = VARPolicy.from_config(VARConfig(pretrained=str(folder), guidance_scale=2.0))
    trained.load_weights(str(out / "checkpoints" / "step_12" / "policy"))
    before = fixed_noise_mean(start, task, task.prompts["test"], 8, "brightness")
    after = fixed_noise_mean(trained, task, task.prompts["test"], 8, "brightness")
    assert after > before + 0.05, (before, after)


@pytest.mark.slow
def test_var_grpo_recipe_raises_held_out_prompt_correctness(tmp_path):
    """The var/tiny_cpu recipe end to end (pretraining the tiny VAR unless ``$MMRL_CACHE`` already holds
    it, ~7 min on one thread; then 80 GRPO steps, ~1.5 min): on every held-out (test) prompt, 64 samples
    each from the pretrained and the trained model with the same noise, the prompt correctness rises
    by more than 2 paired standard errors; so does the out-of-distribution split's."""
    from mmrl.core.registry import make_policy
    from mmrl.core.trainer import train

    cfg = load_config("var/tiny_cpu", ["log.progress=false", "log.tensorboard=false"])
    out = train(cfg, tmp_path / "run")
    task = make_task(cfg.task.name, cfg.task.args)
    start = make_policy(cfg.policy.name, cfg.policy.args)
    trained = make_policy(cfg.policy.name, cfg.policy.args)
    trained.load_weights(str(out / "checkpoints" / f"step_{cfg.trainer.steps}" / "policy"))
    for split in ("test", "ood"):
        examples = [p for p in task.prompts[split] for _ in range(64)]
        diffs = []
        for i in range(0, len(examples), 256):  # same seeds for both models: the same noise
            part = examples[i:i + 256]
            scores = [[task.reward(p, img).components["correctness"] for p, img in
                       zip(part, policy.generate([p.prompt for p in part], seed=1000 + i // 256))]
                      for policy in (start, trained)]
            diffs += list(np.subtract(scores[1], scores[0]))
        gain, se = float(np.mean(diffs)), float(np.std(diffs, ddof=1) / np.sqrt(len(diffs)))
        assert gain > 2 * se and gain > 0.01, (split, gain, se)
