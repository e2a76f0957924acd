"""DSRL (latent-noise SAC on a frozen flow head): the squashed latent's density (golden, and against torch's
transformed Normal), the distillation loss (golden; no gradient into Q^A), the latent actor's start and greedy mode,
the distillation target and the TD target's a' rebuilt from the same seeded draws, the frozen VLA through the
trainer, the action selector's decisions, exact resume (4 steps against 2 + 2), the config refusals, and a learning
check: on a one-step toy whose reward peaks at the action the head makes of a known noise, the latent actor learns
to steer the frozen head there."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch.distributions import AffineTransform, Normal, TanhTransform, TransformedDistribution

from mmrl.algos.offpolicy import (LatentActor, TransitionBuffer, latent_distillation_loss, squashed_latent_logprob)
from mmrl.algos.offpolicy.episodes import Episode
from mmrl.core.config import ConfigError, load_config
from mmrl.core.rollout import SamplingParams
from mmrl.core.trainer import Trainer, train
from mmrl.policies.vla import VLAConfig, VLAPolicy

RECIPE = "vla_reach/dsrl_tiny_cpu"
QUIET = ["log.progress=false", "log.tensorboard=false"]
TINY = [*QUIET, "task.args.image_size=32", "policy.args.image_size=32", "policy.args.flow_steps=4",
        "policy.args.flow_width=32", "warm_start.sft_steps=10", "algo.extra.dsrl.offline_demos=4",
        "algo.extra.dsrl.offline_steps=4", "algo.extra.dsrl.batch_size=32", "algo.extra.dsrl.critic_width=32",
        "algo.extra.dsrl.latent_width=32", "algo.extra.dsrl.latent_critic_width=32", "rollout.prompts_per_step=4",
        "trainer.minibatches=2", "eval.num_examples=4", "eval.extra_splits=[]", "eval.every=0", "checkpoint.every=1"]


# -- pure pieces ---------------------------------------------------------------------------------------------

def test_squashed_latent_logprob_golden_and_against_a_transformed_normal():
    """u = μ = 0, σ = 1, b = 2.5 in one dimension: −½ ln 2π − ln 2.5; two dimensions at u = (0.5, −1), μ = 0,
    log σ = 0, b = 2: the tanh-Gaussian's density less 2 ln 2, which torch's Normal → tanh → ×b agrees with."""
    zero = torch.tensor([[0.0]])
    assert squashed_latent_logprob(zero, zero, zero, 2.5).item() == pytest.approx(
        -0.5 * math.log(2 * math.pi) - math.log(2.5), abs=1e-6)
    torch.manual_seed(0)
    mean, log_std, u = torch.randn(6, 3), torch.randn(6, 3) * 0.5, torch.randn(6, 3) * 1.5
    for bound in (0.5, 2.5):
        reference = TransformedDistribution(Normal(mean, log_std.exp()), [TanhTransform(), AffineTransform(0.0, bound)])
        expected = reference.log_prob(bound * torch.tanh(u)).sum(-1)
        assert torch.allclose(squashed_latent_logprob(u, mean, log_std, bound), expected, atol=1e-4)


def test_latent_distillation_loss_golden_and_no_gradient_into_the_action_critic():
    """Member 0 off by (1, 0): mean 0.5; member 1 off by (1, 3): mean 5; summed over members: 5.5."""
    q_latent = torch.tensor([[1.0, 2.0], [0.0, 0.0]], requires_grad=True)
    q_action = torch.tensor([[0.0, 2.0], [1.0, 3.0]], requires_grad=True)
    loss = latent_distillation_loss(q_latent, q_action)
    assert loss.item() == pytest.approx(5.5)
    loss.backward()
    assert q_action.grad is None
    assert q_latent.grad.tolist() == [[1.0, 0.0], [-1.0, -3.0]]  # 2 (Q^W − Q^A) / B


def test_the_formulas_doctests_pass():
    """Including the golden numbers of squashed_latent_logprob and latent_distillation_loss."""
    import doctest

    from mmrl.algos.offpolicy import formulas

    result = doctest.testmod(formulas)
    assert result.attempted >= 9 and result.failed == 0


def test_a_fresh_latent_actor_starts_at_the_base_noise_and_stays_in_the_box():
    """μ = 0 and σ = 1/b at the start (w ≈ N(0, I) near 0): greedy w = 0; samples lie in (−b, b) with spread ≈ 1."""
    actor = LatentActor(features=8, noise_size=2, width=16, bound=2.5)
    h = torch.randn(4000, 8)
    mean, log_std = actor(h)
    assert torch.equal(mean, torch.zeros_like(mean))
    assert torch.allclose(log_std, torch.full_like(log_std, -math.log(2.5)), atol=1e-5)
    greedy, none = actor.rsample(h[:3], torch.Generator(), temperature=0.0)
    assert none is None and torch.equal(greedy, torch.zeros(3, 2))
    w, logp = actor.rsample(h, torch.Generator().manual_seed(0))
    assert w.abs().max() < 2.5 and 0.85 < w.std().item() < 1.0  # tanh shrinks the tails a little
    u = torch.atanh(w[:5] / 2.5)
    assert torch.allclose(logp[:5], squashed_latent_logprob(u, mean[:5], log_std[:5], 2.5), atol=1e-3)


# -- the learner's pieces, on a tiny recipe -------------------------------------------------------------------

def tiny_trainer(tmp_path, *overrides: str) -> Trainer:
    return Trainer(load_config(RECIPE, [*TINY, *overrides]), tmp_path / "run")


def test_distillation_targets_are_the_action_critic_at_the_heads_actions(tmp_path):
    """Replaying distill_step's draws by hand: B noises from N(0, I) clipped to the box, then B from π_w; the
    target is Q^A_i(s, clip(g(h, w))) and the logged loss is the distillation loss of Q^W before the step."""
    trainer = tiny_trainer(tmp_path)
    hook = trainer.loss_hooks[0][1]
    learner, policy = hook.learner, trainer.policy
    batch = hook.buffer.sample(8, torch.Generator().manual_seed(3))
    with torch.no_grad():
        h = policy.features(batch.images, batch.proprio, batch.instruction_ids)
        g = torch.Generator().manual_seed(11)
        w_prior = torch.randn((8, 2), generator=g).clamp(-2.5, 2.5)
        w_actor, _ = learner.latent_actor.rsample(h, g)
        w = torch.cat([w_prior, w_actor])
        actions = policy.flow_actions(torch.cat([h, h]), w).clamp(-1, 1)
        h_critic = learner.critic.features(batch.images, batch.proprio, batch.instruction_ids)
        target = learner.critic.q(torch.cat([h_critic, h_critic]), actions)
        expected = latent_distillation_loss(learner.q_latent(torch.cat([h, h]), w), target).item()
    metrics = learner.distill_step(batch, h, torch.Generator().manual_seed(11))
    assert metrics["loss/latent_distill"] == pytest.approx(expected, rel=1e-5)
    after = latent_distillation_loss(learner.q_latent(torch.cat([h, h]), w), target).item()
    assert after < expected  # one Adam step toward the targets


def test_td_target_bootstraps_through_the_latent_actor_and_the_frozen_head(tmp_path):
    """a' = g(h', w'), w' ~ π_w(h') from the same generator, with log π_w(w' | h') for the soft backup."""
    trainer = tiny_trainer(tmp_path)
    learner, policy = trainer.loss_hooks[0][1].learner, trainer.policy
    assert learner.s.backup_entropy and learner.next_action_density()
    h_next = torch.randn(5, policy.feature_size)
    a_next, logp = learner.next_actions(None, h_next, torch.Generator().manual_seed(4))
    w, expected_logp = learner.latent_actor.rsample(h_next, torch.Generator().manual_seed(4))
    assert torch.equal(a_next, policy.flow_actions(h_next, w)) and torch.equal(logp, expected_logp)


def test_the_vla_stays_frozen_while_the_latent_actor_and_critics_learn(tmp_path):
    trainer = tiny_trainer(tmp_path, "trainer.steps=2")
    hook = trainer.loss_hooks[0][1]
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    actor_before = {k: v.clone() for k, v in hook.learner.latent_actor.state_dict().items()}
    critic_before = {k: v.clone() for k, v in hook.learner.latent_critic.state_dict().items()}
    trainer.train()
    assert all(torch.equal(v, trainer.policy.state_dict()[k]) for k, v in before.items())
    for module, start in ((hook.learner.latent_actor, actor_before), (hook.learner.latent_critic, critic_before)):
        assert any(not torch.equal(v, module.state_dict()[k]) for k, v in start.items())
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[1]["policy/grad_norm"] == 0.0 and rows[1]["policy/version"] == 2  # stepped, with nothing to move
    assert {"loss/critic_td", "loss/latent_distill", "loss/actor", "dsrl/q_latent_gap"} <= set(rows[1])


def test_the_action_selector_acts_through_the_latent_actor(tmp_path):
    """Decisions of the right shape, executed in [−1, 1]; greedy = g(h, b·tanh(μ_w)) (= the head's own greedy
    action g(h, 0) for a fresh latent actor); sampled decisions differ from it."""
    trainer = tiny_trainer(tmp_path, "algo.extra.dsrl.offline_steps=0")
    hook, policy = trainer.loss_hooks[0][1], trainer.policy
    assert policy.action_selector is hook
    examples = trainer.task.sample_batch("test", 3, np.random.default_rng(0))
    greedy = policy.rollout(examples, 1, SamplingParams(0.0), seed=1)
    p = greedy.payload
    rows, steps = p.mask.nonzero(as_tuple=True)
    with torch.no_grad():
        h = policy.features(p.images[rows, steps], p.proprio[rows, steps], p.instruction_ids[rows])
        expected = policy.sample_actions(h, 0.0, torch.Generator())  # w = 0
    assert p.actions.shape[-1] == 2 and torch.allclose(p.actions[rows, steps], expected, atol=1e-6)
    sampled = policy.rollout(examples, 1, SamplingParams(1.0), seed=1).payload
    decisions = sampled.actions[sampled.mask > 0]
    assert decisions.shape[1] == 2 and not torch.allclose(decisions[:3], p.actions[rows, steps][:3])
    assert policy.executed_decisions(decisions).abs().max() <= 1.0
    with torch.no_grad():  # after the latent actor moves, greedy follows b·tanh(μ_w)
        hook.learner.latent_actor.net[-1].bias[:2] = torch.tensor([0.3, -0.2])
        moved = hook(None, None, None, h[:4], 0.0, torch.Generator())
        assert torch.allclose(moved, policy.flow_actions(h[:4], 2.5 * torch.tanh(torch.tensor([[0.3, -0.2]] * 4))))


def rows_of(out):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_dsrl_resumes_exactly(tmp_path):
    full = tmp_path / "full"
    train(load_config(RECIPE, [*TINY, "trainer.steps=4"]), full)
    rows = rows_of(full)
    assert "offline/latent_distill" in rows[1] and rows[1]["offpolicy/online"] == 1.0
    assert rows[1]["offpolicy/buffer_transitions"] > rows[1]["offpolicy/env_steps"]  # the demonstrations are kept
    part = tmp_path / "part"
    train(load_config(RECIPE, [*TINY, "trainer.steps=2"]), part)
    Trainer(load_config(RECIPE, [*TINY, "trainer.steps=4"]), part, resume=True).train()
    resumed = rows_of(part)

    def without_eval(r):
        return {k: v for k, v in r.items() if not k.startswith("eval/")}

    assert [without_eval(r) for r in resumed[1:]] == [without_eval(r) for r in rows[1:]]
    a, b = (torch.load(run / "offpolicy" / "state_step_4.pt", weights_only=True)["learner"] for run in (full, part))
    for key in ("latent_actor", "latent_critic", "critic"):
        assert all(torch.equal(x, y) for x, y in zip(a[key].values(), b[key].values())), key
    assert a["latent_optimizer"]["state"][0]["step"] == b["latent_optimizer"]["state"][0]["step"] > 0


@pytest.mark.parametrize("overrides, message", [
    (["algo.extra.dsrl.noise_bound=0"], r"noise_bound must be in \(0, 10.0\]"),
    (["algo.extra.dsrl.noise_bound=20"], r"noise_bound must be in \(0, 10.0\]"),
    (["algo.extra.dsrl.nois_bound=2"], "unknown key 'nois_bound' in algo.extra.dsrl"),
    (["algo.extra.dsrl.online_cql_alpha=1.0"], "cql_alpha and online_cql_alpha must be 0"),
    (["algo.extra.dsrl.offline_actor_start=5"], "offline_actor_start must be 0"),
    (["policy.args.action_head=tokens"], "needs continuous actions"),
])
def test_bad_settings_are_refused_when_the_recipe_loads(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(RECIPE, [*QUIET, *overrides])


def test_a_policy_without_a_flow_head_or_with_weight_decay_is_refused(tmp_path):
    for head in ("gaussian", "consistency"):
        with pytest.raises(ValueError, match=f"algo.offpolicy: dsrl: .*action_head: flow \\(got '{head}'\\)"):
            Trainer(load_config(RECIPE, [*TINY, f"policy.args.action_head={head}"]), tmp_path / head)
    with pytest.raises(ValueError, match="trainer.weight_decay .* set it to 0"):
        Trainer(load_config(RECIPE, [*TINY, "trainer.weight_decay=0.1"]), tmp_path / "decay")


# -- learning check --------------------------------------------------------------------------------------------

def test_the_latent_actor_learns_to_steer_the_frozen_head_to_the_rewarded_action(tmp_path):
    """One-step episodes (terminal) on real reach observations; the executed actions are uniform in [−1, 1]² and the
    reward is −‖a − a*‖² with a* = g(h, w*), w* = (0.7, −0.7): reachable through the frozen head only by steering its
    noise. 300 DSRL updates (Q^A regresses the reward, Q^W distils it, π_w climbs Q^W): the greedy action's reward
    rises from the base's g(h, 0) (measured −1.19 → −0.25; the actor first overshoots into the box's corner, where
    the clipped actions make Q flat, while Q^A is still nearly linear, then comes back) and Q^W's gap to Q^A at π_w's
    noise shrinks (measured 0.71 over the first 50 updates → 0.03 over the last 50)."""
    trainer = tiny_trainer(tmp_path, "algo.extra.dsrl.batch_size=64", "algo.extra.dsrl.init_alpha=0.001",
                           "algo.extra.dsrl.critic_width=64", "algo.extra.dsrl.critic_lr=1e-3",
                           "algo.extra.dsrl.latent_critic_lr=1e-3", "algo.extra.dsrl.latent_lr=1e-3")
    hook, policy = trainer.loss_hooks[0][1], trainer.policy
    states = hook.buffer.sample(64, torch.Generator().manual_seed(0))  # observations of the demonstrations
    with torch.no_grad():
        h = policy.features(states.images, states.proprio, states.instruction_ids)
        target = policy.flow_actions(h, torch.tensor([[0.7, -0.7]]).expand(64, -1)).clamp(-1, 1)
    rng = np.random.default_rng(0)
    data = TransitionBuffer(10 * 64 * 2, gamma=0.99, chunked=True)
    for _ in range(10):
        for i in range(64):
            action = rng.uniform(-1, 1, size=(1, 2)).astype(np.float32)
            reward = -float(((action[0] - target[i].numpy()) ** 2).sum())
            data.add(Episode(states.images[i:i + 1].numpy(), states.proprio[i:i + 1].numpy(),
                             states.instruction_ids[i].numpy(), action, np.array([reward], np.float32), True))

    def greedy_reward() -> float:
        with torch.no_grad():
            actions = hook(None, None, None, h, 0.0, torch.Generator()).clamp(-1, 1)
            return -((actions - target) ** 2).sum(-1).mean().item()

    before, gaps = greedy_reward(), []
    for k in range(300):
        generator = torch.Generator().manual_seed(k)
        _, metrics = hook.learner_step(data.sample(64, generator), generator, 0.0, None)
        gaps.append(metrics["dsrl/q_latent_gap"])
    after = greedy_reward()
    assert after > before + 0.5 and after > -0.5, (before, after)
    assert np.mean(gaps[-50:]) < 0.2 * np.mean(gaps[:50]), (np.mean(gaps[:50]), np.mean(gaps[-50:]))


def test_mmrl_eval_of_a_run_acts_through_its_latent_actor_as_the_run_did(tmp_path):
    from mmrl.core.evaluate import EvalSettings, acting_learner_of, evaluate_target

    run = tmp_path / "run"
    cfg = load_config(RECIPE, [*TINY, "trainer.steps=2", "eval.every=2", "eval.num_examples=6"])
    train(cfg, run)
    logged = rows_of(run)[-1]
    assert acting_learner_of(str(run)) == "dsrl"
    settings = EvalSettings(num_examples=6, seed=cfg.eval.seed, temperature=0.0)
    through, alone = (evaluate_target(RECIPE, str(run), TINY, ["test"], settings, through_learner=flag)["test"]
                      for flag in (True, False))
    assert through["return_mean"] == pytest.approx(logged["eval/return_mean"], abs=1e-9)
    assert alone["return_mean"] != pytest.approx(through["return_mean"], abs=1e-9)  # the flow head's own z = 0
