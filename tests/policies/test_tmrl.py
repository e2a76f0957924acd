"""CSP / TMRL (seed #98) on the tiny VLA: golden noising schedules, t = 0 as the exact context, log π of a
decision = the timestep's categorical + the action's density, on-policy ratio 1, greedy decoding at t = 0,
recipe-time errors naming the key, exact resume through the trainer, and CSP behaviour cloning that learns."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from mmrl.core.config import ConfigError, load_config
from mmrl.core.registry import make_task
from mmrl.core.rollout import SamplingParams
from mmrl.core.trainer import Trainer, train
from mmrl.core.warm_start import warm_start_key
from mmrl.policies.context_smoothing import ContextSmoothing, alpha_bars, context_noise, noise_context
from mmrl.policies.vla import VLAConfig, VLAPolicy

RECIPE = "vla_reach/tmrl_tiny_cpu"
TINY = ["log.progress=false", "log.tensorboard=false", "task.args.image_size=32", "policy.args.image_size=32",
        "policy.args.max_decisions=8", "policy.args.context_smoothing.levels=4", "warm_start.sft_steps=5",
        "rollout.prompts_per_step=4", "eval.num_examples=4", "eval.extra_splits=[]", "eval.every=0",
        "checkpoint.every=1", "trainer.ppo_epochs=1", "trainer.minibatches=1"]  # one update: it starts on-policy


def policy(levels: int = 4, **kw) -> VLAPolicy:
    return VLAPolicy.from_config(VLAConfig(**{"max_decisions": 10, "num_envs": 8,
                                              "context_smoothing": ContextSmoothing(levels=levels), **kw}))


def examples(n: int = 3) -> list:
    return make_task("robot/reach-v0").sample_batch("train", n, np.random.default_rng(0))


def test_noising_schedules_golden():
    # linear: β_i = 1e-4 + (0.02 − 1e-4)(i − 1)/99 over 100 steps; level k of K = 4 sits at step 25k:
    # ᾱ = Π_{i ≤ 25k} (1 − β_i) = 0.939029 (25 steps), 0.777180 (50), 0.566564 (75)
    assert alpha_bars(4, "linear").tolist() == pytest.approx([1.0, 0.939029, 0.777180, 0.566564], abs=1e-6)
    # cosine: cos²((u + 0.008)/1.008 · π/2) / cos²(0.008/1.008 · π/2) at u = 0, ¼, ½, ¾
    assert alpha_bars(4, "cosine").tolist() == pytest.approx([1.0, 0.847012, 0.493844, 0.144272], abs=1e-6)
    assert alpha_bars(10, "linear")[-1].item() == pytest.approx(0.440873, abs=1e-6)  # the recipe's top level
    assert alpha_bars(1, "cosine").tolist() == [1.0]
    # x_t = √ᾱ x + scale · √(1 − ᾱ) ε: ᾱ = 0.36, x = 0.5, ε = 1 → 0.6 · 0.5 + 0.8 = 1.1; half scale → 0.7
    x, eps, ab = torch.tensor([[0.5, -1.0]]), torch.tensor([[1.0, 2.0]]), torch.tensor([0.36])
    assert noise_context(x, ab, eps)[0].tolist() == pytest.approx([1.1, 1.0])
    assert noise_context(x, ab, eps, scale=0.5)[0].tolist() == pytest.approx([0.7, 0.2])


def test_level_zero_leaves_the_inputs_unchanged_and_higher_levels_noise_them():
    p = policy(levels=4)
    x = torch.rand(3, 64, 64, 3) - 0.5
    prop = torch.rand(3, 4) * 2 - 1
    t, seeds = torch.tensor([0, 2, 3]), torch.tensor([11, 12, 13])
    x_t, p_t = p.smooth_context(x, prop, t, seeds)
    assert torch.equal(x_t[0], x[0]) and torch.equal(p_t[0], prop[0])
    eps = torch.randn(64 * 64 * 3 + 4, generator=torch.Generator().manual_seed(12))  # row 1's seed
    ab = p.alpha_bars[2]
    assert torch.allclose(x_t[1], ab.sqrt() * x[1] + 0.5 * (1 - ab).sqrt() * eps[:-4].view(64, 64, 3), atol=1e-6)
    assert torch.allclose(p_t[1], ab.sqrt() * prop[1] + (1 - ab).sqrt() * eps[-4:], atol=1e-6)
    assert torch.equal(context_noise(torch.tensor([12]), (64 * 64 * 3 + 4,), torch.device("cpu"))[0], eps)
    # features: level 0 with any seed is the clean features; a noised level differs
    images = torch.randint(0, 256, (3, 64, 64, 3), dtype=torch.uint8)
    ids = p.encode_instructions(["reach the red ball"] * 3)
    clean = p.features(images, prop, ids)
    assert torch.equal(p.features(images, prop, ids, torch.zeros(3, dtype=torch.long), seeds), clean)
    assert not torch.allclose(p.features(images, prop, ids, torch.full((3,), 3), seeds), clean)
    only_image = policy(levels=4, context_smoothing=ContextSmoothing(levels=4, inputs=("image",)))
    _, p_img = only_image.smooth_context(x, prop, t, seeds)
    assert torch.equal(p_img, prop)  # proprio is not noised when only the image is named


def test_learned_timestep_logprob_is_the_categorical_plus_the_gaussian():
    p = policy(levels=5, action_head="gaussian", chunk=2, timestep_policy="learned")
    torch.nn.init.normal_(p.timestep_logits.weight, std=0.5)  # a non-uniform π(t | x)
    r = p.rollout(examples(2), 1, SamplingParams(temperature=0.7), seed=0)
    pay = r.payload
    assert (pay.timesteps[r.mask > 0] > 0).any()
    images, prop, ids = pay.images[:, 0], pay.proprio[:, 0], pay.instruction_ids
    t, seeds, a = pay.timesteps[:, 0], pay.context_seeds[:, 0], pay.actions[:, 0]
    h0, h = p.features(images, prop, ids), p.features(images, prop, ids, t, seeds)
    categorical = torch.distributions.Categorical(logits=p.timestep_logits(h0) / 0.7)
    normal = torch.distributions.Normal(p.action_mean(h), 0.7 * p.log_std(h).exp())
    expected = categorical.log_prob(t) + normal.log_prob(a).sum(-1)
    assert torch.allclose(r.logp[:, 0], expected, atol=1e-5)
    out = p(r, with_entropy=True)
    assert torch.allclose(out.entropy[:, 0], categorical.entropy() + normal.entropy().sum(-1), atol=1e-4)
    # the gradient reaches the timestep head
    out.logp.sum().backward()
    assert p.timestep_logits.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("head", ["tokens", "gaussian"])
@pytest.mark.parametrize("timestep_policy", ["fixed", "learned"])
def test_on_policy_ratio_is_one_and_greedy_acts_at_level_zero(head, timestep_policy):
    p = policy(levels=4, action_head=head, timestep_policy=timestep_policy)
    r = p.rollout(examples(3), 2, SamplingParams(1.0), seed=0)
    out = p(r)
    assert torch.allclose(out.logp, r.logp, atol=1e-5)  # ratio exp(logp − logp_old) = 1
    assert torch.allclose(out.values, r.values, atol=1e-6)
    chosen = r.payload.timesteps[r.mask > 0].float()
    assert r.stats["rollout/timestep_mean"] == pytest.approx(chosen.mean().item())
    assert set(chosen.long().tolist()) > {0}  # several levels are chosen at τ = 1 (uniform at the start)
    sub = r.select(torch.tensor([4, 1]))
    assert torch.allclose(p(sub).logp, sub.logp, atol=1e-5)
    pay = r.payload  # first decisions: log π = log π(a | x_t, t) + log π(t | x), the latter −log K when fixed
    h = p.features(pay.images[:, 0], pay.proprio[:, 0], pay.instruction_ids, pay.timesteps[:, 0],
                   pay.context_seeds[:, 0])
    action_part = p.action_logprob(h, pay.actions[:, 0], 1.0)[0]
    if timestep_policy == "fixed":
        assert torch.allclose(r.logp[:, 0], action_part - math.log(4), atol=1e-5)
    else:
        h0 = p.features(pay.images[:, 0], pay.proprio[:, 0], pay.instruction_ids)
        assert torch.allclose(r.logp[:, 0], action_part + p.timestep_logprob(h0, pay.timesteps[:, 0], 1.0)[0],
                              atol=1e-5)
    # greedy decoding: t = 0 everywhere, the same actions as the policy without a timestep decision
    greedy = p.rollout(examples(2), 1, SamplingParams(0.0), seed=1)
    assert not greedy.payload.timesteps.any()
    plain = policy(levels=4, action_head=head)
    plain.load_state_dict({k: v for k, v in p.state_dict().items() if not k.startswith("timestep_logits")})
    assert torch.equal(plain.rollout(examples(2), 1, SamplingParams(0.0), seed=1).payload.actions,
                       greedy.payload.actions)


def test_bad_settings_fail_when_the_recipe_loads():
    cases = {"policy.args.context_smoothing.levels=0": "context_smoothing.levels must be >= 1",
             "policy.args.context_smoothing.schedule=quadratic": "context_smoothing.schedule must be one of",
             "policy.args.context_smoothing.inputs=[image,depth]": r"context_smoothing.inputs\[1\] must be one of",
             "policy.args.context_smoothing.inputs=[image,image]": "context_smoothing.inputs must name",
             "policy.args.context_smoothing=null": "timestep_policy: learned .* needs policy.args.context_smoothing",
             "policy.args.timestep_policy=always": "timestep_policy must be one of"}
    for override, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            load_config(RECIPE, [override])
    with pytest.raises(ConfigError, match="timestep_policy needs an action head with log π"):
        load_config(RECIPE, ["policy.args.action_head=consistency"])


def test_csp_enters_the_warm_start_key_and_off_leaves_it_unchanged():
    on = warm_start_key(load_config(RECIPE))
    assert '"context_smoothing"' in on and '"timestep_policy"' in on
    off = load_config(RECIPE, ["policy.args.context_smoothing=null", "policy.args.timestep_policy=none"])
    assert warm_start_key(off) == warm_start_key(load_config("vla_reach/tiny_cpu"))


def test_tmrl_trains_the_timestep_head_and_resumes_exactly(tmp_path):
    def rows(out):
        return [{k: v for k, v in json.loads(line).items() if not k.startswith(("perf/", "eval/"))}
                for line in (out / "metrics.jsonl").read_text().splitlines()]

    full, part = tmp_path / "full", tmp_path / "part"
    train(load_config(RECIPE, [*TINY, "trainer.steps=2"]), full)
    got = rows(full)
    assert got[1]["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-5) and got[1]["policy/grad_norm"] > 0
    assert 0 < got[1]["rollout/timestep_mean"] < 3
    train(load_config(RECIPE, [*TINY, "trainer.steps=1"]), part)
    Trainer(load_config(RECIPE, [*TINY, "trainer.steps=2"]), part, resume=True).train()
    assert rows(part)[1:] == got[1:]
    a, b = (VLAPolicy.from_config(VLAConfig(image_size=32, context_smoothing=ContextSmoothing(levels=4),
                                            timestep_policy="learned",
                                            pretrained=str(run / "checkpoints" / "step_2" / "policy")))
            for run in (full, part))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert a.timestep_logits.weight.abs().sum() > 0  # PPO moved π(t | x) away from its uniform start


def test_csp_behaviour_cloning_reaches_a_low_loss_at_level_zero():
    """CSP behaviour cloning (t ~ U{0..9} per sample, cosine schedule: the top levels are almost pure noise) on
    8 reach demonstrations still fits the exact context: the NLL at t = 0 falls well below its start and below
    the NLL at the noisiest level, where the policy cannot see where the ball is."""
    task = make_task("robot/reach-v0")
    p = policy(levels=10, action_head="gaussian", context_smoothing=ContextSmoothing(levels=10, schedule="cosine"))
    fixed = task.sample_batch("train", 8, np.random.default_rng(1))
    demos = [task.reference_output(e) for e in fixed]
    opt = torch.optim.AdamW(p.parameters(), lr=3e-3)
    start = p.sft_loss(fixed, demos, timestep=0).item()
    for _ in range(60):
        loss = p.sft_loss(fixed, demos)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        exact, noisiest = p.sft_loss(fixed, demos, timestep=0).item(), p.sft_loss(fixed, demos, timestep=9).item()
    assert exact < start - 0.3 and exact < noisiest, (start, exact, noisiest)
