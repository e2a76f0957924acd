"""Off-policy pieces (mmrl/algos/offpolicy): golden numbers for the TD target, Cal-QL's term, the actor and
temperature losses and Polyak averaging; the transition buffer (successors, time-limit cuts, seeded
sampling, exact resume); the episode file format; a critic learning check on reach demonstrations; WSRL
through the trainer (warm-up, online updates, exact resume)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from mmrl.algos.offpolicy import (ActorCritic, CriticSettings, Episode, TransitionBuffer, actor_loss, calql_penalty,
                                  discounted_return_to_go, episode_from_demonstration, episodes_from_rollout,
                                  polyak_update, read_episodes, read_logged_episodes, td_target, temperature_loss,
                                  write_episodes)
from mmrl.core.config import ConfigError, load_config
from mmrl.core.trainer import Trainer, train
from mmrl.policies.vla import VLAConfig, VLAPolicy

QUIET = ["log.progress=false", "log.tensorboard=false"]


# -- formulas ----------------------------------------------------------------------------------------

def test_td_target_golden():
    rewards, terminal = torch.tensor([1.0, 0.5]), torch.tensor([0.0, 1.0])
    next_q = torch.tensor([[2.0, 4.0], [3.0, 1.0]])  # [members, B]: min = [2, 1]
    next_logp = torch.tensor([0.5, -1.0])
    # y_0 = 1 + 0.9 (2 − 0.1·0.5) = 2.755; y_1 = 0.5 (terminal: no bootstrap)
    assert td_target(rewards, terminal, next_q, next_logp, 0.9, 0.1).tolist() == pytest.approx([2.755, 0.5])
    # without the entropy backup: 1 + 0.9·2 = 2.8
    assert td_target(rewards, terminal, next_q, next_logp, 0.9, 0.0).tolist() == pytest.approx([2.8, 0.5])


def test_calql_penalty_golden():
    """One member, one state, one sample of each kind, D = 1, τ = 1, V^μ(s) = 2."""
    q_data = torch.tensor([[1.0]], requires_grad=True)
    q_random, q_policy, q_next = torch.tensor([[[0.0]]]), torch.tensor([[[0.5]]]), torch.tensor([[[-1.0]]])
    logp_policy, logp_next = torch.tensor([[0.0]]), torch.tensor([[-0.5]])
    # calibrated: policy values lifted to 2 → log(e^{0 + ln 2} + e^{2 + 0.5} + e^{2 − 0}) − 1
    #   = ln(2 + 12.182494 + 7.389056) − 1 = ln 21.571550 − 1 = 2.071376
    penalty, metrics = calql_penalty(q_data, q_random, q_policy, logp_policy, q_next, logp_next, torch.tensor([2.0]),
                                     action_dims=1)
    assert penalty.item() == pytest.approx(2.071376, abs=1e-5)
    assert metrics["critic/calql_bounded_frac"].item() == 1.0
    penalty.sum().backward()
    assert q_data.grad.item() == pytest.approx(-1.0)  # the data's Q is pushed up
    # plain CQL(H): ln(2 + e^{−1 + 0.5} + e^{0.5}) − 1 = ln(2 + 0.606531 + 1.648721) − 1 = 0.448153
    plain, metrics = calql_penalty(q_data, q_random, q_policy, logp_policy, q_next, logp_next, None, action_dims=1)
    assert plain.item() == pytest.approx(0.448153, abs=1e-5)
    # a bound below every policy value changes nothing
    low, _ = calql_penalty(q_data, q_random, q_policy, logp_policy, q_next, logp_next, torch.tensor([-5.0]), 1)
    assert low.item() == pytest.approx(plain.item())


def test_actor_and_temperature_losses_golden():
    q = torch.tensor([[1.0, 2.0], [3.0, 0.0]])
    logp = torch.tensor([0.0, -1.0])
    assert actor_loss(q, logp, 0.5).item() == pytest.approx(((0 - 1) + (-0.5 - 0)) / 2)
    assert actor_loss(q, logp, 0.5, "mean").item() == pytest.approx(((0 - 2) + (-0.5 - 1)) / 2)
    with pytest.raises(ValueError, match="'min' or 'mean'"):
        actor_loss(q, logp, 0.5, "max")
    log_alpha = torch.tensor(0.0, requires_grad=True)
    temperature_loss(log_alpha, torch.tensor([1.0, 2.0]), -2.0).backward()
    # dL/dlog α = −mean(log π + H̄) = −mean(−1, 0) = 0.5 > 0: entropy (−log π = −1.5) is below H̄ = 2 → α falls
    assert log_alpha.grad.item() == pytest.approx(0.5)


def test_polyak_update_golden():
    source, target = nn.Linear(2, 1), nn.Linear(2, 1)
    with torch.no_grad():
        source.weight.copy_(torch.tensor([[1.0, 2.0]]))
        source.bias.fill_(4.0)
        target.weight.zero_()
        target.bias.fill_(-1.0)
    polyak_update(target, source, 0.1)
    assert target.weight[0].tolist() == pytest.approx([0.1, 0.2])
    assert target.bias.item() == pytest.approx(-1.0 * 0.9 + 4.0 * 0.1)


# -- buffer and episodes ----------------------------------------------------------------------------

def episode(length: int, start: int, terminal: bool, words: int = 3) -> Episode:
    """Images filled with ``start + t`` so a successor can be recognised."""
    images = np.stack([np.full((4, 4, 3), start + t, dtype=np.uint8) for t in range(length)])
    return Episode(images, np.full((length, 2), start, dtype=np.float32), np.arange(1, words + 1),
                   np.full((length, 2), 0.5, dtype=np.float32), np.arange(1, length + 1, dtype=np.float32), terminal)


def test_return_to_go():
    assert discounted_return_to_go(np.array([1.0, 0.0, 2.0]), 0.5).tolist() == pytest.approx([1.5, 1.0, 2.0])


def test_buffer_successors_cuts_and_terminals():
    buffer = TransitionBuffer(capacity=100, gamma=1.0)
    buffer.add(episode(3, 10, terminal=False))  # 3 decisions: 2 transitions + an observation-only last slot
    buffer.add(episode(2, 50, terminal=True))  # 2 transitions, the last one terminal
    assert len(buffer) == 4
    batch = buffer.sample(256, torch.Generator().manual_seed(0))
    image, following = batch.images[:, 0, 0, 0].long(), batch.next_images[:, 0, 0, 0].long()
    assert set(image.tolist()) == {10, 11, 50, 51}  # 12 (cut by the time limit) is never a transition
    done = batch.terminal.bool()
    assert torch.equal(following[~done], image[~done] + 1)
    assert set(image[done].tolist()) == {51}
    # rewards 1..T, γ = 1: returns-to-go of [1, 2, 3] and [1, 2]
    expected = {10: 6.0, 11: 5.0, 50: 3.0, 51: 2.0}
    assert all(batch.mc_returns[i].item() == expected[image[i].item()] for i in range(256))


def test_buffer_wraps_without_breaking_successors():
    buffer = TransitionBuffer(capacity=7, gamma=0.9)
    for k in range(5):
        buffer.add(episode(3, 20 * k, terminal=k % 2 == 0))
    batch = buffer.sample(512, torch.Generator().manual_seed(1))
    image, following, done = batch.images[:, 0, 0, 0].long(), batch.next_images[:, 0, 0, 0].long(), batch.terminal.bool()
    assert torch.equal(following[~done], image[~done] + 1)
    assert image.min() >= 40  # the oldest episodes were overwritten


def test_buffer_sampling_is_seeded_and_resume_is_exact():
    a = TransitionBuffer(capacity=20, gamma=0.99)
    for k in range(4):
        a.add(episode(4, 30 * k, terminal=k == 1))
    first = a.sample(8, torch.Generator().manual_seed(3))
    again = a.sample(8, torch.Generator().manual_seed(3))
    other = a.sample(8, torch.Generator().manual_seed(4))
    assert torch.equal(first.images, again.images) and not torch.equal(first.images, other.images)
    b = TransitionBuffer(capacity=20, gamma=0.99)
    b.load_state_dict(a.state_dict())
    for buf in (a, b):
        buf.add(episode(5, 200, terminal=True))
    x, y = a.sample(16, torch.Generator().manual_seed(5)), b.sample(16, torch.Generator().manual_seed(5))
    assert all(torch.equal(getattr(x, f), getattr(y, f)) for f in x.__dataclass_fields__)
    with pytest.raises(ValueError, match="capacity"):
        TransitionBuffer(capacity=21, gamma=0.99).load_state_dict(a.state_dict())


def test_episode_file_roundtrip_and_errors(tmp_path):
    episodes = [episode(3, 0, False, words=2), episode(2, 9, True, words=4)]
    path = write_episodes(tmp_path / "e.npz", episodes)
    back = read_episodes(path)
    assert [e.terminal for e in back] == [False, True]
    assert back[0].instruction_ids.tolist() == [1, 2, 0, 0]  # padded to the longest instruction
    assert all(np.array_equal(x.images, y.images) and np.array_equal(x.rewards, y.rewards)
               for x, y in zip(episodes, back))
    arrays = dict(np.load(path))
    np.savez(tmp_path / "bad.npz", **{k: v for k, v in arrays.items() if k != "rewards"})
    with pytest.raises(ValueError, match=r"bad.npz.*missing keys \['rewards'\]"):
        read_episodes(tmp_path / "bad.npz")
    np.savez(tmp_path / "short.npz", **{**arrays, "actions": arrays["actions"][:-1]})
    with pytest.raises(ValueError, match="short.npz: key 'actions' has 4 rows, 'lengths' sums to 5"):
        read_episodes(tmp_path / "short.npz")


def test_demonstration_to_decisions_of_a_chunk():
    class Demo:
        images = np.arange(5)[:, None, None, None] * np.ones((5, 2, 2, 3), dtype=np.uint8)
        proprio = np.zeros((5, 4), dtype=np.float32)
        instruction = "reach the red ball"
        executed_actions = np.arange(10, dtype=np.float32).reshape(5, 2) / 10
        rewards = np.array([1.0, 2.0, 3.0, 4.0, 5.0], dtype=np.float32)
        success = True

    ep = episode_from_demonstration(Demo(), np.array([3, 4]), chunk=2)
    assert ep.images[:, 0, 0, 0].tolist() == [0, 2, 4]
    assert ep.rewards.tolist() == [3.0, 7.0, 5.0]
    assert ep.actions.ravel().tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.8, 0.9])
    assert ep.terminal


# -- the critic on real data ---------------------------------------------------------------------------

def reach_episodes(n: int, image_size: int, policy: VLAPolicy) -> list[Episode]:
    from mmrl.tasks.robot import RobotTask, RobotTaskConfig

    task = RobotTask("reach", RobotTaskConfig(image_size=image_size))
    examples = task.sample_batch("train", n, np.random.default_rng(0))
    demos = [task.reference_output(e) for e in examples]
    return [episode_from_demonstration(d, policy.encode_instructions([d.instruction])[0].numpy(), 1) for d in demos]


def settings(**kw) -> CriticSettings:
    base = dict(ensemble_size=2, target_subset=2, width=64, lr=1e-3, tau=0.05, gamma=0.9, init_alpha=0.01,
                auto_alpha=True, alpha_lr=3e-4, target_entropy=None, backup_entropy=False, actor_reduce="min",
                cql_samples=2, cql_temperature=1.0)
    return CriticSettings(**{**base, **kw})


def test_critic_learns_the_demonstrations_values():
    """Critic-only updates (the actor loss is not stepped, so π stays fixed) on 12 reach demonstrations: the
    TD error on a fixed batch falls by a third and Q of the data moves toward its Monte-Carlo return
    (measured: 0.27 → 0.16 and 0.88 → 0.59). Deterministic for a seed."""
    torch.manual_seed(0)
    policy = VLAPolicy.from_config(VLAConfig(action_head="gaussian", value_head=False, image_size=32))
    buffer = TransitionBuffer(2000, gamma=0.9)
    for ep in reach_episodes(12, 32, policy):
        buffer.add(ep)
    learner = ActorCritic(policy, settings(), seed=0)
    probe = buffer.sample(256, torch.Generator().manual_seed(99))

    def errors() -> tuple[float, float]:
        q = learner.data_values(probe)  # [E, B]
        y, _ = learner.targets(probe, torch.Generator().manual_seed(98))
        return (q - y).abs().mean().item(), (q.mean(0) - probe.mc_returns).abs().mean().item()

    td_before, mc_before = errors()
    for k in range(120):
        generator = torch.Generator().manual_seed(k)
        learner.update(buffer.sample(64, generator), generator, 0.0, False)
    td_after, mc_after = errors()
    assert td_after < 0.67 * td_before, (td_before, td_after)
    assert mc_after < mc_before, (mc_before, mc_after)


def test_actor_critic_needs_a_gaussian_head():
    policy = VLAPolicy.from_config(VLAConfig(action_head="tokens", image_size=32))
    with pytest.raises(ValueError, match="action_head: gaussian"):
        ActorCritic(policy, settings(), seed=0)


# -- WSRL through the trainer -----------------------------------------------------------------------

TINY = [*QUIET, "task.args.image_size=32", "policy.args.image_size=32", "warm_start.sft_steps=10",
        "algo.extra.wsrl.offline_demos=4", "algo.extra.wsrl.offline_steps=4", "algo.extra.wsrl.offline_actor_start=2",
        "algo.extra.wsrl.batch_size=32", "algo.extra.wsrl.critic_width=32", "rollout.prompts_per_step=4",
        "trainer.minibatches=2", "eval.num_examples=4", "eval.extra_splits=[]", "eval.every=0",
        "checkpoint.every=1", "rollout.log_episodes=true"]


def rows_of(out):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_wsrl_warms_up_then_learns_online_and_resumes_exactly(tmp_path):
    full = tmp_path / "full"
    train(load_config("vla_reach/wsrl_tiny_cpu", [*TINY, "trainer.steps=3"]), full)
    rows = rows_of(full)
    assert (full / "offpolicy" / "offline.pt").is_file()
    assert rows[1]["policy/grad_norm"] == 0.0 and rows[1]["offpolicy/online"] == 0.0  # warm-up: collect only
    assert "offline/critic_cql" in rows[1] and "offline/transitions" in rows[1]
    assert rows[2]["offpolicy/online"] == 1.0 and rows[2]["policy/grad_norm"] > 0 and "loss/actor" in rows[2]
    assert rows[3]["offpolicy/buffer_transitions"] > rows[2]["offpolicy/buffer_transitions"]
    logged = read_logged_episodes(full, 3)
    assert len(logged) == 12 and sum(e.length for e in logged) == rows[3]["offpolicy/env_steps"]

    part = tmp_path / "part"
    train(load_config("vla_reach/wsrl_tiny_cpu", [*TINY, "trainer.steps=2"]), part)
    state = json.loads((part / "checkpoints" / "step_2" / "trainer_state.json").read_text())
    assert state["loss_hooks"]["offpolicy"]["file"] == "state_step_2.pt"
    Trainer(load_config("vla_reach/wsrl_tiny_cpu", [*TINY, "trainer.steps=3"]), part, resume=True).train()
    resumed = rows_of(part)  # the 2-step run also evaluated at its last step: compare without eval/*
    assert [{k: v for k, v in r.items() if not k.startswith("eval/")} for r in resumed[1:]] == \
        [{k: v for k, v in r.items() if not k.startswith("eval/")} for r in rows[1:]]
    assert resumed[3] == rows[3]
    a = VLAPolicy.from_config(VLAConfig(action_head="gaussian", value_head=False, image_size=32,
                                        pretrained=str(full / "checkpoints" / "step_3" / "policy")))
    b = VLAPolicy.from_config(VLAConfig(action_head="gaussian", value_head=False, image_size=32,
                                        pretrained=str(part / "checkpoints" / "step_3" / "policy")))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_wsrl_recipe_errors_are_clear():
    with pytest.raises(ConfigError, match="algo.policy_loss: none"):
        load_config("vla_reach/wsrl_tiny_cpu", [*QUIET, "algo.policy_loss=ppo_clip"])
    with pytest.raises(ConfigError, match="off-policy learner"):
        load_config("vla_reach/wsrl_tiny_cpu", [*QUIET, "algo.offpolicy=wsrll"])
    with pytest.raises(ConfigError, match="algo.extra.wsrl"):
        load_config("vla_reach/wsrl_tiny_cpu", [*QUIET, "algo.extra.wsrl.cql_alhpa=2"])


def test_episodes_from_a_vla_rollout():
    from mmrl.core.rollout import SamplingParams
    from mmrl.tasks.robot import RobotTask, RobotTaskConfig

    policy = VLAPolicy.from_config(VLAConfig(action_head="gaussian", value_head=False, image_size=32, num_envs=2))
    task = RobotTask("reach", RobotTaskConfig(image_size=32))
    rollout = policy.rollout(task.sample_batch("train", 2, np.random.default_rng(0)), 1, SamplingParams(), seed=0)
    episodes = episodes_from_rollout(rollout)
    assert [e.length for e in episodes] == rollout.mask.sum(1).long().tolist()
    assert all(np.abs(e.actions).max() <= 1 for e in episodes)
    assert [e.terminal for e in episodes] == [o.success for o in rollout.outputs]
    assert math.isclose(sum(float(e.rewards.sum()) for e in episodes),
                        sum(o.episode_return for o in rollout.outputs), rel_tol=1e-5)
