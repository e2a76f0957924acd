"""The tiny VLA: action tokens and Gaussian chunks with exact log-probs, on-policy ratio 1, seeded
and greedy rollouts, the runner's bookkeeping, save/load, behaviour cloning that learns."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mmrl.policies.vla import (VLAConfig, VLAPayload, VLAPolicy, detokenize_actions, instruction_ids,
                               tanh_log_abs_det, tokenize_actions)
from mmrl.core.registry import make_task
from mmrl.core.rollout import Rollout, SamplingParams

HEADS = [{"action_head": "tokens"}, {"action_head": "gaussian"}, {"action_head": "tokens", "chunk": 3},
         {"action_head": "gaussian", "chunk": 2}, {"action_head": "gaussian", "chunk": 2, "squash": "tanh"}]


def policy(**kw) -> VLAPolicy:
    return VLAPolicy.from_config(VLAConfig(**{"max_decisions": 12, "num_envs": 8, **kw}))


def examples(n=3, split="train", task="reach"):
    return make_task(f"robot/{task}-v0").sample_batch(split, n, np.random.default_rng(0))


def test_action_tokens_golden():
    a = torch.tensor([-1.0, -0.999, 0.0, 0.5, 0.9999, 1.0, 3.0])
    tokens = tokenize_actions(a, 256)
    assert tokens.tolist() == [0, 0, 128, 192, 255, 255, 255]
    assert detokenize_actions(torch.tensor([0, 128, 255]), 256).tolist() == pytest.approx(
        [-1 + 1 / 256, 1 / 256, 1 - 1 / 256])
    x = torch.linspace(-1, 1, 1001)
    assert (detokenize_actions(tokenize_actions(x, 256), 256) - x).abs().max() <= 1 / 256 + 1e-6


def test_instruction_hashing():
    ids, mask = instruction_ids(["reach the red ball", "touch it"], 512)
    assert ids.shape == (2, 4) and mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert ids[0, 1] == instruction_ids(["the"], 512)[0][0, 0]  # a word has one id wherever it stands
    assert (ids[mask > 0] > 0).all() and (ids < 512).all()


def test_token_logprob_is_the_sum_over_the_decisions_tokens():
    p = policy(action_head="tokens", chunk=2)
    h = torch.randn(5, p.cfg.hidden)
    actions = torch.randint(0, 256, (5, 4))
    logp, entropy = p.action_logprob(h, actions, temperature=0.7, with_entropy=True)
    logits = p.action_logits(h).view(5, 4, 256) / 0.7
    manual = torch.log_softmax(logits, -1).gather(-1, actions[..., None]).squeeze(-1).sum(-1)
    assert torch.allclose(logp, manual, atol=1e-5)
    manual_h = torch.distributions.Categorical(logits=logits).entropy().sum(-1)
    assert torch.allclose(entropy, manual_h, atol=1e-4)


def test_gaussian_logprob_matches_torch_distributions():
    p = policy(action_head="gaussian", chunk=2)
    h = torch.randn(6, p.cfg.hidden)
    actions = torch.randn(6, 4)
    logp, entropy = p.action_logprob(h, actions, temperature=0.5, with_entropy=True)
    normal = torch.distributions.Normal(p.action_mean(h), 0.5 * p.log_std(h).exp())
    assert torch.allclose(logp, normal.log_prob(actions).sum(-1), atol=1e-4)
    assert torch.allclose(entropy, normal.entropy().sum(-1), atol=1e-5)
    lo, hi = p.cfg.log_std_range
    assert p.log_std(h).min() >= lo and p.log_std(h).max() <= hi
    assert p.log_std(torch.zeros(1, p.cfg.hidden)).mean().item() == pytest.approx(p.cfg.log_std_init, abs=1e-5)


@pytest.mark.parametrize("kw", HEADS)
def test_on_policy_ratio_is_one_and_runner_bookkeeping(kw):
    p = policy(**kw)
    ex = examples(3)
    rollout = p.rollout(ex, 2, SamplingParams(temperature=1.0), seed=0)
    n, t = rollout.logp.shape
    assert n == 6 and t <= math.ceil(12 / 1) and rollout.group_id.tolist() == [0, 0, 1, 1, 2, 2]
    out = p(rollout, with_entropy=True)
    assert torch.allclose(out.logp, rollout.logp, atol=1e-5)  # ratio exp(logp − logp_old) = 1
    assert torch.allclose(out.values, rollout.values, atol=1e-6)
    assert out.entropy.shape == (n, t) and (out.entropy * rollout.mask).sum() != 0
    for row, summary in enumerate(rollout.outputs):
        steps = int(rollout.mask[row].sum())
        assert rollout.mask[row, :steps].all() and not rollout.mask[row, steps:].any()  # right-padded
        assert rollout.dones[row].sum() == 1 and rollout.dones[row, steps - 1] == 1
        assert rollout.step_rewards[row].sum().item() == pytest.approx(summary.episode_return, abs=1e-5)
        in_chunk = rollout.payload.chunk_rewards[row]  # per env step inside each decision, summing to it
        assert in_chunk.shape == (t, p.cfg.chunk)
        assert torch.allclose(in_chunk.sum(-1), rollout.step_rewards[row], atol=1e-5)
        assert math.ceil(summary.length / p.cfg.chunk) == steps
        assert (summary.env_id, summary.seed) == (ex[row // 2].env_id, ex[row // 2].seed)
    # gradients reach the encoder, the trunk and the head
    (out.logp.sum() + out.values.sum()).backward()
    assert p.encoder[0].weight.grad.abs().sum() > 0 and p.value[0].weight.grad.abs().sum() > 0


def test_rows_of_a_group_start_from_the_same_state():
    p = policy()
    r = p.rollout(examples(2), 3, SamplingParams(1.0), seed=0)
    images = r.payload.images[:, 0]
    assert torch.equal(images[0], images[1]) and torch.equal(images[1], images[2])
    assert not torch.equal(images[0], images[3])
    assert not torch.equal(r.payload.actions[0], r.payload.actions[1])  # but the samples differ


def test_seeded_rollouts_reproduce_and_greedy_is_deterministic():
    p = policy(action_head="gaussian")
    ex = examples(2)
    a, b = (p.rollout(ex, 2, SamplingParams(1.0), seed=3) for _ in range(2))
    assert torch.equal(a.logp, b.logp) and torch.equal(a.payload.actions, b.payload.actions)
    c = p.rollout(ex, 2, SamplingParams(1.0), seed=4)
    assert not torch.equal(a.payload.actions[:, 0], c.payload.actions[:, 0])
    g1, g2 = p.rollout(ex, 1, SamplingParams(0.0), seed=1), p.rollout(ex, 1, SamplingParams(0.0), seed=2)
    assert torch.equal(g1.payload.actions, g2.payload.actions)
    state = torch.random.get_rng_state()
    p.rollout(ex, 1, SamplingParams(1.0), seed=5)
    assert torch.equal(state, torch.random.get_rng_state())  # the global RNG is untouched


def test_payload_select_and_concat_pad_the_decision_axis():
    p = policy()
    a = p.rollout(examples(2), 1, SamplingParams(1.0), seed=0)
    b = p.rollout(examples(1, task="reach", split="test"), 1, SamplingParams(1.0), seed=1)
    both = Rollout.concat([a, b])
    assert both.payload.images.shape[:2] == both.mask.shape
    out = p(both)
    assert torch.allclose(out.logp, both.logp, atol=1e-5)
    sub = both.select(torch.tensor([2, 0]))
    assert torch.allclose(p(sub).logp, sub.logp, atol=1e-5)
    with pytest.raises(ValueError, match="temperatures"):
        VLAPayload.concat([a.payload, p.rollout(examples(1), 1, SamplingParams(0.5), seed=0).payload])


def test_save_and_load_roundtrip(tmp_path):
    p = policy(action_head="gaussian")
    p.save_pretrained(str(tmp_path / "vla"))
    q = policy(action_head="gaussian", init_seed=1)
    r = p.rollout(examples(1), 1, SamplingParams(1.0), seed=0)
    assert not torch.allclose(q(r).logp, r.logp)
    q.load_weights(str(tmp_path / "vla"))
    assert torch.allclose(q(r).logp, r.logp, atol=1e-6)
    from_folder = VLAPolicy.from_config(VLAConfig(action_head="gaussian", pretrained=str(tmp_path / "vla")))
    assert torch.allclose(from_folder(r).logp, r.logp, atol=1e-6)
    with pytest.raises(FileNotFoundError, match="save_pretrained"):
        q.load_weights(str(tmp_path / "nothing"))
    with pytest.raises(ValueError, match="does not fit"):
        policy(action_head="tokens").load_weights(str(tmp_path / "vla"))


def test_wrong_image_size_and_action_dims_are_clear_errors():
    reach = make_task("robot/reach-v0")  # 64 px demonstrations
    ex = reach.sample_batch("train", 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="image_size"):
        policy(image_size=48).sft_loss(ex, [reach.reference_output(e) for e in ex])
    assert policy(image_size=48).rollout(ex, 1, SamplingParams(1.0), seed=0).payload.images.shape[2] == 48
    task = make_task("robot/pick_place-v0")
    ex = task.sample_batch("train", 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="action_dims"):
        policy(action_dims=2).sft_loss(ex, [task.reference_output(e) for e in ex])


@pytest.mark.parametrize("head", ["tokens", "gaussian", "gaussian_tanh"])
def test_behaviour_cloning_lowers_the_loss(head):
    task = make_task("robot/reach-v0")
    p = policy(action_head=head.split("_")[0], chunk=2, squash="tanh" if head.endswith("tanh") else "none")
    opt = torch.optim.AdamW(p.parameters(), lr=3e-3)
    fixed = task.sample_batch("train", 8, np.random.default_rng(1))
    demos = [task.reference_output(e) for e in fixed]
    start = p.sft_loss(fixed, demos).item()
    for _ in range(40):
        loss = p.sft_loss(fixed, demos)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert p.sft_loss(fixed, demos).item() < start - (0.5 if head == "tokens" else 0.3), (start, loss.item())


def test_tanh_log_abs_det_golden_and_stable():
    u = torch.tensor([0.0, math.atanh(0.5), -math.atanh(0.5), 2.0, 30.0, -30.0])
    got = tanh_log_abs_det(u)
    assert got[:3].tolist() == pytest.approx([0.0, math.log(0.75), math.log(0.75)], abs=1e-6)  # log(1 − tanh²)
    assert got[3].item() == pytest.approx(math.log(1 - math.tanh(2.0) ** 2), rel=1e-5)
    # 1 − tanh²(30) rounds to 0 in float32; the stable form is 2(log 2 − |u|) up to e^{−60}
    assert got[4:].tolist() == pytest.approx([2 * (math.log(2) - 30)] * 2, rel=1e-6)


def test_squashed_logprob_matches_a_tanh_transformed_normal():
    p = policy(action_head="gaussian", chunk=2, squash="tanh")
    h = torch.randn(6, p.cfg.hidden)
    u = torch.randn(6, 4)  # pre-squash samples, as the payload stores them
    logp, entropy = p.action_logprob(h, u, temperature=0.5, with_entropy=True)
    base = torch.distributions.Normal(p.action_mean(h), 0.5 * p.log_std(h).exp())
    squashed = torch.distributions.TransformedDistribution(base, torch.distributions.TanhTransform())
    assert torch.allclose(logp, squashed.log_prob(torch.tanh(u)).sum(-1), atol=1e-3)
    assert torch.allclose(logp, base.log_prob(u).sum(-1) - torch.log(1 - torch.tanh(u) ** 2).sum(-1), atol=1e-4)
    # the entropy is the one-sample estimate H[u] + Σ log(1 − tanh²(u)) at the stored sample
    assert torch.allclose(entropy, base.entropy().sum(-1) + torch.log(1 - torch.tanh(u) ** 2).sum(-1), atol=1e-4)
    # reparameterised samples: bounded, and their log π is the transformed density of the executed action
    actions, logp_r = p.rsample_actions(h, torch.Generator().manual_seed(0))
    assert actions.abs().max() < 1
    one = torch.distributions.TransformedDistribution(torch.distributions.Normal(p.action_mean(h), p.log_std(h).exp()),
                                                      torch.distributions.TanhTransform())
    assert torch.allclose(logp_r, one.log_prob(actions).sum(-1), atol=1e-2)
    # the same noise without squashing: the actions are tanh of the unsquashed head's
    plain = policy(action_head="gaussian", chunk=2)
    plain.load_state_dict(p.state_dict())
    raw, _ = plain.rsample_actions(h, torch.Generator().manual_seed(0))
    assert torch.allclose(actions, torch.tanh(raw), atol=1e-6)


def test_squashed_rollouts_execute_tanh_of_the_stored_samples():
    p = policy(action_head="gaussian", squash="tanh", log_std_init=0.4)
    r = p.rollout(examples(2), 2, SamplingParams(1.0), seed=0)
    u = r.payload.actions[r.mask > 0]
    assert u.abs().max() > 1  # wide samples: tanh, not clipping, bounds them
    executed = p.executed_decisions(u)
    assert torch.allclose(executed, torch.tanh(u)) and executed.abs().max() < 1
    greedy = p.rollout(examples(1), 1, SamplingParams(0.0), seed=0)
    h = p.features(greedy.payload.images[:, 0], greedy.payload.proprio[:, 0], greedy.payload.instruction_ids)
    assert torch.allclose(greedy.payload.actions[:, 0], p.action_mean(h), atol=1e-6)


def test_squash_needs_the_gaussian_head():
    with pytest.raises(ValueError, match="squash"):
        policy(action_head="tokens", squash="tanh")


def test_ppo_step_with_a_squashed_head_starts_on_policy(tmp_path):
    """One GRPO / PPO-clip trainer step of the Gaussian-head reach recipe with ``squash: tanh``: the trainer's
    first (and only) minibatch re-scores the rollout exactly (ratio 1, approx. KL 0) and the step updates."""
    import json

    from mmrl.core.config import load_config
    from mmrl.core.trainer import train

    cfg = load_config("world_model_rft/grpo_mujoco_tiny_cpu", [
        "log.progress=false", "log.tensorboard=false", "task.args.image_size=32", "policy.args.image_size=32",
        "policy.args.squash=tanh", "policy.args.max_decisions=8", "warm_start.sft_steps=5", "trainer.steps=1",
        "rollout.prompts_per_step=2", "rollout.group_size=4", "eval.num_examples=2", "eval.extra_splits=[]",
        "eval.every=0"])
    train(cfg, tmp_path)
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[1])
    assert row["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert row["policy/approx_kl"] == pytest.approx(0.0, abs=1e-6) and row["policy/grad_norm"] > 0
